"""read/unit_cache.py: the random-access cache, bounded in bytes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from torch_dataloader_utils.read.unit_cache import CachedRows, UnitCache


def _rows(first: int, count: int) -> CachedRows:
    return CachedRows(first, pa.table({"x": np.arange(count, dtype=np.int64)}))


def test_least_recently_used_units_go_first_when_the_bytes_run_out():
    size = _rows(0, 100).table.get_total_buffer_size()
    cache = UnitCache(3 * size)
    for unit in range(3):
        cache.put((0, unit), _rows(0, 100))
    assert cache.get((0, 0), 0, 99) is not None  # unit 0 is now the most recent
    cache.put((0, 3), _rows(0, 100))
    assert (0, 1) not in cache and (0, 0) in cache and (0, 2) in cache and (0, 3) in cache
    assert cache.nbytes == 3 * size


def test_an_entry_serves_only_the_rows_it_holds_and_a_wider_read_replaces_it():
    cache = UnitCache(1 << 20)
    cache.put((1, 2), _rows(50, 10))
    assert cache.get((1, 2), 50, 59) is not None
    assert cache.get((1, 2), 49, 55) is None and cache.get((1, 2), 55, 60) is None
    cache.put((1, 2), _rows(0, 100))
    assert len(cache) == 1 and cache.get((1, 2), 49, 60).first == 0


def test_a_table_larger_than_the_limit_is_not_kept_and_zero_keeps_nothing():
    cache = UnitCache(0)
    cache.put((0, 0), _rows(0, 10))
    assert len(cache) == 0 and cache.nbytes == 0
    with pytest.raises(ValueError, match="row_cache_bytes"):
        UnitCache(-1)

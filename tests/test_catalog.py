"""Planning's reading of footers: local Parquet footers parsed from Python memory, and the
switch to a thread pool when local reads are slow."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.catalog import footers
from torch_dataloader_utils.errors import UnsupportedFileError
from torch_dataloader_utils.formats import _parquet_tail, parquet

pytestmark = pytest.mark.timeout(120)


def _wide_file(path: str) -> None:
    """A file whose footer is larger than the first tail read (FOOTER_READ)."""
    table = pa.table({f"column_{i:03d}": np.arange(40, dtype=np.int64) for i in range(300)})
    pq.write_table(table, path, row_group_size=10)


def test_local_footers_equal_pyarrows_own(tmp_path):
    write_dataset(tmp_path / "narrow", [[30, 25]])
    narrow = str(tmp_path / "narrow" / "part-00000.parquet")
    wide = str(tmp_path / "wide.parquet")
    _wide_file(wide)
    assert pq.ParquetFile(wide).metadata.serialized_size + 8 > _parquet_tail.FOOTER_READ
    for path in (narrow, wide):
        with open(path, "rb") as file:
            footer = _parquet_tail.parsed_footer(_parquet_tail.footer_tail(file, os.path.getsize(path)))
        assert footer.equals(pq.ParquetFile(path).metadata), path
        with open(path, "rb") as file:  # planning reads local tails with pread, the same bytes
            assert _parquet_tail.local_footer_tail(path) == _parquet_tail.footer_tail(file, os.path.getsize(path)), path


@pytest.mark.parametrize(
    "tail",
    [b"", b"PAR1", b"x" * 100, b"PAR1" + b"\0" * 8 + (10**6).to_bytes(4, "little") + b"PAR1"],
    ids=["empty", "magic-only", "no-magic", "footer-longer-than-file"],
)
def test_tails_that_are_not_plain_footers_look_cut_short(tmp_path, tail):
    """The footer error asks "Is it a complete parquet file?" for these, and only these."""
    path = tmp_path / "odd.parquet"
    path.write_bytes(tail)
    with open(path, "rb") as file, pytest.raises(ValueError) as error:
        _parquet_tail.footer_tail(file, len(tail))
    assert not isinstance(error.value, UnsupportedFileError)
    with pytest.raises(ValueError, match="Is it a complete parquet file"):
        StructuredDataset(str(path), num_workers=0)


def test_planning_local_files_allocates_nothing_from_pyarrows_pool(tmp_path):
    """The pool's first allocation in a process may stall on a huge-page fault (_parquet_tail.parsed_footer)."""
    write_dataset(tmp_path, [[30, 25], [40], [20, 35]])
    script = (
        "import pyarrow as pa; from torch_dataloader_utils import StructuredDataset\n"
        "pool = pa.default_memory_pool(); before = pool.max_memory()\n"
        f"dataset = StructuredDataset({str(tmp_path)!r}, num_workers=0, batch_size=8)\n"
        "assert len(dataset) == 150, len(dataset)\n"
        "print(pool.max_memory() - before)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


def test_a_slow_local_footer_sends_the_rest_to_threads(tmp_path, monkeypatch):
    layout = [[10], [20, 5], [7], [9, 9], [3]]
    write_dataset(tmp_path, layout)
    expected = StructuredDataset(str(tmp_path), num_workers=0)._catalog.layouts
    threads = []
    read = footers._read_footer

    def recorded(fmt, fs, entry):
        threads.append(threading.current_thread() is threading.main_thread())
        return read(fmt, fs, entry)

    monkeypatch.setattr(footers, "_read_footer", recorded)
    monkeypatch.setattr(footers, "SLOW_LOCAL_FOOTER_S", 0.0)  # every read counts as slow
    monkeypatch.setattr(footers, "_SLOW_READS", 2)  # two in a row send the rest to the pool
    layouts = StructuredDataset(str(tmp_path), num_workers=0)._catalog.layouts
    assert threads == [True, True] + [False] * (len(layout) - 2)
    assert [layout_.unit_rows for layout_ in layouts] == [tuple(groups) for groups in layout]
    assert layouts == expected

    threads.clear()
    monkeypatch.setattr(footers, "SLOW_LOCAL_FOOTER_S", 60.0)
    StructuredDataset(str(tmp_path), num_workers=0)
    assert threads == [True] * len(layout)


def test_null_counts_of_every_column_equal_those_asked_by_name(tmp_path):
    """Planning keeps ``nulls_by_column`` of each local file; ``null_counts`` answers by name."""
    table = pa.table({"a": [1, None, 3, None, 5], "s": pa.array([{"x": 1, "y": None}, None, {"x": None, "y": 2.0}, {"x": 4, "y": 1.0}, None])})
    for name, options in {"stats": {}, "no-stats-for-a": {"write_statistics": ["s.x", "s.y"]}}.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(table, path, row_group_size=2, **options)
        footer = pq.ParquetFile(path).metadata
        leaves = [footer.schema.column(i).path for i in range(footer.num_columns)]
        assert parquet.PARQUET.nulls_by_column(footer) == parquet.PARQUET.null_counts(footer, leaves), name
    assert "a" not in parquet.PARQUET.nulls_by_column(footer)  # a row group without its count: not known

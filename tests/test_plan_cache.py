"""The plan cache (catalog/plan_cache.py) and what the catalog keeps per file after planning."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.formats import parquet


def write(path, rows: int, first: int = 0) -> None:
    ids = np.arange(first, first + rows, dtype=np.int64)
    pq.write_table(pa.table({"id": ids}), path)


@pytest.fixture
def data(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    for i in range(20):
        write(root / f"part-{i:02d}.parquet", 10, first=10 * i)
    return root


@pytest.fixture
def footer_reads(monkeypatch):
    reads: list[str] = []
    original = parquet.ParquetFormat.read_footer

    def counted(self, fs, path, size, url):
        reads.append(url)
        return original(self, fs, path, size, url)

    monkeypatch.setattr(parquet.ParquetFormat, "read_footer", counted)
    return reads


def ids(dataset) -> list[int]:
    return sorted(int(i) for batch in dataset for i in batch["id"])


def test_unchanged_files_are_planned_from_the_cache(data, tmp_path, footer_reads):
    cache = str(tmp_path / "cache")
    first = StructuredDataset(str(data), num_workers=0, batch_size=7, cache_dir=cache)
    assert len(footer_reads) == 20 and os.listdir(os.path.join(cache, "plans"))
    footer_reads.clear()
    again = StructuredDataset(str(data), num_workers=0, batch_size=7, cache_dir=cache)
    assert footer_reads == []
    assert again.splits == first.splits and again._catalog.schema == first._catalog.schema
    assert ids(again) == list(range(200))


def test_a_file_changed_between_runs_is_read_again(data, tmp_path, footer_reads):
    cache = str(tmp_path / "cache")
    StructuredDataset(str(data), num_workers=0, cache_dir=cache)
    footer_reads.clear()
    target = data / "part-03.parquet"
    write(target, 25, first=1000)  # another size and modification time
    added = data / "part-99.parquet"
    write(added, 5, first=2000)
    dataset = StructuredDataset(str(data), num_workers=0, batch_size=7, cache_dir=cache)
    assert sorted(footer_reads) == [str(target), str(added)]
    assert len(dataset) == 200 - 10 + 25 + 5
    assert ids(dataset) == sorted([*range(30), *range(40, 200), *range(1000, 1025), *range(2000, 2005)])
    footer_reads.clear()
    StructuredDataset(str(data), num_workers=0, cache_dir=cache)  # the rewritten cache holds them now
    assert footer_reads == []


def test_a_rewrite_with_the_same_size_is_caught_by_its_modification_time(data, tmp_path, footer_reads):
    cache = str(tmp_path / "cache")
    StructuredDataset(str(data), num_workers=0, cache_dir=cache)
    footer_reads.clear()
    target = data / "part-05.parquet"
    before = os.stat(target)
    write(target, 10, first=500)  # same layout, other values
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    assert os.stat(target).st_size == before.st_size
    dataset = StructuredDataset(str(data), num_workers=0, batch_size=7, cache_dir=cache)
    assert footer_reads == [str(target)]
    assert 505 in ids(dataset)


def test_a_damaged_cache_is_ignored(data, tmp_path, footer_reads):
    cache = tmp_path / "cache"
    StructuredDataset(str(data), num_workers=0, cache_dir=str(cache))
    (entry,) = (cache / "plans").iterdir()
    entry.write_text('{"schemas": [1, 2')
    footer_reads.clear()
    dataset = StructuredDataset(str(data), num_workers=0, batch_size=7, cache_dir=str(cache))
    assert len(footer_reads) == 20 and ids(dataset) == list(range(200))


def test_the_catalog_keeps_no_footers_of_local_files(data):
    dataset = StructuredDataset(str(data), num_workers=0)
    catalog = dataset._catalog
    assert all(footer is None for footer in catalog.footers)
    assert not any(isinstance(value, pq.FileMetaData) for value in vars(catalog).values())
    per_file = len(pickle.dumps(catalog)) / len(catalog.files)
    assert per_file < 600, per_file  # what each DataLoader worker receives per file
    assert ids(dataset) == list(range(200))  # the footers are read again when the files are opened

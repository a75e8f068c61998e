"""StreamReader: unshuffled Parquet pieces decoded batch by batch give the same rows as whole
row groups, in any order of reads."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datagen import write_dataset

from torch_dataloader_utils import DataReadError, StructuredDataset
from torch_dataloader_utils.read.reader import StreamReader


def _reads(dataset: StructuredDataset, stream_rows: int, order: list[int]) -> dict[int, pa.Table]:
    tasks = dataset.delivery.begin_pass(keep_slots=False)
    reader = StreamReader(dataset._catalog, dataset.columns, False, stream_rows=stream_rows)
    return {i: reader.read_segments(dataset.delivery.reader.book, tasks[i].segments).table for i in order}


@pytest.mark.parametrize("paged", [False, True])
def test_streamed_pieces_equal_whole_row_groups_in_any_read_order(tmp_path, seek_tiny_files, paged):
    """With ``paged`` (a page index), a read that starts inside a piece seeks to its page."""
    write_dataset(tmp_path, [[130, 70, 200], [45], [300, 1, 99]], paged=paged)
    _, dataset = StructuredDataset.create_dataloader(str(tmp_path), batch_size=10, chunk_rows=40, num_workers=0)
    count = len(dataset.delivery.begin_pass(keep_slots=False))
    whole = _reads(dataset, 0, list(range(count)))
    forward = _reads(dataset, 40, list(range(count)))
    shuffled = list(range(count)) * 2
    random.Random(0).shuffle(shuffled)  # backwards reads restart a piece's decoding
    jumping = _reads(dataset, 25, shuffled)
    for i in range(count):
        assert forward[i].equals(whole[i]) and jumping[i].equals(whole[i]), i


def test_a_window_of_several_pieces_is_one_chunk_and_reads_take_from_it():
    """A mixture's or shuffled window is combined once, and reads take from it with the same rows
    as from the pieces; a table already in one chunk is kept as it is."""
    from torch_dataloader_utils.read.windows import gather, one_chunk

    parts = [pa.table({"id": list(range(start, start + 5)), "s": [str(i) for i in range(5)]}) for start in (0, 5, 10)]
    table = pa.concat_tables(parts)
    held = [table]
    combined = one_chunk(held)
    assert held == [] and all(column.num_chunks == 1 for column in combined.columns) and combined.equals(table)
    rows = pa.array([14, 0, 7, 3, 11]).to_numpy()
    assert gather(combined, rows).equals(table.take(rows)) and gather(table, rows).equals(table.take(rows))
    assert one_chunk([combined]) is combined


def test_combining_a_window_frees_each_columns_pieces_before_the_next(monkeypatch):
    """The copy of a window into one chunk needs about one column beyond the window, not a second
    window: each column's pieces are freed (and handed back) once that column is combined."""
    import numpy as np
    import pyarrow.compute as pc

    from torch_dataloader_utils.read import windows

    column_bytes = 8 << 20
    piece_rows = column_bytes // 8 // 4
    pieces = [pa.table({name: pc.add(pa.array(np.full(piece_rows, i)), 0) for name in "abc"}) for i in range(4)]  # in Arrow's pool
    held, allocated = [pa.concat_tables(pieces)], []
    del pieces
    window_bytes = 3 * column_bytes
    before = pa.total_allocated_bytes() - window_bytes

    class Pool:
        def release_unused(self):
            allocated.append(pa.total_allocated_bytes() - before)

    monkeypatch.setattr(windows.pa, "default_memory_pool", Pool)
    combined = windows.one_chunk(held)
    assert combined.num_rows == 4 * column_bytes // 32 and len(allocated) == 3
    assert max(allocated) <= window_bytes + (1 << 20), [a / window_bytes for a in allocated]


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_tiny_source_upsampled_is_decoded_once(tmp_path, monkeypatch, shuffle):
    """Each copy of an upsampled row is a window of its own; its unit stays decoded between them."""
    import pyarrow.parquet as pq

    from torch_dataloader_utils import Source
    from torch_dataloader_utils.read import reader

    (tmp_path / "one").mkdir()
    (tmp_path / "many").mkdir()
    pq.write_table(pa.table({"id": pa.array([-1], pa.int64())}), tmp_path / "one" / "a.parquet")
    pq.write_table(pa.table({"id": pa.array(range(500), pa.int64())}), tmp_path / "many" / "a.parquet", row_group_size=100)
    reads: list = []
    original = reader.read_conformed
    monkeypatch.setattr(reader, "read_conformed", lambda *args: reads.append(args[3].files[args[4]].url) or original(*args))
    sources = [Source(str(tmp_path / "many")), Source(str(tmp_path / "one"), rows_per_epoch=400)]
    loader, _ = StructuredDataset.create_dataloader(sources, batch_size=50, num_workers=0, shuffle=shuffle)
    ids = [i for batch in loader for i in batch["id"].tolist()]
    assert sorted(ids) == [-1] * 400 + list(range(500))
    assert sum("/one/" in url for url in reads) == 1


@pytest.mark.parametrize("atomic", [False, True], ids=["in-place", "os.replace"])
@pytest.mark.parametrize("workers", [(0, False), (2, True)], ids=["main-process", "persistent-workers"])
def test_file_rewritten_between_epochs_is_refused_by_a_reader_that_kept_it_open(tmp_path, atomic, workers):
    """A reader that lives on across epochs (the main process's, a persistent worker's) checks a
    file it keeps open against the planned version again: a same-size rewrite is refused, not read."""
    path = tmp_path / "a.parquet"

    def write(first: int) -> None:
        target = tmp_path / "a.tmp" if atomic else path
        pq.write_table(pa.table({"id": pa.array(range(first, first + 100), pa.int64())}), target, row_group_size=25)
        if atomic:
            os.replace(target, path)

    write(0)
    num_workers, persistent = workers
    loader, dataset = StructuredDataset.create_dataloader(
        str(tmp_path), batch_size=10, num_workers=num_workers, split_bytes=1, persistent_workers=persistent
    )
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(100))
    before = os.stat(path).st_mtime_ns
    write(1000)
    if os.stat(path).st_mtime_ns == before:  # a filesystem with a coarse clock: make the rewrite visible
        os.utime(path, ns=(before + 10**9, before + 10**9))
    dataset.set_epoch(1)
    with pytest.raises(DataReadError, match=r"a\.parquet.*changed after planning"):
        for batch in loader:
            assert all(i < 100 for i in batch["id"].tolist())


@pytest.mark.parametrize("workers", [(0, False), (1, True)], ids=["main-process", "persistent-worker"])
def test_a_unit_kept_decoded_from_an_earlier_epoch_is_checked_against_its_file(tmp_path, workers):
    """Shuffled windows keep a unit that several splits read decoded into the next epoch; a file
    replaced since is refused there too, not delivered from the kept copy."""
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": pa.array(range(1000), pa.int64())}), path, row_group_size=1000)
    num_workers, persistent = workers
    loader, dataset = StructuredDataset.create_dataloader(
        str(tmp_path), batch_size=50, num_workers=num_workers, shuffle=True, split_rows=100, persistent_workers=persistent
    )
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(1000))
    stat = path.stat()
    pq.write_table(pa.table({"id": pa.array(range(5000, 6000), pa.int64())}), tmp_path / "b.tmp", row_group_size=1000)
    os.replace(tmp_path / "b.tmp", path)
    os.utime(path, ns=(stat.st_mtime_ns + 10**9, stat.st_mtime_ns + 10**9))
    dataset.set_epoch(1)
    with pytest.raises(DataReadError, match=r"a\.parquet.*changed after planning"):
        for batch in loader:
            assert all(i < 1000 for i in batch["id"].tolist())

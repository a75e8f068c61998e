"""StreamReader: unshuffled Parquet pieces decoded batch by batch give the same rows as whole
row groups, in any order of reads."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset
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
    """A mixture's or shuffled window is combined once; a table that cannot be stays as it is and
    is gathered chunk by chunk, with the same rows."""
    from torch_dataloader_utils.read.reader import _gather, _one_chunk

    parts = [pa.table({"id": list(range(start, start + 5)), "s": [str(i) for i in range(5)]}) for start in (0, 5, 10)]
    table = pa.concat_tables(parts)
    combined = _one_chunk(table)
    assert all(column.num_chunks == 1 for column in combined.columns) and combined.equals(table)
    rows = pa.array([14, 0, 7, 3, 11]).to_numpy()
    assert _gather(combined, rows).equals(table.take(rows)) and _gather(table, rows).equals(table.take(rows))
    assert _one_chunk(combined) is combined

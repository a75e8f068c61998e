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

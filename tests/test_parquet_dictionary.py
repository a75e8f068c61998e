"""_parquet_dictionary: a zstd dictionary page rewritten with its values stored decompresses to
the same values, and pages it should leave alone are left alone."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils.formats._parquet_dictionary import raw_zstd_frame, stored_dictionary_page
from torch_dataloader_utils.formats._thrift_compact import decode_struct


@pytest.mark.parametrize("size", [0, 1, 128 * 1024, 128 * 1024 + 1, 300_000])
def test_a_raw_frame_decompresses_to_its_data(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    frame = raw_zstd_frame(memoryview(data))
    assert pa.Codec("zstd").decompress(frame, decompressed_size=size).to_pybytes() == data


def _dictionary_page(tmp_path, values: int) -> bytes:
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": np.arange(values, dtype=np.int64)}), path, compression="zstd")
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    start = chunk.dictionary_page_offset
    return path.read_bytes()[start : chunk.data_page_offset]


def test_a_large_dictionary_page_keeps_its_values(tmp_path):
    page = _dictionary_page(tmp_path, 20_000)  # 160,000 bytes of values
    stored = stored_dictionary_page(page)
    assert stored is not None
    header, length = decode_struct(stored)
    original, original_length = decode_struct(page)
    assert header.integer(3) == len(stored) - length and header.integer(2) == original.integer(2)
    values = pa.Codec("zstd").decompress(stored[length:], decompressed_size=header.integer(2))
    assert values.to_pybytes() == pa.Codec("zstd").decompress(page[original_length:], decompressed_size=original.integer(2)).to_pybytes()


def test_small_dictionaries_and_other_pages_are_left_alone(tmp_path):
    assert stored_dictionary_page(_dictionary_page(tmp_path, 100)) is None  # 800 bytes of values
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"x": np.arange(20_000, dtype=np.int64)}), path, compression="zstd", use_dictionary=False)
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    assert stored_dictionary_page(path.read_bytes()[chunk.data_page_offset : chunk.data_page_offset + chunk.total_compressed_size]) is None

"""thrift_compact: Parquet's footers and page headers decode and encode back byte for byte;
damaged bytes raise ThriftError."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datagen import PAGED, make_table

from torch_dataloader_utils.formats._thrift_compact import (
    BINARY,
    DOUBLE,
    I32,
    I64,
    LIST,
    STRUCT,
    TRUE,
    Struct,
    ThriftError,
    ThriftList,
    decode_struct,
    encode_struct,
)


def _footer_bytes(path) -> bytes:
    sink = pa.BufferOutputStream()
    pq.ParquetFile(path).metadata.write_metadata_file(sink)
    data = sink.getvalue().to_pybytes()
    return data[4:-8]


@pytest.fixture
def footer(tmp_path) -> bytes:
    path = tmp_path / "f.parquet"
    with pq.ParquetWriter(path, make_table(0, 1).schema, **PAGED) as writer:
        writer.write_table(make_table(0, 40), row_group_size=17)
    return _footer_bytes(path)


def test_a_parquet_footer_decodes_and_encodes_back_to_the_same_bytes(footer):
    decoded, end = decode_struct(footer)
    assert end == len(footer)
    assert encode_struct(decoded) == footer
    assert decoded.get(3) == 40  # num_rows
    groups = decoded.get(4)
    assert [group.get(3) for group in groups.values] == [17, 17, 6]


def test_page_headers_decode_and_encode_back(tmp_path):
    path = tmp_path / "f.parquet"
    pq.write_table(make_table(0, 30), path, write_page_index=True, data_page_size=1, write_batch_size=5)
    chunk = decode_struct(_footer_bytes(path))[0].get(4).values[0].get(1).values[0].get(3)  # id's ColumnMetaData
    data = path.read_bytes()
    offset, seen = chunk.get(11) or chunk.get(9), 0
    while seen < chunk.get(5):
        header, end = decode_struct(data, offset)
        assert encode_struct(header) == data[offset:end]
        if header.get(1) == 0:  # a data page
            seen += header.get(5).get(1)
        offset = end + header.get(3)
    assert seen == chunk.get(5)


def test_every_value_kind_round_trips():
    value = Struct(
        [
            [1, TRUE, True],
            [2, TRUE, False],
            [3, I32, -5],
            [4, I64, 2**62],
            [5, DOUBLE, 0.25],
            [6, BINARY, b"\x00abc"],
            [40, LIST, ThriftList(I32, list(range(-20, 20)))],  # a long field-id gap, a long list
            [41, LIST, ThriftList(TRUE, [True, False, True])],
            [42, STRUCT, Struct([[1, I32, 7]])],
        ]
    )
    decoded, _ = decode_struct(encode_struct(value))
    assert [(f[0], f[2] if not isinstance(f[2], (Struct, ThriftList)) else None) for f in decoded.fields][:6] == [
        (1, True),
        (2, False),
        (3, -5),
        (4, 2**62),
        (5, 0.25),
        (6, b"\x00abc"),
    ]
    assert decoded.get(40).values == list(range(-20, 20))
    assert decoded.get(41).values == [True, False, True]
    assert decoded.get(42).get(1) == 7
    assert encode_struct(decoded) == encode_struct(value)


def test_set_and_drop_keep_field_order():
    value = Struct([[1, I32, 1], [5, I32, 5]])
    value.set(3, I32, 3)
    value.set(5, I32, 50)
    value.drop(1)
    assert [(f[0], f[2]) for f in value.fields] == [(3, 3), (5, 50)]
    assert decode_struct(encode_struct(value))[0].get(5) == 50


def test_every_truncation_of_a_footer_raises_thrift_error(footer):
    for size in range(len(footer)):
        with pytest.raises(ThriftError):
            decode_struct(footer[:size])


def test_nesting_beyond_the_limit_raises_thrift_error():
    deep = b"\x1c" * 100 + b"\x00" * 101  # field 1 of type struct, 100 levels down
    with pytest.raises(ThriftError, match="nested too deeply"):
        decode_struct(deep)


@pytest.mark.parametrize("index", [0, 1, 2, 5])
def test_only_one_element_of_a_list_is_decoded_and_the_rest_skipped(footer, index):
    whole, end = decode_struct(footer)
    sparse, sparse_end = decode_struct(footer, only=(4, index))  # the row groups
    assert sparse_end == end
    groups = sparse.get(4).values
    assert len(groups) == 3
    assert [i for i, group in enumerate(groups) if group is not None] == ([index] if index < 3 else [])
    if index < 3:
        assert encode_struct(groups[index]) == encode_struct(whole.get(4).values[index])
    assert [f[0] for f in sparse.fields] == [f[0] for f in whole.fields]
    assert encode_struct(Struct([f for f in sparse.fields if f[0] != 4])) == encode_struct(Struct([f for f in whole.fields if f[0] != 4]))


def test_skipping_passes_every_value_kind():
    value = Struct(
        [
            [1, LIST, ThriftList(STRUCT, [Struct([[1, TRUE, True], [2, I64, -(2**40)], [3, DOUBLE, 1.5], [30, BINARY, b"xy" * 40]]), Struct([])])],
            [2, LIST, ThriftList(TRUE, [True, False])],
            [3, LIST, ThriftList(BINARY, [b"a", b"bc"])],
            [4, LIST, ThriftList(I32, list(range(20)))],
            [5, I32, 9],
        ]
    )
    for field in (1, 2, 3, 4):
        decoded, end = decode_struct(encode_struct(value), only=(field, 1))
        assert end == len(encode_struct(value))
        assert decoded.get(5) == 9
        assert decoded.get(field).values[0] is None
        assert decoded.get(field).values[1] == value.get(field).values[1] or field == 1


def test_every_truncation_of_a_footer_raises_thrift_error_when_skipping(footer):
    for size in range(len(footer)):
        with pytest.raises(ThriftError):
            decode_struct(footer[:size], only=(4, 2))


def test_skipping_rejects_what_decoding_rejects():
    too_long = bytes([0x16]) + b"\xff" * 12 + b"\x01" + b"\x00"  # field 1, i64: a varint of 13 bytes
    listed = bytes([0x19, 0x16]) + too_long[1:] + b"\x00"  # field 1: a list of one such i64
    for data in (too_long, listed):
        with pytest.raises(ThriftError, match="longer than 10 bytes"):
            decode_struct(data)
    with pytest.raises(ThriftError, match="longer than 10 bytes"):
        decode_struct(listed, only=(1, 5))

"""Private: a Parquet file's footer as decoded Thrift (``_thrift_compact.Struct``), and the field
ids of parquet.thrift that the page-level seek (``_parquet_seek``) reads and rewrites.

It exists because pyarrow gives the footer only as a read-only ``FileMetaData``: the seek needs
each column chunk's offset-index location as stored and must write a new footer for a file of
cut column chunks, neither of which pyarrow offers. It goes when pyarrow reads a row group from
a given row through the page index itself (apache/arrow#45284), and ``_parquet_seek`` with it.
"""

from __future__ import annotations

import functools
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ._thrift_compact import Struct, ThriftError, ThriftList, decode_struct
from ._varint import write_varint

MAGIC = b"PAR1"
# Parquet INT96 timestamps (Spark's, Hive's and Impala's legacy default) are decoded in
# microseconds, then conformed to the nanoseconds the schema gives them (pyarrow's unit for
# INT96) with a checked cast: decoding them straight to nanoseconds wraps a value outside
# 1677-2262 (Spark's 9999-12-31 "open end") around silently, where the checked cast raises.
INT96_DECODE_UNIT = "us"
ENCRYPTED_MAGIC = b"PARE"  # the end of a file whose footer is encrypted

# parquet.thrift's field ids. FileMetaData:
FILE_VERSION, FILE_SCHEMA, FILE_NUM_ROWS, FILE_ROW_GROUPS, FILE_KEY_VALUES, FILE_CREATED_BY, FILE_COLUMN_ORDERS = 1, 2, 3, 4, 5, 6, 7
FILE_ENCRYPTION_ALGORITHM = 8  # set for encrypted files with a plaintext footer
# SchemaElement, RowGroup, ColumnChunk:
SCHEMA_TYPE, SCHEMA_NUM_CHILDREN = 1, 5
GROUP_COLUMNS, GROUP_BYTES, GROUP_NUM_ROWS, GROUP_OFFSET, GROUP_COMPRESSED = 1, 2, 3, 5, 6
CHUNK_FILE_OFFSET, CHUNK_META, CHUNK_CRYPTO, CHUNK_ENCRYPTED_META = 2, 3, 8, 9
CHUNK_INDEXES = (4, 5, 6, 7)  # offset index offset and length, column index offset and length
# ColumnMetaData:
META_CODEC, META_NUM_VALUES, META_UNCOMPRESSED, META_COMPRESSED, META_DATA_OFFSET, META_INDEX_OFFSET = 4, 5, 6, 7, 9, 10
META_DICT_OFFSET, META_STATISTICS, META_SIZE_STATISTICS = 11, 12, 16
META_BLOOM = (14, 15)
# PageHeader and its data page headers:
PAGE_TYPE, PAGE_COMPRESSED_SIZE, PAGE_DATA_V1, PAGE_DATA_V2 = 1, 3, 5, 8
DATA_PAGE, DATA_PAGE_V2 = 0, 3
DICTIONARY_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY
ARROW_SCHEMA_KEY = b"ARROW:schema"  # the key of the Arrow schema pyarrow stores in a file's metadata


def read_exact(source: Any, offset: int, size: int) -> bytes:
    """``size`` bytes of ``source`` (a pyarrow-style file with ``read_at``) from ``offset``;
    ThriftError when the file ends first."""
    data = source.read_at(size, offset)
    if len(data) != size:
        raise ThriftError(f"{size} bytes at offset {offset} run past the end of the file")
    return bytes(data)


def footer_struct(footer: pq.FileMetaData, unit: int | None, data: bytes | None = None) -> Struct:
    """The footer as decoded Thrift, with row group ``unit`` alone decoded (the others are None:
    see ``row_group``; ``unit`` None: all of them). ``data``: the footer's bytes as the file holds
    them, when the caller has them (else pyarrow serialises ``footer``, which is slower than
    reading them)."""
    if data is None:
        sink = pa.BufferOutputStream()
        footer.write_metadata_file(sink)
        written = sink.getvalue().to_pybytes()
        data = written[len(MAGIC) : len(written) - 4 - len(MAGIC)]
    return decode_struct(data, only=None if unit is None else (FILE_ROW_GROUPS, unit))[0]


def footer_bytes(source: Any, footer: pq.FileMetaData) -> bytes | None:
    """The bytes of ``footer`` read from the end of ``source`` (a local file), or None when the
    file does not end in a plain footer of that size."""
    size = source.size()
    if size < footer.serialized_size + 4 + 2 * len(MAGIC):
        return None
    tail = source.read_at(4 + len(MAGIC), size - 4 - len(MAGIC))
    if tail[4:] != MAGIC or int.from_bytes(tail[:4], "little") != footer.serialized_size:
        return None
    return read_exact(source, size - len(tail) - footer.serialized_size, footer.serialized_size)


def row_group(thrift: Struct, unit: int) -> Struct:
    """Row group ``unit`` of a footer from ``footer_struct(footer, unit)``."""
    groups = thrift.get(FILE_ROW_GROUPS)
    group = groups.values[unit] if isinstance(groups, ThriftList) and 0 <= unit < len(groups.values) else None
    if not isinstance(group, Struct):
        raise ThriftError(f"the footer has no row group {unit}")
    return group


def has_encryption_algorithm(data: bytes, created_by: str | None) -> bool:
    """Whether FileMetaData ``data`` (a footer in plaintext) sets ``encryption_algorithm``: the
    file's columns are encrypted, and pyarrow aborts the process when asked for their metadata.

    The field follows ``created_by`` (6) and ``column_orders`` (7), so the footer is decoded from
    the end of ``created_by`` on, not over its row groups (decoding those in Python would cost
    more than pyarrow's whole read of the footer). Field ids there are relative to 6 in Thrift's
    short form, absolute in its long form."""
    if created_by is not None:
        text = created_by.encode()
        at = data.rfind(_varint(len(text)) + text)
        if at >= 1 and data[at - 1] & 0x0F == 8:  # (the field header of a binary)
            found = _sets_encryption_after(data[at + len(_varint(len(text))) + len(text) :])
            if found is not None:
                return found
            # else not where created_by ends after all: decode the whole footer
    return decode_struct(data, only=(FILE_ROW_GROUPS, 0))[0].get(FILE_ENCRYPTION_ALGORITHM) is not None


@functools.lru_cache(maxsize=64)
def _sets_encryption_after(rest: bytes) -> bool | None:
    """Whether the fields ``rest`` holds (a footer's from ``created_by`` on) set
    ``encryption_algorithm``; None when they are not valid Thrift. Cached: files written alike end
    in the same bytes, and decoding them costs more than the rest of a small file's footer."""
    try:
        fields = decode_struct(rest)[0].fields
    except ThriftError:
        return None
    return any(fid == FILE_ENCRYPTION_ALGORITHM - FILE_CREATED_BY or fid == FILE_ENCRYPTION_ALGORITHM for fid, _, _ in fields)


def _varint(n: int) -> bytes:
    out = bytearray()
    write_varint(out, n)
    return bytes(out)

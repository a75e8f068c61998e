"""Private: a zstd-compressed Parquet dictionary page rewritten with its values stored (a zstd
frame of raw blocks), which pyarrow decompresses for the cost of a copy.

A read of a few rows from a column chunk's pages (``_parquet_range``) hands pyarrow the chunk's
dictionary page each time, and pyarrow decompresses it each time: for a dictionary of 65,536
int64 values (512 KiB) about 0.65 ms, more than it takes to decode the rows read. Decompressed
once and kept as stored zstd blocks (part of the zstd format, RFC 8878), the page stays in the
column chunk's codec, so pyarrow decodes the chunk as before.
"""

from __future__ import annotations

import pyarrow as pa

from ._parquet_footer import PAGE_COMPRESSED_SIZE, PAGE_TYPE
from ._thrift_compact import I32, ThriftError, decode_struct, encode_struct

ZSTD = 6  # parquet.thrift's CompressionCodec
DICTIONARY_PAGE = 2  # PageType
_PAGE_UNCOMPRESSED_SIZE, _PAGE_CRC = 2, 4
#: dictionaries of fewer value bytes decompress in a few microseconds: kept as they are
MIN_VALUE_BYTES = 64 * 1024
_ZSTD_MAGIC = (0xFD2FB528).to_bytes(4, "little")
_ZSTD_BLOCK = 128 * 1024  # the largest block a zstd frame may hold
_RAW_LAST = 1  # block header bit: the frame's last block (block type 0: raw)


def stored_dictionary_page(page: bytes) -> bytes | None:
    """``page`` (a whole zstd-compressed dictionary page: header and values) with its values
    stored, or None for a page that is not a dictionary page or holds under ``MIN_VALUE_BYTES``.
    ThriftError for a header that does not give the page's size; pyarrow's error for values that
    do not decompress to the size the header gives."""
    header, length = decode_struct(page)
    if header.integer(PAGE_TYPE) != DICTIONARY_PAGE:
        return None
    size = header.integer(_PAGE_UNCOMPRESSED_SIZE)
    if size < MIN_VALUE_BYTES:
        return None
    if length + header.integer(PAGE_COMPRESSED_SIZE) != len(page):
        raise ThriftError("a dictionary page is not the size its header gives")
    values = pa.Codec("zstd").decompress(memoryview(page)[length:], decompressed_size=size)
    frame = raw_zstd_frame(memoryview(values))
    header.set(PAGE_COMPRESSED_SIZE, I32, len(frame))
    header.drop(_PAGE_CRC)  # (the checksum of the compressed bytes, which change)
    return encode_struct(header) + frame


def raw_zstd_frame(data: memoryview) -> bytes:
    """A zstd frame holding ``data`` in raw (stored) blocks: its header with the content size in
    four bytes (one segment, no checksum), then blocks of at most 128 KiB."""
    if len(data) >= 1 << 32:
        raise ValueError("a dictionary page of 4 GiB or more")
    out = bytearray(_ZSTD_MAGIC)
    out.append(0b10_1_00000)  # frame header: content size in 4 bytes, single segment
    out += len(data).to_bytes(4, "little")
    starts = range(0, len(data), _ZSTD_BLOCK) if len(data) else range(1)
    for start in starts:
        block = data[start : start + _ZSTD_BLOCK]
        last = start + _ZSTD_BLOCK >= len(data)
        out += ((len(block) << 3) | (_RAW_LAST if last else 0)).to_bytes(3, "little")
        out += block
    return bytes(out)

"""Private: unsigned LEB128 varints, as protobuf (ORC's tail) and Thrift's compact protocol
(Parquet's footer) write them.

It exists for the two private parsers that read those encodings, ``_orc_tail`` and
``_thrift_compact``, because pyarrow parses neither for Python; it goes when both have gone.
"""

from __future__ import annotations

MAX_BYTES = 10  # a 64-bit value


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it. IndexError when ``data`` ends first,
    ValueError when it runs past 64 bits (damaged bytes)."""
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 7 * MAX_BYTES:
            raise ValueError("varint longer than 10 bytes")

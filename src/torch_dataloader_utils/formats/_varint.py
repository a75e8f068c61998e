"""Private: unsigned LEB128 varints, as protobuf (ORC's tail) and Thrift's compact protocol
(Parquet's footer) write them.

It exists for the private parsers of those encodings, ``_orc_tail``, ``_thrift_compact`` and
``_parquet_footer``, because pyarrow parses neither for Python; it goes when they have gone.
"""

from __future__ import annotations

MAX_BYTES = 10  # a 64-bit value


def write_varint(out: bytearray, value: int) -> None:
    """Append ``value`` (>= 0) to ``out`` as a varint."""
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


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

"""Private: the exact stripe layout (offset, bytes, rows) of an ORC file, read from its tail,
and the byte ranges of a projection's streams in a stripe.

It exists because ``pyarrow.orc.ORCFile`` gives only the number of stripes and the file's
total rows: not each stripe's offset, length and rows, which planning needs to split a file
by stripes with exact row counts (Arrow C++ has them, ``ORCFileReader::GetStripeInformation``
from apache/arrow#14806, but pyarrow does not expose it), and nothing about a stripe's streams,
which a remote read needs to fetch the projected columns' bytes in one concurrent round before
pyarrow reads them (pyarrow's reader asks the file object for bytes as it decodes).
``read_tail`` can go once pyarrow exposes the stripe information; ``stream_ranges`` has no
pyarrow counterpart, nor has ``read_stripe_statistics`` (each stripe's column statistics, which
filters= prunes stripes by; Arrow C++'s ORC adapter does not expose them either).

It parses the two small protobuf messages at the end of the file: the PostScript
(uncompressed) and the Footer (compressed with the file's codec, in ORC's 3-byte-header
chunks). A stripe's own footer (same encoding) lists its streams, which locates a column's
bytes for a remote read of a projection.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

import pyarrow as pa

from ._varint import read_varint

_CODECS = {2: "snappy", 4: "lz4_raw"}  # block codecs; zlib (1) and zstd (5) are decoded as streams
_TAIL_GUESS = 64 * 1024


@dataclass(frozen=True)
class Stripe:
    offset: int
    length: int  # index, data and stripe footer
    rows: int
    footer_length: int = 0

    @property
    def footer_start(self) -> int:
        return self.offset + self.length - self.footer_length


@dataclass(frozen=True)
class OrcTail:
    """What the file's tail says: stripes, the column-id range of each top-level column (ORC
    numbers the type tree in pre-order, so a column's subtree is a contiguous range), and the
    codec that stripe footers are compressed with."""

    stripes: list[Stripe]
    column_ids: dict[str, tuple[int, int]]  # top-level name -> [first, last] column ids
    compression: int
    null_counts: dict[str, int] = field(default_factory=dict)  # top-level name -> nulls, where the statistics say
    # dates counted in the hybrid Julian/Gregorian calendar: ORC's Java writer (Spark, Hive) unless it says proleptic
    hybrid_calendar: bool = False


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """A protobuf message's fields as (field number, value): an int for a varint, else bytes
    (a nested message, a packed run, a string, or a fixed-size value as it is stored)."""
    pos = 0
    value: int | bytes
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(data, pos)
        elif wire == 2:
            length, pos = read_varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
        elif wire == 1:
            value, pos = data[pos : pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, value


def _lz4_block_size(block: bytes) -> int:
    """Decoded length of a raw LZ4 block, from its sequences' lengths (pyarrow's ``lz4_raw``
    codec needs the exact length: given more, it returns that many bytes, the rest undefined)."""
    size = pos = 0
    try:
        while True:
            token = block[pos]
            pos += 1
            literals, pos = _lz4_length(block, pos, token >> 4)
            size += literals
            pos += literals
            if pos >= len(block):  # the last sequence has literals only
                return size
            match, pos = _lz4_length(block, pos + 2, token & 15)  # after the 2-byte match offset
            size += match + 4
    except IndexError:
        raise ValueError("a compressed LZ4 block ends inside a sequence") from None


def _lz4_length(block: bytes, pos: int, length: int) -> tuple[int, int]:
    """A sequence's length whose 4-bit field is ``length``: 15 continues in bytes until one is not 255."""
    if length == 15:
        while True:
            extra = block[pos]
            pos += 1
            length += extra
            if extra != 255:
                break
    return length, pos


def _decompress(data: bytes, kind: int) -> bytes:
    if kind == 0:
        return data
    out, pos = [], 0
    while pos < len(data):
        header = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
        pos += 3
        length = header >> 1
        chunk = data[pos : pos + length]
        pos += length
        if header & 1:
            out.append(chunk)
        elif kind == 1:
            out.append(zlib.decompress(chunk, -15))
        elif kind == 5:  # a zstd frame need not state its decoded size: the stream finds its end
            out.append(pa.CompressedInputStream(pa.py_buffer(chunk), "zstd").read())
        elif kind in _CODECS:
            size = read_varint(chunk, 0)[0] if kind == 2 else _lz4_block_size(chunk)
            out.append(pa.Codec(_CODECS[kind]).decompress(chunk, decompressed_size=size).to_pybytes())
        else:
            raise ValueError(f"unsupported ORC compression kind {kind}")
    return b"".join(out)


def _varints(value: int | bytes) -> list[int]:
    """A repeated varint field's values: one unpacked value, or a packed run."""
    if isinstance(value, int):
        return [value]
    out, pos = [], 0
    while pos < len(value):
        number, pos = read_varint(value, pos)
        out.append(number)
    return out


def _top_level_column_ids(types: list[bytes]) -> dict[str, tuple[int, int]]:
    if not types:
        return {}
    root = list(_fields(types[0]))
    children = [i for number, value in root if number == 2 for i in _varints(value)]
    names = [bytes(value).decode() for number, value in root if number == 3]
    ends = children[1:] + [len(types)]
    return {name: (first, end - 1) for name, first, end in zip(names, children, ends)}


def stream_ranges(stripe: Stripe, footer: bytes, tail: OrcTail, columns: list[str]) -> list[tuple[int, int]]:
    """Byte ranges of the streams (index and data) of ``columns`` in one stripe, adjacent ones
    merged; ``footer`` is the stripe's footer as stored (compressed)."""
    ranges = [tail.column_ids[name] for name in columns if name in tail.column_ids]
    wanted: list[tuple[int, int]] = []
    offset = stripe.offset
    for number, value in _fields(_decompress(footer, tail.compression)):
        if number != 1:
            continue
        stream = dict(_fields(cast(bytes, value)))  # (field 1: a Stream message)
        length, column = int(stream.get(3, 0)), int(stream.get(2, 0))
        if length and any(first <= column <= last for first, last in ranges):
            if wanted and wanted[-1][1] == offset:
                wanted[-1] = (wanted[-1][0], offset + length)
            else:
                wanted.append((offset, offset + length))
        offset += length
    return wanted


def read_tail(source, file_size: int) -> OrcTail:
    """The stripes and columns of an ORC file, read from its tail through a seekable binary file;
    ValueError saying what is wrong for a tail that does not decode."""
    try:
        return _read_tail(source, file_size)
    except _NotOrc as error:
        raise ValueError(str(error)) from None
    except (ValueError, IndexError, KeyError, TypeError, zlib.error, pa.ArrowException) as error:
        detail = f"field {error} is missing" if isinstance(error, KeyError) else str(error)[:120]
        raise ValueError(f"its tail (postscript and footer) does not decode as ORC's: {type(error).__name__}: {detail}") from error


class _NotOrc(Exception):
    """A file that is no ORC file at all (the message says why)."""


def _read_tail(source, file_size: int) -> OrcTail:
    if file_size < 4:
        raise _NotOrc(f"the file has {file_size} bytes, too few for an ORC file")
    tail_len = min(file_size, _TAIL_GUESS)
    source.seek(file_size - tail_len)
    tail = source.read(tail_len)
    ps_len = tail[-1]
    postscript = dict(_fields(tail[-1 - ps_len : -1]))
    if postscript.get(8000) != b"ORC":  # ORC 0.11 files have the magic only at the start (Hive 0.11 wrote them)
        source.seek(0)
        if source.read(3) != b"ORC" or 1 not in postscript:
            raise _NotOrc("not an ORC file (no 'ORC' magic in the postscript or at the start)")
    footer_len = int(postscript[1])
    need = footer_len + ps_len + 1
    if need > len(tail):
        source.seek(file_size - need)
        tail = source.read(need)
    footer = _decompress(tail[-need : -1 - ps_len], int(postscript.get(2, 0)))
    stripes: list[Stripe] = []
    types: list[bytes] = []
    statistics: list[bytes] = []
    rows = 0
    writer, calendar = 0, 0  # (absent: ORC_JAVA, the calendar unknown)
    for number, value in _fields(footer):
        if number == 3:
            info = dict(_fields(cast(bytes, value)))  # (field 3: a StripeInformation message)
            footer_length = int(info.get(4, 0))
            length = int(info.get(2, 0)) + int(info.get(3, 0)) + footer_length
            stripes.append(Stripe(int(info.get(1, 0)), length, int(info.get(5, 0)), footer_length))
        elif number == 4:
            types.append(cast(bytes, value))  # (field 4: a Type message)
        elif number == 6:
            rows = int(value)  # (field 6: numberOfRows)
        elif number == 7:
            statistics.append(cast(bytes, value))  # (field 7: a ColumnStatistics message per column id)
        elif number == 9:
            writer = int(value)  # (field 9: the writer, 0 ORC_JAVA)
        elif number == 11:
            calendar = int(value)  # (field 11: 1 JULIAN_GREGORIAN, 2 PROLEPTIC_GREGORIAN)
    column_ids = _top_level_column_ids(types)
    hybrid = writer == 0 and calendar != 2
    return OrcTail(stripes, column_ids, int(postscript.get(2, 0)), _null_counts(column_ids, statistics, rows), hybrid)


def _null_counts(column_ids: dict[str, tuple[int, int]], statistics: list[bytes], rows: int) -> dict[str, int]:
    """Nulls per top-level column: the file's rows less the column's values (ColumnStatistics
    field 1, numberOfValues), or none when its hasNull (field 10) is false."""
    counts = {}
    for name, (first, _) in column_ids.items():
        if first >= len(statistics):
            continue
        stats = dict(_fields(statistics[first]))
        if stats.get(10) == 0:
            counts[name] = 0
        elif isinstance(stats.get(1), int):
            counts[name] = rows - int(stats[1])
    return counts


@dataclass(frozen=True)
class ColumnStatistics:
    """One column's statistics in one stripe: min and max as Python values (None: not recorded or
    not a kind read here), how many values are not null, and whether any is null (None: unknown)."""

    minimum: object
    maximum: object
    values: int | None
    has_null: bool | None


def _zigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def _column_statistics(message: bytes, hybrid_dates: bool = False) -> ColumnStatistics:
    fields = dict(_fields(message))
    if hybrid_dates and 7 in fields:  # days of the hybrid calendar (OrcTail.hybrid_calendar): no bounds of the dates read
        del fields[7]
    values = int(cast(int, fields[1])) if 1 in fields else None
    has_null = bool(fields[10]) if 10 in fields else None
    low: object = None
    high: object = None
    if 2 in fields or 7 in fields:  # integers, dates (days): sint64 / sint32 minimum and maximum
        bounds = dict(_fields(cast(bytes, fields[2] if 2 in fields else fields[7])))
        if 1 in bounds and 2 in bounds:
            low, high = _zigzag(cast(int, bounds[1])), _zigzag(cast(int, bounds[2]))
    elif 4 in fields:  # strings: exact minimum and maximum, when the writer kept them
        bounds = dict(_fields(cast(bytes, fields[4])))
        if 1 in bounds and 2 in bounds:
            low, high = bytes(cast(bytes, bounds[1])).decode(), bytes(cast(bytes, bounds[2])).decode()
    elif 5 in fields and values is not None:  # booleans: the count of true values
        trues = _varints(dict(_fields(cast(bytes, fields[5]))).get(1, 0))[0]
        low, high = trues == values, trues > 0
    return ColumnStatistics(low, high, values, has_null)


def read_stripe_statistics(source, file_size: int, columns: dict[str, tuple[int, int]], hybrid_dates: bool = False) -> list[dict[str, ColumnStatistics]]:
    """Per stripe, the statistics of each top-level column of ``columns`` that is one ORC column
    (a primitive), from the file's Metadata section (before the footer). Empty when there is none.
    ``hybrid_dates``: the file's dates are of the hybrid calendar, so their bounds are left out."""
    source.seek(file_size - 1)
    ps_len = source.read(1)[0]
    source.seek(file_size - 1 - ps_len)
    postscript = dict(_fields(source.read(ps_len)))
    footer_len, metadata_len = int(postscript.get(1, 0)), int(postscript.get(5, 0))
    if not metadata_len:
        return []
    strings = int(postscript.get(6, 0)) >= 1  # writers before HIVE-8732 (writer version 1) got string bounds wrong
    source.seek(file_size - 1 - ps_len - footer_len - metadata_len)
    metadata = _decompress(source.read(metadata_len), int(postscript.get(2, 0)))
    single = {name: first for name, (first, last) in columns.items() if first == last}
    stripes = []
    for number, value in _fields(metadata):
        if number != 1:
            continue
        stats = [cast(bytes, v) for n, v in _fields(cast(bytes, value)) if n == 1]
        found = {name: _column_statistics(stats[column], hybrid_dates) for name, column in single.items() if column < len(stats)}
        if not strings:
            found = {name: c if not isinstance(c.minimum, str) else ColumnStatistics(None, None, c.values, c.has_null) for name, c in found.items()}
        stripes.append(found)
    return stripes

"""Private: a schema-less reader and writer of Thrift's compact protocol, the encoding of
Parquet's footer, page headers and page indexes.

A struct decodes to a ``Struct``: its fields in order as ``[field_id, type, value]``, so that a
caller can read, change or drop the fields it knows and write the rest back unchanged.

It exists for the page-level seek (``_parquet_seek``): pyarrow gives Python the footer only as
a read-only ``FileMetaData`` and neither a column chunk's offset index nor its page headers,
and the seek must read those and write a footer of its own. It goes with the seek when pyarrow
reads a row group from a given row through the page index (apache/arrow#45284).
"""

from __future__ import annotations

import struct as _struct
from typing import Any

from ._varint import read_varint, write_varint

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)
_INTEGERS = (BYTE, I16, I32, I64)
MAX_DEPTH = 64  # Parquet's metadata nests a few levels; deeper input is damaged


class ThriftError(ValueError):
    """Bytes that are not valid compact-protocol Thrift."""


class Struct:
    """A decoded struct: ``fields`` as ``[field_id, type, value]`` in the order read."""

    def __init__(self, fields: list[list[Any]] | None = None) -> None:
        self.fields = fields if fields is not None else []

    def get(self, field_id: int, default: Any = None) -> Any:
        for fid, _, value in self.fields:
            if fid == field_id:
                return value
        return default

    def integer(self, field_id: int, default: int | None = None) -> int:
        """An integer field; ThriftError when it is missing (without ``default``) or not an integer."""
        value = self.get(field_id, default)
        if type(value) is not int:
            raise ThriftError(f"field {field_id} is {type(value).__name__}, not an integer")
        return value

    def struct(self, field_id: int) -> Struct:
        """A struct field; ThriftError when it is missing or not a struct."""
        value = self.get(field_id)
        if not isinstance(value, Struct):
            raise ThriftError(f"field {field_id} is {type(value).__name__}, not a struct")
        return value

    def structs(self, field_id: int) -> list[Struct]:
        """A list-of-structs field; ThriftError when it is missing or holds anything else."""
        value = self.get(field_id)
        if not isinstance(value, ThriftList) or not all(isinstance(item, Struct) for item in value.values):
            raise ThriftError(f"field {field_id} is not a list of structs")
        return value.values

    def set(self, field_id: int, kind: int, value: Any) -> None:
        """Set a field (added in field-id order when absent)."""
        for field in self.fields:
            if field[0] == field_id:
                field[1], field[2] = kind, value
                return
        self.fields.append([field_id, kind, value])
        self.fields.sort(key=lambda f: f[0])

    def drop(self, *field_ids: int) -> None:
        self.fields = [f for f in self.fields if f[0] not in field_ids]


class ThriftList:
    """A decoded list or set: its element type and values."""

    def __init__(self, element: int, values: list[Any]) -> None:
        self.element = element
        self.values = values


class Encoded(bytes):
    """A list or struct value already encoded (``frozen``): written as it is."""


def frozen(value: Struct) -> Struct:
    """A copy of ``value`` whose list and struct fields are encoded once (``Encoded``), for a
    struct written many times with only its other fields changed."""
    fields = []
    for fid, kind, item in value.fields:
        if kind in (LIST, SET, STRUCT):
            out = bytearray()
            _write_value(out, kind, item)
            item = Encoded(out)
        fields.append([fid, kind, item])
    return Struct(fields)


def decode_struct(data: bytes | memoryview, offset: int = 0, only: tuple[int, int] | None = None) -> tuple[Struct, int]:
    """The struct at ``offset`` and the offset after it. ``only=(field_id, index)``: of the list
    in that field of the struct, only the element at ``index`` is decoded; the others are
    skipped (about twice as fast as decoding) and None."""
    reader = _Reader(memoryview(data), offset)
    value = reader.struct(0, only)
    return value, reader.pos


def encode_struct(value: Struct) -> bytes:
    out = bytearray()
    _write_struct(out, value)
    return bytes(out)


class _Reader:
    def __init__(self, data: memoryview, pos: int) -> None:
        self.data = data
        self.pos = pos

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise ThriftError("unexpected end of data")
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        try:
            value, self.pos = read_varint(self.data, self.pos)
        except IndexError:
            raise ThriftError("unexpected end of data") from None
        except ValueError as error:
            raise ThriftError(str(error)) from None
        return value

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, kind: int, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ThriftError("values nested too deeply")
        if kind in (TRUE, FALSE):  # (a list's booleans are one byte each: 1 true)
            return kind == TRUE
        if kind in _INTEGERS:
            return self.zigzag() if kind != BYTE else _struct.unpack("b", bytes([self.byte()]))[0]
        if kind == DOUBLE:
            end = self.pos + 8
            if end > len(self.data):
                raise ThriftError("unexpected end of data")
            self.pos = end
            return _struct.unpack("<d", self.data[end - 8 : end])[0]
        if kind == BINARY:
            size = self.varint()
            end = self.pos + size
            if end > len(self.data):
                raise ThriftError("unexpected end of data")
            self.pos = end
            return bytes(self.data[end - size : end])
        if kind in (LIST, SET):
            size, element = self._list_header()
            if element in (TRUE, FALSE):
                return ThriftList(element, [self.byte() == TRUE for _ in range(size)])
            return ThriftList(element, [self.value(element, depth + 1) for _ in range(size)])
        if kind == STRUCT:
            return self.struct(depth + 1)
        if kind == MAP:
            raise ThriftError("maps do not occur in Parquet's metadata")
        raise ThriftError(f"unknown type {kind}")

    def _list_header(self) -> tuple[int, int]:
        """A list's or set's size and element type."""
        header = self.byte()
        size, element = header >> 4, header & 0x0F
        return (self.varint() if size == 15 else size), element

    def skip(self, kind: int, depth: int) -> None:
        """Past a value without building it (as ``value`` would read it)."""
        if depth > MAX_DEPTH:
            raise ThriftError("values nested too deeply")
        data = self.data
        if kind in (TRUE, FALSE):
            return
        if kind == BYTE:
            self.pos += 1
        elif kind in _INTEGERS:
            self.varint()
        elif kind == DOUBLE:
            self.pos += 8
        elif kind == BINARY:
            size = self.varint()  # (not `self.pos += self.varint()`: that adds to the pos before the varint)
            self.pos += size
        elif kind in (LIST, SET):
            size, element = self._list_header()
            if element in (TRUE, FALSE, BYTE):
                self.pos += size
            else:
                for _ in range(size):
                    self.skip(element, depth + 1)
        elif kind == STRUCT:
            while True:
                header = self.byte()
                if (header & 0x0F) == STOP:
                    break
                if not header >> 4:
                    self.zigzag()
                self.skip(header & 0x0F, depth + 1)
        else:
            raise ThriftError(f"unknown type {kind}")
        if self.pos > len(data):
            raise ThriftError("unexpected end of data")

    def struct(self, depth: int, only: tuple[int, int] | None = None) -> Struct:
        if depth > MAX_DEPTH:
            raise ThriftError("values nested too deeply")
        fields: list[list[Any]] = []
        last = 0
        while True:
            header = self.byte()
            kind = header & 0x0F
            if kind == STOP:
                return Struct(fields)
            delta = header >> 4
            last = last + delta if delta else self.zigzag()
            if only is not None and last == only[0] and kind in (LIST, SET):
                fields.append([last, kind, self._one_element(only[1], depth)])
            else:
                fields.append([last, kind, self.value(kind, depth)])

    def _one_element(self, index: int, depth: int) -> ThriftList:
        size, element = self._list_header()
        if element in (TRUE, FALSE):  # (a list's booleans are one byte each)
            flags = [self.byte() == TRUE for _ in range(size)]
            return ThriftList(element, [flag if i == index else None for i, flag in enumerate(flags)])
        values: list[Any] = []
        for i in range(size):
            if i == index:
                values.append(self.value(element, depth + 1))
            else:
                self.skip(element, depth + 1)
                values.append(None)
        return ThriftList(element, values)


def _zigzag(out: bytearray, n: int) -> None:
    write_varint(out, (n << 1) ^ (n >> 63))


def _write_value(out: bytearray, kind: int, value: Any) -> None:
    if type(value) is Encoded:
        out += value
    elif kind in (TRUE, FALSE):
        return  # in the field header
    elif kind == BYTE:
        out += _struct.pack("b", value)
    elif kind in _INTEGERS:
        _zigzag(out, value)
    elif kind == DOUBLE:
        out += _struct.pack("<d", value)
    elif kind == BINARY:
        write_varint(out, len(value))
        out += value
    elif kind in (LIST, SET):
        size, element = len(value.values), value.element
        if size < 15:
            out.append(size << 4 | element)
        else:
            out.append(0xF0 | element)
            write_varint(out, size)
        for item in value.values:
            if element in (TRUE, FALSE):
                out.append(TRUE if item else FALSE)
            else:
                _write_value(out, element, item)
    elif kind == STRUCT:
        _write_struct(out, value)
    else:
        raise ThriftError(f"cannot write type {kind}")


def _write_struct(out: bytearray, value: Struct) -> None:
    last = 0
    for fid, kind, item in value.fields:
        if kind in (TRUE, FALSE):
            kind = TRUE if item else FALSE
        if 0 < fid - last <= 15:
            out.append((fid - last) << 4 | kind)
        else:
            out.append(kind)
            _zigzag(out, fid)
        last = fid
        _write_value(out, kind, item)
    out.append(STOP)

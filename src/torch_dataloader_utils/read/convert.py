"""Arrow -> torch. Chunks are converted once in the worker; batches are row slices of them.

Batch values by Arrow type:
- integers, floats, bool, timestamps, dates, durations: a 1-D tensor (temporal types as
  int64/int32 counts of the column's unit; uint16/uint32/uint64 widened to int32/int64/int64,
  which torch computes with); zero-copy where Arrow's layout allows;
- fixed-size lists (nested too): an N-D tensor (rows first);
- variable-length lists of numbers: a 2-D tensor when every row of the batch has the same
  length, else a ``Ragged(values, offsets)`` pair (``values[offsets[i]:offsets[i+1]]`` is row i);
- strings / binary: ``list[str]`` / ``list[bytes]`` (a null is ``None``);
- dictionary-encoded columns are decoded first.
A null in a numeric column raises ValueError naming the column.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np
import pyarrow as pa
import torch

from ..catalog.schema import LARGE_TYPES

_INT32_OFFSET_MAX = 2**31 - 1  # past this many bytes a chunk's strings need 64-bit offsets

Where = Callable[[], str]  # describes a chunk's source; called only when there is an error to report


class Ragged(NamedTuple):
    """A batch of variable-length rows: row i is ``values[offsets[i]:offsets[i+1]]``."""

    values: torch.Tensor
    offsets: torch.Tensor


class ListColumn(NamedTuple):
    """A list column of a chunk: its values and Arrow offsets (on the device when fed to one,
    with ``host_offsets`` kept for slicing). ``width`` is the length every row of the chunk has,
    when they all have the same (found once per chunk in the worker, so that the loop slices a
    batch as one view instead of checking its rows' lengths)."""

    values: torch.Tensor
    offsets: torch.Tensor
    host_offsets: torch.Tensor | None = None
    width: int | None = None


class StringColumn(NamedTuple):
    """Strings / binary of a chunk as their Arrow offsets and bytes (two tensors cross between
    processes instead of one pickled Python object per row); batches build their own list."""

    type: pa.DataType
    offsets: torch.Tensor
    data: torch.Tensor


_STRING_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)


def _strings(array: pa.Array) -> Any:
    if array.null_count:
        return array.to_pylist()  # nulls become None; rare enough to take the simple path
    wide = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    bounds = np.frombuffer(array.buffers()[1], dtype=np.int64 if wide else np.int32)[array.offset : array.offset + len(array) + 1]
    data = np.frombuffer(array.buffers()[2], dtype=np.uint8)[bounds[0] : bounds[-1]] if array.buffers()[2] else np.zeros(0, np.uint8)
    return StringColumn(array.type, torch.from_numpy(bounds - bounds[0]), _tensor(data))


_READ_ONLY_WARNING_SPENT = False  # torch warns once per process about read-only arrays


def _tensor(array: np.ndarray) -> torch.Tensor:
    global _READ_ONLY_WARNING_SPENT
    if _READ_ONLY_WARNING_SPENT:
        return torch.from_numpy(array)
    with warnings.catch_warnings():  # costs more than the conversion: only until torch's one warning is spent
        warnings.simplefilter("ignore", UserWarning)  # Arrow buffers are flagged read-only
        tensor = torch.from_numpy(array)
    _READ_ONLY_WARNING_SPENT = not array.flags.writeable
    return tensor


def _is_number(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def _innermost(kind: pa.DataType) -> pa.DataType:
    while pa.types.is_fixed_size_list(kind):
        kind = kind.value_type
    return kind


def _is_time_count(kind: pa.DataType) -> bool:
    """Timestamps, dates, times and durations: integer counts of a unit (intervals are not one number)."""
    return pa.types.is_temporal(kind) and not pa.types.is_interval(kind)


def batch_form_problem(kind: pa.DataType) -> str | None:
    """Why a column of Arrow type ``kind`` has no batch value (None when it has one): the rules
    of this module, checked on the schema before any row is read."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if any(check(kind) for check in _STRING_TYPES) or _is_number(kind) or _is_time_count(kind):
        return None
    if pa.types.is_fixed_size_list(kind):
        inner = _innermost(kind)
        return None if _is_number(inner) or _is_time_count(inner) else f"fixed-size lists of {inner} are not supported"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        values = kind.value_type
        inner = _innermost(values)
        supported = _is_number(inner) or _is_time_count(inner)
        return None if supported else f"lists of {values} are not supported"
    return "it has no tensor form"


def check_batch_forms(schema: pa.Schema, columns: list[str] | None) -> None:
    """TypeError naming the first selected column of ``schema`` whose type has no batch value."""
    for name in schema.names if columns is None else columns:
        kind = schema.field(name).type
        problem = batch_form_problem(kind)
        if problem is not None:
            raise TypeError(f"column {name!r} ({kind}): {problem}; leave it out with columns=[...] or cast it in the data")


# unsigned types torch can hold but hardly compute with: widened to the signed type holding them
_WIDER = {np.dtype(np.uint16): np.int32, np.dtype(np.uint32): np.int64, np.dtype(np.uint64): np.int64}


def _numeric(array: pa.Array, name: str, where: Where) -> torch.Tensor:
    if array.null_count:
        raise ValueError(
            f"column {name!r} has {array.null_count} null value(s) in {where()}; a tensor cannot hold nulls. "
            "Fill them in the data, or leave the column out with columns=[...]"
        )
    kind = array.type
    if pa.types.is_timestamp(kind) or pa.types.is_duration(kind) or pa.types.is_date64(kind) or pa.types.is_time64(kind):
        array = array.view(pa.int64())
    elif pa.types.is_date32(kind) or pa.types.is_time32(kind):
        array = array.view(pa.int32())
    values = array.to_numpy(zero_copy_only=False)
    if values.dtype in _WIDER:
        if values.dtype == np.uint64 and len(values) and int(values.max()) > np.iinfo(np.int64).max:
            raise ValueError(f"column {name!r} (uint64) has values above int64's range in {where()}; a tensor cannot hold them")
        values = values.astype(_WIDER[values.dtype])
    return _tensor(values)


def _flatten_fixed(array: pa.Array, name: str, where: Where) -> torch.Tensor:
    shape = [len(array)]
    while pa.types.is_fixed_size_list(array.type):
        if array.null_count:
            raise ValueError(f"column {name!r} has null list rows in {where()}; fill them or leave the column out")
        size = array.type.list_size
        shape.append(size)
        array = array.values.slice(array.offset * size, len(array) * size)  # flatten() without its compute call
    return _numeric(array, name, where).reshape(shape)


def _column(array: pa.Array, name: str, where: Where) -> Any:
    kind = array.type
    if pa.types.is_dictionary(kind):
        return _column(array.dictionary_decode(), name, where)
    if any(check(kind) for check in _STRING_TYPES):
        return _strings(array)
    if pa.types.is_fixed_size_list(kind):
        return _flatten_fixed(array, name, where)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        if array.null_count:
            raise ValueError(f"column {name!r} has null list rows in {where()}; fill them or leave the column out")
        offsets = array.offsets.to_numpy().astype(np.int64)
        values = array.flatten()
        inner = _flatten_fixed(values, name, where) if pa.types.is_fixed_size_list(values.type) else None
        if inner is None:
            if not (_is_number(values.type) or _is_time_count(values.type)):
                raise TypeError(f"column {name!r}: lists of {values.type} are not supported; leave it out with columns=[...]")
            inner = _numeric(values, name, where)
        return ListColumn(inner, torch.from_numpy(offsets - offsets[0]), width=_common_length(offsets))
    if _is_number(kind) or pa.types.is_temporal(kind):
        return _numeric(array, name, where)
    raise TypeError(f"column {name!r} has type {kind}, which has no tensor form; leave it out with columns=[...] or cast it in the data")


def _common_length(offsets: np.ndarray) -> int | None:
    """The length all rows have, or None when they differ (or there are none)."""
    if len(offsets) < 2:
        return None
    lengths = np.diff(offsets)
    return int(lengths[0]) if bool((lengths == lengths[0]).all()) else None


@dataclass(frozen=True)
class Joined:
    """A tensor made of pieces laid one after another, each plus an addend (offsets of later
    pieces are rebased). It is materialized by one copy, into new memory (``build``) or into a
    shared buffer (transfer.py), so that a chunk spread over several Arrow chunks is copied once."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    pieces: tuple[tuple[torch.Tensor, int], ...]

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.dtype, self.shape)

    def write(self, out: torch.Tensor) -> None:
        """Fill ``out`` (contiguous, of ``shape`` and ``dtype``)."""
        flat, at = out.view(-1), 0
        for piece, addend in self.pieces:
            count = piece.numel()
            if addend:
                torch.add(piece.reshape(-1), addend, out=flat[at : at + count])
            else:
                flat[at : at + count].copy_(piece.reshape(-1))
            at += count

    def build(self, copy: bool = True) -> torch.Tensor:
        """The tensor; with ``copy`` one of its own also for a single piece: pieces may be views of
        the Arrow tables the reader keeps (and delivers again: padding, a repeated pass, a
        rollback), and a loop that writes to its batch in place must not change them."""
        if not copy and len(self.pieces) == 1 and not self.pieces[0][1]:
            return self.pieces[0][0]
        out = torch.empty(self.shape, dtype=self.dtype)
        self.write(out)
        return out


def tensor_nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * dtype.itemsize


def _is_named_tuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def leaves(value: Any, kind: type) -> list[Any]:
    """Each ``kind`` in ``value``: the value itself, or the fields of a named tuple."""
    if isinstance(value, kind):
        return [value]
    if _is_named_tuple(value):
        return [field for field in value if isinstance(field, kind)]
    return []


def replace_leaves(value: Any, kind: type, replace: Callable[[Any], Any]) -> Any:
    """``value`` with each ``kind`` (the value itself, or a field of a named tuple) mapped through ``replace``."""
    if isinstance(value, kind):
        return replace(value)
    if _is_named_tuple(value):
        return value._replace(**{name: replace(field) for name, field in zip(value._fields, value) if isinstance(field, kind)})
    return value


def _join_tensors(parts: list[torch.Tensor]) -> Joined:
    rows = sum(len(part) for part in parts)
    return Joined(parts[0].dtype, (rows, *parts[0].shape[1:]), tuple((part, 0) for part in parts))


def _join_offsets(parts: list[torch.Tensor], sizes: list[int]) -> Joined:
    """Offsets (each part starting at 0) of parts whose values are laid one after another."""
    pieces, base = [], 0
    for index, (offsets, size) in enumerate(zip(parts, sizes)):
        pieces.append((offsets if index == len(parts) - 1 else offsets[:-1], base))
        base += size
    return Joined(parts[0].dtype, (sum(len(o) - 1 for o in parts) + 1,), tuple(pieces))


def _join(parts: list[Any]) -> Any:
    """One chunk's column from its converted Arrow chunks, tensors as ``Joined``."""
    if all(isinstance(part, torch.Tensor) for part in parts):
        return _join_tensors(parts)
    if all(isinstance(part, ListColumn) for part in parts):
        values = [part.values for part in parts]
        widths = {part.width for part in parts if len(part.offsets) > 1}
        width = widths.pop() if len(widths) == 1 else None
        # a Joined stands in for each tensor until the transfer builds it in shared memory
        joined_offsets = _join_offsets([part.offsets for part in parts], [len(v) for v in values])
        return ListColumn(_join_tensors(values), joined_offsets, width=width)  # type: ignore[arg-type]
    if all(isinstance(part, StringColumn) for part in parts):
        data = [part.data for part in parts]
        kind, offsets = parts[0].type, [part.offsets for part in parts]
        if sum(len(d) for d in data) > _INT32_OFFSET_MAX and kind in LARGE_TYPES:  # Arrow chunks each under 2 GiB, together over
            kind, offsets = LARGE_TYPES[kind], [o.to(torch.int64) for o in offsets]
        return StringColumn(kind, _join_offsets(offsets, [len(d) for d in data]), _join_tensors(data))  # type: ignore[arg-type]
    strings: list = []  # strings with nulls in some parts: Python lists
    for part in parts:
        strings.extend(part if isinstance(part, list) else _slice_strings(part, 0, len(part.offsets) - 1))
    return strings


def table_to_joined(table: pa.Table, where: Where) -> dict[str, Any]:
    """Convert a whole chunk, each tensor left as a ``Joined`` of its Arrow chunks' tensors;
    ``where()`` describes the chunk's source, asked only for an error message."""
    columns = {}
    for name, column in zip(table.column_names, table.columns):
        chunks = column.chunks or [pa.array([], type=column.type)]
        columns[name] = _join([_column(chunk, name, where) for chunk in chunks])
    return columns


def build_columns(columns: dict[str, Any], copy: bool = True) -> dict[str, Any]:
    """Columns from ``table_to_joined`` with every ``Joined`` built into a tensor (see ``Joined.build``)."""
    return {name: replace_leaves(value, Joined, lambda joined: joined.build(copy)) for name, value in columns.items()}


def table_to_columns(table: pa.Table, where: Where, copy: bool = True) -> dict[str, Any]:
    """Convert a whole chunk into tensors (and lists); see ``table_to_joined``. ``copy=False`` may
    leave tensors as views of ``table`` (fine when they are copied on anyway, as out of a worker)."""
    return build_columns(table_to_joined(table, where), copy)


def _slice_strings(column: StringColumn, start: int, stop: int) -> list:
    offsets = column.offsets[start : stop + 1].numpy()
    first, last = int(offsets[0]), int(offsets[-1])
    buffers = [None, pa.py_buffer(offsets - first), pa.py_buffer(column.data[first:last].numpy())]
    array = pa.Array.from_buffers(column.type, stop - start, buffers)
    try:  # through numpy: faster than to_pylist() for a batch of strings
        return array.to_numpy(zero_copy_only=False).tolist()
    except pa.ArrowException:  # a value that is not UTF-8: to_pylist() says which bytes
        return array.to_pylist()


def _slice_list(column: ListColumn, start: int, stop: int) -> Any:
    if column.width is not None:
        width = column.width
        return column.values[start * width : stop * width].view(stop - start, width, *column.values.shape[1:])
    host = column.offsets if column.host_offsets is None else column.host_offsets
    offsets = host[start : stop + 1]
    first = int(offsets[0])
    values = column.values[first : int(offsets[-1])]
    offsets = offsets - first
    lengths = offsets[1:] - offsets[:-1]
    if len(lengths) and bool((lengths == lengths[0]).all()):
        return values.reshape(len(lengths), int(lengths[0]), *values.shape[1:])
    if column.host_offsets is not None:
        offsets = column.offsets[start : stop + 1] - first
    return Ragged(values, offsets)


def slice_columns(columns: dict[str, Any], start: int, stop: int, where: Where | None = None) -> dict[str, Any]:
    """Rows [start, stop) of a converted chunk as a batch (views, no copies of tensor data);
    ``where`` describes the chunk's rows for an error message."""
    batch = {}
    for name, column in columns.items():
        if isinstance(column, ListColumn):
            batch[name] = _slice_list(column, start, stop)
        elif isinstance(column, StringColumn):
            try:
                batch[name] = _slice_strings(column, start, stop)
            except UnicodeDecodeError as error:
                source = f" of {where()}" if where is not None else ""
                raise ValueError(
                    f"column {name!r}{source} holds a string that is not valid UTF-8 ({error}); the file's writer stored bytes "
                    "under a string type. Fix the data, or leave the column out (columns=...)"
                ) from error
        else:
            batch[name] = column[start:stop]
    return batch

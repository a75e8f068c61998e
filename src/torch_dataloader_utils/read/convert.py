"""Arrow -> torch. Chunks are converted once in the worker; batches are row slices of them.

Batch values by Arrow type (forms.py decides which; docs/types.md has the full table):
- integers, floats, bool, timestamps, dates, durations: a 1-D tensor (temporal types as
  int64/int32 counts of the column's unit; uint16/uint32/uint64 widened to int32/int64/int64,
  which torch computes with); zero-copy where Arrow's layout allows; decimals as float64 (or
  their unscaled int64 with decimals="int64");
- fixed-size lists (nested too): an N-D tensor (rows first);
- variable-length lists of numbers: a 2-D tensor when every row of the batch has the same
  length, else a ``Ragged(values, offsets)`` pair (``values[offsets[i]:offsets[i+1]]`` is row i);
- strings / binary: ``list[str]`` / ``list[bytes]`` (a null is ``None``);
- fixed-size binary, the null type, lists of anything else: a Python list of pyarrow's values;
- dictionary-encoded columns are decoded first.
Nulls in tensor columns raise, or are filled, under the dataset's ``nulls=`` (nulls.py).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np
import pyarrow as pa
import torch

from ..catalog.schema import LARGE_TYPES
from .forms import batch_form, holds_mask
from .forms import batch_form_problem as batch_form_problem  # (where the CLI and tests find it)
from .nulls import DEFAULT_POLICY, MASK_SUFFIX, ColumnPolicy, decimal_values, filled, valid_mask

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    from ..formats._lazy import compute as pc  # imported when first used

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


# unsigned types torch can hold but hardly compute with: widened to the signed type holding them
_WIDER = {np.dtype(np.uint16): np.int32, np.dtype(np.uint32): np.int64, np.dtype(np.uint64): np.int64}


def _numeric(array: pa.Array, name: str, where: Where, policy: ColumnPolicy = DEFAULT_POLICY) -> torch.Tensor:
    kind = array.type
    if pa.types.is_decimal(kind):
        array = decimal_values(array, name, policy, where)
    elif pa.types.is_timestamp(kind) or pa.types.is_duration(kind) or pa.types.is_date64(kind) or pa.types.is_time64(kind):
        array = array.view(pa.int64())
    elif pa.types.is_date32(kind) or pa.types.is_time32(kind):
        array = array.view(pa.int32())
    values = filled(array, name, policy, where).to_numpy(zero_copy_only=False)
    if values.dtype in _WIDER:
        if values.dtype == np.uint64 and len(values) and int(values.max()) > np.iinfo(np.int64).max:
            raise ValueError(f"column {name!r} (uint64) has values above int64's range in {where()}; a tensor cannot "
                'hold them: read it with output_format="numpy" or "arrow", or leave it out with columns=[...]')
        values = values.astype(_WIDER[values.dtype])
    return _tensor(values)


def _null_rows(array: pa.Array, name: str, policy: ColumnPolicy, where: Where) -> None:
    if policy.nulls == "raise":
        raise ValueError(
            f"column {name!r} has {array.null_count} null list row(s) in {where()}; pass nulls='fill' (a null row becomes "
            "empty, or fill values for a fixed-size list) or nulls='mask', or leave the column out with columns=[...]"
        )


def _flatten_fixed(array: pa.Array, name: str, where: Where, policy: ColumnPolicy = DEFAULT_POLICY) -> torch.Tensor:
    shape = [len(array)]
    valid = None  # per value of the current level, when a row above was null
    while pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        if array.null_count:
            _null_rows(array, name, policy, where)
            rows = valid_mask(array) if valid is None else valid & valid_mask(array)
            valid = rows
        shape.append(size)
        valid = None if valid is None else np.repeat(valid, size)
        array = array.values.slice(array.offset * size, len(array) * size)  # flatten() without its compute call
    if valid is not None:  # values under a null row become nulls, then fills
        array = pc.if_else(pa.array(valid), array, pa.nulls(len(array), array.type))
    return _numeric(array, name, where, policy).reshape(shape)


def _list(array: pa.Array, name: str, where: Where, policy: ColumnPolicy) -> ListColumn:
    if array.null_count:
        _null_rows(array, name, policy, where)
        lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy()
        offsets = np.zeros(len(array) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
    else:
        offsets = array.offsets.to_numpy().astype(np.int64)
        offsets -= offsets[0]
    values = array.flatten()  # (without the values under null rows)
    if pa.types.is_fixed_size_list(values.type):
        inner = _flatten_fixed(values, name, where, policy)
    else:
        inner = _numeric(values, name, where, policy)
    return ListColumn(inner, torch.from_numpy(offsets), width=_common_length(offsets))


def _column(array: pa.Array, name: str, where: Where, policy: ColumnPolicy = DEFAULT_POLICY) -> Any:
    kind = array.type
    if pa.types.is_dictionary(kind):
        return _column(array.dictionary_decode(), name, where, policy)
    form = batch_form(kind)
    if form == "strings":
        return _strings(array)
    if form == "python":
        return array.to_pylist()
    if pa.types.is_fixed_size_list(kind) and form == "tensor":
        return _flatten_fixed(array, name, where, policy)
    if form == "ragged":
        return _list(array, name, where, policy)
    if form == "tensor":
        return _numeric(array, name, where, policy)
    raise TypeError(f"column {name!r} has type {kind}, which has no batch form; leave it out with columns=[...] or cast it in the data")


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


def table_to_joined(table: pa.Table, where: Where, policy: ColumnPolicy = DEFAULT_POLICY) -> dict[str, Any]:
    """Convert a whole chunk, each tensor left as a ``Joined`` of its Arrow chunks' tensors;
    ``where()`` describes the chunk's source, asked only for an error message; ``policy``: what
    nulls and decimals become (nulls.py), with nulls="mask" a ``"<column>.valid"`` mask each."""
    columns = {}
    for name, column in zip(table.column_names, table.columns):
        chunks = column.chunks or [pa.array([], type=column.type)]
        columns[name] = _join([_column(chunk, name, where, policy) for chunk in chunks])
        if policy.masks and holds_mask(column.type):
            columns[name + MASK_SUFFIX] = _join_tensors([torch.from_numpy(valid_mask(chunk)) for chunk in chunks])
    return columns


def build_columns(columns: dict[str, Any], copy: bool = True) -> dict[str, Any]:
    """Columns from ``table_to_joined`` with every ``Joined`` built into a tensor (see ``Joined.build``)."""
    return {name: replace_leaves(value, Joined, lambda joined: joined.build(copy)) for name, value in columns.items()}


def table_to_columns(table: pa.Table, where: Where, copy: bool = True, policy: ColumnPolicy = DEFAULT_POLICY) -> dict[str, Any]:
    """Convert a whole chunk into tensors (and lists); see ``table_to_joined``. ``copy=False`` may
    leave tensors as views of ``table`` (fine when they are copied on anyway, as out of a worker)."""
    return build_columns(table_to_joined(table, where, policy), copy)


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

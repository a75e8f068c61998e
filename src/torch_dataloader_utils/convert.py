"""Arrow -> torch. Chunks are converted once in the worker; batches are row slices of them.

Batch values by Arrow type:
- integers, floats, bool, timestamps, dates, durations: a 1-D tensor (temporal types as
  int64/int32 counts of the column's unit); zero-copy where Arrow's layout allows;
- fixed-size lists (nested too): an N-D tensor (rows first);
- variable-length lists of numbers: a 2-D tensor when every row of the batch has the same
  length, else a ``Ragged(values, offsets)`` pair (``values[offsets[i]:offsets[i+1]]`` is row i);
- strings / binary: ``list[str]`` / ``list[bytes]`` (a null is ``None``);
- dictionary-encoded columns are decoded first.
A null in a numeric column raises ValueError naming the column.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple

import numpy as np
import pyarrow as pa
import torch


Where = Callable[[], str]  # describes a chunk's source; called only when there is an error to report


class Ragged(NamedTuple):
    """A batch of variable-length rows: row i is ``values[offsets[i]:offsets[i+1]]``."""

    values: torch.Tensor
    offsets: torch.Tensor


class _ListColumn(NamedTuple):
    values: torch.Tensor
    offsets: torch.Tensor


class _StringColumn(NamedTuple):
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
    return _StringColumn(array.type, torch.from_numpy(bounds - bounds[0]), _tensor(data))


def _tensor(array: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Arrow buffers are flagged read-only
        return torch.from_numpy(array)


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
    return _tensor(array.to_numpy(zero_copy_only=False))


def _flatten_fixed(array: pa.Array, name: str, where: Where) -> torch.Tensor:
    shape = [len(array)]
    while pa.types.is_fixed_size_list(array.type):
        if array.null_count:
            raise ValueError(f"column {name!r} has null list rows in {where()}; fill them or leave the column out")
        shape.append(array.type.list_size)
        array = array.flatten()
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
            if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_boolean(values.type)):
                raise TypeError(f"column {name!r}: lists of {values.type} are not supported; leave it out with columns=[...]")
            inner = _numeric(values, name, where)
        return _ListColumn(inner, torch.from_numpy(offsets - offsets[0]))
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind) or pa.types.is_temporal(kind):
        return _numeric(array, name, where)
    raise TypeError(f"column {name!r} has type {kind}, which has no tensor form; leave it out with columns=[...] or cast it in the data")


def table_to_columns(table: pa.Table, where: Where) -> dict[str, Any]:
    """Convert a whole chunk; ``where()`` describes its source, asked only for an error message."""
    return {name: _column(_one_array(table.column(name)), name, where) for name in table.column_names}


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array; ``combine_chunks`` would copy even a single chunk."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _slice_strings(column: _StringColumn, start: int, stop: int) -> list:
    offsets = column.offsets[start : stop + 1].numpy()
    first, last = int(offsets[0]), int(offsets[-1])
    buffers = [None, pa.py_buffer(offsets - first), pa.py_buffer(column.data[first:last].numpy())]
    return pa.Array.from_buffers(column.type, stop - start, buffers).to_pylist()


def _slice_list(column: _ListColumn, start: int, stop: int) -> Any:
    offsets = column.offsets[start : stop + 1]
    first = int(offsets[0])
    values = column.values[first : int(offsets[-1])]
    offsets = offsets - first
    lengths = offsets[1:] - offsets[:-1]
    if len(lengths) and bool((lengths == lengths[0]).all()):
        return values.reshape(len(lengths), int(lengths[0]), *values.shape[1:])
    return Ragged(values, offsets)


def slice_columns(columns: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    """Rows [start, stop) of a converted chunk as a batch (views, no copies of tensor data)."""
    batch = {}
    for name, column in columns.items():
        if isinstance(column, _ListColumn):
            batch[name] = _slice_list(column, start, stop)
        elif isinstance(column, _StringColumn):
            batch[name] = _slice_strings(column, start, stop)
        else:
            batch[name] = column[start:stop]
    return batch

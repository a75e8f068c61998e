"""What ``dataset[key]`` accepts, and one row out of a batch.

A key is an integer (one row) or rows: a slice, a list or range of integers, a 1-d integer
NumPy array or a 1-d integer torch tensor (numpy's rules: negative counts from the end, a
slice is clipped to the rows there are, duplicates and any order are kept).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from ..plan.row_index import normalize_rows
from .convert import Ragged

_INT64 = (-(2**63), 2**63 - 1)
_FORMS = "an int, a slice, a list of ints, a 1-d integer numpy array or a 1-d integer torch tensor"


def parse_key(key: Any, num_rows: int) -> int | np.ndarray:
    """``key`` as one row (an int in [0, num_rows)) or rows (an int64 array in request order).
    IndexError for a row out of range, TypeError for a key of another kind."""
    if isinstance(key, slice):
        return np.arange(*key.indices(num_rows), dtype=np.int64)
    if isinstance(key, (bool, np.bool_)):
        raise TypeError(f"dataset indices must be {_FORMS}, not a bool")
    if isinstance(key, torch.Tensor):
        return _rows_of_array(key, key.dtype.is_floating_point or key.dtype.is_complex or key.dtype == torch.bool, num_rows, "a tensor")
    if isinstance(key, np.ndarray):
        return _rows_of_array(key, key.dtype.kind not in "iu", num_rows, "an array")
    if isinstance(key, (list, range)):
        if any(isinstance(item, (bool, np.bool_)) for item in key):  # numpy would read [True, 2] as [1, 2]
            raise TypeError(f"a list of dataset indices must hold ints only, not bools; got {_describe(key)}")
        array = np.asarray(key) if len(key) else np.zeros(0, np.int64)
        if array.dtype.kind != "i" and all(isinstance(item, (int, np.integer)) and not isinstance(item, bool) for item in key):
            beyond = [int(item) for item in key if not _INT64[0] <= item <= _INT64[1]]  # numpy made them uint64, float or object
            if beyond:
                raise _out_of_range(beyond[0], num_rows)
            array = np.array([int(item) for item in key], np.int64)
        if array.dtype.kind not in "iu" or array.ndim != 1:
            raise TypeError(f"a list of dataset indices must hold ints only; got {_describe(key)}")
        return normalize_rows(array, num_rows)
    if isinstance(key, (int, np.integer)):
        if not _INT64[0] <= key <= _INT64[1]:
            raise _out_of_range(int(key), num_rows)
        return int(normalize_rows(np.array([key]), num_rows)[0])
    if isinstance(key, tuple):
        raise TypeError(f"dataset indices must be {_FORMS}, not a tuple: rows have no second dimension (pass a list for several rows)")
    raise TypeError(f"dataset indices must be {_FORMS}, not {type(key).__name__}")


def _rows_of_array(key: Any, wrong_dtype: bool, num_rows: int, kind: str) -> int | np.ndarray:
    if wrong_dtype:
        advice = " (for a boolean mask, pass its nonzero positions)" if "bool" in str(key.dtype) else ""
        raise TypeError(f"{kind} of dataset indices must have an integer dtype, got {key.dtype}{advice}")
    if key.ndim == 0:
        return parse_key(operator.index(key), num_rows)
    if key.ndim != 1:
        raise TypeError(f"{kind} of dataset indices must be 1-d, got shape {tuple(key.shape)}")
    values = key.cpu().numpy() if isinstance(key, torch.Tensor) else key
    if values.dtype == np.uint64 and len(values) and int(values.max()) > np.iinfo(np.int64).max:
        raise _out_of_range(int(values.max()), num_rows)
    return normalize_rows(values.astype(np.int64, copy=False), num_rows)


def _out_of_range(index: int, num_rows: int) -> IndexError:
    """normalize_rows' error, for an index numpy cannot hold as an int64."""
    return IndexError(f"row index {index} is out of range for a dataset of {num_rows:,} rows (valid: -{num_rows} to {num_rows - 1})")


def _describe(key: Any) -> str:
    kinds = sorted({type(item).__name__ for item in key})
    return f"items of type {', '.join(kinds)}"


def row_of(batch: Any, index: int) -> dict[str, Any]:
    """Row ``index`` of a batch as column -> the column's item: of a torch batch, a number as a
    0-d tensor, a list as a tensor of its values, a string or bytes (or None) as itself; of a
    numpy batch, the arrays' items; of an Arrow ``RecordBatch``, Arrow scalars; of a dict of
    lists, Python values."""
    if isinstance(batch, pa.RecordBatch):
        return {name: batch.column(position)[index] for position, name in enumerate(batch.schema.names)}
    return {name: _value(column, index) for name, column in batch.items()}


def _value(column: Any, index: int) -> Any:
    if isinstance(column, Ragged):
        return column.values[int(column.offsets[index]) : int(column.offsets[index + 1])]
    return column[index]


def split_rows(batch: Any, count: int) -> list[dict[str, Any]]:
    """A batch of ``count`` rows as a list of rows (``row_of`` each)."""
    return [row_of(batch, index) for index in range(count)]

"""What a batch holds where the data has nulls, and how decimals become numbers: the dataset's
``nulls=``, ``fill_values=`` and ``decimals=`` arguments (docs/types.md).

- ``nulls="raise"`` (default): a null in a column whose batch value is a tensor is an error,
  found at planning from the files' statistics where they carry null counts, else when read.
- ``nulls="fill"``: such nulls are replaced: integers and timestamps by 0, bools by False, floats
  and decimals (as float64) by NaN, unless ``fill_values={column: value}`` says otherwise; a null
  list row becomes an empty row (a fixed-size list row: a row of fill values). Strings and other
  Python values stay None.
- ``nulls="mask"``: as "fill", and each tensor column ``c`` also has a bool tensor ``"c.valid"``
  (True where the row's value is not null).

Fills are vectorised (``pyarrow.compute.fill_null`` / numpy), once per chunk in the worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    from ..formats._lazy import compute as pc  # imported when first used

NULL_POLICIES = ("raise", "fill", "mask")
DECIMAL_FORMS = ("float64", "int64")
MASK_SUFFIX = ".valid"

Where = Callable[[], str]


@dataclass(frozen=True)
class ColumnPolicy:
    """How nulls and decimals become batch values (picklable: workers get a copy)."""

    nulls: str = "raise"
    fill_values: Mapping[str, Any] = field(default_factory=dict)
    decimals: str = "float64"

    @property
    def masks(self) -> bool:
        return self.nulls == "mask"

    def fill_for(self, name: str, kind: pa.DataType) -> Any:
        """The value a null of column ``name`` (of numeric Arrow type ``kind``) becomes."""
        if name in self.fill_values:
            return self.fill_values[name]
        if pa.types.is_floating(kind):
            return math.nan
        return False if pa.types.is_boolean(kind) else 0


DEFAULT_POLICY = ColumnPolicy()


def check_policy(nulls: Any, fill_values: Any, decimals: Any) -> ColumnPolicy:
    """The arguments as a ColumnPolicy, or a ValueError naming the bad one."""
    if nulls not in NULL_POLICIES:
        raise ValueError(f"nulls must be one of {NULL_POLICIES}, got {nulls!r}")
    if decimals not in DECIMAL_FORMS:
        raise ValueError(f"decimals must be one of {DECIMAL_FORMS}, got {decimals!r}")
    if fill_values is not None and not isinstance(fill_values, Mapping):
        raise ValueError(f"fill_values must be a dict of column name -> number or bool, got {fill_values!r:.80}")
    fill_values = dict(fill_values or {})
    for name, value in fill_values.items():
        if not isinstance(name, str) or isinstance(value, (str, bytes)) or not isinstance(value, (bool, int, float, np.number)):
            raise ValueError(f"fill_values must map column names to numbers or bools, got {name!r}: {value!r}")
    if fill_values and nulls == "raise":
        raise ValueError("fill_values is used only with nulls='fill' or nulls='mask'; pass one of them too")
    return ColumnPolicy(nulls, fill_values, decimals)


class NullValuesError(ValueError):
    """Nulls in ``column`` found while reading with nulls="raise" (a tensor cannot hold them)."""

    def __init__(self, message: str, column: str | None = None, count: int = 0):
        super().__init__(message)
        self.column, self.count = column, count


def null_error(name: str, count: int, where: Where) -> NullValuesError:
    """The error for nulls found while reading with nulls="raise"."""
    return NullValuesError(
        f"column {name!r} has {count} null value(s) in {where()}; a tensor cannot hold nulls. Pass nulls='fill' "
        "(fill_values={column: value} for other values than 0 / False / NaN) or nulls='mask' for a validity mask, "
        "or leave the column out with columns=[...]",
        name,
        count,
    )


def filled(array: pa.Array, name: str, policy: ColumnPolicy, where: Where) -> pa.Array:
    """``array`` (integers, floats or bools) without nulls, under ``policy``."""
    if not array.null_count:
        return array
    if policy.nulls == "raise":
        raise null_error(name, array.null_count, where)
    value = policy.fill_for(name, array.type)
    try:
        return pc.fill_null(array, pa.scalar(value).cast(array.type))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as error:
        raise ValueError(f"fill_values[{name!r}] = {value!r} does not fit column {name!r} ({array.type}): {error}") from error


def valid_mask(array: pa.Array) -> np.ndarray:
    """True where ``array``'s row is not null (a bool numpy array)."""
    if not array.null_count:
        return np.ones(len(array), dtype=np.bool_)
    return array.is_valid().to_numpy(zero_copy_only=False)


def decimal_values(array: pa.Array, name: str, policy: ColumnPolicy, where: Where) -> pa.Array:
    """A decimal column as float64 (the nearest double to each value while its unscaled integer
    has at most 15 digits) or, with ``decimals="int64"``, its unscaled integers (value *
    10**scale) as int64."""
    raw, valid, fits = _unscaled(array)
    mask = ~valid if array.null_count else None
    if policy.decimals == "float64":
        scale = array.type.scale
        if not fits.all() or abs(scale) > _EXACT_POWERS_OF_TEN:
            return pc.cast(array, pa.float64(), safe=False)
        # an integer below 2**53 divided by an exact power of ten is rounded once, to the
        # nearest double; pyarrow's cast is not (0.41 would come as 0.41000000000000003)
        values = raw / 10.0**scale if scale >= 0 else raw * 10.0 ** (-scale)
        return pa.array(values, pa.float64(), mask=mask)
    if not fits.all():
        raise ValueError(
            f"column {name!r} ({array.type}) has a value in {where()} whose unscaled integer does not fit int64; "
            "read it with decimals='float64' (the default), or leave the column out with columns=[...]"
        )
    return pa.array(raw, pa.int64(), mask=mask)


_EXACT_POWERS_OF_TEN = 22  # 10**22 is the largest power of ten a double holds exactly


def _unscaled(array: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A decimal array's unscaled integers as int64 (where they fit), its validity, and where they fit."""
    words = array.type.bit_width // 64
    valid = valid_mask(array)
    if words == 0:  # decimal32: the unscaled integers as stored
        raw = np.frombuffer(array.buffers()[1], dtype=np.int32)[array.offset : array.offset + len(array)].astype(np.int64)
        return raw, valid, np.ones(len(array), dtype=bool)
    stored = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset * words : (array.offset + len(array)) * words]
    stored = stored.reshape(len(array), words)
    raw = stored[:, 0]
    high = stored[:, 1:]
    fits = (high == (raw >> 63)[:, None]).all(axis=1) | ~valid
    return raw, valid, fits

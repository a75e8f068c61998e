"""Batches in another form than torch's, and per-batch transforms, built where the chunk is read.

``output_format`` picks what a batch is:

- ``"torch"`` (default): a dict of tensors (``convert.py``);
- ``"numpy"``: a dict of numpy arrays. Numbers, booleans and temporal types as arrays of their
  numpy dtype (timestamps as ``datetime64``); fixed-size lists of numbers as N-D arrays; strings,
  binary, decimals, variable-length lists and structs as object arrays (``None`` for a null). A
  null number: with ``nulls="fill"`` or ``"mask"`` the fill value (and ``"c.valid"`` arrays with
  "mask", as for tensors); else, pyarrow's rule (an integer column becomes float64 with NaN, a
  fixed-size list with a null row an object array);
- ``"arrow"``: one ``pyarrow.RecordBatch``;
- ``"dict"``: a dict of Python lists (``RecordBatch.to_pydict()``).

A chunk in any of these forms (or with a transform) is sliced into batches where it is read,
in the DataLoader worker, so that the transform runs there. numpy and Arrow batches without a
transform then cross to the main process in the worker's shared buffers (packed_batches.py), as
torch chunks do; the others in the worker's pickle (no Python object per row except where a
column or the transform's result is one).
"""

from __future__ import annotations

import contextvars
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from ..errors import TransformError
from .convert import Where, slice_columns, table_to_columns
from .forms import holds_mask
from .nulls import DEFAULT_POLICY, MASK_SUFFIX, ColumnPolicy, filled, valid_mask

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    from ..formats._lazy import compute as pc  # imported when first used

OUTPUT_FORMATS = ("torch", "numpy", "arrow", "dict")


@dataclass(frozen=True)
class BatchOutput:
    """What a batch is: ``format`` (one of ``OUTPUT_FORMATS``), then ``transform`` applied to it."""

    batch_size: int
    format: str = "torch"
    transform: Callable[[Any], Any] | None = None

    @property
    def prepared(self) -> bool:
        """Whether chunks are sliced into finished batches where they are read (else the main
        process slices a torch chunk: the shared-memory path of transfer.py)."""
        return self.format != "torch" or self.transform is not None


#: False while a dataset is built for reader threads (create_dataloader's worker_mode="thread"):
#: its transform runs in this process, so it need not pickle
TRANSFORM_LEAVES_PROCESS: contextvars.ContextVar[bool] = contextvars.ContextVar("transform_leaves_process", default=True)


def check_output(output_format: Any, transform: Any, num_workers: int, batch_size: int) -> BatchOutput:
    """The checked ``output_format`` and ``transform``; ValueError / TypeError naming the argument."""
    if output_format not in OUTPUT_FORMATS:
        raise ValueError(f"output_format must be one of {OUTPUT_FORMATS}, got {output_format!r}")
    if transform is not None:
        if not callable(transform):
            raise TypeError(f"transform must be a callable taking a batch, got {type(transform).__name__} {transform!r:.60}")
        if num_workers > 0 and TRANSFORM_LEAVES_PROCESS.get():
            try:
                pickle.dumps(transform)
            except Exception as error:  # noqa: BLE001 - any pickling failure means the same to the user
                raise TypeError(
                    f"transform {transform!r:.80} cannot be pickled ({type(error).__name__}: {error}), and it runs in the "
                    f"DataLoader's worker processes (num_workers={num_workers}). Define it as a module-level function "
                    "or a class instance with picklable fields (not a lambda or a local function), or read in threads of "
                    "this process (create_dataloader(..., worker_mode='thread')) or with num_workers=0"
                ) from error
    return BatchOutput(batch_size, output_format, transform)


def batch_bounds(rows: int, size: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of each batch of ``rows`` rows read, in batches of ``size``."""
    for start in range(0, rows, size):
        yield start, min(start + size, rows)


def prepare_batches(
    table: pa.Table, output: BatchOutput, where: Where, copy: bool, batch_of: Callable[[int, int], str], policy: ColumnPolicy = DEFAULT_POLICY
) -> list[Any]:
    """The chunk ``table`` as finished batches: sliced, in ``output.format`` (torch tensors under the
    null and decimal ``policy``), transformed. ``copy``: False where the batches are pickled next (a
    DataLoader worker): torch tensors may stay views of ``table``, Arrow batches are compacted to
    their own rows; ``batch_of(start, stop)`` describes a batch for a transform's error."""
    if output.format == "torch":
        columns = table_to_columns(table, where, copy=copy, policy=policy)
        batches = [slice_columns(columns, start, stop, where) for start, stop in batch_bounds(table.num_rows, output.batch_size)]
    else:
        form = _form(output.format, policy, where)
        try:
            batches = [form(table.slice(start, stop - start)) for start, stop in batch_bounds(table.num_rows, output.batch_size)]
        except (UnicodeDecodeError, pa.ArrowException) as error:
            named = _not_utf8(table, where, error)
            if named is None:
                raise
            raise named from error
        except OverflowError as error:  # a date or duration beyond Python's datetime types
            raise ValueError(
                f"column {_overflowing(table)!r} holds a value that Python cannot hold ({error}) in {where()}: read it with "
                "output_format='torch', 'numpy' or 'arrow', or leave it out with columns=[...]"
            ) from error
        if output.format == "arrow" and not copy:
            batches = [_compact(batch) for batch in batches]
    if output.transform is None:
        return batches
    transformed = []
    for (start, stop), batch in zip(batch_bounds(table.num_rows, output.batch_size), batches):
        try:
            transformed.append(output.transform(batch))
        except Exception as error:  # noqa: BLE001 - re-raised naming the batch
            raise TransformError(f"transform {_name(output.transform)} raised {type(error).__name__}: {error} on {batch_of(start, stop)}") from error
    return transformed


def _name(function: Callable) -> str:
    return getattr(function, "__qualname__", None) or type(function).__qualname__


def to_record_batch(table: pa.Table) -> pa.RecordBatch:
    """``table`` as one RecordBatch (its chunks joined)."""
    batches = table.combine_chunks().to_batches()
    if len(batches) == 1:
        return batches[0]
    return pa.RecordBatch.from_arrays([pa.array([], type=field.type) for field in table.schema], schema=table.schema)


def _compact(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch holding only its own rows' bytes: pickling a slice of a larger batch writes the
    whole of its buffers (pyarrow 26), here the whole decoded chunk for every batch."""
    return batch.take(pa.array(np.arange(batch.num_rows)))


def to_numpy_columns(table: pa.Table, policy: ColumnPolicy = DEFAULT_POLICY, where: Where = lambda: "the batch") -> dict[str, np.ndarray]:
    """``table`` as a dict of numpy arrays (see the module's docstring for each type's form), the
    null ``policy`` applied to number, bool, temporal and fixed-size list columns."""
    columns = {}
    for name, column in zip(table.column_names, table.columns):
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        if pa.types.is_dictionary(array.type):
            array = array.dictionary_decode()
        masked = policy.masks and holds_mask(array.type)
        valid = valid_mask(array) if masked else None
        if policy.nulls != "raise" and _fillable(array.type):
            array = _filled_values(array, name, policy, where)
        columns[name] = _numpy(array)
        if valid is not None:
            columns[name + MASK_SUFFIX] = valid
    return columns


def _fillable(kind: pa.DataType) -> bool:
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):  # one level, as tensor batches' Ragged columns
        kind = kind.value_type
    while pa.types.is_fixed_size_list(kind):
        kind = kind.value_type
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind) or pa.types.is_temporal(kind)


def _filled_values(array: pa.Array, name: str, policy: ColumnPolicy, where: Where) -> pa.Array:
    """``array`` with its nulls filled, keeping its type; a null fixed-size list row becomes a row
    of fill values and a null variable-length list row an empty one, as in tensor batches."""
    kind = array.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        values = array.flatten()  # the values of the rows that are not null
        if not array.null_count and not values.null_count:
            return array
        lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32 if pa.types.is_list(kind) else np.int64)
        return type(array).from_arrays(pa.array(offsets), _filled_values(values, name, policy, where), type=kind)
    if pa.types.is_fixed_size_list(kind):
        values = array.values.slice(array.offset * kind.list_size, len(array) * kind.list_size)
        if array.null_count:
            rows = np.repeat(valid_mask(array), kind.list_size)
            values = pc.if_else(pa.array(rows), values, pa.nulls(len(values), values.type))
        return pa.FixedSizeListArray.from_arrays(_filled_values(values, name, policy, where), kind.list_size)
    if not array.null_count:
        return array
    if pa.types.is_temporal(kind):
        storage = pa.int64() if kind.bit_width == 64 else pa.int32()
        return filled(array.view(storage), name, policy, where).view(kind)
    return filled(array, name, policy, where)


def _numpy(array: pa.Array) -> np.ndarray:
    kind = array.type
    if pa.types.is_fixed_size_list(kind) and not array.null_count:
        shape = [len(array)]
        values = array
        while pa.types.is_fixed_size_list(values.type) and not values.null_count:
            size = values.type.list_size
            shape.append(size)
            values = values.values.slice(values.offset * size, len(values) * size)
        inner = values.type
        if pa.types.is_integer(inner) or pa.types.is_floating(inner) or pa.types.is_boolean(inner) or pa.types.is_temporal(inner):
            return _numpy(values).reshape(shape)
    if pa.types.is_struct(kind):
        return _objects(array.to_pylist())
    return array.to_numpy(zero_copy_only=False)


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _to_dict(table: pa.Table) -> dict[str, list]:
    return table.to_pydict()


_FORMS: dict[str, Callable[[pa.Table], Any]] = {"numpy": to_numpy_columns, "arrow": to_record_batch, "dict": _to_dict}


def _form(output_format: str, policy: ColumnPolicy, where: Where) -> Callable[[pa.Table], Any]:
    """What turns a table into one batch of ``output_format`` (numpy arrays under the null ``policy``)."""
    if output_format == "numpy":
        return lambda table: to_numpy_columns(table, policy, where)
    return _FORMS[output_format]


def _overflowing(table: pa.Table) -> str:
    """The first column whose values do not convert to Python objects ("?" when each does alone)."""
    for name, column in zip(table.column_names, table.columns):
        try:
            column.to_pylist()
        except OverflowError:
            return name
    return "?"


def _not_utf8(table: pa.Table, where: Where, error: Exception) -> ValueError | None:
    """The error naming the string column that holds bytes that are not UTF-8 (None: no such column)."""
    for name, column in zip(table.column_names, table.columns):
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            try:
                column.validate(full=True)
            except pa.ArrowInvalid:
                return ValueError(
                    f"column {name!r} of {where()} holds a string that is not valid UTF-8 ({error}); the file's writer stored bytes "
                    "under a string type. Fix the data, or leave the column out (columns=...)"
                )
    return None


def table_in_format(table: pa.Table, output_format: str, policy: ColumnPolicy = DEFAULT_POLICY) -> Any:
    """``table`` as one batch in ``output_format`` other than "torch" (numpy arrays that would be
    read-only views of ``table``'s buffers are copies)."""
    batch = _form(output_format, policy, lambda: "the rows read")(table)
    if output_format == "numpy":
        batch = {name: array if array.flags.writeable else array.copy() for name, array in batch.items()}
    return batch

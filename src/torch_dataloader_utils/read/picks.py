"""Rows picked out of decoded batches in another order, left unmoved until they are converted.

A shuffled window, and a mixture's window (its sources' rows interleaved), hands out its rows in
an order of its own. Gathering them into an Arrow table in that order and then converting the
table to tensors copies every value twice; a ``Picked`` instead records, per decoded batch, which
of its rows go to which output positions, and the conversion moves each value once, from the
batch straight into its place in the output tensor (``convert.Joined``'s scatter). Columns
whose conversion is not a plain view of the batch's values (nulls, strings, lists, bools,
decimals, widened integers) are gathered as before, each on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import torch

from .convert import Joined, Where, _column, table_to_joined
from .forms import batch_form, holds_mask
from .nulls import DEFAULT_POLICY, MASK_SUFFIX, ColumnPolicy

Rows_ = np.ndarray | slice  # rows of a batch: an index array, or a run


@dataclass
class Picked:
    """Output row ``dest[i][j]`` is row ``rows[i][j]`` of ``batches[batch[i]]`` (``num_rows`` in all)."""

    schema: pa.Schema
    batches: list[pa.RecordBatch]
    parts: list[tuple[int, Rows_, Rows_]]  # (batch, its rows, their output positions)
    num_rows: int

    def table(self) -> pa.Table:
        """The rows as a table in output order (two copies: a take per batch, then the reorder)."""
        pieces = [self.batches[b].slice(r.start, r.stop - r.start) if isinstance(r, slice) else self.batches[b].take(pa.array(r)) for b, r, _ in self.parts]
        dest = np.concatenate([_indices(d) for _, _, d in self.parts]) if self.parts else np.zeros(0, dtype=np.int64)
        if len(dest) == self.num_rows and bool(np.all(dest[1:] > dest[:-1])):
            return pa.Table.from_batches(pieces, schema=self.schema)
        inverse = np.empty(self.num_rows, dtype=np.int64)
        inverse[dest] = np.arange(self.num_rows)
        return pa.Table.from_batches(pieces, schema=self.schema).take(inverse)

    def shifted(self, batch_base: int, row_base: int) -> list[tuple[int, Rows_, Rows_]]:
        """The parts with batch indices and output positions moved on (when joined after others)."""
        return [(b + batch_base, r, _moved(d, row_base)) for b, r, d in self.parts]


def _indices(rows: Rows_) -> np.ndarray:
    return np.arange(rows.start, rows.stop, dtype=np.int64) if isinstance(rows, slice) else rows


def _moved(rows: Rows_, by: int) -> Rows_:
    return slice(rows.start + by, rows.stop + by) if isinstance(rows, slice) else rows + by


def run_of(rows: np.ndarray) -> Rows_:
    """``rows`` as a slice when it is one ascending run."""
    if len(rows) and int(rows[-1]) - int(rows[0]) == len(rows) - 1 and (len(rows) < 2 or bool(np.all(np.diff(rows) == 1))):
        return slice(int(rows[0]), int(rows[0]) + len(rows))
    return rows


def pick(table: pa.Table, rows: np.ndarray) -> Picked:
    """Rows ``rows`` of ``table`` (in this order), grouped by the batch that holds them."""
    batches = table.to_batches()
    bounds = np.cumsum([0] + [b.num_rows for b in batches])
    owner = np.searchsorted(bounds, rows, side="right") - 1
    if len(batches) <= np.iinfo(np.int16).max:
        owner = owner.astype(np.int16)  # a stable sort of 16-bit integers is a radix sort
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=len(batches))
    ends = np.cumsum(counts)
    local = rows[order] - bounds[owner[order]]
    parts = [(int(b), run_of(local[ends[b] - counts[b] : ends[b]]), run_of(order[ends[b] - counts[b] : ends[b]])) for b in np.flatnonzero(counts)]
    return Picked(table.schema, batches, parts, len(rows))


def join_picked(parts: Sequence[tuple[Picked | pa.Table, int]]) -> Picked:
    """Consecutive row ranges (each a Picked or a table in order, with its row count) as one Picked."""
    schema: pa.Schema | None = None
    batches: list[pa.RecordBatch] = []
    out: list[tuple[int, Rows_, Rows_]] = []
    base = 0
    for part, length in parts:
        if isinstance(part, Picked):
            schema = schema or part.schema
            out += part.shifted(len(batches), base)
            batches += part.batches
        else:
            schema = schema or part.schema
            at = 0
            for batch in part.to_batches():
                if batch.num_rows:
                    out.append((len(batches), slice(0, batch.num_rows), slice(base + at, base + at + batch.num_rows)))
                    batches.append(batch)
                    at += batch.num_rows
        base += length
    assert schema is not None
    return Picked(schema, batches, out, base)


def _scatters(field: pa.Field, policy: ColumnPolicy) -> bool:
    """Whether a column's values convert to a tensor that views the batch (so it can be scattered)."""
    kind = field.type
    while pa.types.is_fixed_size_list(kind):
        kind = kind.value_type
    plain = pa.types.is_integer(kind) and (pa.types.is_signed_integer(kind) or kind == pa.uint8()) or pa.types.is_floating(kind)
    return plain and batch_form(field.type) == "tensor" and not (policy.masks and holds_mask(field.type))


def picked_to_joined(picked: Picked, where: Where, policy: ColumnPolicy = DEFAULT_POLICY) -> dict[str, Any]:
    """``convert.table_to_joined`` of the picked rows: plain numeric columns as a ``Joined`` that
    scatters each batch's rows into place; the other columns gathered, then converted."""
    if not picked.parts:
        return table_to_joined(picked.table(), where, policy)
    used = sorted({b for b, _, _ in picked.parts})
    scattered = [
        i for i, field in enumerate(picked.schema)
        if _scatters(field, policy) and all(picked.batches[b].column(i).null_count == 0 for b in used)
    ]  # fmt: skip
    columns: dict[str, Any] = {}
    rest = [i for i in range(len(picked.schema)) if i not in scattered]
    if rest:  # (in schema order, each with its mask where nulls="mask" adds one)
        narrow = Picked(pa.schema([picked.schema.field(i) for i in rest]), [b.select(rest) for b in picked.batches], picked.parts, picked.num_rows)
        columns.update(table_to_joined(narrow.table(), where, policy))
    for i in scattered:
        name = picked.schema.field(i).name
        views = {b: _column(picked.batches[b].column(i), name, where, policy) for b in used}
        sample = next(iter(views.values()))
        scatter = tuple((views[b], _torch_rows(r), _torch_rows(d)) for b, r, d in picked.parts)
        columns[name] = Joined(sample.dtype, (picked.num_rows, *sample.shape[1:]), (), scatter)
    ordered = {}
    for name in picked.schema.names:
        ordered[name] = columns[name]
        if name + MASK_SUFFIX in columns:
            ordered[name + MASK_SUFFIX] = columns[name + MASK_SUFFIX]
    return ordered


def _torch_rows(rows: Rows_) -> slice | torch.Tensor:
    return rows if isinstance(rows, slice) else torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))

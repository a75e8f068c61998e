"""Checks of the selected columns at planning, each listing every column it finds at once, with
its type, the files it comes from and what fixes it: so a job stops before its first batch,
not hours in, and one error names everything to change."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ..catalog.schema import check_repeated_columns
from ..plan.columns import row_counts
from . import nested
from .forms import batch_form, batch_form_problem, holds_mask
from .nested import BatchColumn
from .nulls import MASK_SUFFIX, ColumnPolicy

_SHOWN = 20  # columns listed in one error before "and N more"
#: Column chunks whose statistics planning reads for null counts (pyarrow takes about 4 us for
#: one): past these, nulls in further files are found when their rows are read, as for files
#: without statistics, so that planning a very large dataset stays quick.
NULL_STATS_CHUNKS = 250_000


def _files_text(names: Sequence[str]) -> str:
    more = f" (and {len(names) - 1} more file{'s' if len(names) > 2 else ''})" if len(names) > 1 else ""
    return f"{names[0]}{more}"


def _listed(lines: list[str]) -> str:
    shown = lines[:_SHOWN] + ([f"... and {len(lines) - _SHOWN} more"] if len(lines) > _SHOWN else [])
    return "\n  " + "\n  ".join(shown)


def _holders(catalog: Any, top: str) -> list[str]:
    """The files (non-empty ones first) that hold top-level column ``top``."""
    missing = catalog.missing_columns or [()] * len(catalog.files)
    rows = row_counts(catalog.layouts).tolist()
    holding = [(rows[i] == 0, i) for i, lacks in enumerate(missing) if top not in lacks]
    return [catalog.files[i].url for _, i in sorted(holding, key=lambda item: item[0])] or [catalog.files[0].url]


def check_conflicts(catalog: Any, selected: Sequence[BatchColumn]) -> None:
    """ValueError for every selected column whose files' types do not unify."""
    tops = dict.fromkeys(c.top for c in selected)
    found = [catalog.conflicts[top] for top in tops if top in catalog.conflicts]
    if found:
        raise ValueError(found[0] if len(found) == 1 else f"{len(found)} selected columns have incompatible types:" + _listed(found))


def check_forms(catalog: Any, selected: Sequence[BatchColumn], every: Sequence[BatchColumn]) -> None:
    """TypeError listing every selected column a batch cannot hold (unions, intervals)."""
    bad = [c for c in selected if batch_form(c.type) is None]
    if not bad:
        return
    lines = [f"column {c.name!r} ({c.type}): {batch_form_problem(c.type)}; in {_files_text(_holders(catalog, c.top))}" for c in bad]
    names = {c.name for c in bad}
    keep = [c.name for c in (selected or every) if c.name not in names]
    fix = f"leave them out with columns={keep!r}, or cast them in the data" if keep else "cast them in the data"
    if len(bad) == 1:
        raise TypeError(f"{lines[0]}. A batch cannot hold it: {fix.replace('them', 'it')}")
    raise TypeError(f"{len(bad)} columns have no batch form:" + _listed(lines) + f"\nA batch cannot hold them: {fix}")


def check_missing(catalog: Any, selected: Sequence[BatchColumn], policy: ColumnPolicy) -> None:
    """ValueError listing selected tensor columns that non-empty files lack (they would be read
    as nulls) when nulls="raise"."""
    if policy.nulls != "raise" or not catalog.missing_columns:
        return
    lines = []
    rows = row_counts(catalog.layouts).tolist()
    for column in selected:
        if batch_form(column.type) not in ("tensor", "ragged"):
            continue
        lacking = [catalog.files[i].url for i, lacks in enumerate(catalog.missing_columns) if rows[i] and column.top in lacks]
        if lacking:
            lines.append(f"column {column.name!r} ({column.type}) is missing from {_files_text(lacking)}")
    if lines:
        fix = (
            "which a tensor cannot hold (a column a file stores with only nulls, as CSV files with an empty column "
            "are read, counts as missing). Pass nulls='fill' (or 'mask'), leave the column out with columns=[...], or add "
            "its values to those files."
        )
        if len(lines) == 1:
            raise ValueError(f"{lines[0]}: it would be read as nulls there, {fix}")
        raise ValueError(f"{len(lines)} columns are missing from some files:" + _listed(lines) + f"\nThey would be read as nulls there, {fix}")


def check_statistics_nulls(catalog: Any, selected: Sequence[BatchColumn], policy: ColumnPolicy) -> None:
    """ValueError listing every selected tensor column that the files' statistics say holds
    nulls, when nulls="raise" (formats without a ``null_counts`` are checked as rows are read)."""
    if policy.nulls != "raise":
        return
    names = [c.name for c in selected if batch_form(c.type) == "tensor" and not pa.types.is_fixed_size_list(c.type) and all(isinstance(s, int) for s in c.path)]
    if not names:
        return
    found: dict[str, list[tuple[str, int]]] = {}
    budget = NULL_STATS_CHUNKS
    kept_nulls = catalog.nulls or [None] * len(catalog.files)
    rows = row_counts(catalog.layouts).tolist()
    for file, (footer, file_nulls) in enumerate(zip(catalog.footers, kept_nulls)):
        if not rows[file]:
            continue
        if footer is None:  # the counts kept at planning; none for a file planned from the plan cache (checked when read)
            counts = {name: file_nulls[name] for name in names if name in file_nulls} if file_nulls else {}
        else:
            counts_of = getattr(catalog.format_of(file), "null_counts", None)  # a mixture's sources may differ
            if counts_of is None:
                continue
            budget -= len(catalog.layouts[file].unit_rows) * len(names)
            if budget < 0:
                break
            counts = counts_of(footer, names)
        for name, count in counts.items():
            if count:
                found.setdefault(name, []).append((catalog.files[file].url, count))
    if not found:
        return
    lines = [
        f"column {name!r} has {sum(c for _, c in files):,} null value(s) in "
        + (files[0][0] if len(files) == 1 else f"{len(files):,} files, {files[0][1]:,} in {_files_text([url for url, _ in files])}")
        for name, files in sorted(found.items(), key=lambda item: names.index(item[0]))
    ]
    raise ValueError(
        "the files' statistics show nulls in column(s) whose batch value is a tensor, which cannot hold nulls:"
        + _listed(lines)
        + "\nPass nulls='fill' (0 / False / NaN, or fill_values={column: value}) or nulls='mask' (also a "
        "'<column>.valid' bool tensor), or leave the column(s) out with columns=[...]"
    )


def check_mask_names(selected: Sequence[BatchColumn], policy: ColumnPolicy) -> None:
    """ValueError when a mask's name ("<column>.valid") is a column's name too."""
    if not policy.masks:
        return
    names = {c.name for c in selected}
    clashes = [c.name for c in selected if holds_mask(c.type) and c.name + MASK_SUFFIX in names]
    if clashes:
        raise ValueError(
            f"nulls='mask' would name the masks of {clashes} like existing columns ('<column>{MASK_SUFFIX}'); "
            "leave one of them out with columns=[...]"
        )


def check_batch_names(selected: Sequence[BatchColumn]) -> None:
    """ValueError when two batch columns would have one name: a top-level column named like a
    struct's leaf or a map's part ("st.a" beside a struct "st" with a field "a")."""
    seen: dict[str, BatchColumn] = {}
    for column in selected:
        other = seen.setdefault(column.name, column)
        if other is not column:
            raise ValueError(
                f"two columns of the batches would be named {column.name!r}: {_described(other)} and {_described(column)}. "
                "Leave one of them out with columns=[...], or rename one in the data"
            )


def _described(column: BatchColumn) -> str:
    return f"the top-level column {column.top!r}" if not column.path else f"a leaf of the column {column.top!r}"


def check_fill_names(every: Sequence[BatchColumn], policy: ColumnPolicy) -> None:
    """ValueError when ``fill_values`` names a column that no batch has (a typo would otherwise
    leave that column's nulls at the default fill)."""
    names = [c.name for c in every]
    unknown = [key for key in policy.fill_values if key not in names]
    if not unknown:
        return
    parents = sorted({key for key in unknown if any(name.startswith(f"{key}.") for name in names)})
    leaves = [name for name in names if any(name.startswith(f"{parent}.") for parent in parents)]
    hint = f"; a struct's or map's nulls are filled per leaf: {leaves}" if parents else ""
    raise ValueError(f"fill_values names column(s) {unknown} that the files do not have{hint}. The batch columns are {names}")


def checked_selection(catalog: Any, columns: list[str] | None, tensors: bool, policy: ColumnPolicy, nulls_apply: bool = False) -> list[BatchColumn] | None:
    """The batch columns ``columns`` select from ``catalog`` (None: the catalog has no schema),
    after every check planning can make: types that do not unify, repeated columns; where
    ``nulls=`` applies (``nulls_apply``: tensors and numpy), the names of fill values and masks;
    for batches of tensors (``tensors``), columns without a batch form, missing columns and nulls
    the statistics show."""
    if catalog.schema is None:
        return None
    selected = nested.select(catalog.schema, columns)
    if not row_counts(catalog.layouts).any():
        return selected  # nothing will be converted (files without rows may type a column as null)
    check_conflicts(catalog, selected)
    check_repeated_columns(catalog.schema, nested.top_columns(selected), catalog.repeated_columns)
    check_batch_names(selected)
    every = nested.batch_columns(catalog.schema) if tensors or nulls_apply else []
    if tensors or nulls_apply:
        check_fill_names(every, policy)
        check_mask_names(selected, policy)
    if tensors:  # the other forms hold every type, and nulls
        check_forms(catalog, selected, every)
        check_missing(catalog, selected, policy)
        if catalog.row_filter is None:  # statistics count the nulls of rows a filter may leave out
            check_statistics_nulls(catalog, selected, policy)
    return selected

"""Mixtures: ``Source`` (one dataset of a mixture and its share) and the catalog of several.

Each source is catalogued as a dataset of its own (files, footers, its schema), then the
catalogs are laid end to end: file ``i`` of the mixture is a file of one source, read with that
source's filesystem and format. The output columns are the union of the sources' columns after
``columns=`` projection, unified by the rule of catalog/schema.py.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pyarrow as pa

from ..formats import FileFormat
from ..plan.mixing import MixtureBook, MixturePlan, SourceLayout, allocate_rows
from ..plan.mixing_canonical import CanonicalMixtureBook
from ..plan.splits import MAX_ROW_COUNT, Split
from ..plan.streams import SplitRows
from ..storage.remote import IOOptions
from .build import Catalog, build_catalog
from .filter_prune import row_filter
from .schema import check_missing_columns, missing_columns, unify
from .sources import SourceOptions


class Source:
    """One dataset of a mixture: ``path`` (a file, directory, glob or list, as for a plain
    dataset) and its share of every epoch.

    ``rows_per_epoch=n``: exactly n rows per epoch (more than the source has: upsampled, every
    row appearing floor or ceil of n / rows times; fewer: consecutive epochs walk through the
    source). ``weight=w``: a share of ``epoch_rows`` proportional to w. Neither: all its rows
    once. ``format`` (default: the dataset's) and ``storage_options`` apply to this source.
    """

    def __init__(
        self,
        path: str | Sequence[str],
        *,
        format: str | None = None,
        rows_per_epoch: int | None = None,
        weight: float | None = None,
        storage_options: dict | None = None,
    ):
        if rows_per_epoch is not None:
            if isinstance(rows_per_epoch, bool) or not isinstance(rows_per_epoch, numbers.Integral) or not 1 <= rows_per_epoch <= MAX_ROW_COUNT * 2**31:
                raise ValueError(f"Source rows_per_epoch must be a positive integer, got {rows_per_epoch!r} (source {path!r})")
            rows_per_epoch = int(rows_per_epoch)
        if weight is not None:
            if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight) or weight <= 0:
                raise ValueError(f"Source weight must be a positive finite number, got {weight!r} (source {path!r})")
            weight = int(weight) if isinstance(weight, numbers.Integral) else float(weight)  # NumPy's: exact shares, JSON states
        if rows_per_epoch is not None and weight is not None:
            raise ValueError(f"Source {path!r} has both rows_per_epoch and weight; pass one of them")
        # str paths (a PathLike too, as a plain dataset takes): a state records the path as JSON
        self.path = os.fspath(path) if isinstance(path, os.PathLike) else [os.fspath(p) for p in path] if isinstance(path, (list, tuple)) else path
        self.format = format
        self.rows_per_epoch = rows_per_epoch
        self.weight = weight
        self.storage_options = storage_options

    def __repr__(self) -> str:
        shares = {k: v for k, v in (("rows_per_epoch", self.rows_per_epoch), ("weight", self.weight)) if v is not None}
        extra = "".join(f", {k}={v!r}" for k, v in (("format", self.format), *shares.items()) if v is not None)
        return f"Source({self.path!r}{extra})"


def is_mixture(path: Any) -> bool:
    """Whether ``path`` is a Source or a list of them (TypeError for a list mixing them with paths)."""
    if isinstance(path, Source):
        return True
    if isinstance(path, (list, tuple)) and any(isinstance(p, Source) for p in path):
        if not all(isinstance(p, Source) for p in path):
            raise TypeError("pass a list of paths or a list of Source(...), not both: wrap every path of a mixture in Source(path)")
        return True
    return False


@dataclass
class MixCatalog(Catalog):
    """The catalogs of a mixture's sources laid end to end, and the mixture's plan."""

    stores: list[Any] = field(default_factory=list)  # per file: its source's filesystem
    formats: list[FileFormat] = field(default_factory=list)  # per file: its source's format
    sources: list[dict] = field(default_factory=list)  # per source: what a state records of it
    plan: MixturePlan | None = None
    unfiltered: Catalog | None = None  # with filters=: the same files with all their rows (random access numbers those)

    def fs_of(self, file: int) -> Any:
        return self.stores[file]

    def format_of(self, file: int) -> FileFormat:
        return self.formats[file]

    def splits_at(self, epoch: int) -> Sequence[Split]:
        assert self.plan is not None
        return self.plan.epoch(epoch).splits


def _label(index: int, source: Source) -> str:
    return f"source {index} ({source.path if isinstance(source.path, str) else ', '.join(map(str, source.path))})"


def _check_source_columns(index: int, source: Source, catalog: Catalog, columns: Sequence[str] | None) -> pa.Schema | None:
    """The source's schema projected to ``columns``; ValueError naming the source and a column it lacks."""
    schema = catalog.schema
    if schema is None or columns is None:
        return schema
    lacking = [c for c in columns if c not in schema.names]
    if lacking:
        raise ValueError(
            f"{_label(index, source)} has no column {lacking[0]!r} (columns=[...] asks for it); its columns are "
            f"{schema.names}. Every source of a mixture must hold every selected column: leave it out of columns=[...] or add it to the source"
        )
    return pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)


def check_mixture_arguments(path: Any, epoch_rows: Any) -> int | None:
    """``epoch_rows``; ValueError when a plain dataset is given it."""
    if not is_mixture(path):
        if epoch_rows is not None:
            raise ValueError("epoch_rows= applies to a mixture: pass a list of Source(path, weight=...) instead of paths")
        return None
    return epoch_rows


def mixture_book(catalog: Catalog, lanes: int | None = None) -> MixtureBook | None:
    """The stream book of a mixture's catalog (None for any other catalog); with ``lanes``, one
    that also serves its canonical lanes."""
    if not isinstance(catalog, MixCatalog) or catalog.plan is None:
        return None
    return MixtureBook(catalog.plan) if lanes is None else CanonicalMixtureBook(catalog.plan, lanes=lanes)


@dataclass(frozen=True)
class MixtureSettings:
    """How a mixture is planned: the dataset's settings that apply to every source.

    ``format`` and ``storage_options`` are for sources without their own. With ``filters``,
    ``count_filtered(catalog, filters)`` (read/filtering.py) plans each source over the rows the
    filter matches, and the sources' shares are of those rows. ``canonical_lanes``: plan the
    epoch's blocks for that many canonical lanes (plan/mixing_canonical.py). ``nulls_ok``: the
    batches hold nulls (nulls="fill" / "mask", or not tensors), so a source may lack a number column.
    """

    split_bytes: int
    format: str | None = None
    storage_options: dict | None = None
    split_rows: int | None = None
    source_options: SourceOptions | None = None
    io: IOOptions = field(default_factory=IOOptions)
    columns: Sequence[str] | None = None
    epoch_rows: int | None = None
    shuffle: bool = False
    shuffle_seed: int = 0
    shuffle_buffer_rows: int = 0
    filters: Any = None
    count_filtered: Callable[[Catalog, Any], Catalog] | None = None
    canonical_lanes: int | None = None
    nulls_ok: bool = False
    skip_unreadable: bool = False  # on_error="skip": files that cannot be read are left out at planning


def build_mixture_catalog(sources: Source | Sequence[Source], settings: MixtureSettings) -> MixCatalog:
    """Catalogue every source, unify their schemas and plan the mixture."""
    sources = [sources] if isinstance(sources, Source) else list(sources)
    if not sources:
        raise ValueError("a mixture needs at least one Source")
    epoch_rows, columns, filters = settings.epoch_rows, settings.columns, settings.filters
    if epoch_rows is not None and (isinstance(epoch_rows, bool) or not isinstance(epoch_rows, numbers.Integral) or epoch_rows < 1):
        raise ValueError(f"epoch_rows must be a positive integer, got {epoch_rows!r}")
    catalogs = [
        build_catalog(
            s.path, settings.format if s.format is None else s.format,
            settings.storage_options if s.storage_options is None else s.storage_options,
            settings.split_bytes, settings.io, settings.split_rows, settings.source_options, settings.skip_unreadable,
        )  # fmt: skip
        for s in sources
    ]
    labels = [_label(i, s) for i, s in enumerate(sources)]
    read_columns = columns
    if filters is not None:  # every source must hold the filter's columns; they are read with the selected ones
        needed = [name for label, catalog in zip(labels, catalogs) for name in _filter_columns(label, catalog, filters)]
        read_columns = None if columns is None else [*columns, *dict.fromkeys(n for n in needed if n not in columns)]
    projected = [_check_source_columns(i, s, c, read_columns) for i, (s, c) in enumerate(zip(sources, catalogs))]
    known = [(schema, label) for schema, label in zip(projected, labels) if schema is not None]
    try:
        unified = unify([s for s, _ in known], [label for _, label in known], noun="source") if known else None
    except ValueError as error:
        raise ValueError(f"the mixture's {error}") from None
    stored = catalogs
    if filters is not None:
        if settings.count_filtered is None:
            raise RuntimeError("internal error: a mixture with filters was planned without the counting pass")
        catalogs = [settings.count_filtered(catalog, filters) for catalog in catalogs]
    sizes = [sum(layout.num_rows for layout in c.layouts) for c in catalogs]
    if unified is not None and not settings.nulls_ok:
        lacks = [missing_columns(s, unified) if s is not None else tuple(unified.names) for s in projected]
        check_missing_columns(unified, read_columns, lacks, list(zip(labels, sizes)))
    rows = allocate_rows(sizes, [s.rows_per_epoch for s in sources], [s.weight for s in sources], None if epoch_rows is None else int(epoch_rows))
    empty = [label for label, size in zip(labels, sizes) if size == 0]
    if empty:
        matching = f" that match filters={filters!r}" if filters is not None else ""
        raise ValueError(f"{empty[0]} has no rows{matching}, so it cannot contribute rows to an epoch; leave it out of the mixture")
    mixture = _combine(sources, catalogs, unified, rows, settings)
    if filters is not None:
        mixture.row_filter = row_filter(filters, unified)  # the filter on the columns as read (conformed to the unified schema)
        mixture.source_layouts = [layout for c in catalogs for layout in (c.source_layouts or c.layouts)]
        mixture.unfiltered = _combine(sources, stored, unified, rows, settings)
    return mixture


def _filter_columns(label: str, catalog: Catalog, filters: Any) -> tuple[str, ...]:
    """The columns ``filters`` reads, checked against one source (ValueError naming the source)."""
    try:
        return tuple(row_filter(filters, catalog.schema).columns)
    except ValueError as error:
        raise ValueError(f"{label}: {error}") from None


def _combine(
    sources: Sequence[Source],
    catalogs: Sequence[Catalog],
    unified: pa.Schema | None,
    rows: Sequence[int],
    settings: MixtureSettings,
) -> MixCatalog:
    """The sources' catalogs laid end to end (file indices shifted), with the mixture's plan."""
    files: list[Any] = []
    split_rows: list[SplitRows] = []
    missing: list[tuple[str, ...]] = []
    layouts, described = [], []
    for index, (source, catalog) in enumerate(zip(sources, catalogs)):
        own = [SplitRows(r.file + len(files), r.start, r.stop) for r in catalog.split_rows]
        layouts.append(SourceLayout(tuple(own), tuple(s.path for s in catalog.splits), rows[index]))
        split_rows += own
        files += catalog.files
        names = set() if catalog.schema is None else set(catalog.schema.names)
        for file in range(len(catalog.files)):
            lacking = catalog.missing_columns[file] if catalog.missing_columns else ()
            missing.append(() if unified is None else tuple(n for n in unified.names if n in lacking or n not in names))
        described.append(
            {
                "path": source.path if isinstance(source.path, str) else list(source.path),
                "format": catalog.format.name,
                "rows": sum(layout.num_rows for layout in catalog.layouts),
                "rows_per_epoch": rows[index],
                "weight": source.weight,
            }
        )
    repeated: dict[str, tuple[str, int]] = {}
    for catalog in catalogs:
        for name, found in catalog.repeated_columns.items():
            repeated.setdefault(name, found)
    offsets = [o for c in catalogs for o in c.file_offsets]
    s = settings
    plan = MixturePlan(layouts, offsets, s.shuffle, s.shuffle_seed, s.shuffle_buffer_rows, s.canonical_lanes)
    return MixCatalog(
        catalogs[0].fs, catalogs[0].format, files, [x for c in catalogs for x in c.layouts], [x for c in catalogs for x in c.footers],
        [x for c in catalogs for x in c.splits], split_rows, offsets, s.split_bytes, unified, missing, repeated,
        stores=[c.fs for c in catalogs for _ in c.files], formats=[c.format for c in catalogs for _ in c.files],
        sources=described, plan=plan, max_split_rows=catalogs[0].max_split_rows,
        nulls=[x for c in catalogs for x in (c.nulls or [None] * len(c.files))], unreadable=tuple(x for c in catalogs for x in c.unreadable),
    )  # fmt: skip

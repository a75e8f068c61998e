"""The catalog: files, their footers and the split plan, built once per dataset.

Footers of local files are read one after another while that is fast, the rest in parallel
threads; with ``cache_dir`` what planning needs of them is kept in a plan cache
(plan_cache.py). The catalog keeps per file only what the plan needs (its layout and
fingerprint): a local file's footer is read again by the worker that opens the file (from
the page cache, and checked to be the planned version first), so neither the main process
nor the copy of the catalog each worker receives holds 100,000 footers. Remote files keep
their footers (their tails were fetched at planning, and fetching them again costs a
request per file): Parquet ones as their bytes (``KeptFooter``, a tenth of pyarrow's parsed
form), parsed again where a file is opened.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import UnsupportedFileError
from ..formats import FileFormat, get_format
from ..formats._parquet_tail import metadata
from ..plan.columns import LayoutTable, plan_split_table
from ..plan.splits import FileLayout, Split
from ..plan.streams import SplitRows
from ..storage.paths import is_local, is_remote
from ..storage.remote import IOOptions, open_store
from ..storage.versions import FileEntry
from .arrow_tails import arrow_tails
from .discovery import as_path_list, discover_files, filesystem_for, infer_format
from .file_table import FileTable
from .footers import read_footers, reopens_footers, without_unreadable
from .partitions import PartitionedFormat
from .plan_cache import PlanCache, cache_for
from .progress_bar import planning_started, progress, waiting
from .schema import missing_columns, repeated_columns, unify
from .shared_footers import shared_footers
from .sources import SourceOptions, prepare_source

log = logging.getLogger(__name__)
@dataclass
class Catalog:
    fs: Any
    format: FileFormat
    files: Sequence[FileEntry]  # a FileTable when planned here (a mixture's: a list)
    layouts: Sequence[FileLayout]  # a LayoutTable when planned here
    footers: Sequence[Any]  # per file: the footer for ``format.open``; None for local files (read again on open)
    splits: Sequence[Split]  # a SplitTable when planned here
    split_rows: Sequence[SplitRows]
    file_offsets: Sequence[np.ndarray]
    split_bytes: int
    schema: pa.Schema | None = None  # all files' schemas unified (schema.py); pieces are conformed to it
    missing_columns: list[tuple[str, ...]] = field(default_factory=list)  # per file: unified columns it lacks
    repeated_columns: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (a file holding it twice or more, count)
    row_filter: Any = None  # a filter_prune.RowFilter: layouts then count the rows that match, and readers keep only those
    source_layouts: Sequence[FileLayout] | None = None  # with a row filter: the files' own row counts (layouts: the matching rows)
    max_split_rows: int | None = None  # split_rows: the most rows of a split (None: no limit)
    conflicts: dict[str, str] = field(default_factory=dict)  # column -> why its files' types do not unify (raised if selected)
    # per file whose footer is not kept: the columns its statistics say hold nulls (None: unknown, or the footer is kept)
    nulls: list[dict[str, int] | None] | None = None
    unreadable: tuple[tuple[str, str], ...] = ()  # (url, why) of files left out at planning (on_error="skip")

    @property
    def fingerprint(self) -> list[list]:
        """(url, size, tag) of every file, in plan order: what a checkpoint is checked against."""
        if isinstance(self.files, FileTable):
            return self.files.fingerprint()
        return [[f.url, f.size, f.tag] for f in self.files]

    def footer(self, index: int) -> Any:
        """File ``index``'s footer: the one kept (parsed, for a remote Parquet file's
        ``KeptFooter``), or read again (local Parquet and ORC files keep none, see
        ``reopens_footers``) for statistics that planning checks."""
        footer = self.footers[index]
        if footer is None:
            entry = self.files[index]
            footer = self.format_of(index).read_footer(self.fs, entry.fs_path, entry.size, entry.url)[1]
        return metadata(footer)

    @property
    def files_digest(self) -> str:
        return hashlib.sha256(json.dumps(self.fingerprint).encode()).hexdigest()[:16]

    def fs_of(self, file: int) -> Any:
        """The filesystem file ``file`` is read from (a mixture's sources may have their own)."""
        return self.fs

    def format_of(self, file: int) -> FileFormat:
        return self.format

    def splits_at(self, epoch: int) -> Sequence[Split]:
        """The splits the pieces of ``epoch`` refer to (a mixture's change with the epoch)."""
        return self.splits


def replanned(catalog: Catalog, layouts: Sequence[FileLayout]) -> Catalog:
    """``catalog`` with other row counts per unit (a row filter's) and the splits planned from them."""
    paths = catalog.layouts.paths if isinstance(catalog.layouts, LayoutTable) else None
    table = LayoutTable(layouts, paths)
    splits = plan_split_table(table, catalog.split_bytes, catalog.max_split_rows)
    return replace(catalog, layouts=table, splits=splits, split_rows=splits.rows, file_offsets=table.offsets)


class _SharedSchemas:
    """Gives a file's schema as the previous file's object when they are equal, so that files
    written alike share one schema object (unify and missing_columns then work once)."""

    def __init__(self) -> None:
        self._last: pa.Schema | None = None

    def __call__(self, schema: pa.Schema) -> pa.Schema:
        if self._last is not None and schema.equals(self._last, check_metadata=True):
            return self._last
        self._last = schema
        return schema


def _young_collected(items: Iterable[Any], every: int = 4096) -> Iterator[Any]:
    """The items, with the collector's young generations swept every ``every`` items: with the
    collector paused, a footer read's reference cycles (pyarrow's file objects) would otherwise
    live until planning ends (900 MB at 100,000 files); the sweep costs only what is young."""
    for count, item in enumerate(items, 1):
        yield item
        if count % every == 0:
            gc.collect(1)


@contextlib.contextmanager
def _prefetched_tails(fs: Any, entries: Sequence[FileEntry]) -> Iterator[None]:
    """While planning: every remote file's tail fetched in one concurrent batch (footers live
    there); nothing for local files."""
    if not is_remote(fs):
        yield
        return
    with waiting(len(entries), "fetching footers"):  # one concurrent batch: its requests report no progress
        fs.prefetch_tails(entries, arrow_tails(fs))
    try:
        yield
    finally:
        fs.drop_tails()


def build_catalog(
    path: str | Sequence[str],
    format: str | None,
    storage_options: dict | None,
    split_bytes: int,
    io_options: IOOptions | None = None,
    split_rows: int | None = None,
    source: SourceOptions | None = None,
    skip_unreadable: bool = False,
) -> Catalog:
    """Discover files, read every footer once (in parallel) and plan the splits (of at most
    ``split_bytes`` bytes and ``split_rows`` rows). ``source``: the format's options and the
    directory layout (catalog/sources.py). ``skip_unreadable`` (on_error="skip"): a file that
    cannot be read as the format is left out (``Catalog.unreadable``) instead of raising."""
    # Planning creates a few objects per file and frees none: the cyclic collector would walk
    # them all again and again (at 100,000 files it doubled planning time), for no garbage.
    collecting = gc.isenabled()
    gc.disable()
    try:
        with planning_started():
            return _build(path, format, storage_options, split_bytes, io_options, split_rows, source or SourceOptions(), skip_unreadable)
    finally:
        if collecting:
            gc.enable()


def _build(
    path: str | Sequence[str],
    format: str | None,
    storage_options: dict | None,
    split_bytes: int,
    io_options: IOOptions | None,
    split_rows: int | None,
    source: SourceOptions,
    skip_unreadable: bool,
) -> Catalog:
    paths = as_path_list(path)
    fs = open_store(filesystem_for(paths, storage_options), io_options)
    if format is not None:
        get_format(format)  # an unknown format is a usage error, not "no files found"
    files = discover_files(paths, fs, format)
    fmt = get_format(format or infer_format(files))
    fmt, files = prepare_source(fmt, fs, paths, files, source, split_bytes, split_rows, io_options)
    name = f"{fmt.name}+hive" if isinstance(fmt, PartitionedFormat) else fmt.name
    cache = cache_for(io_options.cache_dir if io_options else None, paths, name, is_local(fs)) if reopens_footers(fmt) else None
    return catalog_of_files(fs, fmt, files, split_bytes, split_rows, cache, skip_unreadable)


def _stored_schemas(hive: PartitionedFormat, schemas: Sequence[pa.Schema]) -> list[pa.Schema]:
    """Each file's schema without the partition columns, one object per distinct schema object
    (files written alike share one, and the plan cache keeps one entry per object)."""
    stored: dict[int, pa.Schema] = {}
    out = []
    for schema in schemas:
        found = stored.get(id(schema))
        if found is None:
            found = stored[id(schema)] = hive.stored_schema(schema)
        out.append(found)
    return out


def catalog_of_files(
    fs: Any,
    fmt: FileFormat,
    files: list[FileEntry],
    split_bytes: int,
    split_rows: int | None = None,
    cache: PlanCache | None = None,
    skip_unreadable: bool = False,
) -> Catalog:
    """The catalog of files already found (a table's snapshot lists its own): footers, schema, splits."""
    cached = cache.lookup(files) if cache else [None] * len(files)
    unread = [entry for entry, known in zip(files, cached) if known is None]
    # Kept per file in one list per field, not a tuple per file: tuples held to the end of
    # planning and freed then would leave the memory of 100,000 of them scattered among the
    # objects the plan keeps, which the allocator cannot hand back.
    layouts: list[FileLayout] = []
    footers: list[Any] = []
    schemas: list[pa.Schema] = []
    nulls: list[dict[str, int] | None] = []
    shared = _SharedSchemas()
    hive = fmt if isinstance(fmt, PartitionedFormat) else None  # (the cache keeps schemas as files store them)
    with_partitions: dict[int, tuple[pa.Schema, pa.Schema]] = {}  # id of a cached schema -> it, with the partition columns
    unreadable: list[tuple[FileEntry, ValueError]] = []
    with _prefetched_tails(fs, unread):
        read = _young_collected(progress(read_footers(fmt, fs, unread, skip_unreadable), len(unread), "reading footers"))
        for entry, known in zip(files, cached):
            if known is None:
                found = next(read)
                if isinstance(found, ValueError):
                    unreadable.append((entry, found))
                    continue
                layout, footer, file_schema, file_nulls = found
                file_schema = shared(file_schema)
            else:
                (layout, file_schema), footer, file_nulls = known, None, None
                if hive is not None:
                    found = with_partitions.get(id(file_schema))
                    if found is None:
                        try:
                            found = with_partitions[id(file_schema)] = (file_schema, shared(hive.with_partitions(file_schema)))
                        except UnsupportedFileError as error:
                            raise UnsupportedFileError(f"cannot read {entry.url}: {error}.") from error
                    file_schema = found[1]
                    file_nulls = hive.partition_nulls(entry.url, layout.num_rows) or None  # (the file's own: found when read)
            layouts.append(layout)
            footers.append(footer)
            schemas.append(file_schema)
            nulls.append(file_nulls)
    if unreadable:
        files = without_unreadable(files, unreadable)
    if cache and unread:
        cache.store(files, list(zip(layouts, _stored_schemas(hive, schemas) if hive is not None else schemas)))
    log.debug("footers: %d read, %d from the plan cache", len(unread), len(files) - len(unread))
    conflicts: dict[str, str] = {}
    # a file without rows holds no value that needs a wider type (pandas writes an empty frame's
    # columns as float64): it types no column, unless every file is empty
    typed = [i for i, layout in enumerate(layouts) if layout.num_rows] or range(len(files))
    schema = unify([schemas[i] for i in typed], [files[i].url for i in typed], conflicts)
    advice = getattr(fmt, "schema_advice", None)  # a text format's inferred types: its options can fix them
    if advice:
        conflicts = {name: f"{why} {advice}" for name, why in conflicts.items()}
    first_with: dict[int, tuple[pa.Schema, str]] = {}  # per distinct schema object: it and its first file
    for file_schema, entry in zip(schemas, files):
        first_with.setdefault(id(file_schema), (file_schema, entry.url))
    lacking = {key: missing_columns(s, schema) for key, (s, _) in first_with.items()}
    missing = [lacking[id(s)] for s in schemas]
    repeated = repeated_columns([s for s, _ in first_with.values()], [url for _, url in first_with.values()])
    del schemas
    # The per-file records kept as columns (plan/columns.py): the objects read above are freed
    # together when planning returns, so the allocator can hand their memory back.
    table = FileTable(files)
    kept = LayoutTable(layouts, table.urls)
    del layouts
    splits = plan_split_table(kept, split_bytes, split_rows)
    log.debug("planned %d splits over %d files", len(splits), len(files))
    return Catalog(
        fs, fmt, table, kept, shared_footers(footers), splits, splits.rows, kept.offsets, split_bytes,
        schema, missing, repeated, conflicts=conflicts, max_split_rows=split_rows, nulls=nulls,
        unreadable=tuple((entry.url, str(error)) for entry, error in unreadable),
    )

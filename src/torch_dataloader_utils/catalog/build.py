"""The catalog: files, their footers and the split plan, built once per dataset.

Footers of local files are read one after another while that is fast, the rest in parallel
threads. The catalog is pickled to DataLoader workers together with the dataset, so workers
never read a footer again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import RemoteReadError, UnsupportedFileError
from ..formats import FileFormat, get_format
from ..plan.splits import FileLayout, Split, plan_splits
from ..plan.streams import SplitRows, unit_offsets
from ..storage.paths import is_local, is_remote
from ..storage.remote import IOOptions, open_store
from ..storage.versions import FileEntry
from .discovery import as_path_list, discover_files, filesystem_for, format_for_path, infer_format
from .progress_bar import progress
from .schema import missing_columns, repeated_columns, unify
from .sources import SourceOptions, prepare_source

log = logging.getLogger(__name__)
_FOOTER_THREADS = 32
#: A local footer read slower than this sends the remaining files to the thread pool. A footer
#: read from the page cache is fast, and then one thread is faster than a pool (whose threads
#: contend for the GIL); a slow read means storage latency (a network file system), which
#: threads overlap.
SLOW_LOCAL_FOOTER_S = 0.002


@dataclass
class Catalog:
    fs: Any
    format: FileFormat
    files: list[FileEntry]
    layouts: list[FileLayout]
    footers: list[Any]
    splits: list[Split]
    split_rows: list[SplitRows]
    file_offsets: list[np.ndarray]
    split_bytes: int
    schema: pa.Schema | None = None  # all files' schemas unified (schema.py); pieces are conformed to it
    missing_columns: list[tuple[str, ...]] = field(default_factory=list)  # per file: unified columns it lacks
    repeated_columns: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (a file holding it twice or more, count)
    row_filter: Any = None  # a filter_prune.RowFilter: layouts then count the rows that match, and readers keep only those
    source_layouts: list[FileLayout] | None = None  # with a row filter: the files' own row counts (layouts: the matching rows)
    max_split_rows: int | None = None  # split_rows: the most rows of a split (None: no limit)
    conflicts: dict[str, str] = field(default_factory=dict)  # column -> why its files' types do not unify (raised if selected)

    @property
    def fingerprint(self) -> list[list]:
        """(url, size, tag) of every file, in plan order: what a checkpoint is checked against."""
        return [[f.url, f.size, f.tag] for f in self.files]

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


def _read_footer(fmt: FileFormat, fs: Any, entry: FileEntry) -> tuple[FileLayout, Any, pa.Schema]:
    try:
        layout, footer = fmt.read_footer(fs, entry.fs_path, entry.size, entry.url)
        return layout, footer, fmt.schema(fs, entry.fs_path, footer)
    except Exception as error:  # re-raised with the file named
        if isinstance(error, RemoteReadError) or (isinstance(error, OSError) and error.errno is not None):
            raise  # the storage failed, not the file (a permission, a request): the error names it
        if isinstance(error, UnicodeEncodeError):  # the name, not the contents
            raise ValueError(  # noqa: TRY004 - the file name is a bad value
                f"cannot open {entry.url!r}: its name is not valid UTF-8, and pyarrow opens files by UTF-8 names. "
                "Rename the file, or pass a path without it."
            ) from error
        named = format_for_path(entry.url)
        if isinstance(error, UnsupportedFileError):  # complete, but not readable here: the error says why
            raise UnsupportedFileError(f"cannot read {entry.url}: {error}.") from error
        advice = (
            f"Its name says {named}: pass format={named!r}."
            if named not in (None, fmt.name)
            else f"Is it a complete {fmt.name} file? Remove or replace it, or pass a path without it."
        )
        raise ValueError(f"cannot read the {fmt.name} footer of {entry.url}: {str(error).rstrip('.')}. {advice}") from error


def _footers(fmt: FileFormat, fs: Any, files: Sequence[FileEntry]) -> Iterator[tuple[FileLayout, Any, pa.Schema]]:
    """Every file's footer, in order: local files in this thread until one is slow
    (SLOW_LOCAL_FOOTER_S), the rest by a thread pool."""
    done = 0
    if is_local(fs):
        for entry in files:
            started = time.perf_counter()
            footer = _read_footer(fmt, fs, entry)
            slow = time.perf_counter() - started > SLOW_LOCAL_FOOTER_S
            yield footer
            done += 1
            if slow:
                break
    rest = files[done:]
    if rest:
        with ThreadPoolExecutor(max_workers=min(_FOOTER_THREADS, len(rest))) as pool:
            yield from pool.map(lambda entry: _read_footer(fmt, fs, entry), rest)


def _split_rows(splits: Sequence[Split], layouts: Sequence[FileLayout]) -> list[SplitRows]:
    index = {layout.path: i for i, layout in enumerate(layouts)}
    rows = []
    for split in splits:
        file = index[split.path]
        if split.row_offset is None or split.row_length is None:  # (both None: the whole file)
            rows.append(SplitRows(file, 0, layouts[file].num_rows))
        else:
            rows.append(SplitRows(file, split.row_offset, split.row_offset + split.row_length))
    return rows


def replanned(catalog: Catalog, layouts: list[FileLayout]) -> Catalog:
    """``catalog`` with other row counts per unit (a row filter's) and the splits planned from them."""
    splits = plan_splits(layouts, catalog.split_bytes, catalog.max_split_rows)
    offsets = [unit_offsets(layout) for layout in layouts]
    return replace(catalog, layouts=layouts, splits=splits, split_rows=_split_rows(splits, layouts), file_offsets=offsets)


@contextlib.contextmanager
def _prefetched_tails(fs: Any, entries: Sequence[FileEntry]) -> Iterator[None]:
    """While planning: every remote file's tail fetched in one concurrent batch (footers live
    there); nothing for local files."""
    if not is_remote(fs):
        yield
        return
    fs.prefetch_tails(entries)
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
) -> Catalog:
    """Discover files, read every footer once (in parallel) and plan the splits (of at most
    ``split_bytes`` bytes and ``split_rows`` rows). ``source``: the format's options and the
    directory layout (catalog/sources.py)."""
    paths = as_path_list(path)
    fs = open_store(filesystem_for(paths, storage_options), io_options)
    if format is not None:
        get_format(format)  # an unknown format is a usage error, not "no files found"
    files = discover_files(paths, fs, format)
    fmt = get_format(format or infer_format(files))
    fmt, files = prepare_source(fmt, fs, paths, files, source or SourceOptions(), split_bytes, split_rows, io_options)
    return catalog_of_files(fs, fmt, files, split_bytes, split_rows)


def catalog_of_files(fs: Any, fmt: FileFormat, files: list[FileEntry], split_bytes: int, split_rows: int | None = None) -> Catalog:
    """The catalog of files already found (a table's snapshot lists its own): footers, schema, splits."""
    with _prefetched_tails(fs, files):
        results = list(progress(_footers(fmt, fs, files), len(files), "reading footers"))
    layouts = [layout for layout, _, _ in results]
    footers = [footer for _, footer, _ in results]
    conflicts: dict[str, str] = {}
    schema = unify([s for _, _, s in results], [f.url for f in files], conflicts)
    advice = getattr(fmt, "schema_advice", None)  # a text format's inferred types: its options can fix them
    if advice:
        conflicts = {name: f"{why} {advice}" for name, why in conflicts.items()}
    missing = [missing_columns(s, schema) for _, _, s in results]
    repeated = repeated_columns([s for _, _, s in results], [f.url for f in files])
    splits = plan_splits(layouts, split_bytes, split_rows)
    log.debug("planned %d splits over %d files", len(splits), len(files))
    return Catalog(
        fs, fmt, files, layouts, footers, splits, _split_rows(splits, layouts), [unit_offsets(layout) for layout in layouts], split_bytes,
        schema, missing, repeated, conflicts=conflicts, max_split_rows=split_rows,
    )

"""Reading every file's footer for planning: local files one after another while that is fast,
the rest in parallel threads (footer reads of a network file system or an object store overlap);
each failure named with its file, or, with ``skip_unreadable`` (on_error="skip"), handed back for
the file to be left out."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from ..errors import RemoteReadError, UnsupportedFileError
from ..formats import FileFormat, get_format
from ..plan.splits import FileLayout
from ..storage.paths import is_local
from ..storage.remote import RemoteStore
from ..storage.versions import FileEntry
from .discovery import format_for_path
from .partitions import PartitionedFormat

log = logging.getLogger(__name__)
_FOOTER_THREADS = 32
#: A local footer read slower than this sends the remaining files to the thread pool. A footer
#: read from the page cache is fast, and then one thread is faster than a pool (whose threads
#: contend for the GIL); a slow read means storage latency (a network file system), which
#: threads overlap.
SLOW_LOCAL_FOOTER_S = 0.002
_SLOW_READS = 8
_POOL_BATCH = 1024


def reopens_footers(fmt: FileFormat) -> bool:
    """Whether the catalog may keep no footer of a local file of this format (its reader reads
    the footer again cheaply: Parquet and ORC, also with hive partition columns, not text
    formats, whose footer is a scanned row index, nor a table's files)."""
    inner = fmt.inner if isinstance(fmt, PartitionedFormat) else fmt
    return inner.name in ("parquet", "orc") and inner is get_format(inner.name)


def _read_footer(fmt: FileFormat, fs: Any, entry: FileEntry) -> tuple[FileLayout, Any, pa.Schema]:
    try:
        layout, footer = fmt.read_footer(fs, entry.fs_path, entry.size, entry.url)
        schema = fmt.schema(fs, entry.fs_path, footer)
        schema.names  # noqa: B018 - column names that are not UTF-8 raise here, naming the file, not in later steps
        return layout, footer, schema
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
        if named not in (None, fmt.name):
            advice = f"Its name says {named}: pass format={named!r}."
        elif getattr(fmt, "schema_advice", ""):  # a text file has no footer: planning scanned its records (a hive wrapper has it empty for Parquet)
            options = "csv_options" if fmt.name == "csv" else "json_options"
            advice = f"Fix, replace or remove the file, or pass a path without it ({options} set how it is parsed)."
            if fmt.name == "jsonl":
                advice += " JSON Lines holds one object per line: a JSON array or a pretty-printed document is not JSON Lines."
            raise ValueError(f"cannot read {entry.url} as {fmt.name} (planning scans its records): {str(error).rstrip('.')}. {advice}") from error
        else:
            advice = f"Is it a complete {fmt.name} file? Remove or replace it, or pass a path without it."
        raise ValueError(f"cannot read the {fmt.name} footer of {entry.url}: {str(error).rstrip('.')}. {advice}") from error


def read_footers(fmt: FileFormat, fs: Any, files: Sequence[FileEntry], skip_unreadable: bool = False) -> Iterator[Any]:
    """Every file's footer, in order: local files, and remote ones whose tails were fetched
    beforehand, in this thread until reads are slow (SLOW_LOCAL_FOOTER_S, several in a row: one
    slow read may be the machine's load; a footer larger than its tail is a request), the rest
    by a thread pool, a batch at a time (so that finished reads do not pile up). The footers of
    local files whose reader reads them again (``reopens_footers``) are dropped once read, their
    statistics' null counts kept instead (None: the footer is kept). With ``skip_unreadable`` a
    file that cannot be read as the format comes as its ``ValueError`` instead."""
    local = is_local(fs)
    drop = local and reopens_footers(fmt)
    # remote files whose tails were fetched at once (prefetch_tails) are parsed from memory
    in_memory = local or (isinstance(fs, RemoteStore) and fs.has_tails())

    def read(entry: FileEntry) -> tuple[FileLayout, Any, pa.Schema, dict[str, int] | None] | ValueError:
        try:
            layout, footer, schema = _read_footer(fmt, fs, entry)
        except ValueError as error:  # the file's contents (a storage failure is an OSError: raised)
            if not skip_unreadable:
                raise
            return error
        if not drop:
            return layout, footer, schema, None
        return layout, None, schema, nulls_in(fmt, footer)

    done = slow = 0
    if in_memory:
        for entry in files:
            started = time.perf_counter()
            yield read(entry)
            done += 1
            slow = slow + 1 if time.perf_counter() - started > SLOW_LOCAL_FOOTER_S else 0
            if slow >= _SLOW_READS:
                break
    rest = files[done:]
    if rest:
        with ThreadPoolExecutor(max_workers=min(_FOOTER_THREADS, len(rest))) as pool:
            for first in range(0, len(rest), _POOL_BATCH):
                yield from pool.map(read, rest[first : first + _POOL_BATCH])


_NO_NULLS: dict[str, int] = {}


def nulls_in(fmt: FileFormat, footer: Any) -> dict[str, int]:
    """The columns the footer's statistics say hold nulls, with their counts (files written
    alike, without nulls, share one empty dict)."""
    counts_of = getattr(fmt, "nulls_by_column", None)
    found = {name: count for name, count in counts_of(footer).items() if count} if counts_of is not None else {}
    return found or _NO_NULLS


def without_unreadable(files: list[FileEntry], unreadable: list[tuple[FileEntry, ValueError]]) -> list[FileEntry]:
    """``files`` without the unreadable ones, reported on the logger; if none is left, a ValueError with the first one's error."""
    left_out = {id(entry) for entry, _ in unreadable}
    kept = [entry for entry in files if id(entry) not in left_out]
    if not kept:
        first = unreadable[0][1]
        raise ValueError(f"on_error='skip' leaves no file to read: none of the {len(files):,} file(s) can be read; the first: {first}") from first
    shown = "; ".join(str(error) for _, error in unreadable[:3]) + (f"; and {len(unreadable) - 3:,} more" if len(unreadable) > 3 else "")
    log.warning("on_error='skip': leaving out %d file(s) that cannot be read: %s", len(unreadable), shown)
    return kept

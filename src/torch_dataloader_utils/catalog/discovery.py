"""Resolve user paths (file, directory, glob, or a list of these) into a sorted file list."""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import fsspec
from fsspec.registry import known_implementations
from fsspec.utils import get_protocol

from ..formats import FORMATS, canonical_name, format_for_path
from ..storage.paths import is_local, is_remote
from ..storage.retry import store_error
from ..storage.versions import FileEntry, content_tag

_GLOB_CHARS = ("*", "?", "[")
_MARKER_SUFFIXES = (".crc", "_$folder$")  # checksums, Hadoop's folder markers


def _hidden(name: str) -> bool:
    """Hidden as Spark and Hive hide them: a name starting with '.', or with '_' unless it is a
    ``key=value`` partition directory (Spark writes ``_key=0/`` for a column named ``_key``)."""
    return name.startswith(".") or (name.startswith("_") and "=" not in name)


def _is_ignored(relative: str) -> bool:
    parts = [p for p in relative.split("/") if p]
    if any(_hidden(p) for p in parts):
        return True
    return relative.endswith(_MARKER_SUFFIXES)


def _as_str(path: Any) -> str:
    """A path as text: bytes are decoded as the OS does (``os.fsdecode``), not ``str(b"...")``."""
    return os.fsdecode(path) if isinstance(path, bytes) else str(path)


def as_path_list(path: str | bytes | Sequence[str]) -> list[str]:
    """The user's path argument (one path or a list of them) as a list of strings."""
    if isinstance(path, (str, bytes)) or hasattr(path, "__fspath__"):
        return [_as_str(path)]
    given = list(path) if hasattr(path, "__iter__") else None
    if given is None or not all(isinstance(p, (str, bytes)) or hasattr(p, "__fspath__") for p in given):
        raise TypeError(
            f"path must be a file, directory or glob (str or os.PathLike), a list of them, or a list of Sources; got {path!r:.200}"
        )
    paths = [_as_str(p) for p in given]
    if not paths:
        raise ValueError("path is an empty list: give at least one file, directory or glob")
    return paths


_CLIENTS = {"s3": "s3fs", "gcs": "gcsfs", "azure": "adlfs"}  # our extra -> the fsspec client it installs
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure"}  # protocol -> extra


def _filesystem_kind(path: str) -> str:
    """The filesystem implementation a path's protocol selects (so ``s3``/``s3a`` are one kind)."""
    protocol = get_protocol(path)
    return known_implementations.get(protocol, {}).get("class", protocol)


def filesystem_for(paths: list[str], storage_options: dict | None) -> Any:
    """The one filesystem of all ``paths``; a ValueError if they are on different ones."""
    if storage_options is not None and not isinstance(storage_options, Mapping):
        found = f"{type(storage_options).__name__} {storage_options!r:.60}"
        raise TypeError(f"storage_options must be a dict of fsspec options (e.g. {{'anon': True}}) or None, got {found}")
    first = _filesystem_kind(paths[0])
    for path in paths[1:]:
        if _filesystem_kind(path) != first:
            raise ValueError(
                f"path {path!r} is on a different filesystem ({get_protocol(path)}://) than the first "
                f"path {paths[0]!r} ({get_protocol(paths[0])}://): all paths must be on one filesystem; "
                "build one dataset per filesystem, or copy the files to one place"
            )
    try:
        fs, _ = fsspec.core.url_to_fs(paths[0], **(storage_options or {}))
    except ImportError as error:
        extra = _EXTRAS.get(get_protocol(paths[0]))
        if extra is None:
            raise
        raise ImportError(
            f"{error}; for {get_protocol(paths[0])}:// paths, pip install {_CLIENTS[extra]} "
            f"(or, in a checkout of this library: pip install -e \".[{extra}]\")"
        ) from error
    return fs


def _url(fs: Any, path: str) -> str:
    if is_local(fs):
        return posixpath.normpath(path)
    return fs.unstrip_protocol(path)


def _wanted(name: str, format: str | None) -> bool:
    """Whether a directory listing keeps a file: a Parquet or ORC extension (the format's, when
    one is given). Files named by the user, or matched by their glob, are taken as they are."""
    found = format_for_path(name)
    return found is not None and (format is None or found == canonical_name(format))


def _relative(path: str, root: str) -> str:
    """``path`` below the directory ``root``; its base name if it is not below it."""
    prefix = root.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else posixpath.basename(path)


def _glob_root(pattern: str) -> str:
    """The fixed directory part of a glob pattern: the components before the first wildcard."""
    parts = pattern.split("/")
    fixed = next((i for i, part in enumerate(parts) if any(c in part for c in _GLOB_CHARS)), len(parts))
    return "/".join(parts[:fixed])


def _walk(fs: Any, directory: str, format: str | None) -> Iterable[tuple[str, dict]]:
    """The wanted files below a directory, skipping ignored names at every level."""
    for path, info in fs.find(directory, detail=True).items():
        relative = _relative(path, directory)
        parts = relative.split("/")
        table = _table_kind(parts)
        if table is not None:
            raise _table_error("/".join([directory.rstrip("/"), *parts[: table[1]]]), table[0])
        if not _is_ignored(relative) and _wanted(path, format):
            yield path, info


def _walk_local(directory: str, format: str | None) -> Iterable[tuple[str, dict]]:
    """``_walk`` for the local filesystem with os.scandir: the size and modification time come
    with the directory entry (fsspec's find builds a dict of eleven fields per file, several
    seconds for 100,000 files)."""
    top = os.stat(directory)
    stack: list[tuple[str, tuple[tuple[int, int], ...]]] = [(directory, ((top.st_dev, top.st_ino),))]  # with its ancestors' identities
    while stack:
        current, ancestors = stack.pop()
        in_metadata = os.path.basename(current) == "metadata"
        with os.scandir(current) as entries:
            for entry in entries:
                if _hidden(entry.name):
                    if entry.name == "_delta_log" and entry.is_dir():
                        raise _table_error(current, "delta")
                    continue
                if in_metadata and _ICEBERG_METADATA.fullmatch(entry.name):
                    raise _table_error(os.path.dirname(current), "iceberg")
                try:
                    if entry.is_dir():
                        found = entry.stat()
                        if (found.st_dev, found.st_ino) in ancestors:
                            raise ValueError(
                                f"{entry.path!r} is a symbolic link to {os.path.realpath(entry.path)!r}, a directory that holds it: "
                                "a walk would never end. Remove the link, or pass the directories to read as a list"
                            )
                        stack.append((entry.path, (*ancestors, (found.st_dev, found.st_ino))))
                        continue
                    if entry.name.endswith(_MARKER_SUFFIXES) or not _wanted(entry.name, format):
                        continue
                    found = entry.stat()
                except FileNotFoundError:  # removed while listing, or a dangling link
                    continue
                yield entry.path, _local_file_info(entry.path, found)


def _local_file_info(path: str, found: os.stat_result) -> dict:
    """Size and modification time of a local data file; a named pipe, socket or device is refused
    (reading one would wait for a writer forever, and no read of it can be repeated)."""
    if not stat.S_ISREG(found.st_mode):
        kind = "a named pipe (FIFO)" if stat.S_ISFIFO(found.st_mode) else "a socket" if stat.S_ISSOCK(found.st_mode) else "a device"
        raise ValueError(
            f"{path!r} is {kind}, not a regular file: the loader reads files it can read again from any offset. "
            "Write the data to a file, or leave this path out"
        )
    return {"size": found.st_size, "mtime": found.st_mtime}


def _expand(fs: Any, user_path: str, format: str | None) -> Iterable[tuple[str, dict]]:
    stripped = fs._strip_protocol(user_path)
    # a local path that exists is that path, whatever characters it holds (exp[2024]/, run?.parquet)
    if any(c in user_path for c in _GLOB_CHARS) and not (is_local(fs) and os.path.lexists(stripped)):
        root = _glob_root(stripped)
        for path, info in fs.glob(stripped, detail=True).items():
            if _is_ignored(_relative(path, root)) or path.endswith("/"):  # "a/b/": a console's folder marker
                continue
            if info.get("type") == "directory":
                yield from _walk(fs, path, format)
            elif info.get("type") == "other" and is_local(fs):
                yield path, _local_file_info(path, os.stat(path))
            else:
                yield path, info
        return
    directory = stripped.rstrip("/") or stripped  # adlfs: "a/b/" is no directory but may be a marker blob
    if is_local(fs):  # one stat: a list of 100,000 local files pays fsspec's isdir and info for each otherwise
        found = os.stat(stripped)
        if stat.S_ISDIR(found.st_mode):
            _refuse_inside_table(directory)
            yield from _walk_local(directory, format)
        else:
            yield stripped, _local_file_info(stripped, found)
        return
    if fs.isdir(directory):
        yield from _walk(fs, directory, format)
        return
    yield stripped, fs.info(stripped)


_ICEBERG_METADATA = re.compile(r"(v\d+|\d+-[0-9a-fA-F-]{36})(\.\w+)?\.metadata\.json")  # what Iceberg writers name a table's metadata
_TABLES = {
    "delta": ("a Delta table (it holds _delta_log/)", "DeltaDataset"),
    "iceberg": ("an Iceberg table (it holds metadata/*.metadata.json)", "IcebergDataset"),
}


def _table_kind(relative_parts: Sequence[str]) -> tuple[str, int] | None:
    """("delta" | "iceberg", how many leading parts name the table's root) when a path found in a
    walk (its parts below the walked directory) belongs to a table's log or metadata, else None."""
    if "_delta_log" in relative_parts[:-1]:
        return "delta", relative_parts.index("_delta_log")
    if len(relative_parts) >= 2 and relative_parts[-2] == "metadata" and _ICEBERG_METADATA.fullmatch(relative_parts[-1]):
        return "iceberg", len(relative_parts) - 2
    return None


def _refuse_inside_table(directory: str) -> None:
    """A local directory inside a table (a partition's, or its data/) is refused as the table is."""
    parent = os.path.dirname(os.path.abspath(directory))
    while parent != os.path.dirname(parent):
        if os.path.isdir(os.path.join(parent, "_delta_log")):
            raise _table_error(parent, "delta")
        metadata = os.path.join(parent, "metadata")
        if os.path.isdir(metadata) and any(_ICEBERG_METADATA.fullmatch(name) for name in os.listdir(metadata)):
            raise _table_error(parent, "iceberg")
        parent = os.path.dirname(parent)


def _table_error(root: str, kind: str) -> ValueError:
    """A table's directory is not its rows: files a delete, an update or a compaction replaced stay
    until vacuumed, and deletion vectors and delete files hide rows."""
    what, dataset = _TABLES[kind]
    root = root.rstrip("/")
    return ValueError(
        f"{root!r} is {what}: its files hold rows the table deleted or replaced, which a read of the files would deliver. "
        f"Read the table with torch_dataloader_utils.{dataset} (docs/tables.md); to read its files as they lie anyway, "
        f"pass a glob such as {root + '/**/*.parquet'!r}"
    )


def _list(fs: Any, user_path: str, format: str | None) -> Iterable[tuple[str, dict]]:
    """Matches of one user path; for object stores from a fresh listing, retried on transient
    faults. Local matches are yielded as they are found: a list of them all would hold every
    file's info dict at once, and the memory those leave scattered when freed (30 MB at 100,000
    files) is not handed back to the system."""
    if not is_remote(fs):
        return _expand(fs, user_path, format)

    def listing(raw: Any) -> list[tuple[str, dict]]:
        raw.invalidate_cache()  # a cached listing would hide rewritten files (stale ETag and size)
        return list(_expand(fs, user_path, format))

    return fs.call(listing, f"listing {user_path}")


def discover_files(paths: list[str], fs: Any, format: str | None) -> list[FileEntry]:
    """All data files under ``paths``, sorted by URL, without hidden and marker files."""
    found: dict[str, FileEntry] = {}
    local = is_local(fs)
    sizes: dict[int, int] = {}  # files of one size share its int object (100,000 files: megabytes)
    for user_path in paths:
        try:
            for path, info in _list(fs, user_path, format):
                url = posixpath.normpath(path) if local else _url(fs, path)
                url = path if url == path else url  # one string object for both names
                size = int(info.get("size") or 0)
                found[url] = FileEntry(path, url, sizes.setdefault(size, size), content_tag(info))
        except FileNotFoundError:
            raise FileNotFoundError(f"no such file or directory: {user_path!r}; check the path and storage_options") from None
        except Exception as error:  # a store's own error type: re-raised naming the path
            if not is_remote(fs) or isinstance(error, (ValueError, TypeError)):
                raise
            raise store_error(f"listing {user_path!r}", error, fs.storage_options) from error
    if not found:
        raise FileNotFoundError(_nothing_found(paths, format, _other_formats_found(paths, fs, format)))
    entries = [found[url] for url in sorted(found)]
    if is_remote(fs):
        fs.register(entries)
    return entries


def _other_formats_found(paths: list[str], fs: Any, format: str | None) -> list[str]:
    """The other formats whose files ``paths`` hold (for the message of a wrong ``format``)."""
    kind = canonical_name(format) if format else None
    if kind not in FORMATS:
        return []
    found = []
    for other in (name for name in FORMATS if name != kind):
        for user_path in paths:
            try:
                if next(iter(_list(fs, user_path, other)), None) is not None:
                    found.append(other)
                    break
            except (OSError, ValueError):  # only a hint: the error being raised says what was not found
                continue
    return found


def _nothing_found(paths: list[str], format: str | None, others: Sequence[str] = ()) -> str:
    """The message for paths that hold no data file: what was skipped and what to do."""
    kind = canonical_name(format) if format else None
    if len(others) == 1:
        found_other = f"; {others[0]} files are there: to read those, pass format='{others[0]}' (or format=None to infer it)"
    elif others:
        found_other = f"; files of {', '.join(others)} are there: pass format= the one to read (format=None reads one format only)"
    else:
        found_other = ""
    suffixes = FORMATS[kind].suffixes if kind in FORMATS else [suffix for entry in FORMATS.values() for suffix in entry.suffixes]
    patterns = ", ".join(f"*{suffix}" for suffix in suffixes)
    return (
        f"no {kind or 'data'} files found under {paths!r}{found_other} (a directory keeps {patterns} files; hidden files, "
        "names starting with '_' (_SUCCESS, _metadata, _temporary/, but not _key=value/ directories) and *.crc files are skipped). "
        "For data files without these extensions (Hive's 000000_0), pass a glob that matches them (e.g. 'table/*_0') "
        "or their paths, with format='parquet' or format='orc'"
    )


def infer_format(files: list[FileEntry]) -> str:
    """The one format all files share by extension, or a ValueError naming the odd ones out."""
    kinds = {f.url: format_for_path(f.url) for f in files}
    unknown = [u for u, k in kinds.items() if k is None]
    if unknown:
        raise ValueError(f"cannot infer the format of {unknown[:3]} from the extension; pass format= one of {', '.join(FORMATS)}")
    distinct = sorted({k for k in kinds.values() if k is not None})
    if len(distinct) > 1:
        counts = {kind: [url for url, k in kinds.items() if k == kind] for kind in distinct}
        listed = "; ".join(f"{len(urls)} {kind} file(s), such as {urls[0]!r}" for kind, urls in counts.items())
        raise ValueError(f"files of several formats {distinct} found ({listed}); pass format= the one to read, or a path holding one format")
    return distinct[0]

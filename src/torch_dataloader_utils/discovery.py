"""Resolve user paths (file, directory, glob, or a list of these) into a sorted file list."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import fsspec

from .formats import format_for_path
from .formats.io import is_local, is_remote

_GLOB_CHARS = ("*", "?", "[")
_MARKER_SUFFIXES = (".crc",)


@dataclass(frozen=True)
class FileEntry:
    """One data file: the path its filesystem uses, its full path or URL, size and content tag."""

    fs_path: str
    url: str
    size: int
    tag: str | None


def content_tag(info: dict) -> str | None:
    """What tells two versions of a file apart besides size: the store's ETag or generation,
    or the modification time of a local file."""
    for key in ("ETag", "etag", "generation", "md5Hash", "content_md5"):
        value = info.get(key)
        if value:
            return str(value).strip('"')
    mtime = info.get("mtime")
    if isinstance(mtime, (int, float)):
        return f"mtime:{mtime:.6f}"
    return None


def _is_ignored(relative: str) -> bool:
    parts = [p for p in relative.split("/") if p]
    if any(p.startswith((".", "_")) for p in parts):
        return True
    return relative.endswith(_MARKER_SUFFIXES)


def as_path_list(path: str | Sequence[str]) -> list[str]:
    if isinstance(path, (str, bytes)) or hasattr(path, "__fspath__"):
        return [str(path)]
    paths = [str(p) for p in path]
    if not paths:
        raise ValueError("path is an empty list: give at least one file, directory or glob")
    return paths


def filesystem_for(paths: list[str], storage_options: dict | None) -> Any:
    fs, _ = fsspec.core.url_to_fs(paths[0], **(storage_options or {}))
    return fs


def _url(fs: Any, path: str) -> str:
    if is_local(fs):
        return posixpath.normpath(path)
    return fs.unstrip_protocol(path)


def _wanted(name: str, format: str | None) -> bool:
    found = format_for_path(name)
    return found is not None and (format is None or found == format)


def _expand(fs: Any, user_path: str, format: str | None) -> Iterable[tuple[str, dict]]:
    stripped = fs._strip_protocol(user_path)
    if any(c in user_path for c in _GLOB_CHARS):
        matches = fs.glob(stripped, detail=True)
        for path, info in matches.items():
            if info.get("type") == "directory":
                yield from _expand(fs, path, format)
            elif not _is_ignored(posixpath.basename(path)):
                yield path, info
        return
    if fs.isdir(stripped):
        root = stripped.rstrip("/")
        for path, info in fs.find(stripped, detail=True).items():
            relative = path[len(root) :].lstrip("/")
            if not _is_ignored(relative) and _wanted(path, format):
                yield path, info
        return
    yield stripped, fs.info(stripped)


def _list(fs: Any, user_path: str, format: str | None) -> list[tuple[str, dict]]:
    """Matches of one user path; for object stores from a fresh listing, retried on transient faults."""
    if not is_remote(fs):
        return list(_expand(fs, user_path, format))

    def listing(raw: Any) -> list[tuple[str, dict]]:
        raw.invalidate_cache()  # a cached listing would hide rewritten files (stale ETag and size)
        return list(_expand(fs, user_path, format))

    return fs.call(listing, f"listing {user_path}")


def discover_files(paths: list[str], fs: Any, format: str | None) -> list[FileEntry]:
    """All data files under ``paths``, sorted by URL, without hidden and marker files."""
    found: dict[str, FileEntry] = {}
    for user_path in paths:
        try:
            matches = _list(fs, user_path, format)
        except FileNotFoundError:
            raise FileNotFoundError(f"no such file or directory: {user_path!r}; check the path and storage_options") from None
        for path, info in matches:
            url = _url(fs, path)
            found[url] = FileEntry(path, url, int(info.get("size") or 0), content_tag(info))
    if not found:
        raise FileNotFoundError(
            f"no {format or 'Parquet or ORC'} files found under {paths!r} "
            "(hidden files and _SUCCESS/_metadata markers are ignored; directories match *.parquet, *.pq, *.parq, *.orc)"
        )
    entries = [found[url] for url in sorted(found)]
    if is_remote(fs):
        fs.register(entries)
    return entries


def infer_format(files: list[FileEntry]) -> str:
    """The one format all files share by extension, or a ValueError naming the odd ones out."""
    kinds = {f.url: format_for_path(f.url) for f in files}
    unknown = [u for u, k in kinds.items() if k is None]
    if unknown:
        raise ValueError(f"cannot infer the format of {unknown[:3]} from the extension; pass format='parquet' or 'orc'")
    distinct = sorted(set(kinds.values()))
    if len(distinct) > 1:
        raise ValueError(f"files of several formats {distinct} found; pass format= or a path holding one format")
    return distinct[0]

"""What kind of filesystem a path lives on, and whether a local file is still the one planned."""

from __future__ import annotations

import os
from typing import Any

from .remote import RemoteStore, protocol_of
from .versions import FileEntry, check_version


def is_local(fs: Any) -> bool:
    """Whether ``fs`` is the local filesystem (files pyarrow opens natively)."""
    return protocol_of(fs) in ("file", "local")


def is_remote(fs: Any) -> bool:
    """Whether ``fs`` is a RemoteStore (an object store read through ranged requests)."""
    return isinstance(fs, RemoteStore)


def check_unchanged(fs: Any, entry: FileEntry) -> None:
    """A local file must still be the one planned (size and mtime) when a reader opens it: its
    footer is read now, and the plan's row counts must describe the same bytes. (A remote file's every
    range is read from the planned version, or checked after: remote.RemoteStore.read_many.)"""
    if not is_local(fs):
        return
    try:
        stat = os.stat(entry.fs_path)  # (fsspec's info builds eleven fields: a third of a tiny file's read)
    except FileNotFoundError:
        stat = None
    info = fs.info(entry.fs_path) if stat is None else {"size": stat.st_size, "mtime": stat.st_mtime}
    check_version(info, entry.size, entry.tag)

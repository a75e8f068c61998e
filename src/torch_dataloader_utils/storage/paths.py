"""What kind of filesystem a path lives on."""

from __future__ import annotations

from typing import Any


def protocol_of(fs: Any) -> str:
    """The first protocol name of an fsspec filesystem (``"s3"`` for s3fs, ``"file"`` for local)."""
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def is_local(fs: Any) -> bool:
    """Whether ``fs`` is the local filesystem (files pyarrow opens natively)."""
    return protocol_of(fs) in ("file", "local")


def is_remote(fs: Any) -> bool:
    """Whether ``fs`` is a RemoteStore (an object store read through ranged requests)."""
    from .remote import RemoteStore

    return isinstance(fs, RemoteStore)

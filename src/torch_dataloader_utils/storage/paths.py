"""What kind of filesystem a path lives on."""

from __future__ import annotations

from typing import Any

from .remote import RemoteStore, protocol_of


def is_local(fs: Any) -> bool:
    """Whether ``fs`` is the local filesystem (files pyarrow opens natively)."""
    return protocol_of(fs) in ("file", "local")


def is_remote(fs: Any) -> bool:
    """Whether ``fs`` is a RemoteStore (an object store read through ranged requests)."""
    return isinstance(fs, RemoteStore)

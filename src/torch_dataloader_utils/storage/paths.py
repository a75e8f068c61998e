"""What kind of filesystem a path lives on."""

from __future__ import annotations

from typing import Any


def is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def is_remote(fs: Any) -> bool:
    """Whether ``fs`` is a RemoteStore (an object store read through ranged requests)."""
    from .remote import RemoteStore

    return isinstance(fs, RemoteStore)

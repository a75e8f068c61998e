"""Opening files through fsspec, with a fast path for local files."""

from __future__ import annotations

from typing import Any

import pyarrow as pa


def is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def open_input(fs: Any, path: str) -> Any:
    """A seekable binary file for pyarrow: a native file for local paths, else fsspec's."""
    if is_local(fs):
        return pa.OSFile(path, "rb")
    return fs.open(path, "rb")

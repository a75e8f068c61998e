"""File formats: each turns a footer into units and reads one unit with column projection."""

from __future__ import annotations

from typing import Any, Protocol

import pyarrow as pa

from ..plan.splits import FileLayout


class UnitReader(Protocol):
    """An open data file that reads one unit (row group / stripe) at a time."""

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table: ...


class FileFormat(Protocol):
    """What every format module provides."""

    name: str

    def read_footer(self, fs: Any, path: str, size: int, url: str) -> tuple[FileLayout, Any]:
        """Read a file's footer: its layout for the planner and an opaque footer for ``open``."""
        ...

    def open(self, fs: Any, path: str, footer: Any, use_threads: bool) -> UnitReader:
        """Open the file for reading units, reusing the footer read at planning time."""
        ...


def get_format(name: str) -> FileFormat:
    """The format object for ``"parquet"`` or ``"orc"`` (each imported when first asked for:
    pyarrow.orc alone takes about 5 ms to import)."""
    kind = name.lower()
    if kind == "parquet":
        from .parquet import PARQUET

        return PARQUET
    if kind == "orc":
        from .orc import ORC

        return ORC
    raise ValueError(f"format must be 'parquet' or 'orc' (or None to infer it), got {name!r}")


def format_for_path(path: str) -> str | None:
    """The format implied by a file name's extension, or None."""
    lower = path.lower()
    if lower.endswith((".parquet", ".pq", ".parq")):
        return "parquet"
    if lower.endswith(".orc"):
        return "orc"
    return None

"""File formats: each turns a file's footer into units (row groups, stripes) and reads one unit
with column projection.

A format is one module holding one object that satisfies ``FileFormat``; ``FORMATS`` names the
module and the file name suffixes of each, so that inferring a format from file names imports
no format module.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..plan.splits import FileLayout

if TYPE_CHECKING:  # (the format table is read without pyarrow: tdu --help lists the formats)
    import pyarrow as pa


class UnitReader(Protocol):
    """An open data file that reads one unit (row group / stripe) at a time."""

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        """The unit's rows, projected to ``columns`` (None: every column)."""
        ...


class StreamingUnitReader(UnitReader, Protocol):
    """A ``UnitReader`` that also decodes a unit in batches, from any row (formats whose
    ``streams_units`` is True open these)."""

    def iter_unit(self, unit: int, columns: list[str] | None, batch_rows: int, first_row: int = 0) -> Iterator[pa.Table]:
        """The unit's rows from ``first_row`` on, in tables of about ``batch_rows`` rows, each
        decoded when it is asked for."""
        ...


class FileFormat(Protocol):
    """Everything a format provides to planning (catalog/) and reading (read/)."""

    #: the format's name, as ``format=`` takes it
    name: str
    #: file name endings that imply the format (lower case; the same as its ``FORMATS`` entry)
    suffixes: tuple[str, ...]
    #: whether ``open`` returns a ``StreamingUnitReader``
    streams_units: bool

    def read_footer(self, fs: Any, path: str, size: int, url: str) -> tuple[FileLayout, Any]:
        """Read a file's footer: its layout for the planner (rows and bytes per unit) and an
        opaque footer for ``schema`` and ``open`` (pickled to workers with the catalog)."""
        ...

    def schema(self, fs: Any, path: str, footer: Any) -> pa.Schema:
        """The file's Arrow schema, from the footer ``read_footer`` returned (reading the file
        again only where the footer lacks it)."""
        ...

    def open(self, fs: Any, path: str, footer: Any, use_threads: bool) -> UnitReader:
        """Open the file for reading units, reusing the footer read at planning time."""
        ...


class FormatEntry(NamedTuple):
    """Where a format's object lives, and the file name suffixes that imply it."""

    module: str  # relative to this package
    attribute: str
    suffixes: tuple[str, ...]


#: a text file's compressions by name suffix, as pyarrow's codec names them (.deflate: zlib streams,
#: Hadoop's DefaultCodec, which pyarrow's gzip decompressor reads too: it tells zlib's header from gzip's)
TEXT_COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".deflate": "gzip"}
TEXT_PACKINGS = ("", *TEXT_COMPRESSIONS)

#: The formats, by name, in the order error messages list them. A format module is imported
#: when its format is first asked for (pyarrow.orc alone is slow to import).
FORMATS: dict[str, FormatEntry] = {
    "parquet": FormatEntry(".parquet", "PARQUET", (".parquet", ".pq", ".parq")),
    "orc": FormatEntry(".orc", "ORC", (".orc",)),
    "arrow": FormatEntry(".arrow_ipc", "ARROW", (".arrow", ".ipc", ".feather")),
    "csv": FormatEntry(".csv", "CSV", tuple(f"{base}{packed}" for base in (".csv", ".tsv") for packed in TEXT_PACKINGS)),
    "jsonl": FormatEntry(".jsonl", "JSONL", tuple(f"{base}{packed}" for base in (".jsonl", ".ndjson", ".json") for packed in TEXT_PACKINGS)),
}
ALIASES = {"json": "jsonl"}  # other names format= takes


def canonical_name(name: str) -> str:
    """A format name as ``FORMATS`` keys it (lower case, aliases resolved)."""
    if not isinstance(name, str):
        raise ValueError(f"format must be one of {[*FORMATS, *ALIASES]} (or None to infer it), got {name!r}")
    return ALIASES.get(name.lower(), name.lower())


def get_format(name: str) -> FileFormat:
    """The format object for a name in ``FORMATS`` (any case)."""
    entry = FORMATS.get(canonical_name(name))
    if entry is None:
        names = " or ".join(repr(known) for known in FORMATS)
        raise ValueError(f"format must be {names} (or None to infer it), got {name!r}")
    return getattr(importlib.import_module(entry.module, __name__), entry.attribute)


def format_for_path(path: str) -> str | None:
    """The format implied by a file name's extension, or None."""
    lower = path.lower()
    for name, entry in FORMATS.items():
        if lower.endswith(entry.suffixes):
            return name
    return None

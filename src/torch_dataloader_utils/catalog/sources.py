"""What a dataset reads besides its files: the format's options (``csv_options``,
``json_options``) and the directory layout (``partitioning``), applied to the format once the
files are known."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..formats import FileFormat
from ..storage.remote import IOOptions
from ..storage.versions import FileEntry

PARTITIONINGS = (None, "hive")
_OPTIONS_OF = {"csv": "csv_options", "jsonl": "json_options"}


@dataclass(frozen=True)
class SourceOptions:
    """``csv_options`` / ``json_options``: pyarrow's reader options by name (docs/formats.md);
    ``partitioning``: None, or "hive" (``key=value`` directories become columns)."""

    csv_options: Mapping[str, Any] | None = None
    json_options: Mapping[str, Any] | None = None
    partitioning: str | None = None

    def __post_init__(self) -> None:
        for name in ("csv_options", "json_options"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Mapping):
                raise ValueError(f"{name} must be a dict of reader options (see docs/formats.md), got {value!r}")
        if self.partitioning not in PARTITIONINGS:
            raise ValueError(f"partitioning must be None or 'hive', got {self.partitioning!r}")


def options_identity(options: Mapping[str, Any]) -> str:
    """Reader options as text that is the same in every process for the same options (what a
    state and the filter-count cache record): values by JSON, others by repr, a set's values
    sorted, and an object whose repr is its address (``pyarrow.csv.ISO8601``) by its type."""

    def stable(value: Any) -> Any:
        if isinstance(value, (set, frozenset)):
            return sorted(value, key=repr)
        text = repr(value)
        return f"{type(value).__module__}.{type(value).__qualname__}" if " at 0x" in text else text

    return json.dumps(options, sort_keys=True, default=stable)


def prepare_source(
    fmt: FileFormat,
    fs: Any,
    paths: Sequence[str],
    files: list[FileEntry],
    source: SourceOptions,
    split_bytes: int,
    split_rows: int | None,
    io_options: IOOptions | None,
) -> tuple[FileFormat, list[FileEntry]]:
    """The format configured with its options (text formats: the split sizes and the row index
    cache too), wrapped to add partition columns; and the files to read."""
    for kind, name in _OPTIONS_OF.items():
        if getattr(source, name) is not None and fmt.name != kind:
            raise ValueError(f"{name} applies to format={kind!r}, but the files are read as {fmt.name!r}; leave {name} out, or pass format={kind!r}")
    configure = getattr(fmt, "configured", None)
    if configure is not None:
        options = getattr(source, _OPTIONS_OF.get(fmt.name, ""), None) or {}
        cache_dir = io_options.cache_dir if io_options is not None else None
        fmt = configure(dict(options), split_bytes=split_bytes, split_rows=split_rows, cache_dir=cache_dir, files=files)
    if source.partitioning == "hive":
        from .partitions import hive_format

        fmt = hive_format(fmt, fs, paths, files)
    return fmt, files

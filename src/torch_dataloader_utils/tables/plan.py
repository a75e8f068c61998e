"""A table snapshot's files as a catalog: what Iceberg and Delta planning hand over, and the catalog
built from it with the drops (deletes, row filters) counted in every unit."""

from __future__ import annotations

import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..catalog.build import Catalog, catalog_of_files
from ..catalog.discovery import filesystem_for
from ..catalog.progress_bar import progress
from ..formats import get_format
from ..storage.paths import is_local, is_remote
from ..storage.remote import IOOptions, open_store
from ..storage.retry import store_error
from ..storage.versions import FileEntry, content_tag
from .deletes import merge_dropped, unmatched_rows
from .files import TableFile, TableFileFormat
from .nested import child_type, same_nesting, with_children


@dataclass(frozen=True)
class TableRef:
    """The table and the snapshot a plan read; what a state records (``state/schema.py: TABLE``)."""

    format: str  # "iceberg" or "delta"
    name: str  # Iceberg: the table identifier; Delta: the table's URI
    snapshot: int  # Iceberg: the snapshot id; Delta: the table version
    uuid: str | None = None  # Iceberg's table uuid (a table dropped and created again has another)
    schema_id: int | None = None  # Iceberg: the schema read with (a schema change needs no new snapshot)

    def to_dict(self) -> dict:
        entry = {"format": self.format, "name": self.name, "snapshot": self.snapshot, "uuid": self.uuid}
        return entry if self.schema_id is None else {**entry, "schema_id": self.schema_id}

    @property
    def version(self) -> tuple[int, int | None]:
        """What a re-plan compares: the snapshot, and the schema it is read with."""
        return self.snapshot, self.schema_id

    def describe(self) -> str:
        kind = "snapshot" if self.format == "iceberg" else "version"
        return f"{self.format} table {self.name!r} {kind} {self.snapshot}"


@dataclass
class TablePlan:
    """A snapshot's data files (Parquet), the rows each drops, and the schema of the snapshot."""

    ref: TableRef
    files: list[TableFile]
    schema: pa.Schema  # the snapshot's columns, in its order
    fs: Any  # the fsspec filesystem of the data files


def table_filesystem(example_path: str, storage_options: dict | None) -> Any:
    """The fsspec filesystem of a table's files."""
    return filesystem_for([example_path], storage_options)


def with_row_filter(plan: TablePlan, expression: pc.Expression | None) -> TablePlan:
    """``plan`` with every file also dropping the rows ``expression`` does not keep (each file's
    filter columns are read once, here, so that unit row counts are exact); ``plan`` unchanged."""
    if expression is None:
        return plan
    if not isinstance(expression, pc.Expression):
        raise TypeError(
            f"filters must be a pyarrow.compute expression over the table's columns, e.g. pc.field('year') == 2024; "
            f"got {type(expression).__name__}"
        )
    files = [
        replace(file, dropped=merge_dropped(file.dropped, unmatched_rows(plan.fs, file, expression, plan.schema)))
        for file in progress(iter(plan.files), len(plan.files), "evaluating the row filter")
    ]
    return replace(plan, files=files)


_INFO_THREADS = 32


def _shown(fs: Any, path: str) -> str:
    """A data file's path as messages name it (with its store's scheme)."""
    return fs.unstrip_protocol(path) if is_remote(fs) else path


def _entries(fs: Any, paths: list[str], ref: TableRef) -> list[FileEntry]:
    """The snapshot's files with their sizes and content tags (object stores: asked concurrently,
    one request per file; a table lists its files, so no directory is listed)."""

    def entry(path: str) -> FileEntry:
        try:
            info = fs.info(path)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{_shown(fs, path)}, a data file of {ref.describe()}, does not exist: the table's files were removed (orphan file "
                "clean-up, VACUUM) or the storage options point elsewhere"
            ) from None
        except Exception as error:  # a store's own error type: re-raised naming the file
            if not is_remote(fs) or isinstance(error, (ValueError, TypeError)):
                raise
            raise store_error(f"asking the store for {_shown(fs, path)}, a data file of {ref.describe()},", error, fs.storage_options) from error
        url = posixpath.normpath(path) if is_local(fs) else fs.unstrip_protocol(path)
        return FileEntry(path, url, int(info.get("size") or 0), content_tag(info))

    if is_remote(fs):
        with ThreadPoolExecutor(max_workers=min(_INFO_THREADS, max(1, len(paths)))) as pool:
            entries = list(pool.map(entry, paths))
        fs.register(entries)
        return entries
    return [entry(path) for path in paths]


def with_table_fields(kind: pa.DataType, table_kind: pa.DataType) -> pa.DataType:
    """``kind``, a column's type as its files store it, with the struct fields of the table's type
    ``table_kind`` that no file stores added (a field added to a struct since the last write, also
    to a struct of a list's elements or a map's values)."""
    if same_nesting(kind, table_kind):
        return with_children(kind, lambda item, index: item.with_type(with_table_fields(item.type, child_type(table_kind, index))))
    if not (pa.types.is_struct(kind) and pa.types.is_struct(table_kind)):
        return kind
    fields = []
    for item in kind:
        index = table_kind.get_field_index(item.name)
        fields.append(item.with_type(with_table_fields(item.type, table_kind.field(index).type)) if index >= 0 else item)
    for item in table_kind:
        if kind.get_field_index(item.name) < 0:
            fields.append(pa.field(item.name, item.type.storage_type if isinstance(item.type, pa.BaseExtensionType) else item.type))
    return pa.struct(fields)


def table_catalog(plan: TablePlan, split_bytes: int, io: IOOptions | None) -> Catalog:
    """The catalog of a snapshot's files: footers read once, units counting the rows the table keeps."""
    fs = open_store(plan.fs, io)
    by_storage_path = {plan.fs._strip_protocol(file.path): file for file in plan.files}
    entries = _entries(fs, sorted(by_storage_path), plan.ref)
    files = {entry.fs_path: by_storage_path[entry.fs_path] for entry in entries}
    catalog = catalog_of_files(fs, TableFileFormat(get_format("parquet"), files, plan.schema), entries, split_bytes)
    if not plan.files:  # a snapshot without data files (a new table, every row deleted): no rows
        return replace(catalog, schema=plan.schema)
    if catalog.schema is None:
        return catalog
    # the table's order; a column or struct field no data file holds yet (added since) is read as nulls, as the table's own readers do
    fields = [
        catalog.schema.field(name).with_type(with_table_fields(catalog.schema.field(name).type, plan.schema.field(name).type))
        if name in catalog.schema.names else plan.schema.field(name)
        for name in plan.schema.names
    ]  # fmt: skip
    absent = tuple(name for name in plan.schema.names if name not in catalog.schema.names)
    if not absent:
        return replace(catalog, schema=pa.schema(fields))
    missing = [(*lacks, *absent) for lacks in (catalog.missing_columns or [()] * len(catalog.files))]
    return replace(catalog, schema=pa.schema(fields), missing_columns=missing)

"""Apache Iceberg tables through pyiceberg (the ``iceberg`` extra): a snapshot's data files, its
position deletes and its schema, as a ``TablePlan``."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import CheckpointMismatchError
from .deletes import PositionDeletes
from .files import TableFile
from .nested import stored_path
from .plan import TablePlan, TableRef, table_filesystem, with_row_filter

#: catalog_config properties of pyiceberg's S3 FileIO -> the s3fs storage option they set
_S3_OPTIONS = {
    "s3.access-key-id": ("key",),
    "s3.secret-access-key": ("secret",),
    "s3.session-token": ("token",),
    "s3.endpoint": ("client_kwargs", "endpoint_url"),
    "s3.region": ("client_kwargs", "region_name"),
}
#: pyiceberg's credentials shared by its clients -> the S3 property they stand in for
_CLIENT_OPTIONS = {
    "client.access-key-id": "s3.access-key-id", "client.secret-access-key": "s3.secret-access-key",
    "client.session-token": "s3.session-token", "client.region": "s3.region",
}  # fmt: skip


def _pyiceberg() -> Any:
    try:
        import pyiceberg.catalog
    except ImportError as error:
        raise ImportError(
            f"{error}; Iceberg tables need pyiceberg: pip install 'torch_dataloader_utils[iceberg]' "
            "(or pip install 'pyiceberg[sql-sqlite]', with the extra of your catalog)"
        ) from error
    return pyiceberg.catalog


def load_table(table: str, catalog_config: Mapping[str, Any] | None) -> Any:
    """The pyiceberg table ``table`` ("namespace.table") of the catalog ``catalog_config`` describes:
    its "name" key names the catalog, the other keys are pyiceberg's catalog properties."""
    if not isinstance(table, str) or "." not in table:
        raise ValueError(f"table must be an Iceberg identifier 'namespace.table', got {table!r}")
    config = dict(catalog_config or {})
    name = config.pop("name", "default")
    catalog = _pyiceberg().load_catalog(name, **config)
    try:
        return catalog.load_table(table)
    except Exception as error:
        if type(error).__name__ == "NoSuchTableError":
            raise ValueError(f"Iceberg catalog {name!r} has no table {table!r} ({error}); check table= and catalog_config") from error
        if isinstance(error, (TypeError, KeyError, ValueError)) or type(error).__name__ == "ValidationError":  # they name no table
            raise ValueError(
                f"pyiceberg cannot load Iceberg table {table!r} of catalog {name!r}: {type(error).__name__}: {error} (its metadata "
                "JSON is damaged, or of a form pyiceberg does not read)"
            ) from error
        raise


def storage_options_of(catalog_config: Mapping[str, Any] | None, table: Any) -> dict:
    """s3fs options from the catalog's S3 properties (pyiceberg's names; its shared ``client.*``
    credentials where no ``s3.*`` one is given), for reading the data files."""
    properties = {**(catalog_config or {}), **getattr(table, "properties", {}), **dict(getattr(table.io, "properties", {}) or {})}
    for shared, key in _CLIENT_OPTIONS.items():
        if shared in properties and key not in properties:
            properties[key] = properties[shared]
    options: dict = {}
    for key, target in _S3_OPTIONS.items():
        if key in properties:
            if len(target) == 1:
                options[target[0]] = properties[key]
            else:
                options.setdefault(target[0], {})[target[1]] = properties[key]
    return options


def snapshot_of(table: Any, table_name: str, snapshot_id: int | None, from_state: bool = False) -> Any:
    """The snapshot to read: ``snapshot_id``'s, or the current one."""
    if snapshot_id is None:
        snapshot = table.current_snapshot()
        if snapshot is None:
            raise ValueError(f"Iceberg table {table_name!r} has no snapshot yet (no data was ever committed): nothing to read")
        return snapshot
    snapshot = table.snapshot_by_id(snapshot_id)
    if snapshot is None:
        known = [s.snapshot_id for s in table.snapshots()][-5:]
        if from_state:
            raise CheckpointMismatchError(
                f"Checkpoint state was taken on snapshot {snapshot_id} of Iceberg table {table_name!r}, which the table no "
                f"longer has (expired; its latest snapshots are {known}).\n\n  The rows that epoch read are gone: start the "
                "epoch again from its beginning (set_epoch), or keep snapshots until training jobs that read them end "
                "(expire_snapshots with a longer retention)."
            )
        raise ValueError(f"Iceberg table {table_name!r} has no snapshot {snapshot_id} (expired, or never made); its latest snapshots are {known}")
    return snapshot


def _field_names(schema: Any) -> dict[int, str]:
    return {column.field_id: column.name for column in schema.fields}


def _name_mapping(table: Any) -> dict[str, int] | None:
    """The table's name mapping (``schema.name-mapping.default``, which ``add_files`` and migrations
    set) for top-level columns: how a file written without field ids names each one."""
    mapping = table.name_mapping()
    if mapping is None:
        return None
    return {name: field.field_id for field in mapping for name in field.names if field.field_id is not None}


def _identity_fields(spec: Any, names: Mapping[int, str]) -> list[tuple[int, str]]:
    """(position in the partition tuple, column name) of the spec's identity partitions on columns of the schema."""
    from pyiceberg.transforms import IdentityTransform

    return [(i, names[f.source_id]) for i, f in enumerate(spec.fields) if isinstance(f.transform, IdentityTransform) and f.source_id in names]


def _partition_values(data: Any, identity: list[tuple[int, str]], arrow_schema: Any) -> dict[str, Any]:
    """A data file's identity partition values, typed as the columns: the values of those columns
    where the file does not store them (the Iceberg spec: readers take them from the metadata)."""
    import pyarrow as pa

    values = {}
    for position, name in identity:
        try:
            values[name] = pa.scalar(data.partition[position], arrow_schema.field(name).type)
        except (pa.ArrowException, TypeError, ValueError, KeyError):  # a value pyarrow cannot type so: left to the file
            continue
    return values


def _initial_defaults(schema: Any, arrow_schema: Any, table_name: str) -> dict[tuple[str, ...], Any]:
    """Every top-level column's and struct field's ``initial-default`` (tables/defaults.py) by its
    path of names, typed as the column's files store it (a uuid as its 16 bytes): also of a struct
    in a list's elements or a map's values."""
    import uuid

    import pyarrow as pa

    defaults = {}

    def visit(fields: Any, kinds: Any, path: tuple[str, ...]) -> None:
        for item in fields:
            kind = kinds.field(item.name).type
            value = getattr(item, "initial_default", None)
            if value is not None:
                stored = kind.storage_type if isinstance(kind, pa.BaseExtensionType) else kind
                try:
                    defaults[path + (item.name,)] = pa.scalar(value.bytes if isinstance(value, uuid.UUID) else value, stored)
                except (pa.ArrowException, TypeError, ValueError) as error:
                    raise ValueError(
                        f"Iceberg table {table_name!r}: the default of column {'.'.join((*path, item.name))!r} ({value!r}) cannot be "
                        f"read as {kind} ({error}); rows written before the column was added hold it"
                    ) from error
            visit_inside(item.field_type, kind, path + (item.name,))

    def visit_inside(field_type: Any, kind: Any, path: tuple[str, ...]) -> None:
        """A struct's fields; those of a struct in a list's elements or a map's values (tables/defaults.py's paths)."""
        if hasattr(field_type, "fields") and pa.types.is_struct(kind):
            visit(field_type.fields, kind, path)
        elif hasattr(field_type, "element_type") and (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
            visit_inside(field_type.element_type, kind.value_type, stored_path(path, kind, 0))
        elif hasattr(field_type, "value_type") and pa.types.is_map(kind):
            visit_inside(field_type.value_type, kind.item_type, stored_path(path, kind, 1))

    visit(schema.fields, arrow_schema, ())
    return defaults


def _row_filter(scan_filter: Any, schema: Any) -> tuple[Any, Any]:
    """(pyiceberg's row filter for planning, the same filter as a pyarrow expression)."""
    from pyiceberg.expressions import AlwaysTrue, BooleanExpression
    from pyiceberg.expressions.parser import parse
    from pyiceberg.expressions.visitors import bind
    from pyiceberg.io.pyarrow import expression_to_pyarrow

    if scan_filter is None:
        return AlwaysTrue(), None
    try:
        expression = parse(scan_filter) if isinstance(scan_filter, str) else scan_filter
        if not isinstance(expression, BooleanExpression):
            raise TypeError(f"got {type(scan_filter).__name__}")
        return expression, expression_to_pyarrow(bind(schema, expression, case_sensitive=True), schema)  # schema: a struct leaf by its path
    except Exception as error:  # pyiceberg's parse and bind errors: re-raised naming the argument
        raise ValueError(
            f"scan_filter {scan_filter!r:.200} is not a pyiceberg expression over the snapshot's columns {[f.name for f in schema.fields]} "
            f"({type(error).__name__}: {error}); give its text (e.g. \"year = 2024 and id > 5\") or a pyiceberg.expressions object"
        ) from error


def schema_of(table: Any, table_name: str, snapshot: Any, schema_id: int | None) -> Any:
    """The schema ``schema_id`` names (None: the one ``snapshot`` was written with), as pyiceberg
    reads the current snapshot with the table's current schema and an older one with its own."""
    if schema_id is None:
        schema_id = snapshot.schema_id
    if schema_id is None:
        return table.schema()
    schema = table.schemas().get(schema_id)
    if schema is None:
        raise CheckpointMismatchError(
            f"Checkpoint state was read with schema {schema_id} of Iceberg table {table_name!r}, which the table's metadata no longer "
            f"has (its schemas: {sorted(table.schemas())}).\n\n  Start the epoch again from its beginning (set_epoch)."
        )
    return schema


def plan_iceberg(
    table: Any,
    table_name: str,
    snapshot: Any,
    schema: Any,
    scan_filter: Any,
    filters: Any,
    columns: Sequence[str] | None,
    storage_options: dict | None,
) -> TablePlan:
    """The snapshot's data files with their position deletes (and the rows the filters drop), read
    with ``schema`` (``schema_of``)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyiceberg.manifest import DataFileContent, FileFormat
    from pyiceberg.schema import index_by_id

    row_filter, arrow_filter = _row_filter(scan_filter, schema)
    scan = table.scan(snapshot_id=snapshot.snapshot_id, row_filter=row_filter, selected_fields=tuple(columns) if columns else ("*",))
    try:
        tasks = list(scan.plan_files())
    except ValueError as error:
        if "equality deletes" in str(error):
            raise ValueError(_equality_message(table_name, snapshot.snapshot_id)) from error
        raise
    except (TypeError, KeyError) as error:  # pyiceberg's own on manifests it cannot parse name nothing
        raise ValueError(
            f"pyiceberg cannot read the manifests of Iceberg table {table_name!r} snapshot {snapshot.snapshot_id}: "
            f"{type(error).__name__}: {error} (a manifest of a form pyiceberg does not read, or damaged)"
        ) from error
    arrow_schema = schema_to_pyarrow(schema, include_field_ids=False)
    ref = TableRef("iceberg", table_name, snapshot.snapshot_id, str(table.metadata.table_uuid), schema.schema_id)
    example = tasks[0].file.file_path if tasks else table.location()
    fs = table_filesystem(example, storage_options)
    deletes = PositionDeletes(fs)
    names = _field_names(schema)
    every_name = {field_id: nested_field.name for field_id, nested_field in index_by_id(schema).items()}
    mapping = _name_mapping(table)
    identity = {spec_id: _identity_fields(spec, names) for spec_id, spec in table.specs().items()}
    defaults = _initial_defaults(schema, arrow_schema, table_name)
    files = []
    for task in tasks:
        data = task.file
        if data.file_format != FileFormat.PARQUET:
            raise ValueError(
                f"{data.file_path} of Iceberg table {table_name!r} snapshot {snapshot.snapshot_id} is {data.file_format}: this loader "
                "reads Parquet data files only. Rewrite the table's files as Parquet (write.format.default=parquet and "
                "rewrite_data_files), or read a snapshot of Parquet files only (snapshot_id=)"
            )
        if any(d.content == DataFileContent.EQUALITY_DELETES for d in task.delete_files):
            raise ValueError(_equality_message(table_name, snapshot.snapshot_id))
        vectors = [d.file_path for d in task.delete_files if d.file_format != FileFormat.PARQUET]
        if vectors:
            raise ValueError(
                f"Iceberg table {table_name!r} snapshot {snapshot.snapshot_id} deletes rows of {data.file_path} with {vectors[0]}, a "
                "deletion vector (Iceberg v3, Puffin), which this loader cannot apply. Compact the table (rewrite its data files) "
                "and read the compacted snapshot, or read a snapshot from before the deletes (snapshot_id=)"
            )
        try:
            dropped = deletes.of(data.file_path, [d.file_path for d in task.delete_files])
        except FileNotFoundError as error:
            raise FileNotFoundError(
                f"a position delete file of Iceberg table {table_name!r} snapshot {snapshot.snapshot_id} does not exist ({error}): "
                "the table's files were removed (orphan file clean-up) or the storage options point elsewhere"
            ) from error
        partition = _partition_values(data, identity.get(data.spec_id, []), arrow_schema)
        files.append(TableFile(data.file_path, dropped, every_name, mapped_ids=mapping, partition_values=partition, defaults=defaults))
    return with_row_filter(TablePlan(ref, files, arrow_schema, fs), _and(arrow_filter, filters))


def _and(first: Any, second: Any) -> Any:
    if first is None or second is None:
        return first if second is None else second
    return first & second


def _equality_message(table_name: str, snapshot_id: int) -> str:
    return (
        f"Iceberg table {table_name!r} snapshot {snapshot_id} has equality delete files, which this loader cannot apply "
        "(pyiceberg cannot either). Compact the table (rewrite its data files, e.g. Spark's rewrite_data_files with "
        "delete-file-threshold=1) and read the compacted snapshot"
    )


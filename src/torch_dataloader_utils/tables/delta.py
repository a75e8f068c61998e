"""Delta Lake tables through the ``deltalake`` package (the ``delta`` extra): a version's data files,
their partition values and deletion vectors, as a ``TablePlan``."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa

from ..errors import CheckpointMismatchError
from .deletes import merge_dropped
from .files import TableFile
from .nested import stored_path, with_children
from .plan import TablePlan, TableRef, table_filesystem

#: fsspec storage options (s3fs, adlfs) -> the deltalake (object_store) option they set
_S3_KEYS = {"key": "AWS_ACCESS_KEY_ID", "secret": "AWS_SECRET_ACCESS_KEY", "token": "AWS_SESSION_TOKEN", "profile": "AWS_PROFILE"}
_S3_CLIENT_KEYS = {"endpoint_url": "AWS_ENDPOINT_URL", "region_name": "AWS_REGION"}
_AZURE_KEYS = {
    "account_name": "AZURE_STORAGE_ACCOUNT_NAME", "account_key": "AZURE_STORAGE_ACCOUNT_KEY", "sas_token": "AZURE_STORAGE_SAS_TOKEN",
    "client_id": "AZURE_CLIENT_ID", "client_secret": "AZURE_CLIENT_SECRET", "tenant_id": "AZURE_TENANT_ID",
}  # fmt: skip
#: an Azure connection string's parts -> the deltalake option they set
_CONNECTION_KEYS = {
    "AccountName": "AZURE_STORAGE_ACCOUNT_NAME", "AccountKey": "AZURE_STORAGE_ACCOUNT_KEY",
    "SharedAccessSignature": "AZURE_STORAGE_SAS_TOKEN", "BlobEndpoint": "AZURE_ENDPOINT",
}  # fmt: skip
_NATIVE_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_")
#: reader features whose tables this loader reads as deltalake does (others change how a data file's
#: values are to be read: refused, naming the feature)
_READER_FEATURES = {
    "deletionVectors", "columnMapping", "timestampNtz", "v2Checkpoint", "vacuumProtocolCheck",
    "typeWidening", "typeWidening-preview", "variantType", "variantType-preview", "domainMetadata",
}  # fmt: skip
_MAPPING_ID = b"delta.columnMapping.id"
_MAPPING_NAME = b"delta.columnMapping.physicalName"


def _deltalake() -> Any:
    try:
        import deltalake
    except ImportError as error:
        raise ImportError(f"{error}; Delta Lake tables need deltalake: pip install 'torch_dataloader_utils[delta]' (or pip install deltalake)") from error
    return deltalake


def delta_storage_options(storage_options: dict | None, path: str = "") -> dict[str, str] | None:
    """deltalake's options for fsspec's, by the table's store: s3fs's (key, secret, token, profile,
    anon, client_kwargs' endpoint and region), adlfs's (account name and key, SAS token, service
    principal, connection string) or gcsfs's (a service account file or "anon" as ``token``,
    ``endpoint_url``); ValueError for
    deltalake's own names, which fsspec, reading the data files, cannot take."""
    if not storage_options:
        return None
    native = sorted(k for k in storage_options if isinstance(k, str) and k.upper().startswith(_NATIVE_PREFIXES))
    if native:
        raise ValueError(
            f"storage_options for Delta table {path!r} names {native}: deltalake's option names. Pass fsspec's options instead "
            "(s3fs: key, secret, token, client_kwargs={'endpoint_url': ..., 'region_name': ...}; adlfs: account_name, account_key, "
            "sas_token or connection_string; gcsfs: token): the data files are read through fsspec with them, and deltalake gets "
            "them under its names"
        )
    scheme = path.split("://", 1)[0].lower() if "://" in path else ""
    if scheme in ("az", "abfs", "abfss", "adl", "azure"):
        options = {_AZURE_KEYS[k]: str(v) for k, v in storage_options.items() if k in _AZURE_KEYS}
        for part in str(storage_options.get("connection_string") or "").split(";"):
            name, _, value = part.partition("=")
            if name.strip() in _CONNECTION_KEYS and value:
                options[_CONNECTION_KEYS[name.strip()]] = value.strip()
        endpoint, allow_http = "AZURE_ENDPOINT", "AZURE_ALLOW_HTTP"
    elif scheme in ("gs", "gcs"):
        token = storage_options.get("token")
        options = {"GOOGLE_SERVICE_ACCOUNT": token} if isinstance(token, str) and token.endswith(".json") else {}
        if token == "anon":
            options["GOOGLE_SKIP_SIGNATURE"] = "true"
        if storage_options.get("endpoint_url"):
            options["GOOGLE_BASE_URL"] = str(storage_options["endpoint_url"])
        endpoint, allow_http = "GOOGLE_BASE_URL", "ALLOW_HTTP"
    else:
        options = {_S3_KEYS[k]: str(v) for k, v in storage_options.items() if k in _S3_KEYS}
        if storage_options.get("anon") is True:
            options["AWS_SKIP_SIGNATURE"] = "true"
        for key, value in (storage_options.get("client_kwargs") or {}).items():
            if key in _S3_CLIENT_KEYS:
                options[_S3_CLIENT_KEYS[key]] = str(value)
        endpoint, allow_http = "AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP"
    if str(options.get(endpoint, "")).startswith("http://"):
        options[allow_http] = "true"
    return options


def open_delta(path: str, version: int | None, storage_options: dict | None, from_state: bool = False) -> Any:
    """The ``DeltaTable`` at ``version`` (None: the latest)."""
    deltalake = _deltalake()
    options = delta_storage_options(storage_options, path)
    try:
        return deltalake.DeltaTable(path, version=version, storage_options=options)
    except Exception as error:
        if version is None or (type(error).__name__ == "TableNotFoundError" and not (from_state and _exists(path, storage_options))):
            if type(error).__name__ == "DeltaError":  # (deltalake's message need not name the table)
                raise ValueError(f"deltalake cannot open Delta table {path!r}: {error}") from error
            raise
        if from_state:  # (its log cleaned up: deltalake says TableNotFoundError for the version alone)
            raise CheckpointMismatchError(
                f"Checkpoint state was taken on version {version} of Delta table {path!r}, which cannot be loaded any more "
                f"({type(error).__name__}: {error}).\n\n  Its log or files were cleaned up (log retention, VACUUM): start the epoch "
                "again from its beginning (set_epoch), or keep versions until training jobs that read them end."
            ) from error
        raise ValueError(f"Delta table {path!r} has no version {version} that can be loaded ({type(error).__name__}: {error})") from error


def _exists(path: str, storage_options: dict | None) -> bool:
    """Whether the latest version of the Delta table at ``path`` loads."""
    try:
        _deltalake().DeltaTable(path, storage_options=delta_storage_options(storage_options, path))
    except Exception:  # noqa: BLE001 - any failure means the same here
        return False
    return True


def _deletion_vectors(table: Any, fs: Any) -> dict[str, np.ndarray]:
    """Storage path -> positions the file's deletion vector deletes."""
    vectors = pa.RecordBatchReader.from_stream(table.deletion_vectors()).read_all()
    dropped = {}
    for path, keep in zip(vectors.column("filepath").to_pylist(), vectors.column("selection_vector").to_pylist()):
        dropped[fs._strip_protocol(_decoded(path))] = np.flatnonzero(~np.asarray(keep, dtype=bool)).astype(np.int64)
    return dropped


def plan_delta(table: Any, uri: str, storage_options: dict | None) -> TablePlan:
    """The version's data files, with partition values as constant columns and deletion vectors applied."""
    reader_features = set(table.protocol().reader_features or [])
    features = sorted(reader_features - _READER_FEATURES)
    if features:
        raise ValueError(
            f"Delta table {uri!r} requires the reader feature(s) {features}, which change how its data files are read and "
            f"which this loader does not implement; it reads tables with {sorted(_READER_FEATURES)}"
        )
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mode not in ("none", "name", "id"):
        raise ValueError(f"Delta table {uri!r} has delta.columnMapping.mode {mode!r}; this loader reads the modes 'none', 'name' and 'id'")
    logged = pa.schema(table.schema().to_arrow())
    schema = pa.schema([without_field_metadata(column) for column in logged])
    field_names, physical_ids = column_mapping(logged) if mode != "none" else (None, None)
    actions = pa.table(table.get_add_actions(flatten=True))
    relative = actions.column("path").to_pylist()
    full_paths = [_full_path(table.table_uri, path) for path in relative]
    fs = table_filesystem(full_paths[0] if full_paths else _decoded(table.table_uri), storage_options)
    has_vectors = "deletionVectors" in reader_features
    vectors = _deletion_vectors(table, fs) if has_vectors else {}
    partitions = [name for name in actions.column_names if name.startswith("partition.")]
    values = {name: actions.column(name).to_pylist() for name in partitions}
    files = []
    for row, full in enumerate(full_paths):
        constants = {}
        for column in partitions:
            name = column[len("partition.") :]
            constants[name] = pa.scalar(values[column][row], schema.field(name).type)
        dropped = vectors.get(fs._strip_protocol(full), np.zeros(0, dtype=np.int64))
        by_name = physical_ids if mode == "name" else None
        files.append(TableFile(full, merge_dropped(dropped), field_names, constants, physical_ids=by_name))
    return TablePlan(TableRef("delta", table.table_uri, int(table.version())), files, schema, fs)



def column_mapping(schema: pa.Schema) -> tuple[dict[int, str], dict[tuple[str, ...], int]]:
    """A column-mapped table's fields (``delta.columnMapping.*`` metadata on the logged schema, nested
    fields included): field id -> the field's name, and its path of physical names (``stored_path``)
    -> its field id."""
    names: dict[int, str] = {}
    paths: dict[tuple[str, ...], int] = {}

    def visit(item: pa.Field, path: tuple[str, ...]) -> None:
        metadata = item.metadata or {}
        if _MAPPING_ID in metadata:
            names[int(metadata[_MAPPING_ID])] = item.name
            paths[path] = int(metadata[_MAPPING_ID])
        kind = item.type

        def walk(child: pa.Field, index: int) -> pa.Field:  # a struct's fields are stored under their physical names
            visit(child, (*path, _physical(child)) if pa.types.is_struct(kind) else stored_path(path, kind, index))
            return child

        with_children(kind, walk)

    for column in schema:
        visit(column, (_physical(column),))
    return names, paths


def _physical(item: pa.Field) -> str:
    """The name a column-mapped table's files store ``item`` under."""
    return (item.metadata or {}).get(_MAPPING_NAME, item.name.encode()).decode()


def without_field_metadata(item: pa.Field) -> pa.Field:
    """``item`` without the log's field metadata (column mapping's ids and names), nested fields too."""
    return pa.field(item.name, with_children(item.type, lambda child, _: without_field_metadata(child)), item.nullable)


def _decoded(uri: str) -> str:
    """A URI deltalake gives (``table_uri``, a deletion vector's file: percent-encoded, so a space
    is ``%20``) as the path the filesystem opens."""
    scheme, sep, rest = uri.partition("://")
    return f"{scheme}{sep}{unquote(rest)}" if sep else unquote(uri)


def _full_path(table_uri: str, path: str) -> str:
    """An add action's file: a percent-encoded URI, relative to the table unless absolute."""
    return _decoded(path) if "://" in path else f"{_decoded(table_uri).rstrip('/')}/{unquote(path)}"

"""Small Iceberg and Delta tables for the tests: an embedded pyiceberg SqlCatalog (SQLite) and local
Delta tables written with deltalake; rows carry ``id`` and ``x = id / 2`` so a batch checks itself."""

from __future__ import annotations

import os
import uuid
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import resume_helpers
import torch


def rows(start: int, stop: int, **extra: Any) -> pa.Table:
    ids = pa.array(range(start, stop), pa.int64())
    return pa.table({"id": ids, "x": pa.array([i * 0.5 for i in range(start, stop)]), **extra})


def batch_key(batch: dict) -> tuple:
    ids = batch["id"].tolist()
    if "x" in batch:
        assert torch.equal(batch["x"], batch["id"].double() * 0.5), "x out of step with id"
    return tuple(ids)


def run_epoch(loader, dataset, states: list | None = None) -> list[tuple]:
    """All batches of one pass (as ``batch_key``s); with ``states`` also the JSON state after every batch."""
    return resume_helpers.run_epoch(loader, dataset, states, key=batch_key)


def ids_of(batches: list[tuple]) -> list[int]:
    return [i for b in batches for i in b]


def iceberg_config(warehouse: str, **extra: str) -> dict:
    """A catalog_config for an embedded SQLite catalog with its warehouse at ``warehouse``."""
    local = warehouse if "://" not in warehouse else None
    db = os.path.join(local or extra.pop("db_dir"), "catalog.db")
    return {"name": "test", "type": "sql", "uri": f"sqlite:///{db}", "warehouse": warehouse if not local else f"file://{local}", **extra}


def iceberg_table(config: dict, name: str = "db.t", row_group_rows: int = 100, **properties: str) -> Any:
    from pyiceberg.catalog import load_catalog

    settings = dict(config)
    catalog = load_catalog(settings.pop("name"), **settings)
    namespace = name.split(".")[0]
    if (namespace,) not in catalog.list_namespaces():
        catalog.create_namespace(namespace)
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64())])
    return catalog.create_table(name, schema=schema, properties={"write.parquet.row-group-limit": str(row_group_rows), **properties})


def data_files(table: Any) -> list[str]:
    """The current snapshot's data files, in the order their rows were appended (by first id)."""
    files = [task.file for task in table.scan().plan_files()]
    return [f.file_path for f in sorted(files, key=lambda f: int.from_bytes(f.lower_bounds[1], "little", signed=True))]


def _delete_writer(writer: Any, content: Any) -> Any:
    """A manifest writer that writes a delete manifest (pyiceberg writes data manifests only)."""
    from pyiceberg.manifest import ManifestWriterV2

    class DeleteManifestWriter(ManifestWriterV2):
        def content(self):
            return content

        @property
        def _meta(self):
            return {**super()._meta, "content": "deletes"}

    writer.__class__ = DeleteManifestWriter
    return writer


def _commit_delete_file(table: Any, data_file: Any) -> None:
    from pyiceberg.manifest import ManifestContent

    with table.transaction() as tx:
        with tx.update_snapshot().fast_append() as append:
            new_writer = append.new_manifest_writer
            append.new_manifest_writer = lambda spec: _delete_writer(new_writer(spec), ManifestContent.DELETES)
            append.append_data_file(data_file)


def _write_delete_file(table: Any, columns: dict, schema: pa.Schema, fs: Any = None) -> tuple[str, int]:
    path = f"{table.location()}/data/deletes-{uuid.uuid4()}.parquet"
    if fs is None:
        local = path.removeprefix("file://")
        pq.write_table(pa.table(columns, schema=schema), local)
        return path, os.path.getsize(local)
    with fs.open(path, "wb") as handle:
        pq.write_table(pa.table(columns, schema=schema), handle)
    return path, fs.info(path)["size"]


def add_position_deletes(table: Any, data_path: str, positions: list[int], fs: Any = None) -> None:
    """Commit a position delete file deleting ``positions`` of ``data_path`` (merge-on-read, as
    Spark or Flink write them; pyiceberg itself rewrites files to delete)."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    schema = pa.schema(
        [
            pa.field("file_path", pa.string(), nullable=False, metadata={"PARQUET:field_id": "2147483546"}),
            pa.field("pos", pa.int64(), nullable=False, metadata={"PARQUET:field_id": "2147483545"}),
        ]
    )
    path, size = _write_delete_file(table, {"file_path": [data_path] * len(positions), "pos": positions}, schema, fs)
    data_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES, file_path=path, file_format=FileFormat.PARQUET, partition=Record(),
        record_count=len(positions), file_size_in_bytes=size,
    )  # fmt: skip
    data_file.spec_id = table.spec().spec_id
    _commit_delete_file(table, data_file)


def add_equality_deletes(table: Any, ids: list[int]) -> None:
    """Commit an equality delete file on column ``id``."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False, metadata={"PARQUET:field_id": "1"})])
    path, size = _write_delete_file(table, {"id": ids}, schema)
    data_file = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES, file_path=path, file_format=FileFormat.PARQUET, partition=Record(),
        record_count=len(ids), file_size_in_bytes=size, equality_ids=[1],
    )  # fmt: skip
    data_file.spec_id = table.spec().spec_id
    _commit_delete_file(table, data_file)


_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def _z85(data: bytes) -> str:
    data = data + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        out.append("".join(_Z85[value // 85**k % 85] for k in range(4, -1, -1)))
    return "".join(out)


def add_deletion_vector(table_path: str, file_path: str, positions: list[int]) -> list[int]:
    """Commit an inline deletion vector deleting ``positions`` of the table's file ``file_path``
    (as Spark or Databricks write them; deltalake rewrites files to delete). Returns the ids deleted."""
    import glob
    import json
    import struct
    import time

    from pyroaring import BitMap

    log = os.path.join(table_path, "_delta_log")
    versions = sorted(glob.glob(os.path.join(log, "*.json")))
    add = None
    for name in versions:
        with open(name) as handle:
            for line in handle:
                action = json.loads(line)
                if "add" in action and action["add"]["path"] == file_path:
                    add = action["add"]
    assert add is not None, file_path
    bitmap = BitMap(positions).serialize()
    data = struct.pack("<i", 1681511377) + struct.pack("<q", 1) + struct.pack("<I", 0) + bitmap
    vector = {"storageType": "i", "pathOrInlineDv": _z85(data), "sizeInBytes": len(data), "cardinality": len(positions)}
    now = int(time.time() * 1000)
    remove = {"path": file_path, "deletionTimestamp": now, "dataChange": True, "partitionValues": add.get("partitionValues", {}), "size": add["size"]}
    actions = [{"remove": remove}, {"add": {**add, "deletionVector": vector, "dataChange": True, "modificationTime": now}}]
    with open(os.path.join(log, f"{len(versions):020d}.json"), "w") as handle:
        handle.write("\n".join(json.dumps(a) for a in actions) + "\n")
    ids = pq.read_table(os.path.join(table_path, unquote(file_path))).column("id").to_pylist()
    return [ids[p] for p in positions]


def commit_delta_metadata(table_path: str, schema: dict | None = None, configuration: dict | None = None, protocol: dict | None = None) -> None:
    """Commit a new version of a Delta table's metadata (its schema, as ``schemaString``'s JSON, its
    configuration) and protocol, as Spark's ALTER TABLE does (deltalake cannot rename or drop columns)."""
    import glob
    import json

    from deltalake import DeltaTable

    table = DeltaTable(table_path)
    metadata = table.metadata()
    log = os.path.join(table_path, "_delta_log")
    version = len(glob.glob(os.path.join(log, "*.json")))
    action = {
        "id": metadata.id, "format": {"provider": "parquet", "options": {}}, "partitionColumns": list(metadata.partition_columns),
        "schemaString": json.dumps(schema if schema is not None else json.loads(table.schema().to_json())),
        "configuration": {**metadata.configuration, **(configuration or {})}, "createdTime": metadata.created_time,
    }  # fmt: skip
    actions = [{"metaData": action}] + ([{"protocol": protocol}] if protocol else [])
    with open(os.path.join(log, f"{version:020d}.json"), "w") as handle:
        handle.write("\n".join(json.dumps(a) for a in actions) + "\n")

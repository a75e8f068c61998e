"""IcebergDataset refusing what it cannot read, naming the table: deletion vectors, a table
before its first commit, manifests and metadata pyiceberg cannot parse (tables of
duckdb-iceberg's test data in tests/fixtures/duckdb-iceberg)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("pyiceberg")

from table_helpers import iceberg_config, iceberg_table, rows  # noqa: E402

from torch_dataloader_utils import IcebergDataset  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "duckdb-iceberg"


def _registered(tmp_path, monkeypatch, namespace: str, name: str, metadata: str):
    """A fixture table registered in a SQL catalog, read from a working directory holding its ``data/``."""
    from pyiceberg.catalog import load_catalog

    shutil.copytree(FIXTURES / "data", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    config = iceberg_config(str(tmp_path))
    catalog = load_catalog(**config)
    catalog.create_namespace(namespace)
    return config, catalog.register_table(f"{namespace}.{name}", metadata)


def test_a_deletion_vector_is_refused_naming_the_table_and_files(tmp_path, monkeypatch):
    """A v3 table's Puffin deletion vector (duckdb-iceberg's test table): read as a Parquet delete
    file it gave pyarrow's "magic bytes not found" for a '<Buffer>'; the snapshot before it reads."""
    metadata = "data/persistent/legacy_bare_deletion_vector/warehouse/default/legacy_bare_deletion_vector/metadata/00002-legacy-bare-dv.metadata.json"
    config, table = _registered(tmp_path, monkeypatch, "v3", "t", metadata)
    with pytest.raises(ValueError, match=r"'v3.t' snapshot .*/legacy-bare-deletion-vector.puffin, a deletion vector"):
        IcebergDataset.create_dataloader("v3.t", config, batch_size=8, num_workers=0)
    before = table.snapshot_by_id(table.current_snapshot().parent_snapshot_id)
    loader, dataset = IcebergDataset.create_dataloader("v3.t", config, batch_size=100, num_workers=0, snapshot_id=before.snapshot_id, nulls="fill")
    assert len(dataset) == table.scan(snapshot_id=before.snapshot_id).to_arrow().num_rows > 0


def test_a_table_before_its_first_commit_is_refused_saying_so(tmp_path):
    from pyiceberg.catalog import load_catalog

    config = iceberg_config(str(tmp_path))
    catalog = load_catalog(**config)
    catalog.create_namespace("db")
    catalog.create_table("db.new", schema=rows(0, 1).schema)
    with pytest.raises(ValueError, match="'db.new' has no snapshot yet"):
        IcebergDataset.create_dataloader("db.new", config, batch_size=8, num_workers=0)


def test_a_manifest_pyiceberg_cannot_parse_is_named_with_the_table(tmp_path, monkeypatch):
    """BigQuery's manifest of duckdb-iceberg's test data: pyiceberg raises a bare TypeError."""
    config, _ = _registered(tmp_path, monkeypatch, "bq", "t", "data/persistent/big_query_error/metadata/v1749025517.metadata.json")
    with pytest.raises(ValueError, match=r"pyiceberg cannot read the manifests of Iceberg table 'bq.t' snapshot \d+: TypeError"):
        IcebergDataset.create_dataloader("bq.t", config, batch_size=8, num_workers=0)


def test_metadata_pyiceberg_cannot_parse_is_named_with_the_table(tmp_path):
    config = iceberg_config(str(tmp_path))
    iceberg = iceberg_table(config)
    iceberg.append(rows(0, 10))
    iceberg = iceberg.refresh()
    metadata = iceberg.metadata_location.removeprefix("file://")
    with open(metadata) as handle:
        text = handle.read()
    with open(metadata, "w") as handle:
        handle.write(text.replace('"format-version"', '"format-versio"', 1))
    with pytest.raises(ValueError, match=r"pyiceberg cannot load Iceberg table 'db.t' of catalog 'test'"):
        IcebergDataset.create_dataloader("db.t", config, batch_size=8, num_workers=0)

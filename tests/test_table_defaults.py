"""tables/defaults.py: Iceberg column defaults (``initial-default``) in the rows of files written
before the column was added, on tables Spark wrote (tests/fixtures/duckdb-iceberg), compared with
pyiceberg's own read; and struct fields no data file holds yet."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

pytest.importorskip("pyiceberg")

from table_helpers import iceberg_config  # noqa: E402

from torch_dataloader_utils import IcebergDataset  # noqa: E402
from torch_dataloader_utils.testing import assert_resumes_exactly  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "duckdb-iceberg"
TABLES = {
    "flat": "add_columns_with_defaults/default.db/add_columns_with_defaults/metadata/00003-3f1801a5-7dfb-4072-b14a-39cd12f9279b.metadata.json",
    "nested": "add_columns_with_defaults_in_struct/default.db/add_columns_with_defaults_in_struct/metadata/00003-21a957f9-c2ee-431a-9d18-bf257b561198.metadata.json",
}


@pytest.fixture
def spark_tables(tmp_path, monkeypatch):
    """The tables registered in a SQL catalog, read from a working directory holding their ``data/``."""
    from pyiceberg.catalog import load_catalog

    shutil.copytree(FIXTURES / "data", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    config = iceberg_config(str(tmp_path))
    catalog = load_catalog(**config)
    catalog.create_namespace("spark")
    tables = {name: catalog.register_table(f"spark.{name}", f"data/persistent/{path}") for name, path in TABLES.items()}
    return config, tables


def _read(config: dict, name: str, **kwargs) -> pa.Table:
    loader, _ = IcebergDataset.create_dataloader(f"spark.{name}", config, batch_size=2, num_workers=0, output_format="arrow", **kwargs)
    return pa.Table.from_batches(list(loader))


def _sorted(table: pa.Table, column: str) -> pa.Table:
    return table.append_column("key", pc.cast(table[column], pa.int64())).sort_by("key")


def _expected(table, struct: str | None = None) -> pa.Table:
    read = table.scan().to_arrow()
    columns = read.column(struct).combine_chunks().flatten() if struct else read.columns
    names = [f"{struct}.{n}" for n in read.schema.field(struct).type.names] if struct else read.column_names
    plain = pa.table({n: c.cast(c.type.storage_type) if isinstance(c.type, pa.BaseExtensionType) else c for n, c in zip(names, columns)})
    return _sorted(plain, f"{struct}.col_integer" if struct else "col_integer")


@pytest.mark.parametrize("name, struct", [("flat", None), ("nested", "a")])
def test_rows_written_before_a_column_hold_its_default_as_pyiceberg_reads_them(spark_tables, name, struct):
    config, tables = spark_tables
    expected = _expected(tables[name], struct)
    got = _sorted(_read(config, name), f"{struct}.col_integer" if struct else "col_integer")
    assert got.num_rows == expected.num_rows >= 2
    for column in expected.column_names:
        assert got[column].to_pylist() == expected[column].to_pylist(), column
    assert 342342 in got[f"{struct}.col_integer" if struct else "col_integer"].to_pylist()  # the default, not None


def test_a_filter_on_a_defaulted_column_keeps_the_rows_that_hold_the_default(spark_tables):
    config, tables = spark_tables
    got = _read(config, "flat", filters=pc.field("col_integer") == 342342)
    assert got.num_rows == 2 and set(got["col_string"].to_pylist()) == {"HELLO"}


def test_defaulted_columns_resume_exactly_and_read_the_default_through_random_access(spark_tables):
    config, _ = spark_tables

    def make():
        return IcebergDataset.create_dataloader("spark.flat", config, batch_size=1, num_workers=0, shuffle=True, output_format="dict")

    _, dataset = make()
    assert sorted(dataset[i]["col_integer"] for i in range(dataset.num_rows)) == [342342, 342342, 453243]
    assert_resumes_exactly(make, epochs=1, batch_key=lambda batch: tuple(batch["col1"]))


def test_a_struct_field_no_data_file_holds_yet_is_read_as_nulls(tmp_path):
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType, StructType

    config = iceberg_config(str(tmp_path))
    catalog = load_catalog(**config)
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "st", StructType(NestedField(3, "a", LongType()))))
    table = catalog.create_table("db.t", schema=schema)
    table.append(pa.Table.from_pydict({"id": [1, 2], "st": [{"a": 1}, {"a": 2}]}, schema=table.schema().as_arrow()))
    with table.update_schema() as update:
        update.add_column(("st", "c"), StringType())
        update.add_column("top", StringType())
    loader, dataset = IcebergDataset.create_dataloader("db.t", config, batch_size=8, num_workers=0, output_format="dict")
    assert dataset.schema.names == ["id", "st.a", "st.c", "top"]
    (batch,) = list(loader)
    assert batch == {"id": [1, 2], "st.a": [1, 2], "st.c": [None, None], "top": [None, None]}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_field_added_to_a_struct_in_a_list_or_a_map_holds_its_default_or_nulls(tmp_path, workers):
    """As pyiceberg reads them: before any file stores the fields, and next to a file that does."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import ListType, LongType, MapType, NestedField, StringType, StructType

    config = iceberg_config(str(tmp_path))
    catalog = load_catalog(**config)
    catalog.create_namespace("db")
    element = StructType(NestedField(6, "b", LongType()))
    value = StructType(NestedField(9, "v", LongType()))
    schema = Schema(NestedField(1, "id", LongType()), NestedField(4, "ls", ListType(5, element)), NestedField(7, "m", MapType(8, StringType(), 10, value)))
    table = catalog.create_table("db.t", schema=schema)
    table.append(pa.Table.from_pydict({"id": [1], "ls": [[{"b": 1}, {"b": 3}]], "m": [[("k", {"v": 1})]]}, schema=table.schema().as_arrow()))
    with table.update_schema() as update:
        update.add_column(("ls", "element", "f"), LongType(), default_value=9)
        update.add_column(("ls", "element", "g"), LongType())
        update.add_column(("m", "value", "w"), LongType(), default_value=7)

    def rows() -> list[tuple]:
        loader, _ = IcebergDataset.create_dataloader("db.t", config, batch_size=8, num_workers=workers, output_format="dict")
        return sorted((i, ls, list(zip(keys, values))) for batch in loader for i, ls, keys, values in zip(batch["id"], batch["ls"], batch["m.keys"], batch["m.values"]))

    def expected() -> list[tuple]:
        read = catalog.load_table("db.t").scan().to_arrow().to_pylist()
        return sorted((row["id"], row["ls"], row["m"]) for row in read)

    assert rows() == expected() == [(1, [{"b": 1, "f": 9, "g": None}, {"b": 3, "f": 9, "g": None}], [("k", {"v": 1, "w": 7})])]
    table = catalog.load_table("db.t")
    table.append(pa.Table.from_pydict({"id": [2], "ls": [[{"b": 2, "f": 5, "g": 6}]], "m": [[("j", {"v": 2, "w": 8})]]}, schema=table.schema().as_arrow()))
    assert rows() == expected() and rows()[0][1][0]["f"] == 9

"""IcebergDataset over schemas that changed: type promotion, files imported without field ids
(name mapping, partition values from the manifest), and fields added to or renamed inside structs."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

pytest.importorskip("pyiceberg")

from table_helpers import iceberg_config  # noqa: E402

from torch_dataloader_utils import IcebergDataset  # noqa: E402


def test_type_promotion_widens_old_files(tmp_path):
    """int -> long after the first file: the old file's values are read as the promoted type."""
    import pyarrow as pa
    from pyiceberg.types import LongType

    config = iceberg_config(str(tmp_path))
    ice = catalog_of(config).create_table("db.t", schema=pa.schema([("id", pa.int64()), ("n", pa.int32())]))
    ice.append(pa.table({"id": pa.array([0, 1], pa.int64()), "n": pa.array([5, 6], pa.int32())}))
    with ice.update_schema() as update:
        update.update_column("n", LongType())
    ice.append(pa.table({"id": pa.array([2], pa.int64()), "n": pa.array([2**40], pa.int64())}))
    loader, _ = IcebergDataset.create_dataloader("db.t", config, batch_size=10, num_workers=0)
    (batch,) = list(loader)
    assert batch["n"].dtype == torch.int64 and dict(zip(batch["id"].tolist(), batch["n"].tolist())) == {0: 5, 1: 6, 2: 2**40}


def catalog_of(config):
    """The pyiceberg catalog of ``config``, with the namespace "db"."""
    from pyiceberg.catalog import load_catalog

    settings = dict(config)
    catalog = load_catalog(settings.pop("name"), **settings)
    catalog.create_namespace("db")
    return catalog


def ids_and(dataset_args, column):
    """(id, value of ``column``) of every row the dataset delivers, by id."""
    loader, _ = IcebergDataset.create_dataloader(**{"batch_size": 64, "num_workers": 0, **dataset_args})
    return sorted((int(i), v) for batch in loader for i, v in zip(batch["id"].tolist(), batch[column]))


def test_imported_files_take_partition_values_and_names_from_the_table_metadata(tmp_path):
    """Files imported Hive-style (add_files, Spark's migrate) store neither field ids nor the identity
    partition column: names follow the table's name mapping (a rename included), and the partition
    value comes from the manifest, also for a scan_filter on it."""
    import pyarrow.parquet as pq
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.typedef import Record
    from pyiceberg.types import LongType, NestedField, StringType

    config = iceberg_config(str(tmp_path))
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "name", StringType()), NestedField(3, "region", StringType()))
    table = catalog_of(config).create_table("db.t", schema=schema, partition_spec=PartitionSpec(PartitionField(3, 1000, IdentityTransform(), "region")))
    with table.transaction() as transaction:  # as a migration commits them: the partition tuple from the directory
        transaction.set_properties({"schema.name-mapping.default": table.schema().name_mapping.model_dump_json()})
        with transaction.update_snapshot().fast_append() as append:
            for k, region in enumerate(["eu", "us"]):
                path = tmp_path / f"region={region}" / "part-0.parquet"
                path.parent.mkdir()
                pq.write_table(pa.table({"id": pa.array([2 * k, 2 * k + 1], pa.int64()), "name": [f"n{2 * k}", f"n{2 * k + 1}"]}), path)
                append.append_data_file(DataFile.from_args(
                    content=DataFileContent.DATA, file_path=str(path), file_format=FileFormat.PARQUET, partition=Record(region),
                    record_count=2, file_size_in_bytes=path.stat().st_size, spec_id=0,
                ))  # fmt: skip
    with table.update_schema() as update:
        update.rename_column("name", "label")
    table.append(pa.Table.from_pydict({"id": [4], "label": ["n4"], "region": ["eu"]}, schema=table.schema().as_arrow()))
    args = dict(table="db.t", catalog_config=config)
    assert ids_and(args, "label") == [(i, f"n{i}") for i in range(5)]
    assert ids_and(args, "region") == list(zip(range(5), ["eu", "eu", "us", "us", "eu"]))
    assert [i for i, _ in ids_and({**args, "scan_filter": "region == 'eu'"}, "region")] == [0, 1, 4]


def test_a_scan_filter_on_a_struct_leaf_reads_that_leaf(tmp_path):
    """Not the top-level column of the same name."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StructType

    config = iceberg_config(str(tmp_path))
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "a", LongType()), NestedField(3, "st", StructType(NestedField(4, "a", LongType()))))
    table = catalog_of(config).create_table("db.t", schema=schema)
    table.append(pa.Table.from_pydict({"id": list(range(10)), "a": [100 - i for i in range(10)], "st": [{"a": i} for i in range(10)]}, schema=table.schema().as_arrow()))
    assert [i for i, _ in ids_and(dict(table="db.t", catalog_config=config, scan_filter="st.a >= 5"), "a")] == [5, 6, 7, 8, 9]


def test_a_field_added_to_a_struct_is_null_in_older_files(tmp_path):
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StructType

    config = iceberg_config(str(tmp_path))
    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "st", StructType(NestedField(3, "a", LongType()))))
    table = catalog_of(config).create_table("db.t", schema=schema)
    table.append(pa.Table.from_pydict({"id": [0, 1], "st": [{"a": 10}, {"a": 11}]}, schema=table.schema().as_arrow()))
    with table.update_schema() as update:
        update.add_column(("st", "b"), LongType())
    table.append(pa.Table.from_pydict({"id": [2], "st": [{"a": 12, "b": 5}]}, schema=table.schema().as_arrow()))
    args = dict(table="db.t", catalog_config=config, nulls="mask")
    assert ids_and(args, "st.a") == [(0, 10), (1, 11), (2, 12)]
    loader, _ = IcebergDataset.create_dataloader(**{"batch_size": 64, "num_workers": 0, **args})
    (batch,) = list(loader)
    valid = dict(zip(batch["id"].tolist(), batch["st.b.valid"].tolist()))
    assert valid == {0: False, 1: False, 2: True}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_field_renamed_inside_a_struct_is_followed_by_id(tmp_path, workers):
    """Older files store the struct field under its old name: their values come under the new one,
    as pyiceberg reads them, in a struct, a list of structs and a map's values; a filter on the
    renamed leaf reads those files too, and dataset[i] agrees."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import ListType, LongType, MapType, NestedField, StringType, StructType

    config = iceberg_config(str(tmp_path))
    schema = Schema(
        NestedField(1, "id", LongType()),
        NestedField(2, "st", StructType(NestedField(3, "a", LongType()), NestedField(4, "inner", StructType(NestedField(5, "c", LongType()))))),
        NestedField(6, "ls", ListType(7, StructType(NestedField(8, "p", LongType())))),
        NestedField(9, "m", MapType(10, StringType(), 11, StructType(NestedField(12, "q", LongType())))),
    )
    table = catalog_of(config).create_table("db.t", schema=schema)

    def rows_from(start: int, a: str, c: str, p: str, q: str) -> pa.Table:
        ids = range(start, start + 3)
        data = {
            "id": list(ids), "st": [{a: 10 + i, "inner": {c: 20 + i}} for i in ids],
            "ls": [[{p: 30 + i}, {p: 40 + i}] for i in ids], "m": [[("k", {q: 50 + i})] for i in ids],
        }  # fmt: skip
        return pa.Table.from_pydict(data, schema=table.schema().as_arrow())

    table.append(rows_from(0, "a", "c", "p", "q"))
    with table.update_schema() as update:
        update.rename_column("st.a", "aa")
        update.rename_column("st.inner.c", "cc")
        update.rename_column("ls.element.p", "pp")
        update.rename_column("m.value.q", "qq")
    table.append(rows_from(3, "aa", "cc", "pp", "qq"))
    reference = table.scan().to_arrow().sort_by("id")
    loader, dataset = IcebergDataset.create_dataloader(table="db.t", catalog_config=config, batch_size=64, num_workers=workers, output_format="arrow")
    got = pa.Table.from_batches(list(loader)).sort_by("id")  # structs as their leaves, a map as keys and values
    assert got.column("st.aa").to_pylist() == [row["aa"] for row in reference.column("st").to_pylist()] == [10 + i for i in range(6)]
    assert got.column("st.inner.cc").to_pylist() == [20 + i for i in range(6)]
    assert got.column("ls").to_pylist() == reference.column("ls").to_pylist() == [[{"pp": 30 + i}, {"pp": 40 + i}] for i in range(6)]
    assert got.column("m.values").to_pylist() == [[value for _, value in row] for row in reference.column("m").to_pylist()]
    assert got.column("m.values").to_pylist() == [[{"qq": 50 + i}] for i in range(6)]
    rows_read = [dataset[i] for i in range(6)]
    assert sorted((r["id"].as_py(), r["st.aa"].as_py(), r["st.inner.cc"].as_py()) for r in rows_read) == [(i, 10 + i, 20 + i) for i in range(6)]
    args = dict(table="db.t", catalog_config=config, filters=pc.field("st", "aa") >= 11)
    assert ids_and(args, "st.aa") == [(i, 10 + i) for i in range(1, 6)]


def test_a_checkpoint_taken_before_a_rename_resumes_under_the_new_name(tmp_path):
    """The script names the column as the table does now: the checkpoint's snapshot (schema 0) is
    read by field id under the new name, the rest of the epoch equal to the uninterrupted run's;
    the old name, which the table no longer has, is refused saying so."""
    import json

    from table_helpers import iceberg_table, rows

    config = iceberg_config(str(tmp_path))
    ice = iceberg_table(config)
    for start, stop in ((0, 300), (300, 600)):
        ice.append(rows(start, stop))
    settings = dict(batch_size=40, num_workers=2, shuffle=True, split_bytes=1, chunk_rows=80)

    def pairs(loader, column, stop=None):
        out = []
        for number, batch in enumerate(loader):
            out.append(list(zip(batch["id"].tolist(), batch[column].tolist())))
            if number + 1 == stop:
                break
        return out

    full = pairs(IcebergDataset.create_dataloader("db.t", config, columns=["id", "x"], **settings)[0], "x")
    loader, dataset = IcebergDataset.create_dataloader("db.t", config, columns=["id", "x"], **settings)
    assert pairs(loader, "x", stop=4) == full[:4]
    state = json.loads(json.dumps(dataset.state_dict()))
    with ice.update_schema() as update:
        update.rename_column("x", "half")
    ice.append(rows(600, 700).rename_columns(["id", "half"]))
    with pytest.raises(ValueError, match=r"columns \['x'\] are not in the data.*name it as the table does now"):
        IcebergDataset("db.t", config, columns=["id", "x"], **settings)
    loader, dataset = IcebergDataset.create_dataloader("db.t", config, columns=["id", "half"], **settings)
    dataset.load_state_dict(state)
    assert pairs(loader, "half") == full[4:]

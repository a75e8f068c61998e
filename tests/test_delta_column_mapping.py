"""DeltaDataset over tables with column mapping (``delta.columnMapping.mode`` ``name`` or ``id``):
files store columns under physical names and field ids; batches, filters and resumes use the
table's names, also after a column is renamed or dropped, nested fields included."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest

pytest.importorskip("deltalake")

from deltalake import DeltaTable, WriterProperties, write_deltalake  # noqa: E402
from table_helpers import batch_key, commit_delta_metadata, ids_of, rows, run_epoch  # noqa: E402

from torch_dataloader_utils import CheckpointMismatchError, DeltaDataset  # noqa: E402
from torch_dataloader_utils.testing import assert_resumes_exactly  # noqa: E402

CONFIG = dict(batch_size=32, num_workers=2, split_bytes=1, chunk_rows=64, shuffle=True, shuffle_seed=3, shuffle_buffer_rows=150)


def _rows(start: int, stop: int) -> pa.Table:
    ids = range(start, stop)
    nested = pa.array([{"a": i, "b": f"s{i}"} for i in ids], pa.struct([("a", pa.int64()), ("b", pa.string())]))
    return rows(start, stop, st=nested, part=pa.array([f"p{i % 3}" for i in ids]))


def _mapped_table(path: str, mode: str) -> str:
    settings = dict(partition_by=["part"], writer_properties=WriterProperties(max_row_group_size=64))
    write_deltalake(path, _rows(0, 500), configuration={"delta.columnMapping.mode": mode}, **settings)
    write_deltalake(path, _rows(500, 700), mode="append", **settings)
    return path


def _read(path: str, **kwargs) -> pa.Table:
    loader, _ = DeltaDataset.create_dataloader(path, batch_size=1000, num_workers=0, output_format="arrow", **kwargs)
    table = pa.Table.from_batches(list(loader))
    return table.sort_by(table.column_names[0])


def _renamed(schema: dict, renames: dict[str, str], drop: tuple[str, ...] = ()) -> dict:
    """``schema`` (Delta's JSON) with fields renamed (``"st.a"`` names a struct's field) and dropped."""

    def fields(items: list, prefix: str) -> list:
        kept = []
        for item in items:
            dotted = f"{prefix}{item['name']}"
            if dotted in drop:
                continue
            if isinstance(item["type"], dict) and item["type"].get("type") == "struct":
                item = {**item, "type": {**item["type"], "fields": fields(item["type"]["fields"], f"{dotted}.")}}
            kept.append({**item, "name": renames.get(dotted, item["name"])})
        return kept

    return {**schema, "fields": fields(schema["fields"], "")}


@pytest.mark.parametrize("mode", ["name", "id"])
def test_a_column_mapped_table_reads_exactly_and_resumes(tmp_path, mode):
    path = _mapped_table(str(tmp_path / "t"), mode)
    table = _read(path)
    assert table.column_names == ["id", "x", "st.a", "st.b", "part"]
    assert table.column("id").to_pylist() == list(range(700))
    assert table.column("st.a").to_pylist() == list(range(700)) and table.column("st.b").to_pylist()[7] == "s7"
    assert table.column("part").to_pylist() == [f"p{i % 3}" for i in range(700)]
    assert DeltaDataset(path).schema.field("st.a").metadata is None  # the log's mapping metadata stays out of the schema
    filtered = _read(path, filters=(pc.field("part") == "p1") & (pc.field("st", "a") < 300))
    assert filtered.column("id").to_pylist() == [i for i in range(300) if i % 3 == 1]
    reference = assert_resumes_exactly(lambda: DeltaDataset.create_dataloader(path, **CONFIG), points=[(0, 6)], batch_key=batch_key)
    assert sorted(ids_of(reference.batches[0])) == list(range(700))


def test_renamed_and_dropped_columns_follow_the_log(tmp_path):
    """Spark's RENAME COLUMN and DROP COLUMN change only the log: the files keep their physical names."""
    path = _mapped_table(str(tmp_path / "t"), "name")
    loader, before = DeltaDataset.create_dataloader(path, **CONFIG)
    states: list = []
    uninterrupted = run_epoch(loader, before, states)
    schema = json.loads(DeltaTable(path).schema().to_json())
    commit_delta_metadata(path, _renamed(schema, {"id": "ident", "st.a": "aa"}, drop=("x",)))
    table = _read(path)
    assert table.column_names == ["ident", "st.aa", "st.b", "part"]
    assert table.column("ident").to_pylist() == list(range(700)) and table.column("st.aa").to_pylist() == list(range(700))
    assert _read(path, filters=pc.field("st", "aa") >= 650).column("ident").to_pylist() == list(range(650, 700))
    assert _read(path, columns=["ident"]).column_names == ["ident"]
    assert _read(path, version=before.snapshot).column_names == ["id", "x", "st.a", "st.b", "part"]
    loader, resumed = DeltaDataset.create_dataloader(path, **CONFIG)
    resumed.load_state_dict(states[5])  # taken before the rename: its version, read with its names
    assert list(resumed[[3]]) == ["id", "x", "st.a", "st.b", "part"]
    assert run_epoch(loader, resumed) == uninterrupted[6:]
    resumed.set_epoch(1)
    assert list(next(iter(loader))) == ["ident", "st.aa", "st.b", "part"]
    renamed = DeltaDataset(path, **{**CONFIG, "columns": ["ident"]})
    with pytest.raises(CheckpointMismatchError, match=r"(?s)version 1, which this dataset cannot read.*\['ident'\].*renamed since"):
        renamed.load_state_dict(states[5])
    assert renamed.snapshot == 2 and renamed.epoch == 0


def test_a_table_upgraded_to_name_mapping_reads_its_older_files_by_name(tmp_path):
    """Files written before column mapping was enabled store the logical names, without field ids:
    the names the log gives as physical, which stay when a column is renamed later."""
    path = str(tmp_path / "t")
    write_deltalake(path, _rows(0, 300).drop_columns(["part"]))
    schema = json.loads(DeltaTable(path).schema().to_json())
    counter = iter(range(1, 100))

    def mapped(item: dict) -> dict:
        kind = item["type"]
        if isinstance(kind, dict) and kind.get("type") == "struct":
            kind = {**kind, "fields": [mapped(child) for child in kind["fields"]]}
        metadata = {"delta.columnMapping.id": next(counter), "delta.columnMapping.physicalName": item["name"]}
        return {**item, "type": kind, "metadata": metadata}

    upgraded = {**schema, "fields": [mapped(item) for item in schema["fields"]]}
    configuration = {"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": str(next(counter) - 1)}
    commit_delta_metadata(path, upgraded, configuration, protocol={"minReaderVersion": 2, "minWriterVersion": 5})
    commit_delta_metadata(path, _renamed(upgraded, {"x": "half", "st.b": "label"}))
    table = _read(path)
    assert table.column_names == ["id", "half", "st.a", "st.label"]
    assert table.column("half").to_pylist() == [i * 0.5 for i in range(300)]
    assert table.column("st.label").to_pylist() == [f"s{i}" for i in range(300)]


def test_an_unknown_column_mapping_mode_is_refused(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, rows(0, 10))
    commit_delta_metadata(path, configuration={"delta.columnMapping.mode": "position"})
    with pytest.raises(ValueError, match="delta.columnMapping.mode 'position'"):
        DeltaDataset(path)


def test_lists_of_structs_and_maps_keep_the_table_names_and_no_writer_metadata(tmp_path):
    path = str(tmp_path / "t")
    ids = range(50)
    inner = pa.struct([("q", pa.int64()), ("r", pa.string())])
    table = pa.table({
        "id": pa.array(ids, pa.int64()), "ls": pa.array([[{"q": i, "r": str(i)}] for i in ids], pa.list_(inner)),
        "m": pa.array([{"k": i} for i in ids], pa.map_(pa.string(), pa.int64())),
    })  # fmt: skip
    write_deltalake(path, table, configuration={"delta.columnMapping.mode": "name"})
    read = _read(path)
    assert read.column("ls").to_pylist() == table.column("ls").to_pylist()
    assert read.column("m.values").to_pylist() == [[i] for i in ids]
    assert all(not field.metadata for field in read.schema)
    assert read.schema.field("ls").type.value_type.field("q").metadata is None  # no PARQUET:field_id, no physical names

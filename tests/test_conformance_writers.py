"""Black-box conformance on files as other writers make them: each case reads through the public
API only and compares with pyarrow's (or the writer's) own read of the same files."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.testing import assert_resumes_exactly

pytestmark = pytest.mark.timeout(120)


def _arrow_rows(path, **kwargs) -> pa.Table:
    loader, _ = StructuredDataset.create_dataloader(path, format=None, num_workers=0, batch_size=64, output_format="arrow", **kwargs)
    return pa.Table.from_batches(list(loader))


def _views(rows: int) -> pa.Table:
    return pa.table({
        "id": pa.array(range(rows), pa.int64()),
        "s": pa.array([f"s{i}" if i % 5 else None for i in range(rows)], pa.string_view()),
        "b": pa.array([b"x" * (i % 4) for i in range(rows)], pa.binary_view()),
        "tags": pa.array([[f"t{i}"] * (i % 3) for i in range(rows)], pa.list_(pa.string_view())),
    })


def test_string_view_columns_read_as_strings_alone_and_next_to_plain_strings(tmp_path):
    # deltalake (arrow-rs) stores string_view in the files it rewrites: a table after a delete
    # holds string in its old files and string_view in the new ones
    table = _views(300)
    pq.write_table(table, tmp_path / "view.parquet", row_group_size=100)
    plain = table.slice(0, 50).cast(pa.schema([("id", pa.int64()), ("s", pa.string()), ("b", pa.binary()), ("tags", pa.list_(pa.string()))]))
    pq.write_table(plain, tmp_path / "plain.parquet")
    got = _arrow_rows(str(tmp_path / "view.parquet"))
    assert got.schema.field("s").type == pa.large_string() and got["s"].to_pylist() == table["s"].to_pylist()
    assert got["b"].to_pylist() == table["b"].to_pylist() and got["tags"].to_pylist() == table["tags"].to_pylist()
    (batch,) = list(StructuredDataset.create_dataloader(str(tmp_path), num_workers=0, batch_size=350)[0])
    assert batch["s"] == plain["s"].to_pylist() + table["s"].to_pylist()
    assert batch["tags"] == plain["tags"].to_pylist() + table["tags"].to_pylist()
    assert_resumes_exactly(lambda: StructuredDataset.create_dataloader(str(tmp_path / "view.parquet"), num_workers=2, batch_size=64, shuffle=True), epochs=1, stride=2)


def test_delta_table_after_a_delete_reads_its_rewritten_string_view_files(tmp_path):
    deltalake = pytest.importorskip("deltalake")
    from torch_dataloader_utils import DeltaDataset

    path = str(tmp_path / "t")
    rows = pa.table({"id": pa.array(range(400), pa.int64()), "s": [f"s{i}" for i in range(400)]})
    deltalake.write_deltalake(path, rows)
    deltalake.DeltaTable(path).delete("id % 3 = 0")  # rewrites the file, with string_view columns
    loader, dataset = DeltaDataset.create_dataloader(path, batch_size=64, num_workers=0, output_format="arrow")
    got = pa.Table.from_batches(list(loader)).sort_by("id")
    expected = deltalake.DeltaTable(path).to_pyarrow_table().sort_by("id")
    assert len(dataset) == expected.num_rows == 266
    assert got["id"].to_pylist() == expected["id"].to_pylist() and got["s"].to_pylist() == expected["s"].to_pylist()


def test_an_arrow_stream_is_read_and_a_feather_v1_file_is_refused_saying_what_it_is(tmp_path):
    from pyarrow import feather

    table = pa.table({"id": list(range(10))})
    with pa.OSFile(str(tmp_path / "stream.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)  # as polars' write_ipc_stream writes it
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path / "stream.arrow"), format=None, num_workers=0, batch_size=4)
    assert [i for batch in loader for i in batch["id"].tolist()] == list(range(10))
    feather.write_feather(table, str(tmp_path / "old.feather"), version=1)
    with pytest.raises(ValueError, match=r"old.feather: it is a Feather v1 file.*write_feather") as raised:
        StructuredDataset(str(tmp_path / "old.feather"), format=None, num_workers=0)
    assert "Is it a complete" not in str(raised.value)


@pytest.mark.parametrize("name, text", [("bad.csv", "id,s\n1,a\n2,b,c\n"), ("bad.jsonl", '{"id": 1}\n{"id": \n')])
def test_a_text_file_that_does_not_parse_is_named_without_asking_for_a_footer(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=rf"cannot read .*{name} as .*parse error.*(csv|json)_options") as raised:
        StructuredDataset(str(tmp_path / name), format=None, num_workers=0)
    assert "footer" not in str(raised.value) and "Is it a complete" not in str(raised.value)


def test_tdu_plan_names_the_units_of_text_and_arrow_files(capsys, tmp_path):
    from cli_helpers import run
    from pyarrow import feather

    (tmp_path / "a.csv").write_text("id\n" + "".join(f"{i}\n" for i in range(100)))
    feather.write_feather(pa.table({"id": list(range(100))}), str(tmp_path / "a.arrow"), chunksize=10)
    for name, units in [("a.csv", "1 byte ranges"), ("a.arrow", "10 record batches")]:
        code, out, _ = run(capsys, "plan", tmp_path / name, "--format", name.split(".")[1])
        assert code == 0 and units in out, out


def test_json_documents_that_are_not_json_lines_are_named_as_such(tmp_path):
    import json

    (tmp_path / "array.json").write_text(json.dumps([{"id": i} for i in range(5)]))  # pandas' to_json(orient="records")
    with pytest.raises(ValueError, match=r"array\.json as jsonl.*a JSON array or a pretty-printed document is not JSON Lines"):
        StructuredDataset(str(tmp_path / "array.json"), format=None, num_workers=0)
    (tmp_path / "pretty.json").write_text(json.dumps({"id": 1, "inner": {"a": 2}}, indent=2))
    # (refused at planning: a file within pyarrow's first block is parsed whole for its schema; it was planned as 2 rows)
    with pytest.raises(ValueError, match=r"pretty\.json as jsonl.*parses it to 1 rows where the planning scan counted 2.*not JSON Lines: an object spread over several lines"):
        StructuredDataset(str(tmp_path / "pretty.json"), format=None, num_workers=0)

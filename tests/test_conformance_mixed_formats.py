"""A mixture whose sources are of different formats (Source(path, format=...)), as a user
writes it: a Parquet source next to Arrow IPC, CSV or JSON Lines sources written by other
writers, planned, read and resumed as one dataset."""

from __future__ import annotations

import collections

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils import Source, StructuredDataset


def _table(first: int, rows: int) -> pa.Table:
    return pa.table({"id": pa.array(range(first, first + rows), pa.int64()), "x": pa.array([i / 2 for i in range(rows)], pa.float64())})


@pytest.mark.parametrize("other", ["arrow", "csv", "jsonl"])
def test_a_parquet_source_first_mixes_with_sources_of_other_formats(tmp_path, other):
    # The null check from the statistics asked the first source's format (Parquet) to read every
    # file's footer: an Arrow IPC or text footer raised AttributeError at planning.
    pq.write_table(_table(0, 30), tmp_path / "a.parquet", row_group_size=10)
    table = _table(100, 12)
    path = str(tmp_path / f"b.{other}")
    rows = list(zip(table["id"].to_pylist(), table["x"].to_pylist()))
    if other == "arrow":
        with pa.ipc.new_file(path, table.schema) as writer:
            writer.write_table(table)
    elif other == "csv":
        (tmp_path / "b.csv").write_text("id,x\n" + "".join(f"{i},{x}\n" for i, x in rows))
    else:
        (tmp_path / "b.jsonl").write_text("".join(f'{{"id": {i}, "x": {x}}}\n' for i, x in rows))
    sources = [Source(str(tmp_path / "a.parquet")), Source(path, format=other, rows_per_epoch=24)]
    loader, dataset = StructuredDataset.create_dataloader(sources, num_workers=0, batch_size=8)
    counts = collections.Counter(i for batch in loader for i in batch["id"].tolist())
    assert len(dataset) == 54 and sum(counts.values()) == 54
    assert {i: counts[i] for i in range(30)} == dict.fromkeys(range(30), 1) and {counts[i] for i in range(100, 112)} == {2}


def test_polars_arrow_ipc_view_strings_read_alone_with_pyarrow_files_and_in_a_mixture(tmp_path):
    # Polars writes strings and binary to Arrow IPC as string_view / binary_view (also inside
    # lists and structs): they had no batch form and did not unify with pyarrow's strings.
    polars = pytest.importorskip("polars")
    frame = polars.DataFrame({"id": [1, 2], "s": ["a", None], "b": [b"x", b"y"], "tags": [["t"], []], "st": [{"n": "p"}, {"n": "q"}]})
    frame.write_ipc(tmp_path / "polars.arrow")
    assert pa.types.is_string_view(pa.ipc.open_file(tmp_path / "polars.arrow").schema.field("s").type)
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path / "polars.arrow"), format="arrow", num_workers=0, batch_size=8)
    (batch,) = list(loader)
    assert (batch["s"], batch["b"], batch["tags"], batch["st.n"]) == (["a", None], [b"x", b"y"], [["t"], []], ["p", "q"])
    other = pa.table({"id": pa.array([3], pa.int64()), "s": ["c"], "b": [b"z"], "tags": [["u"]], "st": [{"n": "r"}]})
    with pa.ipc.new_file(tmp_path / "pyarrow.arrow", other.schema) as writer:
        writer.write_table(other)
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), format="arrow", num_workers=2, batch_size=8)
    assert sorted(s for batch in loader for s in batch["s"] if s) == ["a", "c"]
    pq.write_table(_table(10, 4).append_column("s", pa.array(["w"] * 4)), tmp_path / "c.parquet")
    sources = [Source(str(tmp_path / "c.parquet")), Source(str(tmp_path / "polars.arrow"), format="arrow", rows_per_epoch=4)]
    loader, _ = StructuredDataset.create_dataloader(sources, num_workers=0, batch_size=16, columns=["id", "s"])
    assert sorted(s or "-" for batch in loader for s in batch["s"]) == ["-", "-", "a", "a"] + ["w"] * 4


def test_a_source_lacking_a_number_column_mixes_where_batches_hold_nulls_and_tdu_inspect_checks_its_state(tmp_path, capsys):
    # A mixture refused a source without the number column 'v' whatever nulls= and
    # output_format= said (one path of the same files reads it as nulls), and so tdu inspect,
    # which has no --columns, could not check the state of a job that passed columns=["id"].
    import json

    from cli_helpers import run

    pq.write_table(_table(0, 4).append_column("v", pa.array([1.5, 2.5, 3.5, 4.5])), tmp_path / "a.parquet")
    pq.write_table(_table(100, 2), tmp_path / "b.parquet")
    sources = [Source(str(tmp_path / "a.parquet")), Source(str(tmp_path / "b.parquet"), rows_per_epoch=4)]
    with pytest.raises(ValueError, match="column 'v' .* is missing from source 1"):
        StructuredDataset.create_dataloader(sources, num_workers=0, batch_size=8)
    for options in (dict(nulls="fill"), dict(nulls="mask"), dict(output_format="dict")):
        loader, _ = StructuredDataset.create_dataloader(sources, num_workers=0, batch_size=8, **options)
        (batch,) = list(loader)
        values = batch["v"] if options.get("output_format") else batch["v"].tolist()
        assert sorted(v for v in values if v is not None and v == v) == [1.5, 2.5, 3.5, 4.5] and len(values) == 8  # and 4 nulls / NaN
    loader, dataset = StructuredDataset.create_dataloader(sources, num_workers=0, batch_size=2, columns=["id"])
    iterator = iter(loader)
    next(iterator), next(iterator)
    (tmp_path / "state.json").write_text(json.dumps(dataset.state_dict()))
    code, out, err = run(capsys, "inspect", tmp_path / "state.json", tmp_path / "a.parquet", tmp_path / "b.parquet", "--splits")
    assert code == 0 and "YES" in out, out + err


def test_tdu_inspect_checks_a_mixture_state_whose_sources_disagree_on_a_column_the_job_left_out(tmp_path, capsys):
    import json

    from cli_helpers import run

    pq.write_table(_table(0, 4).append_column("v", pa.array([1.5, 2.5, 3.5, 4.5])), tmp_path / "a.parquet")
    pq.write_table(_table(100, 2).append_column("v", pa.array(["p", "q"])), tmp_path / "b.parquet")
    sources = [Source(str(tmp_path / "a.parquet")), Source(str(tmp_path / "b.parquet"), rows_per_epoch=4)]
    loader, dataset = StructuredDataset.create_dataloader(sources, num_workers=0, batch_size=2, columns=["id"])
    iterator = iter(loader)
    next(iterator), next(iterator)
    (tmp_path / "state.json").write_text(json.dumps(dataset.state_dict()))
    code, out, err = run(capsys, "inspect", tmp_path / "state.json", tmp_path / "a.parquet", tmp_path / "b.parquet")
    assert code == 0 and "YES" in out, out + err
    (tmp_path / "b.parquet").unlink()
    pq.write_table(_table(100, 3).append_column("v", pa.array(["p", "q", "r"])), tmp_path / "b.parquet")
    code, out, err = run(capsys, "inspect", tmp_path / "state.json", tmp_path / "a.parquet", tmp_path / "b.parquet")
    assert code == 1 and "NO" in out and "source 1's rows" in out, out + err


def test_tdu_plan_of_a_mixture_counts_the_blocks_it_deals_when_workers_idle(tmp_path, capsys):
    # The note said "there are 2 splits for 4 slots" beside a table dealing 3 blocks.
    from cli_helpers import run

    pq.write_table(_table(0, 1000), tmp_path / "a.parquet", row_group_size=100)
    pq.write_table(_table(2000, 220), tmp_path / "b.parquet", row_group_size=60)
    code, out, err = run(capsys, "plan", tmp_path / "a.parquet", tmp_path / "b.parquet", "--rows-per-epoch", "333", "444", "--world-size", "2")
    assert code == 0 and "in 3 blocks" in out and "there are 3 blocks" in out, out + err


@pytest.mark.parametrize("canonical", [False, True])
def test_a_mixture_state_resumes_with_a_source_path_spelled_otherwise_and_refuses_swapped_sources(tmp_path, canonical):
    # A source's path was compared as text: the same directory with a trailing '/' or as a glob
    # (the same files, in the same order) was refused as "source 0's path changed".
    import json

    from torch_dataloader_utils import CheckpointMismatchError

    for name, first in (("a", 0), ("b", 100)):
        (tmp_path / name).mkdir()
        pq.write_table(_table(first, 40), tmp_path / name / "x.parquet", row_group_size=10)
    options = dict(num_workers=2, batch_size=4, **(dict(canonical_lanes=2, chunk_rows=4) if canonical else {}))

    def make(a: str, b: str):
        return StructuredDataset.create_dataloader([Source(a, rows_per_epoch=30), Source(b, rows_per_epoch=30)], **options)

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    loader, dataset = make(a, b)
    iterator = iter(loader)
    head = [next(iterator)["id"].tolist() for _ in range(3)]
    state = json.loads(json.dumps(dataset.state_dict()))
    rest = [batch["id"].tolist() for batch in iterator]
    assert sorted(i for batch in head + rest for i in batch) == sorted(list(range(30)) + list(range(100, 130)))
    for spelled in ((a + "/", str(tmp_path / "b" / "*.parquet")), (str(tmp_path / "." / "a"), b)):
        loader, dataset = make(*spelled)
        dataset.load_state_dict(state)
        assert [batch["id"].tolist() for batch in loader] == rest
    loader, dataset = make(b, a)
    with pytest.raises(CheckpointMismatchError, match="source 0's path changed"):
        dataset.load_state_dict(state)


def test_a_delta_table_polars_wrote_reads_its_view_strings(tmp_path):
    # Polars' write_delta stores string_view in the Parquet files' Arrow schema: such a table, and
    # its files read as plain Parquet, were refused ("it has no tensor form").
    polars = pytest.importorskip("polars")
    pytest.importorskip("deltalake")
    from torch_dataloader_utils import DeltaDataset

    polars.DataFrame({"id": list(range(20)), "s": [f"s{i}" for i in range(20)]}).write_delta(str(tmp_path / "t"))
    files = sorted(str(p) for p in (tmp_path / "t").glob("*.parquet"))
    assert pq.read_schema(files[0]).field("s").type == pa.string_view()
    loader, _ = DeltaDataset.create_dataloader(str(tmp_path / "t"), num_workers=0, batch_size=8)
    assert sorted(s for batch in loader for s in batch["s"]) == sorted(f"s{i}" for i in range(20))
    loader, dataset = StructuredDataset.create_dataloader(files, num_workers=2, batch_size=8, filters=[("s", "==", "s7")])
    assert [batch["s"] for batch in loader] == [["s7"]] and dataset[3]["s"] == "s3"

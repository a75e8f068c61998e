"""Mixing (issue 30) as a user meets it: sources that Polars and pyarrow wrote (large lists and
large strings inside structs and maps against 32-bit offsets), and a refused state whose
diagnosis leads with what the user changed (a weight, epoch_rows), not with its effects."""

from __future__ import annotations

import collections
import datetime
import decimal
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from torch_dataloader_utils import CheckpointMismatchError, Source, StructuredDataset
from torch_dataloader_utils.read.convert import Ragged


def _table(first: int, rows: int) -> pa.Table:
    ids = range(first, first + rows)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "l": pa.array([list(range(i % 4)) for i in ids], pa.list_(pa.int32())),
            "st": pa.array([{"a": i, "b": f"b{i}"} for i in ids], pa.struct([("a", pa.int64()), ("b", pa.string())])),
            "m": pa.array([[("k", i)] for i in ids], pa.map_(pa.string(), pa.int64())),
        }
    )


@pytest.fixture(scope="module")
def writers(tmp_path_factory) -> dict[str, str]:
    polars = pytest.importorskip("polars")
    root = tmp_path_factory.mktemp("writers")
    pq.write_table(_table(0, 40), root / "pyarrow.parquet", row_group_size=15)
    polars.from_arrow(_table(1000, 10)).write_parquet(root / "polars.parquet", row_group_size=4)
    return {"pyarrow": str(root / "pyarrow.parquet"), "polars": str(root / "polars.parquet")}


def _rows(batch: dict) -> list[tuple]:
    def value(column, i):
        if isinstance(column, Ragged):
            return tuple(column.values[column.offsets[i] : column.offsets[i + 1]].tolist())
        item = column[i]
        return tuple(item.tolist()) if isinstance(item, torch.Tensor) and item.ndim else item.item() if isinstance(item, torch.Tensor) else tuple(item) if isinstance(item, list) else item

    names = sorted(batch)
    return [tuple(value(batch[n], i) for n in names) for i in range(len(batch["id"]))]


def _expected(first: int, rows: int) -> dict[int, tuple]:
    # sorted names: id, l, m.keys, m.values, st.a, st.b
    return {i: (i, tuple(range(i % 4)), ("k",), (i,), i, f"b{i}") for i in range(first, first + rows)}


def test_polars_and_pyarrow_files_with_nested_columns_read_as_one_dataset(writers):
    loader, dataset = StructuredDataset.create_dataloader([writers["pyarrow"], writers["polars"]], num_workers=2, batch_size=16)
    assert pa.types.is_large_list(dataset.schema.field("l").type)
    got = [row for batch in loader for row in _rows(batch)]
    assert sorted(got) == sorted({**_expected(0, 40), **_expected(1000, 10)}.values())
    assert [path.rsplit("/", 1)[1] for path in dataset.files] == ["polars.parquet", "pyarrow.parquet"]  # sorted paths
    assert _rows(dataset[[45, 3]]) == [_expected(0, 40)[35], _expected(1000, 10)[1003]]


def test_a_mixture_of_a_polars_and_a_pyarrow_source_keeps_its_multiplicities(writers):
    loader, dataset = StructuredDataset.create_dataloader(
        [Source(writers["pyarrow"]), Source(writers["polars"], rows_per_epoch=25)], num_workers=0, batch_size=8, shuffle=True
    )
    rows = [row for batch in loader for row in _rows(batch)]
    counts = collections.Counter(row[0] for row in rows)
    assert len(rows) == len(dataset) == 65
    assert all(counts[i] == 1 for i in range(40)) and sorted(counts[i] for i in range(1000, 1010)) == [2] * 5 + [3] * 5
    expected = {**_expected(0, 40), **_expected(1000, 10)}
    assert all(row == expected[row[0]] for row in rows)


def _state(sources: list[Source], **options) -> dict:
    loader, dataset = StructuredDataset.create_dataloader(sources, num_workers=0, batch_size=8, **options)
    iterator = iter(loader)
    next(iterator)
    return json.loads(json.dumps(dataset.state_dict()))


def _likely_cause(sources: list[Source], state: dict, **options) -> str:
    _, dataset = StructuredDataset.create_dataloader(sources, num_workers=0, batch_size=8, **options)
    with pytest.raises(CheckpointMismatchError) as error:
        dataset.load_state_dict(state)
    return next(line.strip() for line in str(error.value).splitlines() if "Likely cause" in line)


def test_a_changed_weight_or_epoch_rows_is_the_likely_cause(writers):
    a, b = writers["pyarrow"], writers["polars"]
    state = _state([Source(a, weight=1), Source(b, weight=1)], epoch_rows=30)
    assert _likely_cause([Source(a, weight=1), Source(b, weight=2)], state, epoch_rows=30) == "Likely cause: source 1's weight changed: checkpoint=1, current=2"
    assert _likely_cause([Source(a, weight=1), Source(b, weight=1)], state, epoch_rows=40) == "Likely cause: epoch_rows changed: checkpoint=30, current=40"


@pytest.mark.parametrize(
    "a, b, unified",
    [
        (pa.list_(pa.int32()), pa.large_list(pa.int64()), pa.large_list(pa.int64())),
        (pa.struct([("a", pa.int32()), ("b", pa.string())]), pa.struct([("a", pa.int64()), ("b", pa.large_string())]), pa.struct([("a", pa.int64()), ("b", pa.large_string())])),
        (pa.map_(pa.string(), pa.int32()), pa.map_(pa.large_string(), pa.int64()), pa.map_(pa.large_string(), pa.int64())),
        (pa.struct([("a", pa.int32())]), pa.struct([("a", pa.string())]), None),  # a field of types that do not unify
        (pa.list_(pa.int32()), pa.large_list(pa.string()), None),
        (pa.decimal128(10, 2), pa.decimal128(18, 2), pa.decimal128(18, 2)),
        (pa.decimal128(10, 2), pa.decimal128(5, 3), pa.decimal128(11, 3)),
        (pa.decimal128(38, 0), pa.decimal128(38, 10), pa.decimal256(48, 10)),
    ],
)
def test_nested_types_unify_part_by_part(a, b, unified):
    from torch_dataloader_utils.catalog.schema import merge_types

    assert merge_types(a, b) == unified and merge_types(b, a) == unified


def test_tdu_plan_refuses_weights_with_rows_per_epoch_and_takes_columns(writers, tmp_path, capsys):
    from cli_helpers import run

    a, b = writers["pyarrow"], writers["polars"]
    code, out, err = run(capsys, "plan", a, b, "--weight", "1", "2", "--rows-per-epoch", "3", "4")
    assert code == 2 and "pass --rows-per-epoch or --weight, not both" in err
    narrow = tmp_path / "narrow.parquet"
    pq.write_table(pa.table({"id": pa.array(range(5000, 5030), pa.int64())}), narrow)  # no l, st, m
    code, out, err = run(capsys, "plan", a, narrow, "--rows-per-epoch", "40", "60", "--json")
    assert code == 2 and "missing from source 1" in err
    code, out, err = run(capsys, "plan", a, narrow, "--rows-per-epoch", "40", "60", "--columns", "id", "--json")
    assert code == 0, err
    assert [s["rows_per_epoch"] for s in json.loads(out)["sources"]] == [40, 60]


def test_a_mixtures_default_state_grows_neither_with_progress_nor_with_upsampling(writers):
    def sizes(upsampled: int) -> list[int]:
        loader, dataset = StructuredDataset.create_dataloader(
            [Source(writers["pyarrow"]), Source(writers["polars"], rows_per_epoch=upsampled)], num_workers=0, batch_size=32, columns=["id"]
        )
        return [len(json.dumps(dataset.state_dict())) for step, _ in enumerate(loader) if step % 8 == 0]

    small, large = sizes(20), sizes(2000)  # the polars source 2x and 200x
    assert max(large) - min(large) < 150 and abs(max(large) - max(small)) < 150


def test_duckdb_and_pyarrow_decimals_of_other_precisions_mix(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "d": pa.array([decimal.Decimal("1.25"), decimal.Decimal("2.50")], pa.decimal128(10, 2))}), tmp_path / "a.parquet")
    duckdb.connect().execute(f"COPY (SELECT 3::BIGINT AS id, 3.75::DECIMAL(18, 2) AS d) TO '{tmp_path / 'b.parquet'}' (FORMAT parquet)")
    loader, _ = StructuredDataset.create_dataloader(
        [Source(str(tmp_path / "a.parquet")), Source(str(tmp_path / "b.parquet"), rows_per_epoch=2)], num_workers=0, batch_size=8, decimals="int64"
    )
    assert sorted(x for batch in loader for x in batch["d"].tolist()) == [125, 250, 375, 375]  # unscaled at the common scale


def test_an_orc_and_a_parquet_source_with_timestamps_mix(tmp_path):
    from pyarrow import orc

    times = [datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=i) for i in range(4)]
    orc.write_table(pa.table({"id": pa.array(range(4), pa.int64()), "t": pa.array(times, pa.timestamp("us"))}), str(tmp_path / "a.orc"))
    pq.write_table(pa.table({"id": pa.array(range(4, 6), pa.int64()), "t": pa.array(times[:2], pa.timestamp("us"))}), tmp_path / "b.parquet")
    assert orc.read_table(str(tmp_path / "a.orc")).schema.field("t").type == pa.timestamp("ns")  # ORC reads as ns
    loader, dataset = StructuredDataset.create_dataloader(
        [Source(str(tmp_path / "a.orc"), format="orc"), Source(str(tmp_path / "b.parquet"), rows_per_epoch=4)], num_workers=0, batch_size=16
    )
    got = sorted(pair for batch in loader for pair in zip(batch["id"].tolist(), batch["t"].tolist()))
    ns = [int(pa.scalar(t, pa.timestamp("ns")).value) for t in times]
    assert got == sorted([(i, ns[i]) for i in range(4)] + [(4, ns[0]), (4, ns[0]), (5, ns[1]), (5, ns[1])])


def test_a_source_takes_path_objects_as_a_plain_dataset_does(writers):
    import pathlib

    def make():
        sources = [Source(pathlib.Path(writers["pyarrow"])), Source([pathlib.Path(writers["polars"])], rows_per_epoch=15)]
        return StructuredDataset.create_dataloader(sources, num_workers=0, batch_size=8, columns=["id"])

    loader, dataset = make()
    iterator = iter(loader)
    next(iterator)
    state = json.loads(json.dumps(dataset.state_dict()))  # plain data: the paths as str
    rest = [batch["id"].tolist() for batch in iterator]
    loader, resumed = make()
    resumed.load_state_dict(state)
    assert [batch["id"].tolist() for batch in loader] == rest and len(dataset) == 55


def test_numpy_weights_share_the_epoch_and_the_state_stays_json(writers):
    import numpy as np

    sources = [Source(writers["pyarrow"], weight=np.float32(0.75)), Source(writers["polars"], weight=np.int64(1))]
    loader, dataset = StructuredDataset.create_dataloader(sources, num_workers=0, batch_size=8, columns=["id"], epoch_rows=np.int64(70))
    counts = collections.Counter(i >= 1000 for batch in loader for i in batch["id"].tolist())
    assert (counts[False], counts[True]) == (30, 40)
    json.dumps(dataset.state_dict())

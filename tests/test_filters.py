"""filters=: pruning by statistics, exact counts of matching rows, and every promise with a filter
(exactly-once, resume equivalence, equal batches per rank, a changed filter refused)."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest
from datagen import write_formats
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset
from torch_dataloader_utils.read import filtering
from torch_dataloader_utils.testing import assert_resumes_exactly

LAYOUT = [[23, 31, 17], [40, 9], [11, 29, 33, 14]]  # ids 0..206, label = id % 7
ROWS = sum(map(sum, LAYOUT))
CONFIG = dict(batch_size=8, split_bytes=2500, chunk_rows=16)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    return write_formats(tmp_path_factory, LAYOUT)


def scores(ids: np.ndarray) -> pa.Array:
    """A nullable column: every fifth row null, else id % 11."""
    return pa.array([None if i % 5 == 0 else int(i % 11) for i in ids], type=pa.int64())


@pytest.fixture(scope="module")
def nullable(tmp_path_factory) -> dict[str, str]:
    """Files with a nullable ``score`` column: Parquet with and without statistics, and ORC."""
    paths = {}
    for name in ("stats", "nostats", "orc"):
        root = tmp_path_factory.mktemp(name)
        first = 0
        for index, groups in enumerate([[30, 30], [25, 15, 20]]):
            ids = np.arange(first, first + sum(groups), dtype=np.int64)
            table = pa.table({"id": ids, "score": scores(ids), "text": [f"row-{i}" for i in ids]})
            if name == "orc":
                writer = orc.ORCWriter(str(root / f"p{index}.orc"), stripe_size=1, batch_size=max(groups), compression="uncompressed")
                offset = 0
                for size in groups:
                    writer.write(table.slice(offset, size))
                    offset += size
                writer.close()
            else:
                with pq.ParquetWriter(root / f"p{index}.parquet", table.schema, write_statistics=name == "stats") as writer:
                    offset = 0
                    for size in groups:
                        writer.write_table(table.slice(offset, size), row_group_size=size)
                        offset += size
            first += sum(groups)
        paths[name] = str(root)
    return paths


def delivered(path: str, **kwargs) -> tuple[list[int], StructuredDataset]:
    loader, dataset = StructuredDataset.create_dataloader(path, **{"num_workers": 0, **kwargs})
    return [i for batch in loader for i in list(batch["id"])], dataset


def expected(ids, mask) -> list[int]:
    return [int(i) for i, keep in zip(ids, mask) if keep]


ALL_IDS = np.arange(ROWS)


def ids_of(batch) -> tuple[int, ...]:
    return tuple(batch["id"].tolist())


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
@pytest.mark.parametrize(
    ("filters", "mask"),
    [
        ([("id", "<", 23)], ALL_IDS < 23),  # exactly the first row group
        (pc.field("label") == 3, ALL_IDS % 7 == 3),  # some rows of every unit
        ([[("id", "<", 5)], [("label", "in", [6]), ("id", ">", 150)]], (ALL_IDS < 5) | ((ALL_IDS % 7 == 6) & (ALL_IDS > 150))),  # DNF
        ([("id", ">=", 0)], ALL_IDS >= 0),  # everything
        ([("id", ">", 10_000)], ALL_IDS > 10_000),  # nothing
    ],
    ids=["one-unit", "label", "dnf", "all", "none"],
)
def test_a_filter_delivers_exactly_the_matching_rows(data, fmt, filters, mask):
    want = expected(ALL_IDS, mask)
    got, dataset = delivered(data[fmt], format=fmt, filters=filters, columns=["id", "x"], **CONFIG)
    assert sorted(got) == want
    assert len(dataset) == len(want)
    assert dataset.num_batches() == -(-len(want) // CONFIG["batch_size"])


@pytest.mark.parametrize("name", ["stats", "nostats", "orc"])
def test_nulls_in_the_filter_column_do_not_match(nullable, name):
    ids = np.arange(120)
    values = scores(ids).to_pylist()
    fmt = "orc" if name == "orc" else "parquet"
    got, _ = delivered(nullable[name], format=fmt, filters=[("score", ">", 7)], batch_size=16)
    assert sorted(got) == [i for i, v in zip(ids, values) if v is not None and v > 7]
    got, _ = delivered(nullable[name], format=fmt, filters=pc.field("score").is_null(), batch_size=16, columns=["id"])
    assert sorted(got) == [i for i, v in zip(ids, values) if v is None]
    got, _ = delivered(nullable[name], format=fmt, filters=~(pc.field("score") < 3), batch_size=16, output_format="dict")
    assert sorted(got) == [i for i, v in zip(ids, values) if v is not None and v >= 3]


def test_statistics_prune_units_and_files_without_them_are_read():
    from torch_dataloader_utils.catalog.filter_prune import ALL, NONE, SOME, may_match, row_filter

    ids = np.arange(60)
    table = pa.table({"id": ids, "score": scores(ids)})
    footers = []
    for stats in (True, False):
        sink = pa.BufferOutputStream()
        with pq.ParquetWriter(sink, table.schema, write_statistics=stats) as writer:
            for start in (0, 20, 40):
                writer.write_table(table.slice(start, 20), row_group_size=20)
        footers.append(pq.ParquetFile(pa.BufferReader(sink.getvalue())).metadata)
    rf = row_filter([("id", ">=", 25), ("id", "<", 30)], table.schema)
    assert rf.columns == ("id",)
    assert may_match(rf, footers, [[20] * 3] * 2, table.schema, [(), ()]) == [[NONE, SOME, NONE], [SOME] * 3]
    below = row_filter([("id", "<", 40)], table.schema)  # row groups [0, 20) and [20, 40) match whole
    assert may_match(below, footers, [[20] * 3] * 2, table.schema, [(), ()]) == [[ALL, ALL, NONE], [SOME] * 3]
    assert may_match(row_filter([("score", "<", 99)], table.schema), footers[:1], [[20] * 3], table.schema, [()]) == [[SOME] * 3]  # nulls
    every_null = row_filter(pc.field("score").is_null(), table.schema)
    assert may_match(every_null, footers[:1], [[20] * 3], table.schema, [("score",)]) == [[ALL] * 3]  # a file lacking it: all null


class _Counted:
    """Bytes read from fsspec's memory filesystem, where the loader reads a memory:// path through fs.open."""

    def __init__(self, monkeypatch):
        self.bytes = 0
        read = MemoryFile.read

        def counting(file, *args):
            out = read(file, *args)
            self.bytes += len(out)
            return out

        monkeypatch.setattr(MemoryFile, "read", counting)


def test_pruning_reads_fewer_bytes(monkeypatch):
    """The same files with and without statistics, read with a filter matching one row group of
    six: with statistics the other row groups are neither counted nor read."""
    memory = MemoryFileSystem()
    rng = np.random.default_rng(0)
    for stats in (True, False):
        for index in range(2):
            ids = np.arange(index * 60_000, (index + 1) * 60_000)
            table = pa.table({"id": ids, "noise": rng.random(len(ids))})
            sink = pa.BufferOutputStream()
            with pq.ParquetWriter(sink, table.schema, write_statistics=stats) as writer:
                writer.write_table(table, row_group_size=20_000)  # (large enough that the 64 KiB footer reads do not count)
            memory.pipe_file(f"/prune-{stats}/p{index}.parquet", sink.getvalue().to_pybytes())
    counted = _Counted(monkeypatch)
    read = {}
    for stats in (True, False):
        counted.bytes = 0
        got, _ = delivered(f"memory://prune-{stats}", filters=[("id", ">=", 21_000), ("id", "<", 21_100)], batch_size=64)
        assert sorted(got) == list(range(21_000, 21_100))
        read[stats] = counted.bytes
    counted.bytes = 0
    delivered("memory://prune-True", batch_size=20_000)
    unfiltered = counted.bytes
    # with statistics: footers, the id column of one row group of six (counting) and that row group
    # (reading); without: footers, the id column of all six, then the one row group
    assert read[True] < 0.6 * read[False], read
    assert read[True] < 0.4 * unfiltered, (read, unfiltered)


def test_orc_stripe_statistics_prune_stripes(monkeypatch):
    """ORC: the stripes' statistics (the file's Metadata section) leave out every stripe but one,
    which shows in the bytes read."""
    memory = MemoryFileSystem()
    rng = np.random.default_rng(0)
    table = pa.table({"id": np.arange(60_000), "noise": rng.random(60_000)})
    sink = pa.BufferOutputStream()
    writer = orc.ORCWriter(sink, stripe_size=1, batch_size=20_000, compression="uncompressed")
    for start in (0, 20_000, 40_000):
        writer.write(table.slice(start, 20_000))
    writer.close()
    memory.pipe_file("/prune-orc/p.orc", sink.getvalue().to_pybytes())
    counted = _Counted(monkeypatch)
    got, dataset = delivered("memory://prune-orc", format="orc", filters=[("id", ">=", 21_000), ("id", "<", 21_100)], batch_size=64)
    assert sorted(got) == list(range(21_000, 21_100))
    assert dataset._catalog.layouts[0].unit_rows == (0, 100, 0)
    filtered = counted.bytes
    counted.bytes = 0
    delivered("memory://prune-orc", format="orc", batch_size=20_000)
    assert filtered < 0.6 * counted.bytes, (filtered, counted.bytes)


@pytest.mark.parametrize(("workers", "shuffle"), [(0, False), (2, True)])
def test_resume_with_a_filter_is_exact(data, workers, shuffle):
    filters = pc.field("label") != 2

    def make():
        return StructuredDataset.create_dataloader(data["parquet"], num_workers=workers, shuffle=shuffle, filters=filters, **CONFIG)

    points = None if workers == 0 else [(0, 0), (0, 5), (1, 9), (1, -1)]
    reference = assert_resumes_exactly(make, epochs=2, points=points, deep_stride=3, batch_key=ids_of)
    for epoch in reference.batches:
        assert sorted(i for batch in epoch for i in batch) == expected(ALL_IDS, ALL_IDS % 7 != 2)
    assert all(state["_filters"] for state in reference.states[0])


def test_every_rank_delivers_the_same_batch_count_when_the_filter_matches_unevenly(data):
    """Rank 0 reads the splits where most rows match; rank 1 far fewer. With equalize="pad" both
    deliver the same batch count, and the ranks' real rows together are the matching rows once."""
    filters = pc.field("id") < 80  # the first file: most of rank 0's splits
    counts, real = [], []
    for rank in range(2):
        loader, dataset = StructuredDataset.create_dataloader(data["parquet"], rank=rank, world_size=2, num_workers=2, filters=filters, **CONFIG)
        batches = 0
        for batch in loader:
            batches += 1
            if not dataset.last_batch_is_padding:
                real.extend(batch["id"].tolist())
        counts.append((batches, dataset.num_batches(), len(dataset)))
    assert counts[0][0] == counts[1][0] == counts[0][1] == counts[1][1]
    assert sorted(real) == list(range(80))
    rows = [len(StructuredDataset(data["parquet"], rank=r, world_size=2, num_workers=2, filters=filters, equalize="none", **CONFIG)) for r in range(2)]
    assert rows[0] != rows[1], "the filter must match unevenly across ranks for this test to mean anything"


def test_a_changed_filter_is_refused(data):
    loader, dataset = StructuredDataset.create_dataloader(data["parquet"], filters=[("label", "<", 3)], num_workers=0, **CONFIG)
    for _, _ in zip(range(2), loader):
        pass
    state = json.loads(json.dumps(dataset.state_dict()))
    for other in ([("label", "<", 4)], None):
        fresh = StructuredDataset(data["parquet"], filters=other, num_workers=0, **CONFIG)
        with pytest.raises(CheckpointMismatchError, match="filters changed"):
            fresh.load_state_dict(state)
    unfiltered = StructuredDataset(data["parquet"], num_workers=0, **CONFIG)
    plain_state = unfiltered.state_dict()
    assert "_filters" not in plain_state  # states without a filter keep their keys
    with pytest.raises(CheckpointMismatchError, match="filters changed"):
        StructuredDataset(data["parquet"], filters=[("label", "<", 3)], num_workers=0, **CONFIG).load_state_dict(plain_state)
    same = StructuredDataset(data["parquet"], filters=pc.field("label") < 3, num_workers=0, **CONFIG)
    same.load_state_dict(state)  # the same filter, as an expression: accepted


def test_counts_are_cached_in_cache_dir(data, tmp_path, monkeypatch):
    filters = [("label", "=", 1)]
    first = StructuredDataset(data["parquet"], filters=filters, cache_dir=str(tmp_path), num_workers=0, **CONFIG)
    assert len(os.listdir(tmp_path / "filter_counts")) == len(LAYOUT)
    filtering._MEMO.clear()

    def no_counting(*args):
        raise AssertionError("counted again despite the cache")

    monkeypatch.setattr(filtering, "_count_file", no_counting)
    again = StructuredDataset(data["parquet"], filters=filters, cache_dir=str(tmp_path), num_workers=0, **CONFIG)
    assert len(again) == len(first) == int(np.count_nonzero(ALL_IDS % 7 == 1))


def test_bad_filters_name_the_problem(data):
    with pytest.raises(ValueError, match="do not have"):
        StructuredDataset(data["parquet"], filters=[("nope", "<", 3)], num_workers=0)
    with pytest.raises(ValueError, match="types"):
        StructuredDataset(data["parquet"], filters=pc.field("text") < 3, num_workers=0)
    with pytest.raises(TypeError, match="Expression"):
        StructuredDataset(data["parquet"], filters="label < 3", num_workers=0)
    with pytest.raises(ValueError, match=r"refer to a column by position \(pc.field\(0\)\); name it"):
        StructuredDataset(data["parquet"], filters=pc.field(0) < 3, num_workers=0)


def test_a_struct_leaf_named_as_columns_names_it_is_pointed_to_its_path(tmp_path):
    pq.write_table(pa.table({"id": [1, 2, 3], "st": [{"a": 1}, {"a": 2}, {"a": 3}]}), tmp_path / "s.parquet")
    for filters in ([("st.a", ">", 1)], pc.field("st.a") > 1):
        with pytest.raises(ValueError, match=r"do not have; their columns are \['id', 'st'\]; a struct's leaf is named by its path: pc.field\('st', 'a'\)"):
            StructuredDataset(str(tmp_path), filters=filters, num_workers=0)
    assert len(StructuredDataset(str(tmp_path), filters=pc.field("st", "a") > 1, num_workers=0)) == 2


def unchanged(batch):
    return batch


def test_a_filter_and_arrow_batches_inside_torchdatas_stateful_dataloader(data):
    """The dataset alone in a StatefulDataLoader (each worker its own lane): filtered arrow batches
    (collate_fn keeps them as they are) resume exactly from the loader's own state."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make():
        dataset = StructuredDataset(data["parquet"], num_workers=2, filters=pc.field("label") >= 4, output_format="arrow", **CONFIG)
        return StatefulDataLoader(dataset, batch_size=None, num_workers=2, collate_fn=unchanged), dataset

    reference = assert_resumes_exactly(
        make,
        epochs=1,
        points=[(0, 2), (0, 7)],
        batch_key=lambda batch: tuple(batch.column("id").to_pylist()),
        save=lambda loader, _: json.loads(json.dumps(loader.state_dict())),
        load=lambda loader, _, state: loader.load_state_dict(state),
    )
    assert sorted(i for batch in reference.batches[0] for i in batch) == expected(ALL_IDS, ALL_IDS % 7 >= 4)


def test_a_file_without_the_filter_column_reads_it_as_nulls(tmp_path):
    pq.write_table(pa.table({"id": [0, 1, 2], "score": [5, None, 9]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [3, 4]}), tmp_path / "b.parquet")
    assert sorted(delivered(str(tmp_path), filters=pc.field("score").is_null(), columns=["id"])[0]) == [1, 3, 4]
    assert sorted(delivered(str(tmp_path), filters=[("score", ">", 6)], columns=["id"])[0]) == [2]


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_pruning_never_loses_a_matching_row(tmp_path, fmt):
    """Filters of every kind statistics can rule on (ranges, negations, nulls, sets, strings,
    timestamps, booleans, floats with NaN): the rows delivered are exactly those pyarrow's
    Table.filter keeps from the whole data."""
    n = 90
    ids = np.arange(n)
    table = pa.table(
        {
            "id": ids,
            "maybe": pa.array([None if i % 4 == 0 else int(i % 13) for i in ids], type=pa.int32()),
            "name": [f"n{i % 17:02d}" for i in ids],
            "when": pa.array(ids * 1_000_000, type=pa.timestamp("us", tz="UTC")),
            "flag": ids % 30 < 10,
            "f": pa.array([float("nan") if i % 7 == 0 else i / 10 for i in ids]),
        }
    )
    if fmt == "parquet":
        pq.write_table(table, tmp_path / "data.parquet", row_group_size=30)
    else:
        writer = orc.ORCWriter(str(tmp_path / "data.orc"), stripe_size=1, batch_size=30, compression="uncompressed")
        for start in (0, 30, 60):
            writer.write(table.slice(start, 30))
        writer.close()
    field = pc.field
    filters = [
        field("id") < 30,
        ~(field("id") < 30),
        (field("id") >= 30) & (field("id") < 31),
        field("maybe").is_null(),
        ~field("maybe").is_valid() | (field("maybe") == 12),
        field("maybe").isin([1, 2]),
        field("name") > "n15",
        field("when") >= pa.scalar(60_000_000, type=pa.timestamp("us", tz="UTC")),
        field("flag"),
        ~field("flag"),
        ~(field("f") < 5.0),
        field("f").is_nan(),
    ]
    for expression in filters:
        got = sorted(delivered(str(tmp_path), format=fmt, filters=expression, columns=["id"], batch_size=7)[0])
        assert got == sorted(table.filter(expression).column("id").to_pylist()), str(expression)


def test_columns_a_filter_reads_are_found_and_other_columns_do_not_matter():
    from torch_dataloader_utils.catalog.filter_prune import row_filter

    schema = pa.schema([("a", pa.int64()), ("odd", pa.dense_union([pa.field("x", pa.int32())])), ("label", pa.int32()), ("la", pa.int8())])
    assert row_filter([("label", "<", 3), ("a", ">", 0)], schema).columns == ("a", "label")  # not "la", whose name is in "label"
    with pytest.raises(ValueError, match="cannot filter rows by"):
        row_filter(pc.field("odd") == 3, schema)
    with pytest.raises(ValueError, match=r"do not have; their columns are \['a', 'odd', 'label', 'la'\]"):
        row_filter([("b", "<", 3)], schema)


def test_value_lists_that_pyarrow_prints_alike_are_different_filters(tmp_path):
    """pyarrow prints only the first and last 10 values of a longer value list: two lists that
    differ in the middle count their own rows, keep their own counts in cache_dir, and a state of
    one is refused by the other."""
    pq.write_table(pa.table({"id": np.arange(1000)}), tmp_path / "x.parquet", row_group_size=100)
    ends = list(range(10)) + list(range(990, 1000))
    few = pc.field("id").isin(ends[:10] + list(range(100, 180)) + ends[10:])
    many = pc.field("id").isin(ends[:10] + list(range(100, 600)) + ends[10:])
    assert str(few) == str(many)
    for cache in (None, str(tmp_path / "cache")):
        loader, first = StructuredDataset.create_dataloader(str(tmp_path / "x.parquet"), filters=few, batch_size=50, num_workers=0, cache_dir=cache)
        assert len(first) == 100 and sum(len(b["id"]) for b in loader) == 100
        loader, second = StructuredDataset.create_dataloader(str(tmp_path / "x.parquet"), filters=many, batch_size=50, num_workers=0, cache_dir=cache)
        assert len(second) == 520 and sum(len(b["id"]) for b in loader) == 520
    _, first = StructuredDataset.create_dataloader(str(tmp_path / "x.parquet"), filters=few, batch_size=50, num_workers=0)
    with pytest.raises(CheckpointMismatchError, match="filters changed"):
        second.load_state_dict(json.loads(json.dumps(first.state_dict())))

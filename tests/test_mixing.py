"""Mixtures of sources (Source, rows_per_epoch / weight): exact multiplicities per row, the walk of
a downsampled source, proportion per batch, resume at every point, elastic 2 -> 3 ranks, errors."""

from __future__ import annotations

import collections
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datagen import write_dataset
from mixing_helpers import CONFIG, read_rank, three_sources, write_sources
from resume_helpers import batch_key
from servers import s3, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import CheckpointMismatchError, Source, StructuredDataset
from torch_dataloader_utils.distributed import merge_states
from torch_dataloader_utils.plan.mixing import allocate_rows, largest_remainder
from torch_dataloader_utils.testing import assert_resumes_exactly

# source k's ids start at k * 1000: A (100 rows, 1x), B (25 rows, upsampled to 60), C (200 rows, downsampled to 70)
SIZES = {"a": 100, "b": 25, "c": 200}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    return write_sources(tmp_path_factory.mktemp("mixing"))


def _sources(data, b=60, c=70):
    return three_sources(data, b, c)


def _ids(loader, dataset=None, skip_padding=False) -> list[int]:
    out = []
    for batch in loader:
        if not (skip_padding and dataset.last_batch_is_padding):
            out += list(batch_key(batch))
    return out


def _check_multiplicities(counts: collections.Counter, b: int, c: int) -> None:
    """A once per row, B floor/ceil of b / 25 per row summing to b, C at most once summing to c."""
    by_source = [{i: n for i, n in counts.items() if i // 1000 == k} for k in range(3)]
    assert sorted(by_source[0]) == list(range(100)) and set(by_source[0].values()) == {1}
    low, high = divmod(b, 25)
    assert sum(by_source[1].values()) == b and set(by_source[1].values()) <= {low, low + 1}
    assert len(by_source[1]) == 25 and list(by_source[1].values()).count(low + 1) == high
    assert sum(by_source[2].values()) == c and set(by_source[2].values()) == {1}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_row_appears_the_planned_number_of_times(data, shuffle, num_workers):
    loader, dataset = StructuredDataset.create_dataloader(_sources(data), num_workers=num_workers, shuffle=shuffle, **CONFIG)
    assert len(dataset) == 230
    extra = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        counts = collections.Counter(_ids(loader))
        _check_multiplicities(counts, 60, 70)
        extra.append({i for i, n in counts.items() if i // 1000 == 1 and n == 3})
    assert extra[0] != extra[1], "the rows that get an extra copy change with the epoch"


def test_two_sources_and_the_downsampled_one_is_walked_without_repeats(data):
    """Two epochs of C at 100 of its 200 rows see every row once; the third starts over."""
    loader, dataset = StructuredDataset.create_dataloader([Source(data["a"]), Source(data["c"], rows_per_epoch=100)], num_workers=2, shuffle=True, **CONFIG)
    seen = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        seen.append([i for i in _ids(loader) if i >= 2000])
    assert len(seen[0]) == len(seen[1]) == 100
    assert sorted(seen[0] + seen[1]) == list(range(2000, 2200))
    assert sorted(seen[2]) == sorted(seen[0])


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_batch_holds_the_sources_in_proportion(data, shuffle):
    """230 rows per epoch as 100 : 60 : 70; a batch of 23 rows holds 10 : 6 : 7, give or take a row
    (the last batch of each worker is short)."""
    loader, _ = StructuredDataset.create_dataloader(
        _sources(data), num_workers=2, shuffle=shuffle, **{**CONFIG, "batch_size": 23, "chunk_rows": 46, "shuffle_buffer_rows": 1000}
    )
    full = 0
    for batch in loader:
        ids = batch["id"].tolist()
        if len(ids) == 23:
            full += 1
            per_source = [sum(1 for i in ids if i // 1000 == k) for k in range(3)]
            assert all(abs(n - want) <= 1 for n, want in zip(per_source, (10, 6, 7))), per_source
    assert full >= 8


def test_resumes_exactly_at_every_point(data):
    def make():
        return StructuredDataset.create_dataloader(_sources(data), num_workers=0, shuffle=True, **CONFIG)

    reference = assert_resumes_exactly(make, epochs=2, batch_key=lambda b: tuple(b["id"].tolist()))
    assert reference.batches[0] != reference.batches[1]
    state = reference.states[0][len(reference.states[0]) // 2]
    assert len(json.dumps(state)) < 8000, "the state stays small"


def test_resumes_exactly_with_workers(data):
    def make():
        return StructuredDataset.create_dataloader(_sources(data), num_workers=2, shuffle=False, **CONFIG)

    assert_resumes_exactly(make, epochs=1, batch_key=lambda b: tuple(b["id"].tolist()), stride=3, deep_stride=3)


def test_elastic_resume_from_two_ranks_to_three_keeps_the_multiplicities(data):
    before = [read_rank(data, rank, 2, 2, stop=40) for rank in range(2)]
    merged = merge_states([state for _, state in before])
    after = [read_rank(data, rank, 3, 1, state=merged)[0] for rank in range(3)]
    counts = collections.Counter(i for ids, _ in before for i in ids)
    counts.update(i for ids in after for i in ids)
    _check_multiplicities(counts, 60, 70)


def test_weights_share_epoch_rows_by_largest_remainder(data):
    assert largest_remainder([1, 1, 1], 10) == [4, 3, 3]
    assert largest_remainder([0.5, 0.3, 0.2], 7) == [4, 2, 1]
    assert allocate_rows([100, 25, 200], [None] * 3, [1, 1, 2], 101) == [25, 25, 51]
    assert allocate_rows([100, 25, 200], [None] * 3, [None, 1, 3], None) == [100, 56, 169]
    assert allocate_rows([100, 25, 200], [None, 60, None], [None] * 3, None) == [100, 60, 200]
    loader, dataset = StructuredDataset.create_dataloader(
        [Source(data["a"], weight=1), Source(data["b"], weight=1), Source(data["c"], weight=2)], epoch_rows=101, num_workers=0, **CONFIG
    )
    assert len(dataset) == 101
    counts = collections.Counter(i // 1000 for i in _ids(loader))
    assert [counts[k] for k in range(3)] == [25, 25, 51]


def test_arguments_that_cannot_make_a_mixture_are_refused(data, tmp_path):
    with pytest.raises(ValueError, match="not both"):
        StructuredDataset([Source(data["a"], weight=1), Source(data["b"], rows_per_epoch=5)], num_workers=0)
    with pytest.raises(ValueError, match="both rows_per_epoch and weight"):
        Source(data["a"], weight=1, rows_per_epoch=5)
    with pytest.raises(ValueError, match="weight must be a positive"):
        Source(data["a"], weight=0)
    with pytest.raises(ValueError, match="epoch_rows= applies to a mixture"):
        StructuredDataset(data["a"], num_workers=0, epoch_rows=5)
    with pytest.raises(ValueError, match="no source has a weight: give the sources weights"):
        StructuredDataset([Source(data["a"]), Source(data["b"])], num_workers=0, epoch_rows=5)
    with pytest.raises(ValueError, match="rows_per_epoch= gives each source's rows"):
        StructuredDataset([Source(data["a"], rows_per_epoch=3), Source(data["b"])], num_workers=0, epoch_rows=5)
    with pytest.raises(TypeError, match="not both"):
        StructuredDataset([Source(data["a"]), data["b"]], num_workers=0)
    with pytest.raises(ValueError, match="canonical_lanes=3 does not fit"):  # the plain dataset's rule (test_mixing_canonical.py)
        StructuredDataset([Source(data["a"])], num_workers=2, batch_size=4, canonical_lanes=3)
    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(pa.table({"id": pa.array(["x", "y"])}), other / "part.parquet")
    with pytest.raises(ValueError, match=r"source 1 .*has no column 'text'"):
        StructuredDataset([Source(data["a"]), Source(str(other))], columns=["id", "text"], num_workers=0)
    with pytest.raises(ValueError, match=r"column 'id' is int64 in source 0 .* but string in source 1"):
        StructuredDataset([Source(data["a"]), Source(str(other))], columns=["id"], num_workers=0)


def test_a_state_of_another_mixture_is_refused_naming_the_change(data):
    loader, dataset = StructuredDataset.create_dataloader(_sources(data), num_workers=0, **CONFIG)
    iterator = iter(loader)
    next(iterator)
    state = json.loads(json.dumps(dataset.state_dict()))
    _, other = StructuredDataset.create_dataloader(_sources(data, b=61), num_workers=0, **CONFIG)
    with pytest.raises(CheckpointMismatchError, match=r"source 1's rows_per_epoch changed: checkpoint=60, current=61"):
        other.load_state_dict(state)
    _, plain = StructuredDataset.create_dataloader([data["a"], data["b"], data["c"]], num_workers=0, **CONFIG)
    with pytest.raises(CheckpointMismatchError, match="saved by a mixture of sources"):
        plain.load_state_dict(state)


def test_stateful_dataloader_resumes_a_mixture_exactly(data):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make():
        dataset = StructuredDataset(_sources(data), num_workers=2, shuffle=True, **CONFIG)
        return StatefulDataLoader(dataset, batch_size=None, num_workers=2), dataset

    reference = assert_resumes_exactly(
        make, epochs=1, batch_key=lambda b: tuple(b["id"].tolist()), points=[(0, 3), (0, 9)],
        save=lambda loader, dataset: loader.state_dict(), load=lambda loader, dataset, state: loader.load_state_dict(state),
    )  # fmt: skip
    _check_multiplicities(collections.Counter(i for batch in reference.batches[0] for i in batch), 60, 70)


def test_on_error_skip_leaves_out_the_unreadable_rows_of_one_source(data, tmp_path):
    from datagen import corrupt_data_pages

    write_dataset(tmp_path / "b", [[150], [150]], first_id=1000)
    corrupt_data_pages(tmp_path / "b" / "part-00001.parquet")
    loader, dataset = StructuredDataset.create_dataloader(
        [Source(data["a"]), Source(str(tmp_path / "b"), rows_per_epoch=450)], num_workers=0, on_error="skip", columns=["id"], **CONFIG
    )
    ids = collections.Counter(i for batch in loader for i in batch["id"].tolist())
    assert sorted(i for i in ids if i < 1000) == list(range(100)), "source A is whole"
    assert sorted(i for i in ids if i >= 1000) == list(range(1000, 1150)), "B's damaged file is left out"
    assert dataset.skipped_splits and all("source 1" in split.describe() for split, _ in dataset.skipped_splits)
    state = json.loads(json.dumps(dataset.state_dict()))
    assert state["skipped_splits"] and {entry["source"] for entry in state["skipped_splits"]} == {1}


def test_tdu_plan_shows_each_sources_rows_per_epoch(data, capsys):
    from torch_dataloader_utils.cli import main

    code = main(["plan", data["a"], data["b"], data["c"], "--rows-per-epoch", "100", "60", "70", "--json", "--world-size", "2"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and [s["rows_per_epoch"] for s in plan["sources"]] == [100, 60, 70] and plan["epoch_rows"] == 230
    _, dataset = StructuredDataset.create_dataloader(_sources(data), rank=1, world_size=2, num_workers=2, split_bytes=128 << 20, shuffle_buffer_rows=1 << 18)
    assert plan["ranks"][1]["rows"] == dataset._delivery.plan().total_rows() - dataset._delivery.plan().padding_rows
    assert main(["plan", data["a"], data["b"], "--weight", "3"]) == 2
    assert "one value per PATH" in capsys.readouterr().err
    assert main(["plan", "--json", "--rows-per-epoch", "100", "60", "70", "--", data["a"], data["b"], data["c"]]) == 0, "values first, ended by --"
    assert [s["rows_per_epoch"] for s in json.loads(capsys.readouterr().out)["sources"]] == [100, 60, 70]


def test_merge_positions_are_the_order_of_the_keys():
    from fractions import Fraction

    import numpy as np

    from torch_dataloader_utils.plan.mixing import merge_positions

    rng = np.random.default_rng(0)
    for _ in range(200):
        counts = [int(c) for c in rng.integers(0, 30, size=int(rng.integers(1, 5)))]
        keys = sorted((Fraction(2 * j + 1, 2 * c), k, j) for k, c in enumerate(counts) for j in range(c))
        want = {(k, j): position for position, (_, k, j) in enumerate(keys)}
        for k, c in enumerate(counts):
            assert merge_positions(counts, k).tolist() == [want[(k, j)] for j in range(c)]


@pytest.mark.parametrize("shuffle", [False, True])
def test_source_ranges_give_each_row_floor_or_ceil_copies(shuffle):
    import numpy as np

    from torch_dataloader_utils.plan.mixing import MixturePlan, SourceLayout
    from torch_dataloader_utils.plan.streams import SplitRows

    splits = (SplitRows(0, 0, 7), SplitRows(0, 7, 20), SplitRows(1, 0, 11))  # 31 rows
    offsets = [np.array([0, 7, 20]), np.array([0, 11])]
    for rows_per_epoch in (5, 31, 100, 31 * 1000 + 3):
        plan = MixturePlan([SourceLayout(splits, ("a", "a", "b"), rows_per_epoch)], offsets, shuffle, 4, 16)
        seen = np.zeros(31, dtype=np.int64)
        for epoch in range(3):
            counts = np.zeros(31, dtype=np.int64)
            for split, start, stop, _ in plan.source_ranges(0, epoch):
                base = 0 if splits[split].file == 0 else 20
                counts[base + start : base + stop] += 1
            assert counts.sum() == rows_per_epoch and counts.max() - counts.min() <= 1
            seen += counts
            mix = plan.epoch(epoch)
            assert len({(s.path, s.row_offset, s.row_length, s.copy) for s in mix.splits}) == len(mix.splits)
        if rows_per_epoch == 5:
            assert seen.max() == 1, "three epochs of 5 rows of 31 repeat none"


def test_a_source_on_an_object_store_mixes_with_a_local_one(data, s3):  # noqa: F811 - fixture
    s3.upload(data["b"], "mixing-b")
    sources = [Source(data["a"]), Source(s3.url("mixing-b"), rows_per_epoch=60, storage_options=s3.options), Source(data["c"], rows_per_epoch=70)]

    def make():
        return StructuredDataset.create_dataloader(sources, num_workers=2, shuffle=True, **CONFIG)

    reference = assert_resumes_exactly(make, epochs=1, batch_key=lambda b: tuple(b["id"].tolist()), points=[(0, 4)])
    _check_multiplicities(collections.Counter(i for batch in reference.batches[0] for i in batch), 60, 70)


def test_schema_errors_count_sources_not_files(tmp_path):
    """A column that sources lack, or types that do not unify, are reported by source."""
    for name, table in {
        "a": pa.table({"id": [1, 2], "x": [1.0, 2.0]}), "b": pa.table({"id": [3]}), "c": pa.table({"id": [4]}),
        "d": pa.table({"id": [5], "x": ["five"]}), "e": pa.table({"id": [6], "x": ["six"]}),
    }.items():
        (tmp_path / name).mkdir()
        pq.write_table(table, tmp_path / name / "part.parquet")
    with pytest.raises(ValueError, match=r"'x' \(double\) is missing from source 1 \(.*b\) \(and 1 more source\): .*nulls='fill'"):
        StructuredDataset([Source(str(tmp_path / n)) for n in "abc"], num_workers=0)
    with pytest.raises(ValueError, match=r"^the mixture's sources have incompatible schemas: column 'x' is double in source 0 .* but string in source 1 \(.*d\) \(and 1 more source\)"):
        StructuredDataset([Source(str(tmp_path / n)) for n in "ade"], num_workers=0)

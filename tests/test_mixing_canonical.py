"""Canonical lanes of a mixture: the same rows in the same global order for every valid
(world_size, num_workers), each source row its planned number of times, resume at every point,
elastic 2 -> 3 ranks, and a state of another canonical_lanes refused. Ranks run one after another
in this process (rank=, world_size=)."""

from __future__ import annotations

import collections
import json
from fractions import Fraction

import numpy as np
import pytest
from mixing_helpers import three_sources, write_sources
from resume_helpers import as_json, batch_key, canonical_config, rank_batches

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset
from torch_dataloader_utils.distributed import merge_states
from torch_dataloader_utils.plan.mixing import lane_phase, merge_positions
from torch_dataloader_utils.plan.mixing_canonical import lane_blocks
from torch_dataloader_utils.testing import assert_resumes_exactly

# A (100 rows) once, B (25 rows) upsampled to 60, C (200 rows) downsampled to 80: 240 rows, 5 global steps of 48
B, C = 60, 80
LANES, GLOBAL = 12, 48
TOPOLOGIES = [(1, 0), (2, 2), (3, 1)]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    return write_sources(tmp_path_factory.mktemp("mixing_canonical"))


def _config(world: int, workers: int, shuffle: bool = True, **extra) -> dict:
    settings = dict(shuffle=shuffle, shuffle_seed=3, split_bytes=3000, shuffle_buffer_rows=400)
    return canonical_config(world, workers, GLOBAL, LANES, **{**settings, **extra})


def _rank_run(data, rank, world, workers, epochs=(0,), state=None, elastic=False, stop=None, **extra):
    """Each batch of one rank (ids), per epoch, and its state where it stopped."""
    return rank_batches(three_sources(data, B, C), {**_config(world, workers, **extra), "rank": rank}, epochs, state, elastic, stop)


def global_order(data, world, workers, epochs=(0,), states=None, elastic=False, stop=None, **extra):
    """Per epoch, each global step's rows in global order (rank 0's batch, then rank 1's, ...), and the ranks' states."""
    runs = [_rank_run(data, rank, world, workers, epochs, states, elastic, stop, **extra) for rank in range(world)]
    assert len({tuple(len(e) for e in batches) for batches, _ in runs}) == 1, "ranks delivered different batch counts"
    steps = [[sum((batches[e][s] for batches, _ in runs), ()) for s in range(len(runs[0][0][e]))] for e in range(len(runs[0][0]))]
    return steps, [state for _, state in runs]


def _check_multiplicities(ids: list[int], b: int, c: int) -> None:
    """A's rows once each, B's floor or ceil of b / 25 times summing to b, C's at most once summing to c."""
    counts = collections.Counter(ids)
    by_source = [{i: n for i, n in counts.items() if i // 1000 == k} for k in range(3)]
    assert sorted(by_source[0]) == list(range(100)) and set(by_source[0].values()) == {1}
    low, high = divmod(b, 25)
    assert len(by_source[1]) == 25 and sum(by_source[1].values()) == b and sorted(by_source[1].values()).count(low + 1) == high
    assert set(by_source[1].values()) <= {low, low + 1}
    assert sum(by_source[2].values()) == c and set(by_source[2].values()) == {1}


@pytest.mark.parametrize("shuffle", [False, True])
def test_global_order_is_the_same_for_every_topology(data, shuffle):
    reference, _ = global_order(data, 1, 0, shuffle=shuffle)
    assert [len(step) for step in reference[0]] == [GLOBAL] * 5
    _check_multiplicities([i for step in reference[0] for i in step], B, C)
    for step in reference[0]:  # each source in proportion (100 : 60 : 80 of 240) to within a few rows per step
        by_source = collections.Counter(i // 1000 for i in step)
        assert all(abs(by_source[k] - GLOBAL * n / 240) <= 4 for k, n in enumerate((100, B, C))), by_source
    for world, workers in TOPOLOGIES[1:]:
        steps, _ = global_order(data, world, workers, shuffle=shuffle)
        assert steps == reference, f"world_size={world}, num_workers={workers}: another global order"


def test_two_epochs_walk_the_downsampled_source_and_keep_the_multiplicities(data):
    (first, second), _ = global_order(data, 2, 2, epochs=(0, 1))
    assert first != second, "each epoch has its own order"
    for steps in (first, second):
        _check_multiplicities([i for step in steps for i in step], B, C)
    walked = {i for steps in (first, second) for step in steps for i in step if i // 1000 == 2}
    assert len(walked) == 2 * C, "two epochs of the downsampled source repeat no row"


def test_resumes_exactly_at_every_point(data):
    config = _config(2, 2)
    assert_resumes_exactly(lambda: StructuredDataset.create_dataloader(three_sources(data, B, C), rank=1, **config), epochs=2, deep_stride=3)


def test_stateful_dataloader_resumes_exactly(data):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make():
        dataset = StructuredDataset(three_sources(data, B, C), rank=1, **_config(2, 2, chunk_rows=GLOBAL // 2))
        return StatefulDataLoader(dataset, batch_size=None, num_workers=2), dataset

    assert_resumes_exactly(
        make, epochs=1, batch_key=batch_key, points=[(0, 1), (0, 3)],
        save=lambda loader, dataset: loader.state_dict(), load=lambda loader, dataset, state: loader.load_state_dict(state),
    )  # fmt: skip


def test_elastic_resume_from_two_ranks_to_three_continues_the_global_order(data):
    reference, _ = global_order(data, 1, 0)
    before, states = global_order(data, 2, 2, stop=(0, 2))
    assert before[0] == reference[0][:2]
    saved = merge_states(states)
    for world, workers in [(3, 1), (1, 0)]:
        after, _ = global_order(data, world, workers, states=saved, elastic=True)
        assert before[0] + after[0] == reference[0], f"resumed on {world} x {workers}"
    _check_multiplicities([i for step in before[0] + after[0] for i in step], B, C)
    with pytest.raises(CheckpointMismatchError, match="elastic=True"):
        _rank_run(data, 0, 3, 1, state=saved)


def test_a_state_of_other_canonical_lanes_is_refused_naming_them(data):
    _, saved = _rank_run(data, 0, 1, 0, stop=(0, 1))
    other = StructuredDataset(three_sources(data, B, C), **_config(1, 0, canonical_lanes=6))
    with pytest.raises(CheckpointMismatchError, match="canonical_lanes changed: checkpoint=12, current=6"):
        other.load_state_dict(saved)
    plain = StructuredDataset(three_sources(data, B, C), **{**_config(1, 0), "canonical_lanes": None})
    with pytest.raises(CheckpointMismatchError, match="canonical_lanes changed: checkpoint=12, current=None"):
        plain.load_state_dict(saved)
    with pytest.raises(CheckpointMismatchError, match="canonical_lanes changed: checkpoint=None"):
        StructuredDataset(three_sources(data, B, C), **_config(1, 0)).load_state_dict(as_json(plain.state_dict()))
    with pytest.raises(CheckpointMismatchError, match="source 1's rows_per_epoch changed"):
        StructuredDataset(three_sources(data, B + 1, C), **_config(1, 0)).load_state_dict(saved)
    both = StructuredDataset(three_sources(data, B + 1, C), **_config(1, 0, canonical_lanes=6))
    with pytest.raises(CheckpointMismatchError, match=r"(?s)canonical_lanes changed: checkpoint=12, current=6.*source 1's rows_per_epoch changed"):
        both.load_state_dict(saved)


def test_the_state_does_not_grow_with_progress_or_upsampling(data):
    loader, dataset = StructuredDataset.create_dataloader(three_sources(data, 6000, C), rank=0, **_config(1, 0))  # B 240x
    sizes = []
    for _ in loader:
        sizes.append(len(json.dumps(dataset.state_dict())))
    assert len(sizes) == (100 + 6000 + C) // GLOBAL + 1 and max(sizes) - min(sizes) < 40 and max(sizes) < 2000


def test_tdu_inspect_counts_each_sources_rows_delivered(data, tmp_path, capsys):
    from torch_dataloader_utils.cli import main

    (batches,), state = _rank_run(data, 0, 2, 2, stop=(0, 2))
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    assert main(["inspect", str(path), data["a"], data["b"], data["c"], "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["matches_data"]["matches"], report["matches_data"]
    delivered = collections.Counter(i // 1000 for batch in batches for i in batch)
    assert [s["rows_delivered"] for s in report["mixture"]] == [delivered[k] for k in range(3)]
    assert main(["inspect", str(path), "--json"]) == 0  # without the data: unknown, not 0 (the state records the step, not splits)
    (report,) = json.loads(capsys.readouterr().out)
    assert [s["rows_delivered"] for s in report["mixture"]] == [None] * 3


def test_each_lane_holds_its_share_of_every_source(data):
    dataset = StructuredDataset(three_sources(data, B, C), **_config(1, 0))
    lanes = dataset._base_plan.book.lane_streams(0)
    per_source = [stream.window_sources.sum(axis=0).tolist() for stream in lanes]
    for k, n in enumerate((100, B, C)):  # lane l: rows [l n / C, (l + 1) n / C) of the source's epoch sequence
        assert [rows[k] for rows in per_source] == [(lane + 1) * n // LANES - lane * n // LANES for lane in range(LANES)]


def test_lanes_are_contiguous_block_ranges_and_phases_spread_the_rounding():
    assert lane_blocks(np.array([5, 0, 3, 1, 4, 2]), 3) == [[0, 1], [3, 2], [5, 4]]
    assert lane_blocks(np.array([1, 0]), 3) == [[], [0], [1]]  # fewer blocks than lanes (an epoch of fewer rows)
    rng = np.random.default_rng(0)
    for _ in range(200):  # with phases, merge_positions is still the order of the keys (j + a_k / m) / count_k
        counts = [int(c) for c in rng.integers(0, 20, size=int(rng.integers(1, 5)))]
        m = 2 * int(rng.integers(1, 20))
        starts = tuple(int(a) for a in rng.integers(1, m, size=len(counts)))
        keys = sorted((Fraction(m * j + starts[k], m * c), k, j) for k, c in enumerate(counts) for j in range(c))
        want = {(k, j): position for position, (_, k, j) in enumerate(keys)}
        for k, c in enumerate(counts):
            assert merge_positions(counts, k, (starts, m)).tolist() == [want[(k, j)] for j in range(c)]
    # 8 lanes, each a window of 3 rows of source 0 and 1 of source 1: with the same merge in every
    # lane, the first row of every lane is source 0's (8 : 0 where 6 : 2 is the proportion);
    # each lane's own phases spread the sources' first rows over the lanes
    assert int(merge_positions((3, 1), 1)[0]) > 0
    firsts = collections.Counter(int(merge_positions((3, 1), 1, lane_phase(lane, 8, 2))[0] == 0) for lane in range(8))
    assert firsts[1] >= 1, "with each lane's phases, some lanes start with source 1"

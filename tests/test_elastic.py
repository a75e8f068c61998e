"""Equal batch counts per rank and elastic resume, one rank at a time in this process.

(tests/test_ddp.py runs the same through real torch.distributed processes.)
"""

import collections
import json
import random

import pytest
from datagen import write_dataset
from resume_helpers import batch_key

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset
from torch_dataloader_utils.distributed import local_state, merge_states
from torch_dataloader_utils.plan.lanes import Segment
from torch_dataloader_utils.state.elastic import deal
from torch_dataloader_utils.state.merge import plan_differences, plan_summary

LAYOUT = [[23, 31, 17], [40, 9], [11, 29, 33, 14], [50], [7, 7, 7]]
ROWS = sum(map(sum, LAYOUT))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic")
    write_dataset(root, LAYOUT)
    return str(root)


def _config(shuffle, equalize="pad"):
    return dict(batch_size=10, split_bytes=2500, chunk_rows=20, shuffle=shuffle, shuffle_seed=1, shuffle_buffer_rows=40, equalize=equalize)


def _roundtrip(state):
    return json.loads(json.dumps(state))


def _run(path, rank, world, workers, config, state=None, elastic=False, stop=None):
    """Batches of one rank (with padding flags) and its state when stopped."""
    loader, dataset = StructuredDataset.create_dataloader(path, rank=rank, world_size=world, num_workers=workers, **config)
    if state is not None:
        dataset.load_state_dict(_roundtrip(state), elastic=elastic)
    batches = []
    for batch in loader:
        batches.append((batch_key(batch), dataset.last_batch_is_padding))
        if stop is not None and len(batches) == stop:
            break
    return batches, _roundtrip(dataset.state_dict()), len(loader)


@pytest.mark.parametrize("equalize", ["pad", "drop"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_rank_delivers_the_same_number_of_batches(data, shuffle, equalize):
    for world in (2, 3, 4):
        runs = [_run(data, rank, world, 2, _config(shuffle, equalize)) for rank in range(world)]
        counts = {len(batches) for batches, _, _ in runs}
        assert len(counts) == 1, counts
        assert all(length == len(batches) for batches, _, length in runs)
        real = collections.Counter(i for batches, _, _ in runs for ids, pad in batches if not pad for i in ids)
        assert max(real.values()) == 1
        if equalize == "pad":
            assert sorted(real) == list(range(ROWS))
            padding = [ids for batches, _, _ in runs for ids, pad in batches if pad]
            assert all(len(ids) == 10 for ids in padding)


def test_padding_comes_from_the_ranks_own_rows_and_is_not_progress(data):
    batches, state, _ = _run(data, 1, 3, 1, _config(False))
    own = {i for ids, pad in batches if not pad for i in ids}
    padded = [ids for ids, pad in batches if pad]
    assert padded, "this layout leaves rank 1 short, so it must pad"
    assert all(set(ids) <= own for ids in padded)
    assert sum(state["rows_delivered"]) == len(own)
    assert state["padding_delivered"] == 10 * len(padded)


@pytest.mark.parametrize("equalize", ["pad", "drop"])
def test_global_state_of_ranks_at_different_steps_resumes_only_elastically(data, equalize):
    """States taken at different steps (a hand-assembled checkpoint): resumed in place, the ranks
    would deliver different numbers of batches (13 and 11 in a review), and DDP would hang. The
    global state is refused, naming the key; elastic=True deals the rest evenly, exactly once."""
    config = _config(True, equalize)
    seen = collections.Counter()
    states = []
    for rank, stop in enumerate((3, 5)):
        batches, state, _ = _run(data, rank, 2, 2, config, stop=stop)
        seen.update(i for ids, pad in batches if not pad for i in ids)
        states.append(state)
    assert [s["batches_delivered"] for s in states] == [3, 5]
    merged = merge_states(states)
    with pytest.raises(CheckpointMismatchError, match=r"ranks\[1\] has delivered 5 batches of epoch 0 but ranks\[0\] 3 \(key 'batches_delivered'\)"):
        StructuredDataset(data, rank=0, world_size=2, num_workers=2, **config).load_state_dict(merged)
    counts = []
    for rank in range(2):
        batches, _, _ = _run(data, rank, 2, 2, config, state=merged, elastic=True)
        seen.update(i for ids, pad in batches if not pad for i in ids)
        counts.append(len(batches))
    assert counts[0] == counts[1] and max(seen.values()) == 1
    if equalize == "pad":
        assert sorted(seen) == list(range(ROWS))


def test_damaged_padding_progress_is_refused(data):
    """Padding is delivered in whole batches, after all of the rank's own rows: a state that says
    otherwise would leave the rank a batch short (a DDP hang) or skip its own rows."""
    _, done, _ = _run(data, 1, 3, 1, _config(False))
    _, part_way, _ = _run(data, 1, 3, 1, _config(False), stop=2)
    assert done["padding_delivered"] >= 10 and part_way["padding_delivered"] == 0
    for damaged, cause in [
        ({**done, "padding_delivered": done["padding_delivered"] - 3}, "is not a whole number of batches of 10"),
        ({**part_way, "padding_delivered": 10}, "padding comes after the rank's own rows, and rows_delivered says some are left"),
    ]:
        with pytest.raises(CheckpointMismatchError, match="'padding_delivered' is out of range") as error:
            StructuredDataset(data, rank=1, world_size=3, num_workers=1, **_config(False)).load_state_dict(damaged)
        assert cause in str(error.value)


@pytest.mark.parametrize("shuffle", [False, True, "whole-lane windows"])
@pytest.mark.parametrize("before, after", [((2, 2), (3, 0)), ((3, 0), (2, 2)), ((2, 1), (1, 3)), ((1, 2), (4, 1)), ((2, 2), (3, 2))])
def test_elastic_resume_delivers_every_row_once(data, shuffle, before, after):
    """With "whole-lane windows" every old lane is one shuffle window, larger than a new lane's share."""
    (world0, workers0), (world1, workers1) = before, after
    config = {**_config(True), "shuffle_buffer_rows": 400} if shuffle == "whole-lane windows" else _config(shuffle)
    seen = collections.Counter()
    states = []
    for rank in range(world0):
        batches, state, _ = _run(data, rank, world0, workers0, config, stop=3 + 2 * rank)
        seen.update(i for ids, pad in batches if not pad for i in ids)
        states.append(state)
    merged = merge_states(states)
    counts, real_rows = [], []
    for rank in range(world1):
        batches, _, length = _run(data, rank, world1, workers1, config, state=merged, elastic=True)
        seen.update(i for ids, pad in batches if not pad for i in ids)
        counts.append((len(batches), length))
        real_rows.append(sum(len(ids) for ids, pad in batches if not pad))
    assert max(seen.values()) == 1, "a row was delivered twice"
    assert sorted(seen) == list(range(ROWS)), "rows were lost"
    assert len(set(counts)) == 1 and counts[0][0] == counts[0][1]
    # the rest is dealt evenly, each new lane a share of whole batches (units are cut where a share
    # ends), so no new rank trains on padding while another holds the rows: its lanes' shares
    # differ by at most one batch from the others' (and the last one may end short)
    assert max(real_rows) - min(real_rows) < 2 * config["batch_size"], real_rows


def test_deal_gives_every_row_once_and_every_lane_an_equal_share_in_batches():
    rng = random.Random(7)
    for _ in range(300):
        largest_unit = rng.choice([3, 30, 300])
        units = [[Segment((0, 0, lane, 0), i * 1000, i * 1000 + rng.randint(1, largest_unit)) for i in range(rng.randint(0, 6))] for lane in range(rng.randint(1, 5))]
        world, workers, batch_size = rng.randint(1, 4), rng.randint(0, 3), rng.randint(1, 20)
        dealt = deal(units, world, workers, batch_size)
        assert len(dealt) == world and all(len(lanes) == max(1, workers) for lanes in dealt)
        given = sorted((s.key, s.start, s.stop) for lanes in units for s in lanes)
        # _join may merge neighbouring units of one stream, so compare rows, not segments
        rows = lambda segments: sorted((s.key, r) for s in segments for r in range(s.start, s.stop))  # noqa: E731
        assert rows(s for lanes in dealt for lane in lanes for s in lane.segments) == rows(Segment(*g) for g in given)
        # shares of whole batches: the ranks' batch counts differ by at most one, and so do a rank's
        # workers' (the last share with rows may end in a short batch, the ones after it are empty)
        loads = [sum(s.num_rows for s in lane.segments) for lanes in dealt for lane in lanes]
        batches = [[-(-sum(s.num_rows for s in lane.segments) // batch_size) for lane in lanes] for lanes in dealt]
        assert max(map(sum, batches)) - min(map(sum, batches)) <= 1, (batches, batch_size)
        assert all(max(lanes) - min(lanes) <= 1 for lanes in batches), (batches, batch_size)
        assert all(load % batch_size == 0 for load in loads[: len([b for b in loads if b]) - 1]), (loads, batch_size)


@pytest.mark.parametrize("before, after", [((2, 2), (3, 1)), ((3, 1), (2, 2)), ((2, 2), (1, 0))])
def test_elastic_resume_with_drop_last_delivers_every_row_the_old_plan_owed(data, before, after):
    """drop_last leaves out each old lane's partial batch once; the re-dealt lanes lose nothing more."""
    (world0, workers0), (world1, workers1) = before, after
    config = {**_config(True), "drop_last": True}
    planned = collections.Counter()
    for rank in range(world0):
        planned.update(i for ids, pad in _run(data, rank, world0, workers0, config)[0] if not pad for i in ids)
    seen = collections.Counter()
    states = []
    for rank in range(world0):
        batches, state, _ = _run(data, rank, world0, workers0, config, stop=2 + rank)
        seen.update(i for ids, pad in batches if not pad for i in ids)
        states.append(state)
    for rank in range(world1):
        batches, _, _ = _run(data, rank, world1, workers1, config, state=merge_states(states), elastic=True)
        seen.update(i for ids, pad in batches if not pad for i in ids)
    assert max(seen.values()) == 1, "a row was delivered twice"
    assert sorted(seen) == sorted(planned), f"lost {sorted(set(planned) - set(seen))}"


@pytest.mark.parametrize("stop", [None, 1, 2])
@pytest.mark.parametrize("before, after", [((3, 2), (2, 1)), ((2, 2), (3, 1)), ((3, 1), (3, 2))])
def test_elastic_resume_under_drop_delivers_only_rows_the_old_plan_would_have(data, before, after, stop):
    """equalize="drop" cuts every rank to the smallest batch count: the rows past the cut are not
    owed this epoch, so an elastic resume must not deal them out (stop=None: saved after the last batch)."""
    (world0, workers0), (world1, workers1) = before, after
    config = _config(False, "drop")
    planned = collections.Counter()
    for rank in range(world0):
        planned.update(i for ids, _ in _run(data, rank, world0, workers0, config)[0] for i in ids)
    assert len(planned) < ROWS, "this layout must make drop leave rows out"
    seen = collections.Counter()
    states = []
    for rank in range(world0):
        batches, state, _ = _run(data, rank, world0, workers0, config, stop=stop)
        seen.update(i for ids, _ in batches for i in ids)
        states.append(state)
    before_resume = sum(seen.values())
    owed = set(planned) - set(seen)
    counts = set()
    for rank in range(world1):
        batches, _, _ = _run(data, rank, world1, workers1, config, state=merge_states(states), elastic=True)
        seen.update(i for ids, _ in batches for i in ids)
        counts.add(len(batches))
    assert max(seen.values()) == 1, "a row was delivered twice"
    assert set(seen) <= set(planned), f"delivered rows the old plan dropped: {sorted(set(seen) - set(planned))}"
    assert len(counts) == 1, counts
    if stop is None:
        assert not owed and sum(seen.values()) == before_resume, "a finished epoch delivered more after the resume"
        return
    # the owed rows go out again, less at most what the new plan's own cut leaves out: the new
    # ranks' rows differ by at most one dealt unit, and each of their lanes may end in a partial batch
    assert owed and counts != {0}, "the resume delivered nothing of what the old plan owed"
    largest_unit = max(split.row_length for split in StructuredDataset(data, num_workers=0, **config).splits)
    lost = owed - set(seen)
    assert len(lost) <= world1 * (largest_unit + max(1, workers1) * config["batch_size"]), (len(lost), len(owed))


def test_checkpoint_after_an_elastic_resume_resumes_exactly(data):
    config = _config(True)
    states = [_run(data, rank, 2, 2, config, stop=4)[1] for rank in range(2)]
    merged = merge_states(states)
    full, _, _ = _run(data, 1, 3, 1, config, state=merged, elastic=True)
    partial, state, _ = _run(data, 1, 3, 1, config, state=merged, elastic=True, stop=3)
    assert state["lanes"] is not None and partial == full[:3]
    rest, _, _ = _run(data, 1, 3, 1, config, state=state)
    assert rest == full[3:]
    # and a second resize in the same epoch still delivers the rest exactly once
    seen = collections.Counter(i for ids, pad in _run(data, 0, 2, 2, config, stop=4)[0] if not pad for i in ids)
    seen.update(i for ids, pad in _run(data, 1, 2, 2, config, stop=4)[0] if not pad for i in ids)
    middle = []
    for rank in range(3):
        batches, st, _ = _run(data, rank, 3, 1, config, state=merged, elastic=True, stop=2)
        seen.update(i for ids, pad in batches if not pad for i in ids)
        middle.append(st)
    for rank in range(2):
        batches, _, _ = _run(data, rank, 2, 0, config, state=merge_states(middle), elastic=True)
        seen.update(i for ids, pad in batches if not pad for i in ids)
    assert max(seen.values()) == 1 and sorted(seen) == list(range(ROWS))


def test_damaged_lanes_or_batch_target_after_an_elastic_resume_are_refused(data):
    """A state that carries dealt lanes is checked against its own row totals, and a global
    state's ranks must agree on the batch target (else rows would be lost or DDP would hang)."""
    import copy

    config = _config(True)
    merged = merge_states([_run(data, rank, 2, 2, config, stop=4)[1] for rank in range(2)])
    dealt = merge_states([_run(data, rank, 3, 1, config, state=merged, elastic=True, stop=2)[1] for rank in range(3)])
    cut = copy.deepcopy(dealt)
    cut["ranks"][0]["lanes"][0] = cut["ranks"][0]["lanes"][0][:-1]
    with pytest.raises(CheckpointMismatchError, match=r"'lanes' is damaged[\s\S]*'rows_total' says"):
        _run(data, 0, 3, 1, config, state=cut)
    raised = copy.deepcopy(dealt)
    raised["ranks"][0]["batch_target"] += 5
    for rank in range(3):
        with pytest.raises(CheckpointMismatchError, match=r"disagree on 'lanes' or 'batch_target'"):
            _run(data, rank, 3, 1, config, state=raised)
    resumed = [_run(data, rank, 3, 1, config, state=dealt)[0] for rank in range(3)]  # the intact state loads on every rank
    assert len({len(batches) for batches in resumed}) == 1 and resumed[0], "the ranks must deliver equally many batches, and some"


def test_same_topology_global_state_resumes_each_rank_exactly(data):
    config = _config(True)
    full = [_run(data, rank, 2, 2, config)[0] for rank in range(2)]
    states = [_run(data, rank, 2, 2, config, stop=5)[1] for rank in range(2)]
    merged = merge_states(states)
    for rank in range(2):
        assert _run(data, rank, 2, 2, config, state=merged)[0] == full[rank][5:]
        assert _run(data, rank, 2, 2, config, state=local_state(merged, rank))[0] == full[rank][5:]


def test_topology_change_without_elastic_is_a_mismatch(data):
    config = _config(False)
    merged = merge_states([_run(data, rank, 2, 2, config, stop=2)[1] for rank in range(2)])
    loader, dataset = StructuredDataset.create_dataloader(data, rank=0, world_size=3, num_workers=2, **config)
    with pytest.raises(CheckpointMismatchError, match="world_size changed: checkpoint=2, current=3"):
        dataset.load_state_dict(merged)
    with pytest.raises(CheckpointMismatchError, match="needs every rank's progress"):
        dataset.load_state_dict(merged["ranks"][0], elastic=True)
    other_seed = dict(config, shuffle_seed=2, shuffle=True)
    merged_shuffled = merge_states([_run(data, rank, 2, 2, dict(config, shuffle=True), stop=2)[1] for rank in range(2)])
    _, dataset = StructuredDataset.create_dataloader(data, rank=0, world_size=3, num_workers=2, **other_seed)
    with pytest.raises(CheckpointMismatchError, match="shuffle_seed changed"):
        dataset.load_state_dict(merged_shuffled, elastic=True)


def test_merge_states_checks_its_input(data):
    config = _config(False)
    states = [_run(data, rank, 2, 0, config, stop=1)[1] for rank in range(2)]
    with pytest.raises(ValueError, match="rank order"):
        merge_states(states[::-1])
    with pytest.raises(ValueError, match=r"got 1 state: states\[0\] was saved by rank 0 of 2; pass the list of all 2 ranks' states"):
        merge_states(states[:1])
    with pytest.raises(ValueError, match=r"from epoch 1 but states\[0\] from epoch 0; take every rank's state at the same step"):
        merge_states([states[0], dict(states[1], epoch=1)])
    with pytest.raises(ValueError, match="empty"):
        merge_states([])
    other = dict(states[1], files=states[1]["files"][:-1])
    with pytest.raises(ValueError, match="do not plan the same epoch: only rank 0 has .*same files"):
        merge_states([states[0], other])
    other_settings = dict(states[1], _batch_size=states[1]["_batch_size"] * 2, _shuffle=True)
    with pytest.raises(ValueError, match=r"shuffle: rank 0 has False, rank 1 True; batch_size: rank 0 has \d+, rank 1 \d+"):
        merge_states([states[0], other_settings])
    unused_seeds = [dict(state, _shuffle_seed=100 + rank, _shuffle_buffer_rows=7 + rank) for rank, state in enumerate(states)]
    assert not states[0]["_shuffle"] and merge_states(unused_seeds)["scope"] == "global"  # settings unused without shuffling
    assert plan_summary(unused_seeds[0]) == plan_summary(unused_seeds[1])
    merged = merge_states(states)
    assert "files" not in merged["ranks"][0] and merged["files"] == states[0]["files"]
    assert local_state(merged, 1) == states[1]


def test_merge_states_refuses_ranks_that_resumed_from_different_checkpoints(data):
    """One rank resumed elastically, the other started the epoch afresh: their batch counts differ
    (a DDP job would hang), and a global state of the two would lose rows."""
    config = _config(False)
    old = merge_states([_run(data, rank, 3, 1, config, stop=1)[1] for rank in range(3)])
    resumed = _run(data, 1, 2, 1, config, state=old, elastic=True, stop=1)[1]
    fresh = _run(data, 0, 2, 1, config, stop=1)[1]
    assert resumed["lanes"] is not None and fresh["lanes"] is None
    with pytest.raises(ValueError, match="come from different plans of epoch 0.*Every rank must load the same checkpoint"):
        merge_states([fresh, resumed])
    other = _run(data, 0, 2, 1, config, state=old, elastic=True, stop=1)[1]
    assert merge_states([other, resumed])["scope"] == "global"  # both resumed from one checkpoint


def test_plan_differences_name_the_settings_and_files_ranks_disagree_on(tmp_path):
    write_dataset(tmp_path, [[20], [30], [10]])
    files = sorted(str(p) for p in tmp_path.iterdir())
    rank0 = StructuredDataset(files[:2], rank=0, world_size=3, num_workers=0).state_dict()
    same = StructuredDataset(files[:2], rank=1, world_size=3, num_workers=0).state_dict()
    assert plan_differences([rank0, same]) == []
    assert plan_summary(rank0) == plan_summary(same) and len(json.dumps(plan_summary(rank0))) < 600
    other = StructuredDataset(files[1:], rank=2, world_size=3, num_workers=0, batch_size=32).state_dict()
    assert plan_differences([rank0, same, other]) == [
        "batch_size: rank 0 has 1024, rank 2 32",
        f"only rank 2 has {files[2]}",
        f"only rank 0 has {files[0]}",
    ]
    newer = json.loads(json.dumps(same))
    newer["files"][1][2] = "another-version"
    assert plan_differences([rank0, newer]) == [f"rank 0 and rank 1 see other versions of {files[1]}"]
    assert plan_summary(newer) != plan_summary(rank0) and plan_summary(other) != plan_summary(rank0)
    canonical = StructuredDataset(files[:2], rank=1, world_size=3, num_workers=0, canonical_lanes=6).state_dict()
    assert plan_differences([rank0, canonical]) == ["canonical_lanes: rank 0 has None, rank 1 6"]
    assert plan_summary(canonical) != plan_summary(rank0)


def test_drop_warns_once_when_it_leaves_out_most_of_a_ranks_batches(tmp_path, caplog):
    write_dataset(tmp_path, [[50], [5]])  # rank 0: 5 batches of 10 rows; rank 1: 1 batch
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), rank=0, world_size=2, num_workers=0, batch_size=10, equalize="drop")
    assert len(list(loader)) == 1
    (warning,) = caplog.records
    assert "equalize='drop': rank 0 delivers 1 of its 5 batches in epoch 0" in warning.message and "equalize='pad'" in warning.message
    dataset.set_epoch(1)
    list(loader)
    assert len(caplog.records) == 1
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), rank=1, world_size=2, num_workers=0, batch_size=10, equalize="drop")
    list(loader)
    assert len(caplog.records) == 1  # rank 1 loses nothing


def test_a_one_rank_jobs_state_resumes_elastically_without_merging(data):
    config = _config(True)
    batches, state, _ = _run(data, 0, 1, 2, config, stop=4)
    seen = collections.Counter(i for ids, _ in batches for i in ids)
    for rank in range(2):
        rest, _, _ = _run(data, rank, 2, 1, config, state=state, elastic=True)
        seen.update(i for ids, pad in rest if not pad for i in ids)
    assert max(seen.values()) == 1 and sorted(seen) == list(range(ROWS))
    two_rank_state = _run(data, 0, 2, 2, config, stop=1)[1]
    with pytest.raises(CheckpointMismatchError, match="needs every rank's progress"):
        _run(data, 0, 3, 2, config, state=two_rank_state, elastic=True)


@pytest.mark.parametrize("equalize", ["pad", "drop"])
def test_the_equal_batch_count_follows_the_epoch(data, equalize):
    """The batch count every rank delivers is cached per epoch: one dataset run through several
    shuffled epochs must deliver what a dataset built for each epoch delivers."""
    config = {**_config(True, equalize), "split_bytes": 800}
    for rank in range(3):
        loader, dataset = StructuredDataset.create_dataloader(data, rank=rank, world_size=3, num_workers=2, **config)
        counts = set()
        for epoch in range(4):
            dataset.set_epoch(epoch)
            fresh_loader, fresh = StructuredDataset.create_dataloader(data, rank=rank, world_size=3, num_workers=2, **config)
            fresh.set_epoch(epoch)
            delivered = [batch_key(b) for b in loader]
            assert len(delivered) == len(loader) == len(fresh_loader), (rank, epoch)
            assert delivered == [batch_key(b) for b in fresh_loader], (rank, epoch)
            counts.add(len(delivered))
        assert rank > 0 or len(counts) > 1, "the layout must give other counts in other epochs"

"""Canonical lanes: the same global steps for every valid (world_size, num_workers), and resume
across topologies. Ranks run one after another in this process (rank=, world_size=); one test
launches real torch.distributed processes with torchrun (tests/canonical_job.py)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest
from datagen import write_dataset
from resume_helpers import as_json, batch_key, canonical_config, rank_batches
from servers import s3, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset
from torch_dataloader_utils.distributed import merge_states
from torch_dataloader_utils.testing import assert_resumes_exactly

LAYOUT = [[23, 31, 17], [40, 9], [11, 29, 33, 14], [50], [7, 7, 7], [60, 45], [80]]
ROWS = sum(map(sum, LAYOUT))  # 463: not a whole number of global batches, lanes run out unevenly
LANES, GLOBAL = 12, 96
TOPOLOGIES = [(1, 0), (1, 3), (2, 2), (3, 1), (4, 3)]
JOB = os.path.join(os.path.dirname(__file__), "canonical_job.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("canonical")
    write_dataset(root, LAYOUT)
    return str(root)


def _config(world: int, workers: int, shuffle: bool = True, **extra) -> dict:
    settings = dict(shuffle=shuffle, shuffle_seed=5, split_bytes=2500, shuffle_buffer_rows=40)
    return canonical_config(world, workers, GLOBAL, LANES, **{**settings, **extra})


def _rank_batches(path, rank, world, workers, epochs=(0,), state=None, elastic=False, stop=None, **extra):
    """Each batch of one rank (ids), per epoch, and its state where it stopped."""
    return rank_batches(path, {**_config(world, workers, **extra), "rank": rank}, epochs, state, elastic, stop)


def global_steps(path, world, workers, epochs=(0,), states=None, elastic=False, stop=None, **extra):
    """Per epoch, each global step as a sorted tuple of ids (every rank's batch s), and the ranks' states."""
    runs = [
        _rank_batches(path, rank, world, workers, epochs, states, elastic, stop, **extra) for rank in range(world)
    ]
    counts = {tuple(len(e) for e in batches) for batches, _ in runs}
    assert len(counts) == 1, f"ranks delivered different batch counts: {counts}"
    steps = [
        [tuple(sorted(i for batches, _ in runs for i in batches[e][s])) for s in range(len(runs[0][0][e]))]
        for e in range(len(runs[0][0]))
    ]
    return steps, [state for _, state in runs]


@pytest.mark.parametrize("shuffle", [False, True])
def test_global_steps_are_the_same_for_every_topology(data, shuffle):
    reference = None
    for world, workers in TOPOLOGIES:
        steps, _ = global_steps(data, world, workers, shuffle=shuffle)
        if reference is None:
            reference = steps
            ids = [i for step in steps[0] for i in step]
            assert set(ids) == set(range(ROWS)), "rows lost"
            assert len(ids) == -(-ROWS // GLOBAL) * GLOBAL, "the last global step is padded to the global batch"
            assert all(len(step) == GLOBAL for step in steps[0])
            padding = collections.Counter(ids) - collections.Counter(range(ROWS))
            assert sum(padding.values()) == len(ids) - ROWS and max(padding.values()) == 1
        assert steps == reference, f"world_size={world}, num_workers={workers}: other global steps"
    # unshuffled, lane l is rows [l*N/C, (l+1)*N/C) in file order, and step 0 their first G/C rows each
    first = tuple(sorted(lane * ROWS // LANES + i for lane in range(LANES) for i in range(GLOBAL // LANES)))
    assert (reference[0][0] == first) != shuffle


def test_elastic_resume_from_2x2_continues_with_the_same_global_steps(data):
    reference, _ = global_steps(data, 1, 0)
    stop = (0, 2)  # mid-epoch: 2 of 5 global steps
    before, states = global_steps(data, 2, 2, stop=stop)
    assert before[0] == reference[0][:2]
    saved = merge_states(states)
    for world, workers in [(3, 1), (1, 0)]:
        after, resumed_states = global_steps(data, world, workers, states=saved, elastic=True)
        assert before[0] + after[0] == reference[0], f"resumed on {world} x {workers}"
        assert all(state["batches_delivered"] == len(reference[0]) for state in resumed_states)
    same, _ = global_steps(data, 2, 2, states=saved)  # same topology: strict, no elastic needed
    assert before[0] + same[0] == reference[0]
    with pytest.raises(CheckpointMismatchError, match="elastic=True"):
        _rank_batches(data, 0, 3, 1, state=saved)


def test_one_rank_state_is_enough_to_resume_on_another_topology(data):
    """Every rank's state records the same global step: debug step 3 of a 4-rank run on one process."""
    reference, _ = global_steps(data, 1, 0)
    _, states = global_steps(data, 4, 3, stop=(0, 3))
    after, _ = global_steps(data, 1, 0, states=states[2], elastic=True)
    assert after[0] == reference[0][3:]


def test_across_an_epoch_boundary(data):
    reference, _ = global_steps(data, 1, 3, epochs=(0, 1))
    assert reference[0] != reference[1], "each epoch has its own order"
    before, states = global_steps(data, 2, 2, epochs=(0, 1), stop=(1, 1))
    assert before[0] == reference[0] and before[1] == reference[1][:1]
    after, _ = global_steps(data, 3, 1, epochs=(1,), states=merge_states(states), elastic=True)
    assert before[1] + after[0] == reference[1]


@pytest.mark.parametrize("policy", [dict(equalize="drop"), dict(drop_last=True), dict(equalize="none")])
def test_end_of_epoch_policies_are_topology_independent(data, policy):
    reference, _ = global_steps(data, 1, 0, **policy)
    ids = [i for step in reference[0] for i in step]
    assert len(ids) == len(set(ids)), "a row delivered twice"
    if policy.get("equalize") == "none":
        assert sorted(ids) == list(range(ROWS)) and len(reference[0][-1]) == ROWS % GLOBAL
    else:
        assert len(ids) == ROWS // GLOBAL * GLOBAL
    for world, workers in [(2, 2), (4, 3)]:
        steps, _ = global_steps(data, world, workers, **policy) if policy.get("equalize") != "none" else (None, None)
        if steps is not None:
            assert steps == reference
    if policy.get("equalize") == "none":  # the last step's 79 rows: 4 ranks of 24 get 24, 24, 24, 7
        runs = [_rank_batches(data, rank, 4, 3, **policy)[0][0] for rank in range(4)]
        assert [len(batches[-1]) for batches in runs] == [24, 24, 24, 7]
        assert tuple(sorted(i for batches in runs for i in batches[-1])) == reference[0][-1]


def test_same_topology_resume_is_exact_at_every_batch(data):
    config = _config(2, 2)
    assert_resumes_exactly(lambda: StructuredDataset.create_dataloader(data, rank=1, **config), epochs=2, stride=2, deep_stride=3)


@pytest.mark.parametrize(
    "world, workers, batch_size, lanes, named",
    [
        (2, 2, 48, 10, "world_size x max(1, num_workers) = 2 x 2 = 4 does not divide it"),
        (3, 3, 32, 12, "3 x 3 = 9 does not divide it"),
        (2, 0, 50, 12, "global batch G = batch_size x world_size = 50 x 2 = 100"),
    ],
)
def test_invalid_topology_names_the_rule_and_an_alternative(data, world, workers, batch_size, lanes, named):
    with pytest.raises(ValueError) as error:
        StructuredDataset(data, rank=0, world_size=world, num_workers=workers, batch_size=batch_size, canonical_lanes=lanes)
    message = str(error.value)
    assert named in message and f"canonical_lanes={lanes}" in message and "Try " in message
    assert f"world_size={world}, num_workers={workers}" in message


def test_states_with_and_without_canonical_lanes_do_not_mix(data):
    _, canonical = _rank_batches(data, 0, 1, 0, stop=(0, 1))
    plain = StructuredDataset(data, num_workers=0, batch_size=GLOBAL, split_bytes=2500)
    with pytest.raises(CheckpointMismatchError, match="canonical_lanes changed: checkpoint=12"):
        plain.load_state_dict(canonical)
    with pytest.raises(CheckpointMismatchError, match="canonical_lanes changed: checkpoint=None"):
        StructuredDataset(data, **_config(1, 0)).load_state_dict(as_json(plain.state_dict()))
    other_batch = StructuredDataset(data, **_config(1, 0, batch_size=48))
    with pytest.raises(CheckpointMismatchError, match="global batch"):
        other_batch.load_state_dict(canonical, elastic=True)
    damaged = dict(canonical, rows_delivered=[canonical["rows_delivered"][0] + 1])
    with pytest.raises(CheckpointMismatchError, match="rows_delivered"):
        StructuredDataset(data, **_config(1, 0)).load_state_dict(damaged)


def test_orc_files(tmp_path):
    write_dataset(tmp_path, LAYOUT[:4], fmt="orc")
    runs = [global_steps(str(tmp_path), world, workers, format="orc")[0] for world, workers in [(1, 0), (2, 2)]]
    assert runs[0] == runs[1]


def test_text_files_and_arrow_streams(tmp_path):
    """Every format plans the same splits and pieces, so the lanes are the same on any topology."""
    import zlib

    import pyarrow as pa

    (tmp_path / "text").mkdir()
    rows = [f"{i},row-{i},{i * 0.5}\n" for i in range(300)]  # (the columns resume_helpers.batch_key checks)
    (tmp_path / "text" / "a.csv").write_text("id,text,x\n" + "".join(rows[:180]))
    (tmp_path / "text" / "b.csv.deflate").write_bytes(zlib.compress(("id,text,x\n" + "".join(rows[180:])).encode()))
    table = pa.table({"id": list(range(200)), "text": [f"row-{i}" for i in range(200)], "x": [i * 0.5 for i in range(200)]})
    with pa.ipc.new_stream(str(tmp_path / "c.arrow"), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=25):
            writer.write_batch(batch)
    for fmt, path, count in (("csv", tmp_path / "text", 300), ("arrow", tmp_path / "c.arrow", 200)):
        runs = [global_steps(str(path), world, workers, format=fmt)[0] for world, workers in [(1, 0), (2, 2), (3, 1)]]
        assert runs[0] == runs[1] == runs[2], fmt
        assert {i for step in runs[0][0] for i in step} == set(range(count)), fmt


def test_remote_files_on_s3(data, s3):
    s3.upload(data, "canonical")
    url = s3.url("canonical")
    reference, _ = global_steps(data, 1, 0)
    before, states = global_steps(url, 2, 2, stop=(0, 2), storage_options=s3.options)
    after, _ = global_steps(url, 3, 1, states=merge_states(states), elastic=True, storage_options=s3.options)
    assert before[0] + after[0] == reference[0]


def test_stateful_dataloader_with_chunks_of_one_batch(data):
    torchdata = pytest.importorskip("torchdata.stateful_dataloader")
    reference, _ = global_steps(data, 1, 0)
    steps = collections.defaultdict(list)
    for rank in range(2):
        dataset = StructuredDataset(data, rank=rank, **_config(2, 2, chunk_rows=GLOBAL // 2))
        loader = torchdata.StatefulDataLoader(dataset, batch_size=None, num_workers=2)
        for step, batch in enumerate(loader):
            steps[step] += batch["id"].tolist()
    assert [tuple(sorted(steps[s])) for s in sorted(steps)] == reference[0]

    def make():  # its workers' states carry canonical_lanes, as a rank state does
        dataset = StructuredDataset(data, rank=1, **_config(2, 2, chunk_rows=GLOBAL // 2))
        return torchdata.StatefulDataLoader(dataset, batch_size=None, num_workers=2), dataset

    assert_resumes_exactly(
        make, epochs=1, batch_key=batch_key, points=[(0, 2)],
        save=lambda loader, dataset: loader.state_dict(), load=lambda loader, dataset, state: loader.load_state_dict(state),
    )  # fmt: skip


def test_real_ddp_processes_with_torchrun(data, tmp_path):
    """Two gloo ranks (torchrun) run an epoch and save a global state after step 2; in this process
    the steps equal a one-process run's, and the state resumes elastically on 3 ranks and on 1."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", JOB, data, str(tmp_path), str(LANES), str(GLOBAL)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"batches-{rank}.json").read_text()) for rank in range(2)]
    steps = [tuple(sorted(ranks[0][s] + ranks[1][s])) for s in range(len(ranks[0]))]
    reference, _ = global_steps(data, 1, 0)
    assert steps == reference[0]
    saved = json.loads((tmp_path / "state.json").read_text())
    for world, workers in [(3, 1), (1, 0)]:
        after, _ = global_steps(data, world, workers, states=saved, elastic=True)
        assert reference[0][:2] + after[0] == reference[0]


@pytest.mark.parametrize("seed", range(4))
def test_global_sequence_is_every_row_once_and_the_tail_is_short(seed):
    """Pure planning, random layouts: the global sequence holds each lane row once, lanes differ
    by at most one row, rows outside the lanes' interleaved body are under G + C, and a rank's
    lanes (with lazily computed task segments, also after pickling) cover its shares of every step."""
    import pickle
    import random

    import numpy as np

    from torch_dataloader_utils.plan.canonical import CanonicalBook, GlobalOrder
    from torch_dataloader_utils.plan.canonical_plan import CanonicalPlan
    from torch_dataloader_utils.plan.epoch import Batching, Topology
    from torch_dataloader_utils.plan.streams import SplitRows

    rng = random.Random(seed)
    units = [[rng.randint(1, 40) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 12))]
    split_rows = [SplitRows(i, 0, sum(u)) for i, u in enumerate(units)]
    offsets = [np.concatenate([[0], np.cumsum(u)]) for u in units]
    lanes, world, workers, batch = 12, rng.choice([1, 2, 3, 4]), rng.choice([0, 1, 3]), 0
    workers = workers if lanes % (world * max(1, workers)) == 0 else 1
    batch = 96 // world
    book = CanonicalBook(split_rows, offsets, seed % 2 == 0, seed, 30, lanes=lanes)
    streams = book.lane_streams(0)
    sizes = [s.num_rows for s in streams]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == sum(map(sum, units))
    order = GlobalOrder(0, tuple(sizes), 96, "none")
    assert order.rows - order.body_steps * 96 < 96 + lanes
    keys = [book.lane_key(0, lane) for lane in range(lanes)]
    seen = collections.Counter((s.key.rank, row) for s in order.segments(keys, 0, order.rows) for row in range(s.start, s.stop))
    assert set(seen.values()) == {1} and len(seen) == order.rows
    for rank in range(world):
        plan = CanonicalPlan(book, 0, Topology(rank, world, workers), Batching(batch, 2 * batch, False, "none"))
        tasks = [pickle.loads(pickle.dumps(t)) for t in plan.tasks(plan.schedule([0] * plan.topology.lanes, 0, 0))]
        got = [(s.key, s.start, s.stop) for t in tasks for s in t.segments]
        want = []
        for step in range(plan.rank_steps):
            start = step * 96 + rank * batch
            want += [(s.key, s.start, s.stop) for s in order.segments(keys, start, min(start + batch, order.rows))]
        merged = lambda segs: [(k, r) for k, a, b in segs for r in range(a, b)]  # noqa: E731
        assert merged(got) == merged(want)

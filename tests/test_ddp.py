"""DDP with real torch.distributed processes (gloo on CPU, one OS process per rank).

Four launches cover 2 and 3 ranks x 0 and 2 workers (and one case with equalize="drop" and
drop_last, one with filters= matching unevenly across ranks): each world size first runs an
uninterrupted epoch and a checkpoint mid-epoch for its two configurations, and exits;
then new processes resume those checkpoints with the same topology and, in the same
launch, resume the other world size's checkpoints elastically (other world size AND
other num_workers).
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time

import pytest
from datagen import write_dataset

# process start-up (importing torch in every rank) dominates; each launch has its own timeout
pytestmark = pytest.mark.timeout(600)

LAYOUT = [[23, 31, 17], [40, 9], [11, 29, 33, 14], [50], [7, 7, 7]]
ROWS = sum(map(sum, LAYOUT))
JOB = os.path.join(os.path.dirname(__file__), "ddp_job.py")
LAUNCH_TIMEOUT = 120

# name -> (world size, num_workers, shuffle, checkpoint after batch, resume from, elastic target (world, workers))
CASES = {
    "w2n0": (2, 0, False, "mid", "global", (3, 2)),
    "w2n2": (2, 2, True, "late", "rank", (3, 0)),
    "w3n0": (3, 0, True, "mid", "rank", (2, 2)),
    "w3n2": (3, 2, False, "late", "global", (2, 0)),
    "w2d2": (2, 2, True, "mid", "global", (3, 1)),  # equalize="drop" and drop_last: rows are left out by design
    "w2f2": (2, 2, True, "mid", "global", (3, 0)),  # a filter matching mostly rank 0's splits
}
DROPPING = {"w2d2": dict(equalize="drop", drop_last=True)}
FILTERED = {"w2f2": dict(filters=[["id", "<", 120]])}


def _expected_ids(name: str) -> list[int]:
    return list(range(120)) if name in FILTERED else list(range(ROWS))


def _config(name: str, world: int | None = None, workers: int | None = None) -> dict:
    _, case_workers, shuffle, *_ = CASES[name]
    return dict(
        batch_size=10,
        split_bytes=2500,
        chunk_rows=20,
        shuffle=shuffle,
        shuffle_seed=3,
        shuffle_buffer_rows=40,
        num_workers=case_workers if workers is None else workers,
        **DROPPING.get(name, {}),
        **FILTERED.get(name, {}),
    )


def launch(tmp, label: str, data: str, world: int, tasks: list[dict]) -> list[dict]:
    """Run ``world`` rank processes of tests/ddp_job.py to completion; every rank's results."""
    out = tmp / label
    out.mkdir()
    spec = dict(data=data, world_size=world, out=str(out), tasks=tasks, timeout=60)
    (out / "spec.json").write_text(json.dumps(spec))
    procs = []
    for rank in range(world):
        log = open(out / f"rank-{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, JOB, str(out / "spec.json"), str(rank)], stdout=log, stderr=subprocess.STDOUT))
        log.close()
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    try:
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = "\n".join(f"--- rank {r}\n" + (out / f"rank-{r}.log").read_text()[-3000:] for r in range(world))
    assert codes is not None, f"launch {label} hung (a rank waits at a collective)\n{logs}"
    assert codes == [0] * world, f"launch {label} exit codes {codes}\n{logs}"
    return [json.loads((out / f"result-{r}.json").read_text()) for r in range(world)]


def _stop(name: str, length: int) -> int:
    return length // 2 if CASES[name][3] == "mid" else length - 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{launch label: [per-rank results]} for the four launches."""
    tmp = tmp_path_factory.mktemp("ddp")
    data = str(tmp / "data")
    write_dataset(data, LAYOUT)
    ckpt = tmp / "ckpt"
    ckpt.mkdir()
    files = {n: dict(global_file=str(ckpt / f"{n}.json"), rank_file=str(ckpt / f"{n}-rank{{rank}}.json")) for n in CASES}
    lengths = _expected_lengths(data)
    extra = str(tmp / "extra")
    write_dataset(extra, [[5]], first_id=ROWS)
    with_extra = sorted(os.path.join(data, f) for f in os.listdir(data)) + [os.path.join(extra, "part-00000.parquet")]
    results = {}
    for world in (2, 3):
        tasks = [
            dict(kind="checkpoint", name=n, config=_config(n), stop=_stop(n, lengths[n]), **files[n])
            for n, case in CASES.items()
            if case[0] == world
        ]
        if world == 2:  # the last rank lists one file more than the others
            tasks.append(dict(kind="check_plan", name="same-files", data=[data] * world, config=_config("w2n0")))
            tasks.append(dict(kind="check_plan", name="extra-file", data=[data] * (world - 1) + [with_extra], config=_config("w2n0")))
        results[f"checkpoint-{world}"] = launch(tmp, f"checkpoint-{world}", data, world, tasks)
    for world in (2, 3):
        tasks = []
        for n, (case_world, _, _, _, source, (target_world, target_workers)) in CASES.items():
            if case_world == world:
                state_file = files[n]["global_file"] if source == "global" else files[n]["rank_file"]
                tasks.append(dict(kind="resume", name=n, config=_config(n), state_file=state_file))
            if target_world == world:
                config = _config(n, workers=target_workers)
                tasks.append(dict(kind="resume", name=f"{n}-elastic", config=config, state_file=files[n]["global_file"], elastic=True))
        results[f"resume-{world}"] = launch(tmp, f"resume-{world}", data, world, tasks)
    return results


def _expected_lengths(data: str) -> dict[str, int]:
    """Batches per rank of each case, computed from metadata in this process (rank 0's view)."""
    from torch_dataloader_utils import StructuredDataset

    lengths = {}
    for n, (world, *_rest) in CASES.items():
        loader, _ = StructuredDataset.create_dataloader(data, rank=0, world_size=world, **_config(n))
        lengths[n] = len(loader)
    return lengths


def _real_ids(batches: list) -> list[int]:
    return [i for ids, padding in batches if not padding for i in ids]


def _ranks(runs, label: str, name: str) -> list[dict]:
    return [rank[name] for rank in runs[label]]


def test_every_rank_delivers_the_same_number_of_batches(runs):
    for label, ranks in runs.items():
        for name in ranks[0]:
            for part in ("full", "before", "after"):
                if part not in ranks[0][name]:
                    continue
                counts = [len(r[name][part]) for r in ranks]
                assert len(set(counts)) == 1, (label, name, part, counts)
                low, high = ranks[0][name][f"{part}_counts"]
                assert low == high == counts[0], (label, name, part)
            if "full" in ranks[0][name] or "after" in ranks[0][name]:
                lengths = [r[name]["len"] for r in ranks]
                assert len(set(lengths)) == 1, (label, name, lengths)


def test_uninterrupted_epoch_is_exactly_once_with_padding_from_own_rows(runs):
    padded = 0
    for n, (world, *_rest) in CASES.items():
        ranks = _ranks(runs, f"checkpoint-{world}", n)
        ids = [i for r in ranks for i in _real_ids(r["full"])]
        if n in DROPPING:  # every rank cut to the shortest one's whole batches: no padding, nothing twice
            assert len(ids) == len(set(ids)) and set(ids) < set(range(ROWS)), n
            assert all(not pad for r in ranks for _, pad in r["full"]) and all(len(b) == 10 for r in ranks for b, _ in r["full"])
            continue
        assert sorted(ids) == _expected_ids(n), n
        for r in ranks:
            assert len(r["full"]) == r["len"]
            own = set(_real_ids(r["full"]))
            padding = [i for ids_, pad in r["full"] if pad for i in ids_]
            assert set(padding) <= own, f"{n}: padding repeats rows of another rank"
            assert all(pad for _, pad in r["full"][len(r["full"]) - sum(p for _, p in r["full"]) :]), "padding is not at the end"
            padded += bool(padding)
    assert padded, "no rank needed padding: the layout does not exercise equalization"


def test_checkpoint_pass_repeats_the_epoch_and_the_gathered_state_holds_each_rank(runs):
    in_padding = 0
    for n, (world, *_rest) in CASES.items():
        for r in _ranks(runs, f"checkpoint-{world}", n):
            assert r["before"] == r["full"][: len(r["before"])]
            assert r["local_part_matches"], n
            in_padding += r["padding_delivered"] > 0
    assert in_padding, "no checkpoint was taken while a rank was padding"


def test_same_topology_resume_is_equivalent_per_rank(runs):
    for n, (world, *_rest) in CASES.items():
        before = _ranks(runs, f"checkpoint-{world}", n)
        after = _ranks(runs, f"resume-{world}", n)
        for rank, (b, a) in enumerate(zip(before, after)):
            assert a["after"] == b["full"][len(b["before"]) :], f"{n} rank {rank}"
            assert a["len"] == b["len"]


def test_elastic_resume_is_exactly_once_across_ranks(runs):
    for n, (world, _workers, _, _, _, (target_world, target_workers)) in CASES.items():
        before = _ranks(runs, f"checkpoint-{world}", n)
        after = _ranks(runs, f"resume-{target_world}", f"{n}-elastic")
        assert len(after) == target_world
        delivered = collections.Counter(i for r in before for i in _real_ids(r["before"]))
        delivered.update(i for r in after for i in _real_ids(r["after"]))
        assert max(delivered.values()) == 1, f"{n}: rows delivered twice"
        if n in DROPPING:  # only rows the old plan owed; the new plan cuts again, at most a unit and a batch per lane
            planned = {i for r in before for i in _real_ids(r["full"])}
            assert set(delivered) <= planned, f"{n}: delivered rows the old plan left out"
            assert len(planned - set(delivered)) <= target_world * (50 + max(1, target_workers) * 10), f"{n}: rows lost"
            assert any(r["after"] for r in after), f"{n}: nothing delivered after the elastic resume"
        else:
            assert sorted(delivered) == _expected_ids(n), f"{n}: rows lost"
        for r in after:
            assert r["len"] == len(r["after"])
            assert r["strict_error"] is not None and "elastic=True" in r["strict_error"], n


def test_check_same_plan_names_a_file_only_some_ranks_see(runs):
    assert [r["same-files"]["error"] for r in runs["checkpoint-2"]] == [None, None]
    errors = [r["extra-file"]["error"] for r in runs["checkpoint-2"]]
    assert errors[0] == errors[1] and errors[0] is not None, "every rank must raise"
    assert re.search(r"only rank 1 has .*extra.part-00000\.parquet", errors[0]), errors[0]


EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "train_ddp.py")
EXAMPLE_ROWS = 1500


def _torchrun(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", EXAMPLE, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _id_log(directory, rank: int) -> list[dict]:
    with open(os.path.join(directory, f"ids-rank{rank}.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_torchrun_example_killed_and_resumed_delivers_every_row_once(tmp_path):
    import torch

    common = ["--data", str(tmp_path / "data"), "--checkpoint", str(tmp_path / "ckpt.pt"), "--epochs", "2"]
    common += ["--batch-size", "32", "--num-workers", "2", "--checkpoint-every", "7"]
    first = _torchrun(common + ["--make-data", str(EXAMPLE_ROWS), "--log-ids", str(tmp_path / "run1"), "--die-after-steps", "31"])
    assert first.returncode != 0, "the first run should have died"
    saved = torch.load(tmp_path / "ckpt.pt")
    second = _torchrun(common + ["--log-ids", str(tmp_path / "run2")])
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"resumed from {tmp_path / 'ckpt.pt'}: epoch {saved['epoch']}, step {saved['step']}" in second.stdout

    killed = [_id_log(tmp_path / "run1", r) for r in range(2)]
    resumed = [_id_log(tmp_path / "run2", r) for r in range(2)]
    for run in (killed, resumed):  # every rank ran the same steps
        assert [(e["epoch"], e["step"]) for e in run[0]] == [(e["epoch"], e["step"]) for e in run[1]]
    assert all(log[0]["step"] == saved["step"] + 1 for log in resumed)
    # the checkpoint is mid-epoch: that epoch has steps on both sides of it
    assert any(e["epoch"] == saved["epoch"] for e in killed[0] if e["step"] <= saved["step"])
    assert resumed[0][0]["epoch"] == saved["epoch"]
    assert killed[0][-1]["step"] > saved["step"], "the killed run should have gone past its checkpoint"
    assert any(e["padding"] for run in (killed, resumed) for log in run for e in log), "no padding: equalization not exercised"

    for epoch in range(2):
        seen = collections.Counter()
        for log in killed:  # only what the checkpoint covers; later batches are trained again
            seen.update(i for e in log if e["epoch"] == epoch and e["step"] <= saved["step"] and not e["padding"] for i in e["ids"])
        for log in resumed:
            seen.update(i for e in log if e["epoch"] == epoch and not e["padding"] for i in e["ids"])
        assert max(seen.values()) == 1, f"epoch {epoch}: rows delivered twice"
        assert sorted(seen) == list(range(EXAMPLE_ROWS)), f"epoch {epoch}: rows lost"

"""Killed processes: a SIGKILLed DataLoader worker and a SIGKILLed training process.

A killed worker must surface as a prompt error (the test's timeout catches a hang), and both
kinds of kill must leave a state from which the resumed run is exact.
"""

from __future__ import annotations

import gc
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
from datagen import write_dataset
from resume_helpers import batch_key, make, resume, run_epoch

LAYOUT = [[60, 45, 50], [70, 30], [55, 65, 25]]  # 400 rows
ROWS = sum(map(sum, LAYOUT))
CONFIG = dict(batch_size=5, num_workers=2, chunk_rows=5, shuffle=True, shuffle_seed=11, split_bytes=3000, shuffle_buffer_rows=40)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("kills")
    write_dataset(root, LAYOUT)
    return str(root)


def _roundtrip(state: dict) -> dict:
    return json.loads(json.dumps(state))


def _new_children(before: set[int]) -> list[psutil.Process]:
    return [c for c in psutil.Process().children() if c.pid not in before]


def _start_and_find_workers(loader, dataset, batches: int):
    """Iterate ``batches`` batches; return (iterator, received keys, (count, state) saved, worker processes)."""
    before = {c.pid for c in psutil.Process().children()}
    it = iter(loader)
    received = [batch_key(next(it)) for _ in range(batches)]
    saved = (len(received), _roundtrip(dataset.state_dict()))
    workers = _new_children(before)
    assert len(workers) == 2, "expected the loader's two worker processes"
    return it, received, saved, workers


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("persistent", [False, True])
def test_worker_killed_during_a_training_step(data, persistent, capsys):
    """The usual case: the worker dies while the loop trains; torch raises in the main thread.

    Exceptions are caught by hand and dropped before anything else runs: a live reference to the
    broken iterator keeps its dead worker in torch's SIGCHLD watch, and any later child exit would
    then raise again anywhere in this process."""
    config = {**CONFIG, "persistent_workers": persistent}
    full = run_epoch(*make(data, **config))
    loader, dataset = make(data, **config)
    it, received, saved, workers = _start_and_find_workers(loader, dataset, 6)
    started, error = time.monotonic(), None
    try:  # SIGCHLD makes torch raise in the main thread wherever it is
        os.kill(workers[0].pid, signal.SIGKILL)
        time.sleep(0.3)  # the training step during which the worker dies
        for batch in it:
            received.append(batch_key(batch))
            saved = (len(received), _roundtrip(dataset.state_dict()))
    except Exception as caught:  # noqa: BLE001 - checked below
        error = _error_text(caught)
    elapsed = time.monotonic() - started
    again = None
    if persistent:
        try:  # the dead persistent worker: a new pass fails at once (no hang) or runs on new workers
            next(iter(loader))
        except Exception as caught:  # noqa: BLE001 - checked below
            again = _error_text(caught)
        del it, loader
        gc.collect()  # shut the broken iterator down, leaving torch's SIGCHLD watch
    assert error is not None, "the epoch ended although a worker was killed"
    # torch's SIGCHLD handler raises its own RuntimeError during the training step; a death seen
    # while the loader waits for a chunk comes as the loader's RuntimeError naming the worker
    assert re.search(r"RuntimeError: .*DataLoader worker \(pid.*(killed by signal|exited unexpectedly)", error), error
    count, state = saved
    assert received[:count] + resume(data, state, **config) == full, "resume from the last state is not exact"
    if persistent:
        assert again is None or "a DataLoader worker process died" in again, again
    else:
        # a new pass of the same loader starts new workers and continues from the progress
        assert received[:count] + run_epoch(loader, dataset) == full
    with capsys.disabled():
        print(f"\n[kills] worker killed (persistent={persistent}): {error.splitlines()[0]} after {elapsed:.2f}s")


@pytest.mark.timeout(90)
def test_worker_killed_while_the_loop_waits_for_it(data, capsys):
    """The race: the loop fetches the dead worker's chunk right after the kill. torch raises either
    its RuntimeError or, when the worker is not yet reaped, a ConnectionResetError of its fd sharing,
    which the loader turns into one clear error; either way promptly, and the last saved state
    resumes exactly."""
    full = run_epoch(*make(data, **CONFIG))
    loader, dataset = make(data, **CONFIG)
    it, received, saved, workers = _start_and_find_workers(loader, dataset, 6)
    time.sleep(0.3)  # both workers fill their prefetch slots
    error = None
    try:
        os.kill(workers[0].pid, signal.SIGKILL)
        for batch in it:
            received.append(batch_key(batch))
            saved = (len(received), _roundtrip(dataset.state_dict()))
    except Exception as caught:  # noqa: BLE001 - checked below
        error = _error_text(caught)
    del it, loader
    gc.collect()
    assert error is not None, "the epoch ended although a worker was killed"
    assert error.startswith(("RuntimeError: a DataLoader worker process died", "RuntimeError: DataLoader worker")), error
    count, state = saved
    assert received[:count] + resume(data, state, **CONFIG) == full
    with capsys.disabled():
        print(f"\n[kills] worker killed while the loop waits: {error.splitlines()[0]}")


_TRAIN = r"""
import json, os, sys, time
from torch_dataloader_utils import StructuredDataset

path, workdir, run, epochs, every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
config, stall_at = json.loads(sys.argv[6]), int(sys.argv[7])
loader, dataset = StructuredDataset.create_dataloader(path, **config)
checkpoint = os.path.join(workdir, "checkpoint.json")
count = 0
if os.path.exists(checkpoint):
    with open(checkpoint) as f:
        saved = json.load(f)
    dataset.load_state_dict(saved["state"])
    count = saved["count"]
log = open(os.path.join(workdir, f"run-{run}.jsonl"), "w")
log.write(json.dumps({"start": count}) + "\n")
log.flush()
for epoch in range(dataset.epoch, epochs):
    dataset.set_epoch(epoch)
    for batch in loader:
        log.write(json.dumps([count, epoch, batch["id"].tolist()]) + "\n")
        log.flush()
        count += 1
        time.sleep(3600 if count == stall_at else 0.002)  # the training step; a long one where the kill lands
        if count % every == 0:
            with open(checkpoint + ".tmp", "w") as f:
                json.dump({"state": dataset.state_dict(), "count": count}, f)
            os.replace(checkpoint + ".tmp", checkpoint)
log.write(json.dumps({"done": count}) + "\n")
log.flush()
"""


def _read_log(path: str) -> tuple[int, list[list], bool]:
    """(first global batch index, [index, epoch, ids] lines, whether the run finished)."""
    start, lines, done = None, [], False
    with open(path) as f:
        for text in f:
            try:
                entry = json.loads(text)
            except json.JSONDecodeError:  # a line cut by the kill
                break
            if isinstance(entry, dict):
                start = entry.get("start", start)
                done = done or "done" in entry
            else:
                lines.append(entry)
    return start, lines, done


def _start(script: str, data: str, workdir: str, run: int, epochs: int, every: int, config: dict, stall_at: int) -> subprocess.Popen:
    args = [sys.executable, script, data, workdir, str(run), str(epochs), str(every), json.dumps(config), str(stall_at)]
    return subprocess.Popen(args, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _kill_at(proc: subprocess.Popen, log: str, target: int, limit: float = 120) -> None:
    """SIGKILL the process group once the job has delivered ``target`` batches in all (global count);
    the run stalls in that batch's training step, so the kill lands there whatever the machine's load."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if os.path.exists(log):
            start, lines, _ = _read_log(log)
            if start is not None and start + len(lines) >= target:
                break
        assert proc.poll() is None, f"the training run exited early: {proc.stdout.read().decode()[-2000:]}"
        time.sleep(0.003)
    assert proc.poll() is None, "the training run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL


@pytest.mark.timeout(180)
def test_killed_training_process_resumes_exactly(data, tmp_path):
    """Two SIGKILLs between checkpoints (one in each epoch), then a run to the end: exact."""
    epochs, every = 2, 7
    config = CONFIG
    loader, dataset = make(data, **config)
    reference = []
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        reference += [(epoch, list(batch_key(b))) for b in loader]
    per_epoch = len(reference) // epochs
    script = str(tmp_path / "train.py")
    with open(script, "w") as f:
        f.write(_TRAIN)
    rng = random.Random(3)
    # between checkpoints: in epoch 0, then in epoch 1 (a kill right after a checkpoint is the easy case)
    kill_points = [every * rng.randint(2, per_epoch // every - 2) + 3, every * rng.randint(per_epoch // every + 2, 2 * per_epoch // every - 2) + 5]
    runs = []
    for run, point in enumerate(kill_points + [None]):
        log = str(tmp_path / f"run-{run}.jsonl")
        proc = _start(script, data, str(tmp_path), run, epochs, every, config, -1 if point is None else point)
        if point is None:
            output = proc.communicate(timeout=120)[0].decode()
            assert proc.returncode == 0, output[-3000:]
        else:
            _kill_at(proc, log, point)
        runs.append(_read_log(log))
    assert runs[-1][2], "the last run did not finish"
    delivered = []
    for (start, lines, _), following in zip(runs, [r[0] for r in runs[1:]] + [None]):
        assert start == len(delivered), "a run resumed from a checkpoint that does not follow the previous ones"
        kept = lines if following is None else lines[: following - start]
        assert following is None or len(lines) >= following - start, "a checkpoint counts batches never logged"
        delivered += [(epoch, ids) for _, epoch, ids in kept]
    assert [r[0] for r in runs[1:]] != [0, 0], "no checkpoint was saved before the kills"
    assert delivered == reference
    for epoch in range(epochs):
        ids = sorted(i for e, batch in delivered if e == epoch for i in batch)
        assert ids == list(range(ROWS)), f"epoch {epoch}: not exactly once across the killed and resumed runs"
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if script in (p.info["cmdline"] or [])]
    assert not leftovers, "processes of a killed run are still alive"

"""The demo (``tdu demo``): train, checkpoint, crash, resume, and check every row was seen once.

The driver writes a small dataset to a temporary directory, then runs two
training processes one after the other:

1. ``train`` trains a tiny model with ``create_dataloader(num_workers=2)``, saves a
   checkpoint part-way (the dataset state as JSON, the model and optimizer with
   ``torch.save``), trains a few more steps and then kills itself with SIGKILL in
   the middle of the epoch (its DataLoader workers die with it).
2. ``resume`` starts from nothing but those two files, calls ``load_state_dict``
   and finishes the epoch.

The driver then checks the rows the model was trained on (up to the checkpoint,
then after the resume) against the dataset and against an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, TextIO

from .state.schema import COMPLETED_SHARDS, EPOCH, IN_PROGRESS

NUM_FEATURES = 8
# rows per file; row groups (Parquet) of 1,000 rows
FILE_ROWS = (6000, 4000, 7000, 3000, 5000, 8000, 4500, 2500)


def loader_config(fmt: str) -> dict[str, Any]:
    """The configuration both training runs use (it must match for an exact resume)."""
    return {
        "format": fmt,
        "batch_size": 250,
        "num_workers": 2,
        "shuffle": True,
        "shuffle_seed": 7,
        "split_bytes": 96 * 1024,
        "shuffle_buffer_rows": 5000,
        "chunk_rows": 2500,
    }


# ---------------------------------------------------------------- data
def write_sample_data(root: str, fmt: str = "parquet", file_rows: tuple[int, ...] = FILE_ROWS) -> int:
    """Write files with unique int64 ``id``, ``features`` (8 floats) and ``target``; return the row count."""
    import numpy as np
    import pyarrow as pa

    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    weights = rng.normal(size=NUM_FEATURES).astype(np.float32)
    first = 0
    for index, rows in enumerate(file_rows):
        features = rng.normal(size=(rows, NUM_FEATURES)).astype(np.float32)
        target = features @ weights + 0.1 * rng.normal(size=rows).astype(np.float32)
        flat = pa.array(features.reshape(-1))
        if fmt == "parquet":
            column = pa.FixedSizeListArray.from_arrays(flat, NUM_FEATURES)
        else:  # ORC has no fixed-size lists; equal-length lists come back as a 2-D tensor
            column = pa.ListArray.from_arrays(pa.array(np.arange(0, rows * NUM_FEATURES + 1, NUM_FEATURES, dtype=np.int32)), flat)
        table = pa.table({"id": np.arange(first, first + rows, dtype=np.int64), "features": column, "target": target})
        path = os.path.join(root, f"part-{index:05d}.{fmt}")
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, path, row_group_size=1000)
        else:
            import pyarrow.orc as orc

            orc.write_table(table, path, stripe_size=64 * 1024)
        first += rows
    return first


# ------------------------------------------------------- training runs
def _model_and_optimizer():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(NUM_FEATURES, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def _step(model, optimizer, batch) -> float:
    import torch

    prediction = model(batch["features"]).squeeze(1)
    loss = torch.nn.functional.mse_loss(prediction, batch["target"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _save_atomic(path: str, write) -> None:
    temporary = path + ".tmp"
    write(temporary)
    os.replace(temporary, path)


def _save_torch(value: Any, path: str) -> None:
    import torch

    torch.save(value, path)


def _write_json(path: str, value: Any) -> None:
    with open(path, "w") as f:
        json.dump(value, f)


def _say(text: str) -> None:
    print(text, flush=True)


def run_train(workdir: str, fmt: str, checkpoint_at: float) -> None:
    """Run 1: train, checkpoint at ``checkpoint_at`` of the epoch, a few more steps, then SIGKILL itself."""
    import torch

    from torch_dataloader_utils import StructuredDataset

    model, optimizer = _model_and_optimizer()
    started = time.perf_counter()
    loader, dataset = StructuredDataset.create_dataloader(os.path.join(workdir, "data"), **loader_config(fmt))
    steps = len(loader)
    checkpoint_step = max(1, int(steps * checkpoint_at))
    crash_step = min(steps - 1, checkpoint_step + 5)
    fresh_s, seen, loss = None, [], float("nan")
    _say(f"run 1 (pid {os.getpid()}): training, {steps} steps in the epoch")
    dataset.set_epoch(0)
    for step, batch in enumerate(loader, start=1):
        if fresh_s is None:
            fresh_s = time.perf_counter() - started
        loss = _step(model, optimizer, batch)
        seen.append(batch["id"].clone())
        if step == 1:
            _say(f"  step {step:4d}  loss {loss:.4f}")
        if step == checkpoint_step:
            state = dataset.state_dict()
            _save_atomic(os.path.join(workdir, "dataset_state.json"), partial(_write_json, value=state))
            payload = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                       "seen_ids": torch.cat(seen), "fresh_start_s": fresh_s}
            _save_atomic(os.path.join(workdir, "model.pt"), partial(_save_torch, payload))
            _say(f"  step {step:4d}  loss {loss:.4f}  checkpoint saved: dataset_state.json + model.pt")
        if step == crash_step:
            _say(f"  step {step:4d}  killing this process with SIGKILL (the {step - checkpoint_step} steps "
                 "since the checkpoint die with it)")
            _die()


def _die() -> None:
    sys.stdout.flush()
    if hasattr(signal, "SIGKILL"):
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)


def run_resume(workdir: str, fmt: str) -> None:
    """Run 2: a new process that resumes from the checkpoint files and finishes the epoch."""
    import torch

    from torch_dataloader_utils import StructuredDataset

    model, optimizer = _model_and_optimizer()
    started = time.perf_counter()
    loader, dataset = StructuredDataset.create_dataloader(os.path.join(workdir, "data"), **loader_config(fmt))
    constructed = time.perf_counter()
    checkpoint = torch.load(os.path.join(workdir, "model.pt"), weights_only=True)
    with open(os.path.join(workdir, "dataset_state.json")) as file:
        state = json.load(file)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    saved_step = checkpoint["step"]
    _say(f"run 2 (pid {os.getpid()}): resuming after step {saved_step}")
    loading = time.perf_counter()
    dataset.load_state_dict(state)
    dataset.set_epoch(state[EPOCH])  # safe: the restored epoch keeps its progress
    resume_s, seen, loss, step = None, [], float("nan"), saved_step
    for batch in loader:
        step += 1
        if resume_s is None:
            resume_s = time.perf_counter() - loading
            _say(f"  first batch {resume_s:.3f} s after load_state_dict")
        loss = _step(model, optimizer, batch)
        seen.append(batch["id"].clone())
    _say(f"  step {step:4d}  loss {loss:.4f}  epoch finished")
    ids = torch.cat(seen) if seen else torch.zeros(0, dtype=torch.int64)
    result = {"seen_ids": ids, "resume_s": resume_s, "construct_s": constructed - started, "final_loss": loss}
    torch.save(result, os.path.join(workdir, "resume_result.pt"))


# ------------------------------------------------------------- driver
@dataclass
class DemoReport:
    """What the demo found."""

    expected: int
    seen: int
    duplicated: int
    lost: int
    unexpected: int
    same_order: bool
    fresh_start_s: float
    resume_s: float

    @property
    def exactly_once(self) -> bool:
        return self.seen == self.expected and self.duplicated == 0 and self.lost == 0 and self.unexpected == 0

    @property
    def ok(self) -> bool:
        return self.exactly_once and self.same_order


def _phase(phase: str, workdir: str, fmt: str, *extra: str) -> int:
    """Run one training process in its own session; afterwards kill whatever it left behind."""
    command = [sys.executable, "-m", "torch_dataloader_utils.demo", phase, workdir, fmt, *extra]
    posix = os.name == "posix"
    child = subprocess.Popen(command, start_new_session=posix)
    try:
        return child.wait()
    finally:
        if posix:  # a killed trainer's DataLoader workers would linger for a few seconds
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _uninterrupted_order(workdir: str, fmt: str):
    from torch_dataloader_utils import StructuredDataset

    loader, dataset = StructuredDataset.create_dataloader(os.path.join(workdir, "data"), columns=["id"], **loader_config(fmt))
    import torch

    return torch.cat([batch["id"] for batch in loader])


def _describe_state(workdir: str, out: TextIO) -> None:
    with open(os.path.join(workdir, "dataset_state.json")) as file:
        state = json.load(file)
    completed = sum(len(entry["splits"]) for entry in state[COMPLETED_SHARDS])
    partial = [split for entry in state[IN_PROGRESS] for split in entry["splits"]]
    out.write(f"checkpoint: epoch {state['epoch']}, rows delivered per worker {state['rows_delivered']}, "
              f"{completed} splits completed (skipped on resume, no I/O)\n")
    for split in partial[:3]:
        name = os.path.basename(split["path"])
        where = "full file" if split["row_offset"] is None else f"rows [{split['row_offset']:,}, {split['row_offset'] + split['row_length']:,})"
        out.write(f"  in progress: {name} {where}, {split['rows_done']:,} rows done -> resumes at that row\n")
    if len(partial) > 3:
        out.write(f"  ... and {len(partial) - 3} more splits in progress (with shuffle, rows are mixed across splits)\n")


def check(workdir: str, fmt: str, expected: int) -> DemoReport:
    """Compare the rows both runs trained on with the dataset and the uninterrupted order."""
    import torch

    before = torch.load(os.path.join(workdir, "model.pt"), weights_only=True)
    after = torch.load(os.path.join(workdir, "resume_result.pt"), weights_only=True)
    seen = torch.cat([before["seen_ids"], after["seen_ids"]])
    unique = torch.unique(seen)
    valid = unique[(unique >= 0) & (unique < expected)]
    reference = _uninterrupted_order(workdir, fmt)
    return DemoReport(
        expected=expected,
        seen=len(seen),
        duplicated=len(seen) - len(unique),
        lost=expected - len(valid),
        unexpected=len(unique) - len(valid),
        same_order=bool(torch.equal(seen, reference)),
        fresh_start_s=float(before["fresh_start_s"]),
        resume_s=float(after["resume_s"]),
    )


def _print_report(report: DemoReport, construct_s: float, out: TextIO) -> None:
    yes = lambda flag: "YES" if flag else "NO"  # noqa: E731
    out.write("\nresult\n")
    out.write(f"  every row seen exactly once: {yes(report.exactly_once)}  (rows expected {report.expected:,}, "
              f"seen {report.seen:,}, duplicated {report.duplicated:,}, lost {report.lost:,}"
              + (f", not in the data {report.unexpected:,}" if report.unexpected else "") + ")\n")
    out.write(f"  same order as an uninterrupted run: {yes(report.same_order)}\n")
    out.write(f"  fresh start  (construction -> first batch):     {report.fresh_start_s:6.3f} s\n")
    out.write(f"  resume       (load_state_dict -> first batch):  {report.resume_s:6.3f} s"
              f"   (construction before it: {construct_s:.3f} s)\n")


def run_demo(workdir: str | None = None, fmt: str = "parquet", checkpoint_at: float = 0.45, out: TextIO | None = None) -> DemoReport:
    """Run the whole demo; ``workdir`` (default: a temporary directory, removed afterwards) holds its files."""
    out = out or sys.stdout
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="tdu-demo-") as temporary:
            return run_demo(temporary, fmt, checkpoint_at, out)
    started = time.perf_counter()
    rows = write_sample_data(os.path.join(workdir, "data"), fmt)
    config = loader_config(fmt)
    out.write("torch_dataloader_utils demo: train, checkpoint, crash, resume, check\n")
    out.write(f"data: {len(FILE_ROWS)} {fmt} files, {rows:,} rows in {workdir}\n")
    out.write("loader: " + ", ".join(f"{k}={v}" for k, v in config.items() if k != "format") + "\n\n")
    out.flush()
    code = _phase("train", workdir, fmt, str(checkpoint_at))
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    out.write(f"run 1 ended abruptly ({how})\n")
    if not os.path.exists(os.path.join(workdir, "model.pt")):
        raise RuntimeError("run 1 did not save a checkpoint; see its output above")
    _describe_state(workdir, out)
    out.write("\n")
    out.flush()
    code = _phase("resume", workdir, fmt)
    if code != 0:
        raise RuntimeError(f"run 2 (resume) failed with exit code {code}; see its output above")
    report = check(workdir, fmt, rows)
    import torch

    after = torch.load(os.path.join(workdir, "resume_result.pt"), weights_only=True)
    _print_report(report, float(after["construct_s"]), out)
    out.write(f"\ndemo took {time.perf_counter() - started:.1f} s\n")
    out.flush()
    return report


def _phase_main(argv: list[str]) -> None:
    phase, workdir, fmt, *rest = argv
    if phase == "train":
        run_train(workdir, fmt, float(rest[0]))
    elif phase == "resume":
        run_resume(workdir, fmt)
    else:
        raise SystemExit(f"unknown demo phase {phase!r}")


if __name__ == "__main__":
    _phase_main(sys.argv[1:])

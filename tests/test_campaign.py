"""Randomized crash/resume campaign: random datasets, configurations and interruption points.

Every case runs E epochs uninterrupted (the reference), then the same E epochs stopped at
several random points; each stop saves the state, and the run continues in a FRESH dataset and
loader from the JSON round-tripped state. Asserted per case: every epoch of the reference delivers
each row exactly once (or, with drop_last, only whole batches of distinct rows; with a damaged
file and on_error="skip", each row pyarrow can still read), and the interrupted run delivers
exactly the reference's batches.

The campaign runs for TDU_CAMPAIGN_SECONDS (default 100) and prints how many cases ran.
Seeds run in order from TDU_CAMPAIGN_SEED (default 0); a failure names its seed, and
TDU_CAMPAIGN_SEED=<seed> runs that case first.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest
from datagen import make_table, write_dataset
from resume_helpers import batch_key, make

BUDGET = float(os.environ.get("TDU_CAMPAIGN_SECONDS", "100"))
FIRST_SEED = int(os.environ.get("TDU_CAMPAIGN_SEED", "0"))
WORKER_WEIGHTS = {0: 60, 1: 14, 2: 16, 3: 10}


@dataclass
class Case:
    seed: int
    fmt: str
    layout: list[list[int]]
    config: dict[str, Any]
    epochs: int
    points: list[int] = field(default_factory=list)  # global batch counts at which the job stops
    boundary_late: bool = False  # a stop at an epoch's end happens after set_epoch(next)
    damaged: int | None = None  # a file whose data pages are overwritten (with on_error="skip")
    readable: list[int] | None = None  # then: the ids pyarrow itself can still read

    @property
    def rows(self) -> int:
        return sum(map(sum, self.layout))

    @property
    def expected(self) -> list[int]:
        return self.readable if self.readable is not None else list(range(self.rows))


def _layout(rng: random.Random) -> list[list[int]]:
    files = []
    for _ in range(rng.randint(1, 5)):
        if rng.random() < 0.15:
            files.append([])  # a file without rows
        else:
            files.append([0 if rng.random() < 0.1 else rng.randint(1, 45) for _ in range(rng.randint(1, 4))])
    return files


def _config(rng: random.Random) -> dict[str, Any]:
    workers = rng.choices(list(WORKER_WEIGHTS), weights=list(WORKER_WEIGHTS.values()))[0]
    config: dict[str, Any] = dict(
        batch_size=rng.choice([1, 2, 3, 4, 5, 7, 8, 10, 13, 16, 32]),
        num_workers=workers,
        drop_last=rng.random() < 0.25,
        shuffle=rng.random() < 0.5,
        shuffle_seed=rng.randint(0, 1000),
        split_bytes=rng.choice([rng.randint(400, 8000), 1 << 27]),
        shuffle_buffer_rows=rng.choice([1, rng.randint(2, 60), rng.randint(60, 400), 1 << 18]),
        chunk_rows=rng.choice([1, rng.randint(2, 40), rng.randint(40, 200), 1 << 16]),
    )
    if workers:
        config["persistent_workers"] = rng.random() < 0.3
        config["prefetch_factor"] = rng.randint(1, 4)
    return config


def draw_case(seed: int) -> Case:
    rng = random.Random(seed)
    fmt = "orc" if rng.random() < 0.3 else "parquet"
    case = Case(seed, fmt, _layout(rng), _config(rng), rng.choices([1, 2, 3], weights=[5, 3, 2])[0])
    with_rows = [i for i, groups in enumerate(case.layout) if sum(groups)]
    if fmt == "parquet" and with_rows and rng.random() < 0.15:
        case.damaged = rng.choice(with_rows)
        case.config.update(on_error="skip", drop_last=False)
    return case


def write_case(root: str, case: Case) -> str:
    """Write the case's files. ORC cannot hold empty stripes, so those are left out of ORC files."""
    layout = case.layout if case.fmt == "parquet" else [[g for g in groups if g] for groups in case.layout]
    write_dataset(root, layout, case.fmt)
    if case.fmt == "orc":
        for index, groups in enumerate(layout):
            if not groups:  # the ORC writer leaves a 0-byte file when nothing is written
                orc.write_table(make_table(0, 1, fixed_list=False).slice(0, 0), os.path.join(root, f"part-{index:05d}.orc"))
    if case.damaged is not None:
        case.readable = _damage(os.path.join(root, f"part-{case.damaged:05d}.parquet"), case)
    return root


def _damage(path: str, case: Case) -> list[int]:
    """Overwrite a random stretch of the file's data pages (the footer stays); the ids still readable.

    Only damage that pyarrow either rejects or reads back intact is used: a row group that decodes
    to other values would be silent corruption, which Parquet without page checksums cannot detect."""
    rng = random.Random(case.seed * 31 + 7)
    data = open(path, "rb").read()
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    first = sum(map(sum, case.layout[: case.damaged]))
    for attempt in range(20):
        start = rng.randrange(4, footer_start - 1) if attempt < 19 else 4
        stop = min(footer_start, start + rng.randint(16, footer_start // 2)) if attempt < 19 else footer_start
        with open(path, "wb") as f:
            f.write(data[:start] + b"\xff" * (stop - start) + data[stop:])
        readable, clean = _readable_ids(path, first)
        if clean:
            return sorted(set(range(case.rows)) - set(range(first, first + sum(case.layout[case.damaged]))) | set(readable))
    raise AssertionError("could not damage the file detectably")


def _readable_ids(path: str, first: int) -> tuple[list[int], bool]:
    """(ids of the row groups pyarrow reads, whether every row group read is intact)."""
    file = pq.ParquetFile(path)
    ids, offset = [], first
    for group in range(file.metadata.num_row_groups):
        rows = file.metadata.row_group(group).num_rows
        try:
            table = file.read_row_group(group)
        except Exception:  # noqa: BLE001 - an unreadable row group is what the damage is for
            offset += rows
            continue
        if table.column("id").to_pylist() != list(range(offset, offset + rows)) or table.column("text").to_pylist() != [
            f"row-{i}" for i in range(offset, offset + rows)
        ]:
            return [], False
        ids += list(range(offset, offset + rows))
        offset += rows
    return ids, True


def _roundtrip(state: dict) -> dict:
    return json.loads(json.dumps(state, allow_nan=False))


def reference_run(path: str, case: Case) -> list[list[tuple]]:
    """All batches of every epoch, uninterrupted, with the per-epoch invariants checked."""
    loader, dataset = make(path, format=case.fmt, **case.config)
    epochs = []
    for epoch in range(case.epochs):
        dataset.set_epoch(epoch)
        batches = [batch_key(b) for b in loader]
        check_epoch(case, batches, len(loader), len(dataset), dataset.logical_workers)
        epochs.append(batches)
    return epochs


def check_epoch(case: Case, batches: list[tuple], batches_expected: int, rows_expected: int, workers: int) -> None:
    ids = [i for b in batches for i in b]
    size = case.config["batch_size"]
    assert len(ids) == len(set(ids)), "a row was delivered twice in one epoch"
    assert all(len(b) > 0 for b in batches), "an empty batch"
    if case.damaged is not None:  # skipped row groups leave gaps in chunks and counts
        assert sorted(ids) == case.expected, "not every readable row was delivered exactly once"
        return
    assert len(batches) == batches_expected, "len(loader) differs from the batches delivered"
    assert len(ids) == rows_expected, "len(dataset) differs from the rows delivered"
    short = [b for b in batches if len(b) != size]
    if case.config["drop_last"]:
        assert not short, "drop_last delivered a partial batch"
        assert set(ids) <= set(range(case.rows))
    else:
        assert sorted(ids) == list(range(case.rows)), "rows were lost"
        assert len(short) <= workers, "more partial batches than streams"


def interrupted_run(path: str, case: Case, reference: list[list[tuple]]) -> tuple[list[list[tuple]], int]:
    """Run the epochs, stopping at each point and resuming in a fresh loader; returns (batches, resumes)."""
    delivered: list[list[tuple]] = [[] for _ in range(case.epochs)]
    count, state, resumes = 0, None, 0
    for point in case.points + [None]:
        loader, dataset = make(path, format=case.fmt, **case.config)
        if state is not None:
            dataset.load_state_dict(_roundtrip(state))
            resumes += 1
            assert _roundtrip(dataset.state_dict()) == state, "state_dict() right after load_state_dict() differs"
        state = _run_until(loader, dataset, case, reference, delivered, count, point)
        count = sum(map(len, delivered))
    return delivered, resumes


def _run_until(loader, dataset, case, reference, delivered, count, point) -> dict:
    """Continue the reference's loop from the loaded state until ``point`` batches; the state then."""
    if point is not None and count == point:
        return _roundtrip(dataset.state_dict())
    for epoch in range(dataset.epoch, case.epochs):
        dataset.set_epoch(epoch)
        for batch in loader:
            delivered[epoch].append(batch_key(batch))
            count += 1
            last = len(delivered[epoch]) == len(reference[epoch])
            if count == point and not (last and case.boundary_late and epoch + 1 < case.epochs):
                return _roundtrip(dataset.state_dict())
        if point is not None and count == point and epoch + 1 < case.epochs:
            dataset.set_epoch(epoch + 1)  # the job stops after moving on to the next epoch
            return _roundtrip(dataset.state_dict())
    return _roundtrip(dataset.state_dict())


def _draw_points(seed: int, case: Case, total: int) -> None:
    rng = random.Random(seed * 7919 + 1)
    stops = rng.randint(1, 3 if case.config["num_workers"] else 6)
    case.points = sorted(rng.randint(0, total) for _ in range(stops))
    case.boundary_late = rng.random() < 0.5


def run_case(seed: int, root: str) -> tuple[Case, int, int]:
    case = draw_case(seed)
    path = write_case(root, case)
    reference = reference_run(path, case)
    _draw_points(seed, case, sum(map(len, reference)))
    try:
        delivered, resumes = interrupted_run(path, case, reference)
        for epoch, (got, want) in enumerate(zip(delivered, reference)):
            assert got == want, f"epoch {epoch}: the interrupted run's batches differ from the reference"
    except Exception as error:
        raise AssertionError(f"campaign case failed, reproduce with TDU_CAMPAIGN_SEED={seed}: {case}") from error
    return case, resumes, sum(map(len, reference))


@pytest.mark.timeout(BUDGET + 240)
def test_campaign(tmp_path, capsys):
    """Random cases until the time budget is spent; at least a few of each kind."""
    deadline = time.monotonic() + BUDGET
    seeds = range(FIRST_SEED, FIRST_SEED + 10**7)
    kinds = ["with_workers", "orc", "shuffle", "drop_last", "skip_damaged"]
    counts = dict.fromkeys(["cases", *kinds, "resumes", "epochs", "batches"], 0)
    for seed in seeds:
        if time.monotonic() > deadline and counts["cases"] >= 10 and all(counts[kind] for kind in kinds):
            break
        case, resumes, batches = run_case(seed, str(tmp_path / f"case{seed}"))
        counts["batches"] += batches
        counts["cases"] += 1
        counts["with_workers"] += case.config["num_workers"] > 0
        counts["orc"] += case.fmt == "orc"
        counts["shuffle"] += case.config["shuffle"]
        counts["drop_last"] += case.config["drop_last"]
        counts["skip_damaged"] += case.damaged is not None
        counts["resumes"] += resumes
        counts["epochs"] += case.epochs
    with capsys.disabled():
        print(f"\n[campaign] {counts} in {BUDGET:.0f}s budget")
    assert all(counts[kind] > 0 for kind in kinds), counts

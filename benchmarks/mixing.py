"""What mixing costs: three sources mixed vs one source of the same total size, rows/s.

    python benchmarks/mixing.py [--rows 2000000] [--num-workers 2] [--batch-size 1024] \
        [--repeats 3] [--workdir DIR] [--name mixing] [--persistent-workers] [--canonical-lanes C]

Writes (once, into ``--workdir``) one source of ``--rows`` rows and three sources of 50%, 30% and
20% of them (same columns, row groups of 131,072 rows), then reads, interleaved over ``--repeats``
rounds after a warm-up epoch, one epoch of:

- the single source (create_dataloader(path)): one file, one split, so only one worker reads;
- the three sources unmixed (create_dataloader([path, path, path])): the same files and rows as
  the mixture reads, three splits, every worker reading;
- the mixture, ``--rows`` rows per epoch: the first source downsampled to 40% of the total, the
  second at 1x (30%), the third upsampled 1.5x (30%);

each with shuffle off and on, and touching every value of every batch. The cost of mixing is the
mixture's median rows/s over the unmixed sources' (the issue's target: at most 5%): the same
files and workers, read with and without mixing. The ratio to the single file is printed too; it
also holds the difference between one worker reading and every worker reading.
Also the workers' CPU seconds and minor page faults per epoch (less moved by a shared
machine's load than rows/s). Without ``--persistent-workers`` every epoch starts fresh worker
processes, which pay for the first touch of their memory (page faults, kernel time) in the
epoch; with it each contender keeps one loader whose workers live on, and each epoch is measured
from its first batch, so the figures are the steady state of a long job.

The figures of docs/mixing.md: ``python benchmarks/mixing.py --repeats 5`` and
``python benchmarks/mixing.py --repeats 5 --persistent-workers``.
Prints a markdown table; writes JSON to benchmarks/results/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  imported before workers fork (first use otherwise imports pandas per worker)
import pyarrow.parquet as pq
import torch

from torch_dataloader_utils import Source, StructuredDataset

HERE = os.path.dirname(os.path.abspath(__file__))
GROUP_ROWS = 1 << 17
SHARES = (0.5, 0.3, 0.2)


def _write(path: str, first: int, rows: int) -> None:
    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, "part-00000.parquet")
    if os.path.exists(target) and pq.ParquetFile(target).metadata.num_rows == rows:
        return
    ids = np.arange(first, first + rows, dtype=np.int64)
    columns = {"id": ids, "label": (ids % 7).astype(np.int32)}
    rng = np.random.default_rng(first)
    for i in range(8):
        columns[f"f{i}"] = rng.random(rows, dtype=np.float32)
    pq.write_table(pa.table(columns), target, row_group_size=GROUP_ROWS)


def _data(workdir: str, rows: int) -> tuple[str, list[str]]:
    single = os.path.join(workdir, f"single-{rows}")
    _write(single, 0, rows)
    parts, first = [], 0
    for index, share in enumerate(SHARES):
        path = os.path.join(workdir, f"source{index}-{rows}")
        size = int(rows * share)
        _write(path, first, size)
        parts.append(path)
        first += size
    return single, parts


def _workers() -> tuple[float, int]:
    """CPU seconds and minor page faults of the finished worker processes so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime, used.ru_minflt


def _live_workers() -> tuple[float, int]:
    """CPU seconds and minor page faults of this process's live children (persistent workers),
    from /proc (Linux)."""
    cpu, faults, me = 0.0, 0, os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:  # fields[0] is the state: ppid, ..., minflt (7), utime (11), stime (12)
            faults += int(fields[7])
            cpu += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return cpu, faults


def _consume(batches) -> int:
    rows = 0
    for batch in batches:
        for value in batch.values():
            if isinstance(value, torch.Tensor):
                value.sum()  # touch every value
        rows += len(batch["id"])
    return rows


def _epoch(make) -> tuple[float, int, float, int]:
    """(seconds, rows, workers' CPU seconds, workers' page faults) of one epoch; the workers are
    not persistent, so they have finished (and are counted) when the epoch ends."""
    loader, _ = make()
    cpu, faults = _workers()
    start = time.perf_counter()
    rows = _consume(loader)
    took = time.perf_counter() - start
    del loader
    cpu_after, faults_after = _workers()
    return took, rows, cpu_after - cpu, faults_after - faults


class _Persistent:
    """Epochs of one loader with persistent workers, measured from its first batch on: the
    workers' start and first touch of their memory are left out (paid once per job)."""

    def __init__(self, make):
        self.loader, self.dataset = make()
        self.epoch = 0

    def __call__(self) -> tuple[float, int, float, int]:
        self.dataset.set_epoch(self.epoch)
        self.epoch += 1
        batches = iter(self.loader)
        first = next(batches)
        cpu, faults = _live_workers()
        start = time.perf_counter()
        rows = len(first["id"]) + _consume(batches)
        took = time.perf_counter() - start
        cpu_after, faults_after = _live_workers()
        return took, rows, cpu_after - cpu, faults_after - faults


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "tdu-mixing-bench"))
    parser.add_argument("--name", default="mixing")
    parser.add_argument(
        "--persistent-workers", action="store_true",
        help="one loader per contender with persistent_workers=True, each epoch measured from its first batch (the CPU "
        "and page faults of the live workers, from /proc); rows/s then leaves out the first batch",
    )  # fmt: skip
    parser.add_argument("--canonical-lanes", type=int, default=None, help="canonical_lanes= for every contender (docs/reproducible-order.md)")
    args = parser.parse_args()
    single, parts = _data(args.workdir, args.rows)
    sizes = [int(args.rows * share) for share in SHARES]
    per_epoch = [int(args.rows * 0.4), sizes[1], args.rows - int(args.rows * 0.4) - sizes[1]]
    common = dict(batch_size=args.batch_size, num_workers=args.num_workers)
    if args.canonical_lanes:
        common.update(canonical_lanes=args.canonical_lanes, equalize="none")  # no rows repeated to fill the last step
    runs = {}
    for shuffle in (False, True):
        runs[("single", shuffle)] = lambda shuffle=shuffle: StructuredDataset.create_dataloader(single, shuffle=shuffle, **common)
        runs[("unmixed", shuffle)] = lambda shuffle=shuffle: StructuredDataset.create_dataloader(parts, shuffle=shuffle, **common)
        runs[("mixture", shuffle)] = lambda shuffle=shuffle: StructuredDataset.create_dataloader(
            [Source(p, rows_per_epoch=n) for p, n in zip(parts, per_epoch)], shuffle=shuffle, **common
        )
    if args.persistent_workers:
        common["persistent_workers"] = True
        runs = {key: _Persistent(make) for key, make in runs.items()}
    measure = (lambda run: run()) if args.persistent_workers else _epoch
    for make in runs.values():
        measure(make)  # warm-up: page cache, imports
    seconds: dict = {key: [] for key in runs}
    cpu: dict = {key: [] for key in runs}
    faults: dict = {key: [] for key in runs}
    for _ in range(args.repeats):
        for key, make in runs.items():
            took, rows, used, faulted = measure(make)
            assert rows == args.rows, (key, rows)
            seconds[key].append(took)
            cpu[key].append(used)
            faults[key].append(faulted)
    results = []
    workers = f"{args.num_workers} persistent workers" if args.persistent_workers else f"{args.num_workers} workers"
    print(f"({args.rows:,} rows, {workers}, median of {args.repeats}, load average {os.getloadavg()[0]:.1f})")
    kinds = ("single", "unmixed", "mixture")
    print("| shuffle | single file rows/s | unmixed rows/s | mixture rows/s | mixture / unmixed | mixture / single file "
          "| workers' CPU s, single / unmixed / mixture | page faults, single / unmixed / mixture |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for shuffle in (False, True):
        rate = {kind: args.rows / statistics.median(seconds[(kind, shuffle)]) for kind in kinds}
        used = [statistics.median(cpu[(kind, shuffle)]) for kind in kinds]
        faulted = [statistics.median(faults[(kind, shuffle)]) for kind in kinds]
        results.append(
            {"shuffle": shuffle, **{f"{kind}_rows_per_s": rate[kind] for kind in kinds},
             "ratio": rate["mixture"] / rate["unmixed"], "ratio_to_single_file": rate["mixture"] / rate["single"],
             "worker_cpu_s": used, "worker_page_faults": faulted}
        )  # fmt: skip
        print(
            f"| {'on' if shuffle else 'off'} | {rate['single']:,.0f} | {rate['unmixed']:,.0f} | {rate['mixture']:,.0f} "
            f"| {rate['mixture'] / rate['unmixed']:.3f} | {rate['mixture'] / rate['single']:.3f} "
            f"| {' / '.join(f'{u:.2f}' for u in used)} | {' / '.join(f'{f:,.0f}' for f in faulted)} |"
        )
    out = os.path.join(HERE, "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{args.name}.json"), "w") as f:
        json.dump({"args": vars(args), "seconds": {f"{k[0]}-{'shuffle' if k[1] else 'plain'}": v for k, v in seconds.items()}, "results": results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())

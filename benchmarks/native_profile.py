"""Where one epoch's CPU time goes, by process and native library: the ceiling and this library.

    python benchmarks/native_profile.py [--size-gb 0.5] [--columns numeric] [--repeat 3]

Runs each contender's epoch (``run.py --child``, a new process each time) under
``perf record -e cpu-clock`` (a software clock, so it works in VMs without hardware counters)
and counts the samples of the worker processes, and of the main process while the workers run,
by the library the CPU was in. Decoding happens in Arrow's and Parquet's libraries, so that row
should match between the two contenders; the other rows are what delivering the data costs.
Needs ``perf`` (Debian: ``apt-get install linux-perf``). Prints a markdown table of CPU
milliseconds, medians over ``--repeat`` interleaved rounds.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from generate import ensure_dataset, rows_for  # noqa: E402
from run import COLUMN_SETS, FILES, child_command  # noqa: E402

FREQUENCY = 2000  # samples per second of CPU time
CONTENDERS = ("a_ceiling", "d_this_library")
LIBRARIES = (  # (label, pattern of the shared object's file name), first match wins
    ("Arrow and Parquet (decode)", r"^(libparquet|libarrow|libzstd)"),
    ("libc (memcpy, malloc)", r"^libc\.so"),
    ("torch (copy kernels, dispatch)", r"^(libtorch|libc10)"),
    ("Python and extension glue", r"^libpython|\.cpython-.*\.so$"),
    ("kernel (page faults, pipes, scheduling)", r"kernel"),
)
SAMPLE = re.compile(r"\s*\S.*?\s+(\d+)\s+([\d.]+):\s+\S+\s+\((.*)\)\s*$")


def library(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return next((label for label, pattern in LIBRARIES if re.search(pattern, name)), "other")


def profile_epoch(contender: str, cfg: dict, work: str) -> dict[str, float]:
    """CPU ms of one epoch by "role: library"; the main process counts only while workers run."""
    command, env, spec_file = child_command({"contender": contender, "config": cfg, "total_rows": 0, "work": work, "collect_ids": False})
    data = work + ".perf.data"
    try:
        perf = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(FREQUENCY), "-o", data, "--"]
        subprocess.run(perf + command, check=True, stdout=subprocess.DEVNULL, env=env)
        script = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,time,ip,dso"], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(spec_file)
    samples = [(int(m[1]), float(m[2]), m[3]) for m in map(SAMPLE.match, script.splitlines()) if m]
    main = samples[0][0]
    worker_times = [t for pid, t, _ in samples if pid != main]
    start, end = min(worker_times), max(worker_times)
    counts: collections.Counter[str] = collections.Counter()
    for pid, t, path in samples:
        if pid != main:
            counts[f"workers: {library(path)}"] += 1
        elif start <= t <= end:
            counts[f"main: {library(path)}"] += 1
    return {key: n * 1000 / FREQUENCY for key, n in counts.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=0.5)
    parser.add_argument("--columns", choices=list(COLUMN_SETS), default="numeric")
    parser.add_argument("--num-workers", type=int, default=2, help="worker processes, 1 or more (default 2)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data-dir", default=os.path.join(HERE, "results", "data"))
    args = parser.parse_args(argv)
    if args.num_workers < 1:
        parser.error("--num-workers must be 1 or more: the profile splits the time between workers and the main process")

    rows = rows_for(args.size_gb, FILES)
    files = ensure_dataset(os.path.join(args.data_dir, f"rows{rows}-rg65536"), FILES, rows, 65536)
    cfg = {"files": files, "columns": COLUMN_SETS[args.columns], "batch_size": args.batch_size, "num_workers": args.num_workers}
    work = os.path.join(HERE, "results", "work", "native_profile")
    os.makedirs(os.path.dirname(work), exist_ok=True)
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in CONTENDERS}
    for _ in range(args.repeat):
        for contender in CONTENDERS:
            runs[contender].append(profile_epoch(contender, cfg, work))
    keys = sorted({k for rs in runs.values() for r in rs for k in r}, key=lambda k: (not k.startswith("workers"), k))
    median = {c: {k: float(np.median([r.get(k, 0.0) for r in rs])) for k in keys} for c, rs in runs.items()}
    print(f"CPU ms of one epoch ({args.columns} columns, {args.size_gb} GiB, median of {args.repeat})\n")
    print("| process: library | (a) ceiling | (d) this library | (d) - (a) |\n|---|---|---|---|")
    for key in keys + ["total"]:
        a, d = (sum(m.values()) if key == "total" else m[key] for m in (median["a_ceiling"], median["d_this_library"]))
        print(f"| {key} | {a:,.0f} | {d:,.0f} | {d - a:+,.0f} |")


if __name__ == "__main__":
    main()

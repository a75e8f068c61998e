"""Page faults of row-group decodes in a fresh process, as a new DataLoader worker makes them.

    python benchmarks/worker_faults.py [--rows 2000000] [--workdir DIR] [--keep 0 3 6]

Uses the three sources of ``benchmarks/mixing.py`` (written there if missing). For each setting a
forked child decodes 12 row groups, the sources in turn as a mixture's worker reads them
(``ParquetFile.read_row_group``, opened as the library opens local files), keeping the last
``--keep`` decoded row groups alive as a worker's unit cache and windows do, and prints the minor
page faults of each decode. Settings: transparent huge pages on or off (the library's workers
turn them off, ``runtime/loader._WorkerStart``), and Arrow's mimalloc, jemalloc and system pools.
A new worker's decodes fault until the allocator's footprint has grown to the worker's peak;
with huge pages off every 4 KiB page is its own fault. ``benchmarks/NOTES.md`` (mixing, new
workers) has the figures.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import resource
import sys
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mixing import _data  # noqa: E402  the benchmark's sources

PR_SET_THP_DISABLE = 41


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _child(paths: list[str], keep: int, huge_pages: bool, pool: str) -> None:
    if not huge_pages:
        ctypes.CDLL(None).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)
    pa.set_memory_pool(getattr(pa, f"{pool}_memory_pool")())
    files = [pq.ParquetFile(p, pre_buffer=False, buffer_size=64 * 1024) for p in paths]
    held: collections.deque = collections.deque()
    faults = []
    for i in range(12):
        before = _faults()
        held.append(files[i % len(files)].read_row_group(i // len(files), use_threads=False))
        faults.append(_faults() - before)
        while len(held) > keep:
            held.popleft()
    peak = pa.default_memory_pool().max_memory() / 1e6
    print(f"| {'on' if huge_pages else 'off'} | {pool} | {keep} | {sum(faults):,} | {' '.join(map(str, faults))} | {peak:.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "tdu-mixing-bench"))
    parser.add_argument("--keep", type=int, nargs="+", default=[0, 3, 6])
    args = parser.parse_args()
    _, sources = _data(args.workdir, args.rows)
    paths = [os.path.join(s, "part-00000.parquet") for s in sources]
    print(f"(load average {os.getloadavg()[0]:.1f})")
    print("| huge pages | pool | decoded row groups kept | faults, 12 decodes | each decode | pool peak MB |")
    print("|---|---|---:|---:|---|---:|")
    for huge_pages in (True, False):
        for pool in ("mimalloc", "jemalloc", "system"):
            for keep in args.keep:
                pid = os.fork()
                if pid == 0:
                    try:
                        _child(paths, keep, huge_pages, pool)
                    finally:
                        os._exit(0)
                os.waitpid(pid, 0)


if __name__ == "__main__":
    sys.exit(main())

"""Worker processes against reader threads (``worker_mode``), with a consumer that reads every
byte of every batch and one that does not (and, reading, with the loop's own thread taking chunks
in and cutting them: "no feed", ``runtime/host_feed.py`` off), against a ceiling of raw pyarrow
decoding in as many processes that each read what they decode. Interleaved rounds; medians.

    python benchmarks/worker_modes.py DATA_DIR [--workers 2] [--columns numeric|text] \
        [--batch-size 1024] [--rounds 3] [--torch-threads 1]

Run it under ``taskset -c 0,1`` to see a 2-core machine on a larger one. DATA_DIR is made by
benchmarks/generate.py (``--size-gb 1`` for the issue's set).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import pyarrow.parquet as pq
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from consume import read_batch  # noqa: E402
from contenders import to_torch  # noqa: E402

from torch_dataloader_utils import StructuredDataset  # noqa: E402

COLUMNS = {"numeric": ["id", "label", "feat"], "text": ["id", "label", "feat", "text"]}


def ours(paths: list[str], columns: list[str], batch_size: int, workers: int, mode: str, touch: bool, feed: bool = True) -> dict[str, float]:
    loader, _ = StructuredDataset.create_dataloader(paths, batch_size=batch_size, num_workers=workers, columns=columns, worker_mode=mode)
    if not feed:
        loader._ahead = None  # the loop's thread takes chunks in and cuts them (runtime/host_feed.py off)
    rows = batches = 0
    start, cpu = time.perf_counter(), time.thread_time()
    for batch in loader:
        if touch:
            read_batch(batch)
        rows += len(batch["id"])
        batches += 1
    elapsed = time.perf_counter() - start
    return {"rows_per_s": rows / elapsed, "cpu_us_per_batch": (time.thread_time() - cpu) / batches * 1e6}


def _ceiling_part(args: tuple[list[str], list[str], int, bool, int]) -> int:
    paths, columns, batch_size, touch, threads = args
    torch.set_num_threads(threads)
    rows = 0
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=columns):
            tensors = to_torch(batch)
            if touch:
                read_batch(tensors)
            rows += len(batch)
    return rows


def ceiling(paths: list[str], columns: list[str], batch_size: int, workers: int, touch: bool, threads: int) -> dict[str, float]:
    start = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        rows = sum(pool.map(_ceiling_part, [(paths[w::workers], columns, batch_size, touch, threads) for w in range(workers)]))
    return {"rows_per_s": rows / (time.perf_counter() - start)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--columns", choices=sorted(COLUMNS), default="numeric")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=1, help="torch threads of the consuming process (0: torch's default)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    threads = torch.get_num_threads()
    paths = sorted(str(p) for p in __import__("pathlib").Path(args.data).glob("*.parquet"))
    columns = COLUMNS[args.columns]
    runs: dict[str, list[dict[str, float]]] = {}
    contenders = {
        "ceiling, read": lambda: ceiling(paths, columns, args.batch_size, args.workers, True, threads),
        "ceiling, not read": lambda: ceiling(paths, columns, args.batch_size, args.workers, False, threads),
        "processes, read": lambda: ours(paths, columns, args.batch_size, args.workers, "process", True),
        "processes, not read": lambda: ours(paths, columns, args.batch_size, args.workers, "process", False),
        "processes, read, no feed": lambda: ours(paths, columns, args.batch_size, args.workers, "process", True, feed=False),
        "threads, read": lambda: ours(paths, columns, args.batch_size, args.workers, "thread", True),
        "threads, not read": lambda: ours(paths, columns, args.batch_size, args.workers, "thread", False),
    }
    for _ in range(args.rounds):
        for name, run in contenders.items():
            runs.setdefault(name, []).append(run())
    medians = {name: statistics.median(r["rows_per_s"] for r in results) for name, results in runs.items()}
    print(f"{args.columns}, {args.workers} workers, batch {args.batch_size}, torch threads {threads}, {len(paths)} files, {args.rounds} rounds")
    for name, results in runs.items():
        ceiling_name = "ceiling, read" if "read" in name and "not read" not in name else "ceiling, not read"
        cpu = [r["cpu_us_per_batch"] for r in results if "cpu_us_per_batch" in r]
        shown = f"{medians[name] / 1e6:6.2f}M rows/s  {medians[name] / medians[ceiling_name]:.2f}x of the {ceiling_name}"
        if cpu:
            shown += f"  {statistics.median(cpu):.0f} us CPU/batch"
        print(f"  {name:<22} {shown}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "medians": medians}, f, indent=1)


if __name__ == "__main__":
    main()

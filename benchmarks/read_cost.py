"""Where the training loop's thread spends its time per batch when every batch is read.

    python benchmarks/read_cost.py [--size-gb 0.25] [--columns numeric|text] [--batch-size 1024] \
        [--num-workers 2] [--rounds 2]

For (d), for (d) with its chunks taken in and cut by the loop's own thread (no host feed,
``runtime/host_feed.py``) and for the ideal feeder (batches decoded beforehand, in ordinary
memory), on run.py's files, each batch's main-thread CPU (``time.thread_time``) and page faults
are split into the delivery (the loader's ``next()``), the first read of the batch
(``consume.read_batch``) and a second read of it (the same bytes, now in cache). The first batch
(worker start-up: forking the workers and their first chunk) is left out; "first batch ms" gives
it. Interleaved rounds; the last lines give each one's delivery + first read over the ideal
feeder's of the same round (medians), with the load average. run.py's "main-thread CPU µs/batch"
is delivery + first read over the whole loop, the first batch included. Then, for one loader
read for 3 passes with and without ``persistent_workers``, the main-thread CPU each later pass
spends before its first batch (``iter()``: unmapping the last pass's buffers; the first ``next()``:
starting workers, the first chunk).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from typing import Any, Iterable

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from consume import read_batch  # noqa: E402
from contenders import Config, prepare_ideal, start_ideal, start_ours  # noqa: E402
from generate import ensure_dataset, rows_for  # noqa: E402
from run import COLUMN_SETS, FILES, _read_once  # noqa: E402


def _faults() -> int:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_minflt + usage.ru_majflt


def split(batches: Iterable[Any]) -> dict[str, np.ndarray]:
    """Per batch: delivery, first read, second read (seconds of this thread's CPU), and the page
    faults of the delivery and of the first read."""
    out: dict[str, list[float]] = {"delivery": [], "read": [], "second_read": [], "delivery_faults": [], "read_faults": []}
    it = iter(batches)
    while True:
        t0, f0 = time.thread_time(), _faults()
        try:
            batch = next(it)
        except StopIteration:
            break
        t1, f1 = time.thread_time(), _faults()
        read_batch(batch)
        t2, f2 = time.thread_time(), _faults()
        read_batch(batch)
        t3 = time.thread_time()
        for key, value in (("delivery", t1 - t0), ("read", t2 - t1), ("second_read", t3 - t2), ("delivery_faults", f1 - f0), ("read_faults", f2 - f1)):
            out[key].append(value)
    parts = {key: np.array(values[1:]) for key, values in out.items()}  # without the first batch (start-up)
    parts["first"] = np.array(out["delivery"][:1] + out["read"][:1])
    return parts


def row(name: str, parts: dict[str, np.ndarray]) -> str:
    us = {key: 1e6 * parts[key] for key in ("delivery", "read", "second_read")}
    return (
        f"| {name} | {len(parts['read'])} | {np.median(us['delivery']):,.0f} / {us['delivery'].mean():,.0f} | "
        f"{parts['delivery_faults'].mean():.1f} | {np.median(us['read']):,.0f} / {us['read'].mean():,.0f} | {parts['read_faults'].mean():.1f} | "
        f"{np.median(us['second_read']):,.0f} | {(us['delivery'] + us['read']).mean():,.0f} | {1e3 * parts['first'].sum():.1f} |"
    )


def both(parts: dict[str, np.ndarray]) -> float:
    """Delivery + first read, µs per batch (mean over the batches after the first)."""
    return float(1e6 * (parts["delivery"] + parts["read"]).mean())


def without_host_feed(cfg: Config) -> Any:
    loader, _state = start_ours(cfg)
    loader._ahead = None  # the loop's thread takes chunks in and cuts them, as before the host feed
    return loader


def pass_costs(cfg: Config, persistent: bool, passes: int = 3) -> list[tuple[float, float]]:
    """(iter() ms, first next() ms) of the main thread's CPU, for passes after the first."""
    loader, _state = start_ours(cfg, persistent_workers=persistent)
    out = []
    for epoch in range(passes):
        loader.dataset.set_epoch(epoch)
        t0 = time.thread_time()
        it = iter(loader)
        t1 = time.thread_time()
        next(it)
        t2 = time.thread_time()
        for _batch in it:
            pass
        out.append((1e3 * (t1 - t0), 1e3 * (t2 - t1)))
    return out[1:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=0.25)
    parser.add_argument("--row-group-rows", type=int, default=65536)
    parser.add_argument("--columns", choices=sorted(COLUMN_SETS), default="numeric")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="epochs of each (interleaved)")
    parser.add_argument("--data-dir", default=os.path.join(HERE, "results", "data"))
    args = parser.parse_args(argv)

    torch.set_num_threads(1)  # as run.py's child: every read on the thread measured
    rows = rows_for(args.size_gb, FILES)
    files = ensure_dataset(os.path.join(args.data_dir, f"rows{rows}-rg{args.row_group_rows}"), FILES, rows, args.row_group_rows)
    cfg = Config(files, COLUMN_SETS[args.columns], args.batch_size, args.num_workers)
    print(f"{args.columns}, {FILES} files x {rows} rows, batch {args.batch_size}, {args.num_workers} workers; µs of the main thread's CPU per batch")
    print("| contender | batches | delivery µs median / mean | delivery faults | first read µs median / mean | read faults | second read µs | both µs | first batch ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {"(d) torch_dataloader_utils": [], "(d) without the host feed": []}
    for _ in range(args.rounds):
        _read_once(files)
        loader, _state = start_ours(cfg)
        ours = split(loader)
        del loader
        print(row("(d) torch_dataloader_utils", ours), flush=True)
        plain = split(without_host_feed(cfg))
        print(row("(d) without the host feed", plain), flush=True)
        ideal = split(start_ideal(cfg, prepared=prepare_ideal(cfg))[0])
        print(row("ideal feeder", ideal), flush=True)
        ratios["(d) torch_dataloader_utils"].append(both(ours) / both(ideal))
        ratios["(d) without the host feed"].append(both(plain) / both(ideal))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    for name, values in ratios.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name}: delivery + first read {np.median(values):.2f}x the ideal feeder's (rounds: {shown}); load average {load}")
    for persistent in (False, True):
        costs = pass_costs(cfg, persistent)
        shown = ", ".join(f"{a:.1f} + {b:.1f}" for a, b in costs)
        print(f"persistent_workers={persistent}: main-thread CPU before a later pass's first batch, iter() + first next(): {shown} ms")


if __name__ == "__main__":
    main()

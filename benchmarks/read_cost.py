"""Where the training loop's thread spends its time per batch when every batch is read.

    python benchmarks/read_cost.py [--size-gb 0.25] [--columns numeric|text] [--batch-size 1024] \
        [--num-workers 2] [--worker-mode process|thread] [--work-us 0] [--rounds 2]

For (d), for (d) with its chunks taken in and cut by the loop's own thread (no host feed,
``runtime/host_feed.py``) and for the ideal feeder (batches decoded beforehand, in ordinary
memory), on run.py's files, each batch's main-thread CPU (``time.thread_time``) and page faults
are split into the delivery (the loader's ``next()``) and the first read of the batch
(``consume.read_batch``); delivery + first read per batch is given as median / p90 / p99 / mean.
The first batch (worker start-up: forking the workers and their first chunk) is left out; "first
batch ms" gives it.

A loop that only reads outruns 2 workers: it waits for the next chunk (here a wait is a delivery
of over 1 ms of wall time), and the batch after a wait costs the loop's thread a wake-up and
caches that the other processes refilled meanwhile. The "after a wait" columns give how many
batches waited and their mean cost. The ideal feeder never waits, so a fourth contender is the
ideal feeder made to wait as (d) waited in the same round (it sleeps, in its ``next()``, before
each batch at which (d)'s loop waited, as long as (d)'s loop waited there): (d) over it is what
taking memory from the loader costs beyond waiting for it. A fifth is the ideal feeder while as
many processes as the loader has workers decode the same files beside it, a chunk at a time and at
most as fast as (d) delivered in the same round: what sharing the cores with decoders costs the
loop's reads. ``--work-us`` gives the loop work of its
own after each read (Python, not counted), so that it waits less for the loader.

Interleaved rounds; the last lines give each round's ratios of the mean delivery + first read,
with the load average. run.py's "main-thread CPU µs/batch" is delivery + first read over the
whole loop, the first batch included. Then, for one loader read for 3 passes with and without
``persistent_workers``, the main-thread CPU each later pass spends before its first batch
(``iter()``: unmapping the last pass's buffers; the first ``next()``: starting workers, the first
chunk).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import sys
import time
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow.parquet as pq
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from consume import read_batch  # noqa: E402
from contenders import Config, prepare_ideal, start_ideal, start_ours, to_torch  # noqa: E402
from generate import ensure_dataset, rows_for  # noqa: E402
from run import COLUMN_SETS, FILES, _read_once  # noqa: E402

WAITED_S = 1e-3  # a delivery of more wall time than this waited for the loader


def _faults_and_switches() -> tuple[int, int]:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_minflt + usage.ru_majflt, usage.ru_nvcsw + usage.ru_nivcsw


def _work(seconds: float) -> None:
    """The loop's own work on a batch: this thread's CPU, in Python, touching no memory of note."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def split(batches: Iterable[Any], work_s: float = 0.0) -> dict[str, np.ndarray]:
    """Per batch: delivery and first read (seconds of this thread's CPU), their page faults and
    context switches, and the delivery's wall time (the first batch left out; "first" holds it);
    ``work_s`` of the loop's own work after each read, not counted."""
    keys = ("delivery", "read", "faults", "switches", "wall")
    out: dict[str, list[float]] = {key: [] for key in keys}
    it = iter(batches)
    begin = time.perf_counter()
    while True:
        w0, t0, (f0, s0) = time.perf_counter(), time.thread_time(), _faults_and_switches()
        try:
            batch = next(it)
        except StopIteration:
            break
        t1, w1 = time.thread_time(), time.perf_counter()
        read_batch(batch)
        t2, (f2, s2) = time.thread_time(), _faults_and_switches()
        for key, value in zip(keys, (t1 - t0, t2 - t1, f2 - f0, s2 - s0, w1 - w0)):
            out[key].append(value)
        if work_s:
            _work(work_s)
    parts = {key: np.array(values[1:]) for key, values in out.items()}  # without the first batch (start-up)
    parts["first"] = np.array(out["delivery"][:1] + out["read"][:1])
    parts["batch_wall"] = np.array([(time.perf_counter() - begin) / max(1, len(out["wall"]))])
    parts["waits"] = np.array([0.0] + [w if w > WAITED_S else 0.0 for w in out["wall"][1:]])
    return parts


def row(name: str, parts: dict[str, np.ndarray]) -> str:
    delivery, read = 1e6 * parts["delivery"], 1e6 * parts["read"]
    both = delivery + read
    waited = parts["wall"] > WAITED_S
    after = f"{waited.sum()} / {both[waited].mean():,.0f}" if waited.any() else "0 / -"
    return (
        f"| {name} | {len(both)} | {np.median(delivery):,.0f} / {delivery.mean():,.0f} | {np.median(read):,.0f} / {read.mean():,.0f} | "
        f"{np.median(both):,.0f} / {np.percentile(both, 90):,.0f} / {np.percentile(both, 99):,.0f} / {both.mean():,.1f} | "
        f"{parts['faults'].mean():.2f} | {parts['switches'].mean():.2f} | {after} | {both[~waited].mean():,.1f} | {1e3 * parts['first'].sum():.1f} |"
    )


def both(parts: dict[str, np.ndarray]) -> float:
    """Delivery + first read, µs per batch (mean over the batches after the first)."""
    return float(1e6 * (parts["delivery"] + parts["read"]).mean())


def waiting_as(prepared: list[dict[str, Any]], waits: np.ndarray) -> Iterator[dict[str, Any]]:
    """The ideal feeder's batches, each after sleeping as long as the measured loop waited for it."""
    for batch, wait in zip(prepared, np.resize(waits, len(prepared))):
        if wait:
            time.sleep(wait)
        yield batch


CHUNK_BATCHES = 32  # the loader's chunks: 32,768 rows at batch 1,024


def _decode_until(files: list[str], columns: list[str], batch_size: int, pace_s: float, stop: Any, started: Any) -> None:
    """Decode ``files`` a chunk at a time and read what was decoded, one chunk every ``pace_s`` at
    most, over and over, until ``stop`` is set."""
    begin, chunks = time.perf_counter(), 0
    while not stop.is_set():
        for path in files:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=CHUNK_BATCHES * batch_size, columns=columns, use_threads=False):
                read_batch(to_torch(batch))
                if not chunks:
                    started.put(0)
                chunks += 1
                if stop.is_set():
                    return
                time.sleep(max(0.0, begin + chunks * pace_s - time.perf_counter()))


def beside_decoders(cfg: Config, prepared: list[dict[str, Any]], work_s: float, batch_wall_s: float) -> dict[str, np.ndarray]:
    """The ideal feeder while ``cfg.num_workers`` processes decode the same files beside it, at
    most as fast as the measured loader delivered (``batch_wall_s`` a batch), as a loader's workers
    share the cores. They are spawned: forking this process would make its batches' pages
    copy-on-write, which its reads would pay for."""
    context = multiprocessing.get_context("spawn")
    stop, started = context.Event(), context.Queue()
    workers = max(1, cfg.num_workers)
    pace = CHUNK_BATCHES * workers * batch_wall_s
    decoders = [
        context.Process(target=_decode_until, args=(cfg.files[w::workers], cfg.columns, cfg.batch_size, pace, stop, started)) for w in range(workers)
    ]
    for process in decoders:
        process.start()
    try:
        for _ in decoders:
            started.get(timeout=120)
        return split(start_ideal(cfg, prepared=prepared)[0], work_s)
    finally:
        stop.set()
        for process in decoders:
            process.join()


def without_host_feed(cfg: Config, worker_mode: str) -> Any:
    loader, _state = start_ours(cfg, worker_mode=worker_mode)
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
    parser.add_argument("--worker-mode", choices=("process", "thread"), default="process", help="(d)'s worker_mode")
    parser.add_argument("--work-us", type=float, default=0.0, help="the loop's own work per batch (Python, not counted), µs")
    parser.add_argument("--rounds", type=int, default=2, help="epochs of each (interleaved)")
    parser.add_argument("--data-dir", default=os.path.join(HERE, "results", "data"))
    args = parser.parse_args(argv)

    torch.set_num_threads(1)  # as run.py's child: every read on the thread measured
    rows = rows_for(args.size_gb, FILES)
    files = ensure_dataset(os.path.join(args.data_dir, f"rows{rows}-rg{args.row_group_rows}"), FILES, rows, args.row_group_rows)
    cfg = Config(files, COLUMN_SETS[args.columns], args.batch_size, args.num_workers)
    print(f"{args.columns}, {FILES} files x {rows} rows, batch {args.batch_size}, {args.num_workers} workers ({args.worker_mode}); µs of the main thread's CPU per batch")
    print(
        "| contender | batches | delivery µs median / mean | first read µs median / mean | both µs median / p90 / p99 / mean "
        "| faults | context switches | after a wait: batches / both µs mean | both µs mean, the others | first batch ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {"(d) torch_dataloader_utils": [], "(d) without the host feed": [], "(d) vs the ideal feeder waiting as (d) waited": [], "(d) vs the ideal feeder beside decoding processes": []}
    work = 1e-6 * args.work_us
    for _ in range(args.rounds):
        _read_once(files)
        loader, _state = start_ours(cfg, worker_mode=args.worker_mode)
        ours = split(loader, work)
        del loader
        print(row("(d) torch_dataloader_utils", ours), flush=True)
        plain = split(without_host_feed(cfg, args.worker_mode), work)
        print(row("(d) without the host feed", plain), flush=True)
        prepared = prepare_ideal(cfg)
        ideal = split(start_ideal(cfg, prepared=prepared)[0], work)
        print(row("ideal feeder", ideal), flush=True)
        waiting = split(waiting_as(prepared, ours["waits"]), work)
        print(row("ideal feeder waiting as (d) waited", waiting), flush=True)
        beside = beside_decoders(cfg, prepared, work, float(ours["batch_wall"][0]))
        print(row(f"ideal feeder beside {max(1, cfg.num_workers)} decoding processes", beside), flush=True)
        del prepared
        ratios["(d) torch_dataloader_utils"].append(both(ours) / both(ideal))
        ratios["(d) without the host feed"].append(both(plain) / both(ideal))
        ratios["(d) vs the ideal feeder waiting as (d) waited"].append(both(ours) / both(waiting))
        ratios["(d) vs the ideal feeder beside decoding processes"].append(both(ours) / both(beside))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    for name, values in ratios.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name}: delivery + first read {np.median(values):.2f}x (rounds: {shown}); load average {load}")
    for persistent in (False, True):
        costs = pass_costs(cfg, persistent)
        shown = ", ".join(f"{a:.1f} + {b:.1f}" for a, b in costs)
        print(f"persistent_workers={persistent}: main-thread CPU before a later pass's first batch, iter() + first next(): {shown} ms")


if __name__ == "__main__":
    main()

"""What torchdata's StatefulDataLoader costs over a StructuredDataset.

    python benchmarks/stateful_overhead.py [--size-gb 0.25] [--num-workers 2] [--batch-size 1024] \
        [--repeats 5] [--many-files 2000] [--name stateful_overhead]

Measures, on the benchmark data of generate.py:

1. one ``dataset.state_dict()`` call inside a real DataLoader worker (what StatefulDataLoader
   does after every batch with ``snapshot_every_n_steps=1``), its JSON size, and the same on a
   dataset of ``--many-files`` tiny files (the file-list digest is computed once, not per call);
   also one main-process (rank) ``state_dict()``, which ``num_workers=0`` saves per checkpoint;
2. one epoch, interleaved over ``--repeats`` rounds after a warm-up epoch, of
   StatefulDataLoader with ``snapshot_every_n_steps=1`` / a very large interval,
   a plain torch DataLoader over the same dataset, and our ``create_dataloader`` loader.

Prints a markdown table; writes JSON to benchmarks/results/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.compute  # noqa: F401  imported before workers fork (first use otherwise imports pandas per worker)
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from generate import ensure_dataset, rows_for  # noqa: E402

from torch_dataloader_utils import StructuredDataset  # noqa: E402

COLUMNS = ["id", "label", "feat"]
FILES = 8
NEVER = 10**12  # snapshot interval that is never reached in an epoch


class _StateDictTimer(IterableDataset):
    """Inside a worker: start a pass of the dataset, then time ``calls`` state_dict() calls."""

    def __init__(self, dataset: StructuredDataset, calls: int):
        self.dataset, self.calls = dataset, calls

    def __iter__(self) -> Iterator[dict]:
        batches = iter(self.dataset)
        next(batches)  # a pass is under way, as when StatefulDataLoader asks
        state = self.dataset.state_dict()
        start = time.perf_counter()
        for _ in range(self.calls):
            self.dataset.state_dict()
        seconds = time.perf_counter() - start
        yield {"us_per_call": 1e6 * seconds / self.calls, "json_bytes": len(json.dumps(state)), "scope": state["scope"]}


class _SnapshotTimer(IterableDataset):
    """Inside a worker: torchdata's per-batch work, timed on the worker process's CPU clock.

    After a warm-up pass, for every batch of a second pass: the fetch (chunk reads amortized
    over their batches, convert, default_convert) and, separately, what
    ``snapshot_every_n_steps=1`` adds after it (``_make_state_dict``, which calls
    ``dataset.state_dict()``, and the incremental delta). Uses torchdata internals.
    """

    def __init__(self, dataset: StructuredDataset):
        self.dataset = dataset

    def __iter__(self) -> Iterator[dict]:
        from torch.utils.data import _DatasetKind, get_worker_info
        from torch.utils.data._utils.collate import default_convert
        from torchdata.stateful_dataloader.incremental_state import _IncrementalWorkerState
        from torchdata.stateful_dataloader.worker import _make_state_dict

        worker, kind = get_worker_info().id, _DatasetKind.Iterable
        for _ in self.dataset:  # warm-up pass: imports, file handles, page cache
            pass
        fetcher = _DatasetKind.create_fetcher(kind, self.dataset, False, default_convert, False)  # a new pass
        incremental = _IncrementalWorkerState(_make_state_dict(worker, kind, fetcher, self.dataset))
        fetch = snapshot = 0.0
        batches, delta = 0, None
        while True:
            start = time.process_time()
            try:
                fetcher.fetch(None)
            except StopIteration:
                break
            middle = time.process_time()
            delta = incremental.generate_delta(_make_state_dict(worker, kind, fetcher, self.dataset))
            snapshot += time.process_time() - middle
            fetch += middle - start
            batches += 1
        yield {"fetch_us": 1e6 * fetch / batches, "snapshot_us": 1e6 * snapshot / batches, "batches": batches, "delta": delta}


def snapshot_cost(dataset: StructuredDataset) -> dict:
    """Per batch: worker fetch CPU, worker snapshot CPU, and the main process's share
    (unpickle and apply the delta, rebuild the snapshot of every worker's state)."""
    import pickle

    from torch.utils.data.dataloader import _InfiniteConstantSampler
    from torchdata.stateful_dataloader.incremental_state import _IncrementalWorkerState
    from torchdata.stateful_dataloader.worker import try_to_serialize

    loader = DataLoader(_SnapshotTimer(dataset), batch_size=None, num_workers=dataset.logical_workers)
    workers = list(loader)
    delta = workers[0]["delta"]
    states = {f"worker_{i}": _IncrementalWorkerState(w["delta"]) for i, w in enumerate(workers)}
    message = pickle.dumps(delta)

    sampler = _InfiniteConstantSampler()
    sampler_iter = iter(sampler)

    def main_step() -> None:
        try_to_serialize(sampler_iter), try_to_serialize(sampler)  # _get_main_state, when sending the index
        states["worker_0"].apply_delta(pickle.loads(message))
        {key: state.get_state() for key, state in states.items()}  # what _update_snapshot builds

    fetch = statistics.median(w["fetch_us"] for w in workers)
    worker_snapshot = statistics.median(w["snapshot_us"] for w in workers)
    main = best_us(main_step, 2000)
    return {
        "worker_fetch_us": fetch,
        "worker_snapshot_us": worker_snapshot,
        "main_snapshot_us": main,
        "delta_bytes": len(message),
        "overhead": (worker_snapshot + main) / fetch,
    }


def state_dict_in_worker(dataset: StructuredDataset, calls: int = 20000, rounds: int = 3) -> dict:
    """The best figures over rounds and workers (the machine may be shared)."""
    loader = DataLoader(_StateDictTimer(dataset, calls), batch_size=None, num_workers=dataset.logical_workers)
    return min((r for _ in range(rounds) for r in loader), key=lambda r: r["us_per_call"])


def best_us(call: Callable[[], Any], calls: int, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls)
    return 1e6 * best


def rank_state_dict(dataset: StructuredDataset, calls: int = 200) -> dict:
    state = dataset.state_dict()
    return {"us_per_call": best_us(dataset.state_dict, calls), "json_bytes": len(json.dumps(state)), "scope": state["scope"]}


def tiny_files(root: str, files: int) -> str:
    os.makedirs(root, exist_ok=True)
    for index in range(files):
        path = os.path.join(root, f"part-{index:05d}.parquet")
        if not os.path.exists(path):
            pq.write_table(pa.table({"id": pa.array(range(index * 8, index * 8 + 8), pa.int64())}), path)
    return root


def _cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the loader's workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def epoch_seconds(loader: Any) -> tuple[float, float, int, int]:
    """(wall seconds, CPU seconds of the process and its workers, rows, batches) of one full pass.

    Workers are not persistent, so they are reaped at the end of the pass and their CPU
    time counts; CPU time is what a shared machine disturbs least.
    """
    rows = batches = 0
    start, cpu = time.perf_counter(), _cpu_seconds()
    for batch in loader:
        rows += len(batch["id"])
        batches += 1
    return time.perf_counter() - start, _cpu_seconds() - cpu, rows, batches


def contenders(path: str, args: argparse.Namespace) -> dict[str, Callable[[], Any]]:
    """name -> function building (a fresh) loader; each built once and iterated every round."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    options = dict(batch_size=args.batch_size, num_workers=args.num_workers, columns=COLUMNS)
    workers = args.num_workers

    def stateful(snapshot: int) -> Callable[[], Any]:
        return lambda: StatefulDataLoader(
            StructuredDataset(path, **options), batch_size=None, num_workers=workers, snapshot_every_n_steps=snapshot
        )

    return {
        "StatefulDataLoader, snapshot_every_n_steps=1": stateful(1),
        "StatefulDataLoader, snapshot_every_n_steps=10^12": stateful(NEVER),
        "torch DataLoader over the dataset": lambda: DataLoader(StructuredDataset(path, **options), batch_size=None, num_workers=workers),
        "create_dataloader (our loader)": lambda: StructuredDataset.create_dataloader(path, **options)[0],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=0.25)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--many-files", type=int, default=2000)
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "tdu_bench"))
    parser.add_argument("--name", default="stateful_overhead")
    args = parser.parse_args(argv)

    path = os.path.join(args.data, "parquet")
    ensure_dataset(path, FILES, rows_for(args.size_gb, FILES), 65536)
    options = dict(batch_size=args.batch_size, num_workers=args.num_workers, columns=COLUMNS)
    result: dict[str, Any] = {"args": vars(args), "torch": torch.__version__}

    calls = {
        f"worker state_dict, {FILES} files": state_dict_in_worker(StructuredDataset(path, **options)),
        f"worker state_dict, {args.many_files} files": state_dict_in_worker(
            StructuredDataset(tiny_files(os.path.join(args.data, "tiny"), args.many_files), batch_size=4, num_workers=1)
        ),
        f"rank state_dict (main process), {FILES} files": rank_state_dict(StructuredDataset(path, **{**options, "num_workers": 0})),
    }
    many = StructuredDataset(os.path.join(args.data, "tiny"), batch_size=4, num_workers=1)
    # what every call would cost if the file-list digest were not computed once
    calls[f"files digest recomputed, {args.many_files} files"] = {"us_per_call": best_us(lambda: many._catalog.files_digest, 50)}
    result["state_dict"] = calls
    cost = result["snapshot_cost"] = snapshot_cost(StructuredDataset(path, **options))

    loaders = {name: build() for name, build in contenders(path, args).items()}
    wall: dict[str, list[float]] = {name: [] for name in loaders}
    cpu: dict[str, list[float]] = {name: [] for name in loaders}
    rows = {}
    for name, loader in loaders.items():  # warm-up: page cache, imports in workers
        rows[name] = epoch_seconds(loader)[2]
    for round_ in range(args.repeats):
        order = list(loaders.items())
        for name, loader in order if round_ % 2 == 0 else order[::-1]:  # no contender always runs first
            seconds, cpu_seconds, rows[name], batches = epoch_seconds(loader)
            wall[name].append(seconds)
            cpu[name].append(cpu_seconds)
    assert len(set(rows.values())) == 1, rows
    result["epoch"] = {
        name: {"wall": wall[name], "cpu": cpu[name], "wall_median": statistics.median(wall[name]), "cpu_median": statistics.median(cpu[name])}
        for name in loaders
    }
    never, every = "StatefulDataLoader, snapshot_every_n_steps=10^12", "StatefulDataLoader, snapshot_every_n_steps=1"
    result["snapshot_overhead"] = {
        "wall_median": statistics.median(wall[every]) / statistics.median(wall[never]) - 1,
        "wall_min": min(wall[every]) / min(wall[never]) - 1,
        "cpu_median": statistics.median(cpu[every]) / statistics.median(cpu[never]) - 1,
    }
    # the snapshot work measured directly, against all CPU (workers + main) a batch costs without it
    cpu_per_batch_us = 1e6 * statistics.median(cpu[never]) / batches
    cost["cpu_per_batch_us"] = cpu_per_batch_us
    cost["overhead_of_total_cpu"] = (cost["worker_snapshot_us"] + cost["main_snapshot_us"]) / cpu_per_batch_us

    print(f"## state_dict() cost ({torch.get_num_threads()} threads, {os.cpu_count()} CPUs)\n")
    print("| call | µs per call | JSON bytes |\n|---|---:|---:|")
    for name, r in calls.items():
        print(f"| {name} | {r['us_per_call']:.1f} | {r.get('json_bytes', '')} |")
    print(
        "\n## per batch, CPU, what snapshot_every_n_steps=1 adds\n\n"
        "| worker: fetch a batch | all CPU of an epoch, per batch (no snapshots) | worker: snapshot | main: snapshot | "
        "delta bytes | added, of the fetch | added, of all CPU |\n|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {cost['worker_fetch_us']:.0f} µs | {cost['cpu_per_batch_us']:.0f} µs | {cost['worker_snapshot_us']:.1f} µs | "
        f"{cost['main_snapshot_us']:.1f} µs | {cost['delta_bytes']} | {cost['overhead']:.1%} | {cost['overhead_of_total_cpu']:.1%} |"
    )
    total = next(iter(rows.values()))
    print(f"\n## one epoch: {total:,} rows, batch_size {args.batch_size}, num_workers {args.num_workers}, {args.repeats} rounds\n")
    print("| loader | wall s, median (min) | rows/s, median | CPU s, median | wall vs snapshot 10^12 | CPU vs snapshot 10^12 |")
    print("|---|---:|---:|---:|---:|---:|")
    base_wall, base_cpu = statistics.median(wall[never]), statistics.median(cpu[never])
    for name in loaders:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"| {name} | {w:.2f} ({min(wall[name]):.2f}) | {total / w:,.0f} | {c:.2f} | {w / base_wall - 1:+.1%} | {c / base_cpu - 1:+.1%} |")
    overhead = result["snapshot_overhead"]
    print(
        f"\nsnapshot_every_n_steps=1 vs never: wall {overhead['wall_median']:+.1%} (median), "
        f"{overhead['wall_min']:+.1%} (best run); CPU {overhead['cpu_median']:+.1%} (median)"
    )
    out = os.path.join(HERE, "results", f"{args.name}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

"""``tdu bench``: this loader's throughput on the user's data, and the time to resume."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from .options import storage_options
from .output import EXIT_OK, human_bytes, print_json


def run_bench(args: argparse.Namespace) -> dict:
    """Iterate the loader on the user's data for one epoch or the time budget; measure a resume."""
    from .. import StructuredDataset

    config: dict[str, Any] = {"format": args.format, "batch_size": args.batch_size, "num_workers": args.num_workers,
                              "shuffle": args.shuffle, "shuffle_seed": args.shuffle_seed, "split_bytes": args.split_bytes,
                              "storage_options": storage_options(args)}
    if args.columns:
        config["columns"] = [c.strip() for c in args.columns.split(",") if c.strip()]
    if args.chunk_rows:
        config["chunk_rows"] = args.chunk_rows
    if args.filters is not None:
        config["filters"] = args.filters
    if args.nulls != "raise":
        config["nulls"] = args.nulls
    started = time.perf_counter()
    loader, dataset = StructuredDataset.create_dataloader(list(args.path), **config)
    constructed = time.perf_counter() - started
    total_batches = len(loader)
    planned = min(total_batches, args.max_batches or total_batches)
    states = _MidpointStates(dataset.state_dict, planned_midpoint=max(1, planned // 2))
    deadline = time.perf_counter() + args.seconds
    for index, _ in enumerate(loader, start=1):
        states.after_batch(index)
        if time.perf_counter() >= deadline or (args.max_batches and index >= args.max_batches):
            break
    stats = loader.stats.last_pass
    steady = stats.wait_s + stats.loop_s
    shown = {k: sorted(v) if k == "storage_options" else v for k, v in config.items() if v is not None}  # names, never secrets
    result: dict[str, Any] = {
        "config": shown,
        "rows_in_epoch": len(dataset),
        "batches_in_epoch": total_batches,
        "batches": stats.batches,
        "rows": stats.rows,
        "construct_s": constructed,
        "first_batch_s": stats.startup_s,
        "elapsed_s": stats.elapsed_s,
        "rows_per_s": stats.rows_per_s,
        # only meaningful once the pass outlasts its start-up (several chunks per worker)
        "steady_rows_per_s": (stats.rows - args.batch_size) / steady if steady >= max(0.5, stats.startup_s) else None,
        "bytes_per_s": _scanned_bytes(dataset, stats.rows) / stats.elapsed_s if stats.elapsed_s > 0 else None,
    }
    middle = states.middle()
    if middle is not None and not args.no_resume and middle[0] >= total_batches:
        result["resume"] = {"at_batch": middle[0], "got_batch": False}  # the state ends the epoch: nothing to time
    elif middle is not None and not args.no_resume:
        result["resume"] = _measure_resume(list(args.path), config, middle[1], middle[0])
    return result


class _MidpointStates:
    """Dataset states saved during a loop, to resume from the middle of however much it read.

    The loop can stop early (``--seconds``), so states are saved at the planned midpoint
    and at batches about 25% apart (a few dozen saves, not one per batch); only those that
    can still be nearest to the middle are kept.
    """

    def __init__(self, state_dict: Callable[[], dict], planned_midpoint: int) -> None:
        self._state_dict = state_dict
        self._planned = planned_midpoint
        self._next = 1
        self._read = 0
        self._saved: list[tuple[int, dict]] = []  # (batches read, state), oldest first

    def after_batch(self, index: int) -> None:
        """Call with the number of batches read so far."""
        self._read = index
        if index not in (self._next, self._planned):
            return
        self._saved.append((index, self._state_dict()))
        if index == self._next:
            self._next = max(index + 1, int(index * 1.25))
        while len(self._saved) > 1 and self._saved[1][0] <= index / 2:
            self._saved.pop(0)  # a later state is already at or before the middle

    def middle(self) -> tuple[int, dict] | None:
        """(batch, state) nearest the middle of what was read; None if nothing was read."""
        if not self._saved:
            return None
        return min(self._saved, key=lambda saved: abs(saved[0] - self._read / 2))


def _scanned_bytes(dataset: Any, rows: int) -> float:
    files = dataset._catalog.files
    total_rows = sum(layout.num_rows for layout in dataset._catalog.layouts)
    return sum(f.size for f in files) * rows / total_rows if total_rows else 0.0


def _measure_resume(path: list[str], config: dict, state: dict, at_batch: int) -> dict:
    from .. import StructuredDataset

    started = time.perf_counter()
    loader, dataset = StructuredDataset.create_dataloader(path, **config)
    constructed = time.perf_counter()
    dataset.load_state_dict(state)
    first = next(iter(loader), None)
    done = time.perf_counter()
    return {"at_batch": at_batch, "construct_s": constructed - started, "load_to_first_batch_s": done - constructed,
            "got_batch": first is not None}


def print_bench(result: dict) -> None:
    config = ", ".join(f"{k}={human_bytes(v) if k == 'split_bytes' else v}" for k, v in result["config"].items())
    print(f"bench: {config}")
    print(f"  epoch        {result['rows_in_epoch']:,} rows in {result['batches_in_epoch']:,} batches")
    print(f"  read         {result['batches']:,} batches, {result['rows']:,} rows in {result['elapsed_s']:.2f} s")
    print(f"  throughput   {result['rows_per_s']:,.0f} rows/s overall"
          + (f", {result['steady_rows_per_s']:,.0f} rows/s after the first batch" if result["steady_rows_per_s"] else "")
          + (f", ~{human_bytes(result['bytes_per_s'])}/s of files" if result["bytes_per_s"] else ""))
    print(f"  start        construction {result['construct_s']:.3f} s, then first batch {result['first_batch_s']:.3f} s")
    resume = result.get("resume")
    if resume and not resume["got_batch"]:
        print(f"  resume       at batch {resume['at_batch']:,}: no batch comes after it (the epoch ends there), nothing to time")
    elif resume:
        print(f"  resume       at batch {resume['at_batch']:,}: construction {resume['construct_s']:.3f} s, "
              f"load_state_dict -> first batch {resume['load_to_first_batch_s']:.3f} s")


def cmd_bench(args: argparse.Namespace) -> int:
    """Measure and print (``--json``: as JSON) the loader's throughput and a resume."""
    result = run_bench(args)
    if args.json:
        print_json(result)
    else:
        print_bench(result)
    return EXIT_OK

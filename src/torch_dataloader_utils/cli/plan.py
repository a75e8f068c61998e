"""``tdu plan``: how a path is cut into splits and dealt to ranks and workers."""

from __future__ import annotations

import argparse
import collections
import logging
import statistics
import time
from collections.abc import Sequence
from typing import Any

from .options import storage_options
from .output import EXIT_OK, human_bytes, print_json
from .plan_mixture import check_plain_plan, is_mixture_plan, mixture_plan, print_sources

log = logging.getLogger("torch_dataloader_utils.cli")  # one logger for all of tdu's commands


def _split_bytes_of(layout: Any, start: int, stop: int) -> int:
    """Compressed bytes of the units that hold rows [start, stop) of a file."""
    total, first = 0, 0
    for rows, size in zip(layout.unit_rows, layout.unit_bytes):
        if first < stop and first + rows > start:
            total += size
        first += rows
    return total


def compute_plan(
    catalog: Any, world_size: int, num_workers: int, batch_size: int, shuffle: bool, seed: int, epoch: int, equalize: str = "pad"
) -> dict:
    """Files, splits, and what every (rank, worker) reads in ``epoch``, from a built catalog."""
    from ..plan.splits import assign_splits, epoch_order

    layouts = catalog.layouts
    split_rows = [r.stop - r.start for r in catalog.split_rows]
    split_bytes = [_split_bytes_of(layouts[r.file], r.start, r.stop) for r in catalog.split_rows]
    order = epoch_order(len(catalog.splits), shuffle, seed, epoch)
    workers, ranks = [], []
    for rank in range(world_size):
        own = []
        for worker, indices in enumerate(assign_splits(order, rank, world_size, num_workers)):
            rows = sum(split_rows[i] for i in indices)
            own.append({"rank": rank, "worker": worker, "splits": len(indices), "rows": rows,
                        "bytes": sum(split_bytes[i] for i in indices), "batches": -(-rows // batch_size)})
        workers += own
        ranks.append({"rank": rank, "rows": sum(w["rows"] for w in own), "batches": sum(w["batches"] for w in own)})
    files_cut = sum(1 for count in collections.Counter(s.path for s in catalog.splits).values() if count > 1)
    counts = [r["batches"] for r in ranks]
    # under DDP every rank delivers the same number of batches (see StructuredDataset's equalize)
    delivered = max(counts) if equalize == "pad" else min(counts) if equalize == "drop" else None
    for r in ranks:
        r["batches_delivered"] = r["batches"] if world_size == 1 or delivered is None else delivered
    return {
        "format": catalog.format.name,
        "files": len(catalog.files),
        "rows": sum(layout.num_rows for layout in layouts),
        "bytes": sum(f.size for f in catalog.files),
        "largest_file_bytes": max((f.size for f in catalog.files), default=0),
        "units": sum(len(layout.unit_rows) for layout in layouts),
        "splits": len(catalog.splits),
        "files_cut": files_cut,
        "split_bytes": catalog.split_bytes,
        "split_rows": {"min": min(split_rows, default=0), "median": int(statistics.median(split_rows)) if split_rows else 0,
                       "max": max(split_rows, default=0)},
        "world_size": world_size,
        "num_workers": num_workers,
        "batch_size": batch_size,
        "shuffle": shuffle,
        "shuffle_seed": seed,
        "epoch": epoch,
        "equalize": equalize,
        "workers": workers,
        "ranks": ranks,
    }


def _spread(values: Sequence[int]) -> str:
    mean = sum(values) / len(values) if values else 0
    above = (max(values) / mean - 1) if mean else 0.0
    return f"min {min(values):,} / max {max(values):,} (max is {above:.0%} above the mean)"


def plan_advice(plan: dict) -> list[str]:
    """Warnings about an unbalanced or starved plan, with what to change."""
    advice = []
    slots = plan["world_size"] * max(1, plan["num_workers"])
    idle = sum(1 for w in plan["workers"] if w["splits"] == 0)
    if idle:
        advice.append(
            f"{idle} of {slots} workers get no split and idle: there are {plan.get('blocks', plan['splits'])} "
            f"{'blocks (each holds about one split of every source)' if 'blocks' in plan else 'splits'} for {slots} "
            f"(rank, worker) slots. "
            + (
                f"Lower --split-bytes (now {human_bytes(plan['split_bytes'])}) or use fewer workers."
                if plan["splits"] < plan["units"]
                else "Every row group (ORC: stripe) is already a split of its own: use fewer workers, or write smaller row groups."
            )
        )
    rows = [w["rows"] for w in plan["workers"]]
    mean = sum(rows) / len(rows) if rows else 0
    if not idle and mean and max(rows) / mean > 1.25:
        advice.append(
            "the busiest worker reads more than 25% above the mean: "
            + (
                "smaller splits (--split-bytes) balance better."
                if plan["splits"] < plan["units"]
                else "every row group (ORC: stripe) is already a split of its own: write smaller or more even row groups, or use fewer workers."
            )
        )
    return advice


_UNITS = {"parquet": "row groups", "orc": "stripes", "arrow": "record batches", "csv": "byte ranges", "jsonl": "byte ranges"}


def print_plan(plan: dict, path: str, show_all: bool) -> None:
    """The plan as a table, with its balance and advice."""
    print(f"plan of {path} ({plan['format']})")
    print(f"  files     {plan['files']:,}: {plan['rows']:,} rows, {human_bytes(plan['bytes'])}, "
          f"{plan['units']:,} {_UNITS.get(plan['format'], 'row groups / stripes')}, "
          f"largest file {human_bytes(plan['largest_file_bytes'])}")
    rows = plan["split_rows"]
    print(f"  splits    {plan['splits']:,} at split_bytes {human_bytes(plan['split_bytes'])}: rows per split "
          f"min {rows['min']:,} / median {rows['median']:,} / max {rows['max']:,}; {plan['files_cut']} files cut into several splits")
    shuffle = f"shuffle on (seed {plan['shuffle_seed']})" if plan["shuffle"] else "shuffle off"
    print(f"  topology  world_size {plan['world_size']} x num_workers {plan['num_workers']}, epoch {plan['epoch']}, "
          f"{shuffle}, batch_size {plan['batch_size']:,}")
    if "sources" in plan:
        print_sources(plan)
    workers = plan["workers"]
    if show_all or len(workers) <= 32:
        print()
        print(f"  {'rank':>5} {'worker':>6} {'splits':>7} {'rows':>12} {'bytes':>11} {'batches':>8}")
        for w in workers:
            print(f"  {w['rank']:>5} {w['worker']:>6} {w['splits']:>7,} {w['rows']:>12,} {human_bytes(w['bytes']):>11} {w['batches']:>8,}")
    else:
        print(f"  ({len(workers)} rank/worker rows hidden; --all shows them)")
    print()
    print(f"  balance   rows per worker: {_spread([w['rows'] for w in workers])}")
    if plan["world_size"] > 1:
        print(f"            rows per rank: {_spread([r['rows'] for r in plan['ranks']])}")
        print(f"            batches per rank: {_spread([r['batches'] for r in plan['ranks']])}")
        delivered = plan["ranks"][0]["batches_delivered"]
        if plan["equalize"] == "pad":
            padding = "short ranks repeat some of their own rows, a rank with none another rank's"
            print(f"            equalize=pad: every rank delivers {delivered:,} batches ({padding})")
        elif plan["equalize"] == "drop":
            print(f"            equalize=drop: every rank delivers {delivered:,} batches (the rest of longer ranks is skipped)")
    for line in plan_advice(plan):
        print(f"  note: {line}")


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan ``args.path`` as create_dataloader would and print it (``--json``: as JSON)."""
    from ..catalog.build import build_catalog

    started = time.perf_counter()
    if is_mixture_plan(args):
        plan = mixture_plan(args, compute_plan)
    else:
        check_plain_plan(args)
        catalog = build_catalog(args.path, args.format, storage_options(args), args.split_bytes)
        if args.filters is not None:
            from ..read.filtering import filter_catalog

            catalog = filter_catalog(catalog, args.filters)
        plan = compute_plan(
            catalog, args.world_size, args.num_workers, args.batch_size, args.shuffle, args.shuffle_seed, args.epoch, args.equalize
        )
    log.info("planned in %.2f s", time.perf_counter() - started)
    if args.json:
        print_json(plan)
    else:
        print_plan(plan, " ".join(args.path), args.all)
    return EXIT_OK

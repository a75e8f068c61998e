"""``tdu plan`` of a mixture: PATHs as sources with ``--rows-per-epoch`` or ``--weight`` (one per
PATH), what each source contributes per epoch, and what every (rank, worker) reads."""

from __future__ import annotations

import argparse
from typing import Any

from .options import storage_options


def is_mixture_plan(args: argparse.Namespace) -> bool:
    return bool(args.rows_per_epoch or args.weight or args.epoch_rows is not None)


def check_plain_plan(args: argparse.Namespace) -> None:
    """ValueError for options only a mixture's plan takes."""
    if args.columns:
        raise ValueError("--columns applies to a mixture's plan (with --rows-per-epoch or --weight): a plain plan reads no column")


def mixture_plan(args: argparse.Namespace, compute_plan: Any) -> dict:
    """The plan of ``tdu plan`` for the sources ``args.path``, with a "sources" table."""
    from ..catalog.mixture import MixtureSettings, Source, build_mixture_catalog
    from ..catalog.progress_bar import planning_started
    from ..plan.lanes import StreamKey
    from ..plan.mixing import MixtureBook

    for name, values in (("--rows-per-epoch", args.rows_per_epoch), ("--weight", args.weight)):
        if values and len(values) != len(args.path):
            raise ValueError(f"{name} takes one value per PATH: {len(args.path)} paths, {len(values)} values")
    if args.rows_per_epoch and args.weight:  # as Source() and create_dataloader refuse them together
        raise ValueError("pass --rows-per-epoch or --weight, not both: weights share --epoch-rows, rows per epoch fix each source's rows")
    shares = [dict(rows_per_epoch=n) for n in args.rows_per_epoch] or [dict(weight=w) for w in args.weight] or [{} for _ in args.path]
    sources = [Source(path, **share) for path, share in zip(args.path, shares)]
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    from ..read.filtering import filter_catalog  # with filters, each source is planned over the rows they match

    settings = MixtureSettings(
        args.split_bytes, args.format, storage_options(args), columns=columns, epoch_rows=args.epoch_rows,
        shuffle=args.shuffle, shuffle_seed=args.shuffle_seed, shuffle_buffer_rows=args.shuffle_buffer_rows,
        filters=args.filters, count_filtered=filter_catalog,
    )  # fmt: skip
    with planning_started():  # a progress bar's delay counts from the first source's planning
        catalog = build_mixture_catalog(sources, settings)
    assert catalog.plan is not None
    plan = compute_plan(catalog, args.world_size, args.num_workers, args.batch_size, args.shuffle, args.shuffle_seed, args.epoch, args.equalize)
    book = MixtureBook(catalog.plan)
    workers, ranks = [], []
    for rank in range(args.world_size):
        own = []
        for worker in range(max(1, args.num_workers)):
            key = StreamKey(args.epoch, rank, args.world_size, args.num_workers, worker)
            stream, rows = book.stream(key), book.stream_rows(key)
            size = sum(catalog.layouts[p.file].unit_bytes[p.unit] * p.num_rows // max(1, catalog.layouts[p.file].unit_rows[p.unit]) for p in stream.pieces)
            own.append({"rank": rank, "worker": worker, "splits": len(stream.splits), "rows": rows, "bytes": size, "batches": -(-rows // args.batch_size)})
        workers += own
        ranks.append({"rank": rank, "rows": sum(w["rows"] for w in own), "batches": sum(w["batches"] for w in own)})
    counts = [r["batches"] for r in ranks]
    delivered = max(counts) if args.equalize == "pad" else min(counts) if args.equalize == "drop" else None
    for r in ranks:
        r["batches_delivered"] = r["batches"] if args.world_size == 1 or delivered is None else delivered
    total = catalog.plan.epoch_rows
    plan["sources"] = [
        {**source, "times": round(source["rows_per_epoch"] / source["rows"], 4) if source["rows"] else 0.0,
         "share": round(source["rows_per_epoch"] / total, 4) if total else 0.0}
        for source in catalog.sources
    ]  # fmt: skip
    formats = sorted({source["format"] for source in catalog.sources})  # each source's own, not the first's
    plan.update(workers=workers, ranks=ranks, epoch_rows=total, blocks=catalog.plan.block_count, format="+".join(formats))
    return plan


def print_sources(plan: dict) -> None:
    """The sources table of a mixture's plan."""
    print(f"  mixture   {len(plan['sources'])} sources, {plan['epoch_rows']:,} rows per epoch in {plan['blocks']:,} blocks")
    print(f"  {'source':>6} {'rows':>12} {'per epoch':>12} {'times':>7} {'share':>6}  path")
    for index, source in enumerate(plan["sources"]):
        path = source["path"] if isinstance(source["path"], str) else " ".join(source["path"])
        print(f"  {index:>6} {source['rows']:>12,} {source['rows_per_epoch']:>12,} {source['times']:>7.3g} {source['share']:>6.1%}  {path}")

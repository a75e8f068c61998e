"""What pruning pages by the page index saves: a filter on a sorted column, counted and read with
and without a page index in the same files.

    python benchmarks/page_pruning.py [--rows 4000000] [--row-group-rows 1000000] [--rounds 5]

Two copies of one table (``id`` sorted int64, ``noise`` float64, 8 KiB pages), one written with
``write_page_index=True``; the filter ``id`` in a range of ``--match`` rows that starts inside a
row group. Each round, interleaved: plan (statistics, then the count pass) and read every
matching row (num_workers=0, batches of 4096) from each copy; the least wall time of the rounds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--row-group-rows", type=int, default=1_000_000)
    parser.add_argument("--match", type=int, default=20_000, help="rows the filter matches")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    from torch_dataloader_utils import StructuredDataset
    from torch_dataloader_utils.read import filtering, page_ranges

    root = tempfile.mkdtemp(prefix="page-pruning-")
    table = pa.table({"id": np.arange(args.rows), "noise": np.random.default_rng(0).random(args.rows)})
    for index in (True, False):
        os.makedirs(os.path.join(root, str(index)))
        pq.write_table(table, os.path.join(root, str(index), "p.parquet"), row_group_size=args.row_group_rows,
                       write_page_index=index, data_page_size=8192, use_dictionary=False)
    first = args.row_group_rows + args.row_group_rows // 3
    filters = [("id", ">=", first), ("id", "<", first + args.match)]
    times: dict[tuple[bool, str], list[float]] = {(index, step): [] for index in (True, False) for step in ("plan", "read")}
    for _ in range(args.rounds):
        for index in (True, False):
            filtering._MEMO.clear()
            page_ranges._MEMO.clear()
            start = time.perf_counter()
            dataset = StructuredDataset(os.path.join(root, str(index)), batch_size=4096, num_workers=0, filters=filters)
            planned = time.perf_counter()
            rows = sum(len(batch["id"]) for batch in dataset)
            times[(index, "plan")].append(planned - start)
            times[(index, "read")].append(time.perf_counter() - planned)
            assert rows == args.match == len(dataset)
    print(f"{args.rows:,} rows, row groups of {args.row_group_rows:,}, filter {filters}; least of {args.rounds} rounds; load {os.getloadavg()[0]:.1f}")
    print("| step | page index: s | no page index: s | ratio |")
    print("|---|---|---|---|")
    for step in ("plan", "read"):
        with_index, without = min(times[(True, step)]), min(times[(False, step)])
        print(f"| {step} | {with_index:.4f} | {without:.4f} | {with_index / without:.2f} |")


if __name__ == "__main__":
    sys.exit(main())

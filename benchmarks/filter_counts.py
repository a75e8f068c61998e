"""What filters= costs at planning: the pass that counts matching rows, against reading the
projected columns of every row group.

    python benchmarks/filter_counts.py [--size-gb 0.1] [--columns narrow|numeric|text] [--filter label|id] [--threads 8] [--rounds 3]

The count reads only the filter's columns (``label``, one int32 column, or ``id``) of every row
group whose statistics neither rule the filter out nor show that every row matches: ``label`` is
random, so every row group is read; ``id`` is sorted, so only the row group holding the boundary is. The peer is a full read of the
projected columns of every row group through the same format reader and the same number of
threads. The filter is counted twice, given as an Expression and in the DNF list form (which
read/filter_eval.py evaluates by compute kernels, without pyarrow's per-call expression plan).
The issue's target: the count <= 0.3x of the full read for a one-column filter. Both
are measured in the same run, interleaved, from the page cache (one warm-up read first); the
table gives wall time (the least of the rounds: on a shared machine the median carries other
processes' load) and CPU time of the process (all threads).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from generate import ensure_dataset, rows_for  # noqa: E402

COLUMN_SETS = {"narrow": ["id", "label"], "numeric": ["id", "label", "feat"], "text": ["id", "label", "feat", "text"]}


def full_read(catalog, columns: list[str], threads: int) -> int:
    """Decode every row group's projected columns; return the rows read."""

    def read_file(file: int) -> int:
        entry = catalog.files[file]
        reader = catalog.format.open(catalog.fs, entry.fs_path, catalog.footers[file], False)
        return sum(reader.read_unit(unit, columns).num_rows for unit in range(len(catalog.layouts[file].unit_rows)))

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return sum(pool.map(read_file, range(len(catalog.files))))


def count_pass(catalog, filters, threads: int) -> int:
    from torch_dataloader_utils.read import filtering

    filtering._MEMO.clear()  # count again (no cache_dir: nothing on disk)
    filtering._COUNT_THREADS = threads
    return sum(layout.num_rows for layout in filtering.filter_catalog(catalog, filters).layouts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=0.1)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--columns", choices=sorted(COLUMN_SETS), default="numeric")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--filter", choices=["label", "id"], default="label", help="label < 100 (random), or id < half the rows (sorted)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data-dir", default=os.path.join(HERE, "results", "data-formats"))
    args = parser.parse_args(argv)
    from torch_dataloader_utils.catalog.build import build_catalog

    files = ensure_dataset(args.data_dir, args.files, rows_for(args.size_gb, args.files), 65536)
    catalog = build_catalog(files, "parquet", None, 128 << 20)
    columns = COLUMN_SETS[args.columns]
    # label is random (every row group has some matching rows); id is sorted (statistics show most
    # row groups match whole or not at all, and only the one holding the boundary is read)
    rows = full_read(catalog, columns, args.threads)  # warm-up
    # the same filter as an Expression (pyarrow's expression engine) and in the DNF list form
    # (evaluated by compute kernels directly: read/filter_eval.py)
    dnf = [("label", "<", 100)] if args.filter == "label" else [("id", "<", rows // 2)]
    forms = {"count": pq.filters_to_expression(dnf), "count-dnf": dnf}
    filters = forms["count"]
    wall: dict[str, list[float]] = {name: [] for name in (*forms, "read")}
    cpu: dict[str, list[float]] = {name: [] for name in (*forms, "read")}
    matching = 0
    for _ in range(args.rounds):
        for name in wall:
            start, started_cpu = time.perf_counter(), time.process_time()
            if name in forms:
                matching = count_pass(catalog, forms[name], args.threads)
            else:
                full_read(catalog, columns, args.threads)
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - started_cpu)
    units = sum(len(layout.unit_rows) for layout in catalog.layouts)
    print(f"{rows:,} rows in {len(files)} files ({units} row groups); filter {filters} matches {matching:,}; {args.rounds} rounds")
    print("| pass | wall s (min / median) | CPU s (median) | x full read (wall min) | x full read (CPU) |")
    print("|---|---|---|---|---|")
    passes = (("count", f"count, Expression (reads {args.filter})"), ("count-dnf", f"count, DNF list (reads {args.filter})"), ("read", f"full read of {','.join(columns)}"))
    for name, label in passes:
        ratio_wall = min(wall[name]) / min(wall["read"])
        ratio_cpu = float(np.median(cpu[name])) / float(np.median(cpu["read"]))
        print(f"| {label} | {min(wall[name]):.3f} / {np.median(wall[name]):.3f} | {np.median(cpu[name]):.3f} | {ratio_wall:.2f} | {ratio_cpu:.2f} |")


if __name__ == "__main__":
    main()

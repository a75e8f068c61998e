"""What reading a table costs against reading its data files as plain files, in the same run.

An Iceberg table (embedded SQLite catalog, local warehouse) of ``--files`` appends of ``--rows``
rows each (int64 id, float64 x), read three ways, each against
``StructuredDataset`` over the same Parquet files (the ceiling):

- the table as it is;
- with position deletes of 1% of every file's rows (merge-on-read);
- with a row filter keeping half the rows (``filters=``), evaluated at planning.

Reported: planning time (create_dataloader) and one epoch's rows/s with every batch's tensors
touched (the best of three each, on a shared machine), as ratios to the plain files. Usage: ``python benchmarks/tables.py [--files 8 --rows 200000]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from table_helpers import add_position_deletes, iceberg_config, iceberg_table  # noqa: E402

from torch_dataloader_utils import IcebergDataset, StructuredDataset  # noqa: E402

LOADER = dict(batch_size=4096, num_workers=2, shuffle=True, shuffle_seed=1)


def _best(make, repeats: int = 3):
    """The best of ``repeats`` epochs (fastest planning, highest rows/s): the machine is shared."""
    runs = [_epoch(make) for _ in range(repeats)]
    return min(r[0] for r in runs), max(r[1] for r in runs), runs[0][2]


def _epoch(make):
    started = time.perf_counter()
    loader, dataset = make()
    planned = time.perf_counter() - started
    started = time.perf_counter()
    rows = 0
    for batch in loader:
        rows += len(batch["id"])
        float(batch["x"].sum())  # touch the batch
    return planned, rows / (time.perf_counter() - started), rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="tdu-tables-")
    config = iceberg_config(root)
    table = iceberg_table(config, row_group_rows=64 * 1024)
    for f in range(args.files):
        ids = np.arange(f * args.rows, (f + 1) * args.rows, dtype=np.int64)
        table.append(pa.table({"id": ids, "x": ids * 0.5}))
    files = sorted(task.file.file_path.removeprefix("file://") for task in table.scan().plan_files())
    plain = lambda: StructuredDataset.create_dataloader(files, **LOADER)  # noqa: E731
    cases = {"table": lambda: IcebergDataset.create_dataloader("db.t", config, **LOADER)}
    cases["table, row filter (half the rows)"] = lambda: IcebergDataset.create_dataloader(
        "db.t", config, filters=pc.bit_wise_and(pc.field("id"), 1) == 0, **LOADER
    )
    rng = np.random.default_rng(0)
    results = []
    for name, make in cases.items():
        results.append((name, _best(plain), _best(make)))
    for path in files:
        add_position_deletes(table, f"file://{path}", sorted(rng.choice(args.rows, args.rows // 100, replace=False).tolist()))
    results.append(("table, 1% position deletes", _best(plain), _best(lambda: IcebergDataset.create_dataloader("db.t", config, **LOADER))))
    print(f"{args.files} files x {args.rows:,} rows; batch_size 4096, 2 workers, shuffled; ratios to StructuredDataset over the same files")
    print("| case | planning (s): plain / table | rows/s: plain / table | ratio |")
    print("|---|---|---|---|")
    for name, (p0, r0, _), (p1, r1, n1) in results:
        print(f"| {name} ({n1:,} rows) | {p0:.2f} / {p1:.2f} | {r0 / 1e6:.2f}M / {r1 / 1e6:.2f}M | {r1 / r0:.2f}x |")


if __name__ == "__main__":
    main()

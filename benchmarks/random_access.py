"""Random access (``dataset[idx]``) against a hand-written pyarrow gather, and slices against the loader.

    python benchmarks/random_access.py [--data-dir DIR] [--size-gb 1.0] [--calls 6] \
        [--slices 200] [--warm-slices 0] [--columns all|numeric] [--parts gathers,slices] [--json OUT]

On generate.py's files (8 Parquet files, 64Ki-row row groups, page index), in one process:

- gathers: ``--calls`` calls of 1024 uniformly random rows of the whole dataset, the same rows
  for every contender, contenders interleaved call by call, the first of each turn rotating (a
  shared machine's load then falls on all of them alike). ``pyarrow``: ``pq.ParquetFile(...).read_row_group(g, columns)`` of every
  row group holding a requested row, ``take`` of its rows, one table in the requested order
  (files opened once, before timing). ``ours``: ``dataset[rows]``, which also converts the rows
  to the loader's batch (tensors, lists of str), with the cache off (``row_cache_bytes=0``:
  every call decodes, as the baseline does) and at its default size. One call of each first,
  not timed (the files then are in the page cache for every contender).
- slices: ``--slices`` slices of 1024 consecutive rows at random places, with the cache off
  (each slice decoded from the file: each column only from its pages that hold the slice, by
  the page index, the columns that start at different rows decoded on threads of their own),
  interleaved slice by slice with the same slices read the way before ``_parquet_range``
  (``seek_only``: each column from the page holding the first row, through ``_parquet_seek``),
  after ``--warm-slices`` untimed slices (default 0: the first reads of each file and row group,
  which decode its footer and page indexes in Python, are timed too; with a few hundred, the
  slices of a process that has used its files a while, its reader-level caches filled);
  and at random places in units already decoded and cached, median and 90th percentile ms per
  slice; and every row in order as consecutive 1024-row slices
  (default cache) against ``create_dataloader(num_workers=0, batch_size=1024)`` over the same
  rows, rows/s (the second of two rounds).

torch runs with one intra-op thread, as in a DataLoader worker: with more, each small tensor
copy of the batch conversion waits for torch's thread pool, which on a busy machine costs more
than the copy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from generate import ensure_dataset, rows_for  # noqa: E402

GATHER_ROWS = 1024
COLUMN_SETS = {"all": None, "numeric": ["id", "label", "feat"]}
#: random slices "from cached units" fall in the first rows of the dataset, whose decoded units fit
#: the default cache (4 row groups of 64Ki rows: about 120 MiB decoded)
WARM_REGION_ROWS = 4 * 65536


class HandWritten:
    """The baseline: row groups read with pyarrow, rows taken, one table in request order."""

    def __init__(self, paths: list[str], columns: list[str] | None):
        self.files = [pq.ParquetFile(path) for path in paths]
        self.columns = columns
        counts = [[f.metadata.row_group(g).num_rows for g in range(f.metadata.num_row_groups)] for f in self.files]
        self.unit_file = np.repeat(np.arange(len(counts)), [len(c) for c in counts])
        self.unit_group = np.concatenate([np.arange(len(c)) for c in counts])
        self.starts = np.concatenate([[0], np.cumsum([n for c in counts for n in c])])

    @property
    def num_rows(self) -> int:
        return int(self.starts[-1])

    def gather(self, rows: np.ndarray) -> pa.Table:
        unit = np.searchsorted(self.starts, rows, side="right") - 1
        order = np.argsort(unit, kind="stable")
        parts, positions = [], []
        for u in np.unique(unit):
            mine = order[unit[order] == u]
            table = self.files[self.unit_file[u]].read_row_group(int(self.unit_group[u]), columns=self.columns)
            parts.append(table.take(rows[mine] - self.starts[u]))
            positions.append(mine)
        gathered = pa.concat_tables(parts)
        where = np.concatenate(positions)
        inverse = np.empty(len(rows), dtype=np.int64)
        inverse[where] = np.arange(len(rows))
        return gathered.take(inverse)


def _interleaved(contenders: dict[str, Callable[[np.ndarray], Any]], requests: list[np.ndarray]) -> dict[str, float]:
    """Seconds each contender spent on all requests, call by call in turn (after one untimed call);
    the turn's first contender rotates, so that none always runs after the same one."""
    for call in contenders.values():
        call(requests[0])
    spent = dict.fromkeys(contenders, 0.0)
    names = list(contenders)
    for index, rows in enumerate(requests[1:]):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            call = contenders[name]
            started = time.perf_counter()
            call(rows)
            spent[name] += time.perf_counter() - started
    return spent


def gathers(root: str, paths: list[str], columns: list[str] | None, calls: int) -> dict:
    from torch_dataloader_utils import StructuredDataset

    baseline = HandWritten(paths, columns)
    cold = StructuredDataset(root, num_workers=0, columns=columns, row_cache_bytes=0)
    cached = StructuredDataset(root, num_workers=0, columns=columns)
    rng = np.random.default_rng(31)
    requests = [rng.integers(0, baseline.num_rows, GATHER_ROWS) for _ in range(calls + 1)]
    contenders = {"pyarrow": baseline.gather, "ours_no_cache": cold.__getitem__, "ours_default_cache": cached.__getitem__}
    spent = _interleaved(contenders, requests)
    rows = GATHER_ROWS * calls
    result = {name: {"rows_per_s": rows / seconds, "ms_per_call": 1000 * seconds / calls} for name, seconds in spent.items()}
    for name in ("ours_no_cache", "ours_default_cache"):
        result[name]["vs_pyarrow"] = result[name]["rows_per_s"] / result["pyarrow"]["rows_per_s"]
    result["ours_default_cache"]["cache_bytes"] = cached._rows.cache.limit_bytes
    return result


def _ms(seconds: list[float]) -> dict[str, float]:
    ms = 1000 * np.array(seconds)
    return {"median": float(np.median(ms)), "p90": float(np.percentile(ms, 90))}


def _seek_only(call: Callable[[], Any]) -> Any:
    """``call()`` with the page-range read off: each column decoded from the page holding the
    first row to the run's end, through ``_parquet_seek`` (the path before ``_parquet_range``)."""
    from torch_dataloader_utils.read import random_access

    kept = random_access.read_rows_conformed
    random_access.read_rows_conformed = lambda *args: None
    try:
        return call()
    finally:
        random_access.read_rows_conformed = kept


def slices(root: str, columns: list[str] | None, count: int, sequential_rows: int, warm_slices: int = 0) -> dict:
    from torch_dataloader_utils import StructuredDataset

    cold = StructuredDataset(root, num_workers=0, columns=columns, row_cache_bytes=0)
    rng = np.random.default_rng(7)
    starts = rng.integers(0, cold.num_rows - GATHER_ROWS, count + 1)
    for start in rng.integers(0, cold.num_rows - GATHER_ROWS, warm_slices):  # untimed: the files' footers, page indexes...
        cold[int(start) : int(start) + GATHER_ROWS]
    contenders = {
        "pages": lambda start: cold[start : start + GATHER_ROWS],
        "seek_only": lambda start: _seek_only(lambda: cold[start : start + GATHER_ROWS]),
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    for index, start in enumerate(starts):
        for name in list(contenders)[index % 2 :] + list(contenders)[: index % 2]:  # the first of each turn alternates
            began, began_cpu = time.perf_counter(), time.process_time()
            contenders[name](int(start))
            if index:  # the first slice of each untimed
                times[name].append(time.perf_counter() - began)
                cpu[name].append(time.process_time() - began_cpu)
    result: dict[str, Any] = {"random_1024_slice_no_cache_ms": _ms(times["pages"]), "random_1024_slice_no_cache_seek_only_ms": _ms(times["seek_only"])}
    # CPU time of the process (all its threads): the work, which a loaded machine's wait does not inflate
    result["random_1024_slice_no_cache_cpu_ms"] = _ms(cpu["pages"])
    result["random_1024_slice_no_cache_seek_only_cpu_ms"] = _ms(cpu["seek_only"])
    result["no_cache_seek_only_vs_pages_median"] = result["random_1024_slice_no_cache_seek_only_ms"]["median"] / result["random_1024_slice_no_cache_ms"]["median"]

    warm = StructuredDataset(root, num_workers=0, columns=columns)
    region = min(warm.num_rows, WARM_REGION_ROWS)
    for start in range(0, region, 32768):  # the region's units decoded and cached
        warm[start : start + 32768]
    times = []
    for start in rng.integers(0, region - GATHER_ROWS, count):
        began = time.perf_counter()
        warm[int(start) : int(start) + GATHER_ROWS]
        times.append(time.perf_counter() - began)
    result["random_1024_slice_cached_units_ms"] = _ms(times)

    total = min(cold.num_rows, sequential_rows)
    walk = StructuredDataset(root, num_workers=0, columns=columns)
    walk_s, loader_s = 0.0, 0.0
    for _ in range(2):  # the first round untimed: the page cache, the loader's start
        began = time.perf_counter()
        for start in range(0, total, GATHER_ROWS):
            walk[start : min(start + GATHER_ROWS, total)]
        walk_s = time.perf_counter() - began
        loader, _ = StructuredDataset.create_dataloader(root, num_workers=0, batch_size=GATHER_ROWS, columns=columns)
        began, seen = time.perf_counter(), 0
        for batch in loader:
            seen += len(batch["id"] if "id" in batch else next(iter(batch.values())))
            if seen >= total:
                break
        loader_s = time.perf_counter() - began
    result["sequential_slices_rows_per_s"] = total / walk_s
    result["loader_rows_per_s"] = total / loader_s
    result["sequential_vs_loader"] = loader_s / walk_s
    result["sequential_rows"] = total
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.path.join("/tmp", "tdu-random-access"))
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--calls", type=int, default=6, help="timed gathers of 1024 random rows per contender")
    parser.add_argument("--slices", type=int, default=200, help="timed random 1024-row slices")
    parser.add_argument(
        "--warm-slices", type=int, default=0, help="untimed random slices read first, as by a process that has used its files a while"
    )
    parser.add_argument("--sequential-rows", type=int, default=1 << 20, help="rows walked in order (slices and the loader)")
    parser.add_argument("--columns", choices=sorted(COLUMN_SETS), default="all")
    parser.add_argument("--parts", default="gathers,slices", help="what to measure: gathers, slices or both (comma-separated)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # as in a DataLoader worker (and run.py): small copies stay on this thread
    root = os.path.join(args.data_dir, f"{args.size_gb:g}gb")
    paths = ensure_dataset(root, args.files, rows_for(args.size_gb, args.files), 65536)
    columns = COLUMN_SETS[args.columns]
    results: dict[str, Any] = {
        "size_gb": args.size_gb,
        "load_average_at_start": os.getloadavg()[0],
        "columns": args.columns,
    }
    parts = args.parts.split(",")
    if "gathers" in parts:
        results["gathers"] = gathers(root, paths, columns, args.calls)
    if "slices" in parts:
        results["slices"] = slices(root, columns, args.slices, args.sequential_rows, args.warm_slices)
    results["load_average_at_end"] = os.getloadavg()[0]
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()

"""CSV and JSON Lines: our loader's rows/s against pyarrow reading the same files in as many
processes, and planning time with and without the cached row index.

    python benchmarks/text_formats.py [--size-mb 64] [--files 4] [--num-workers 2] [--batch-size 4096] \
        [--repeats 3] [--dir DIR] [--name text_formats]

For each format, ``--files`` files of about ``--size-mb`` MB in all (an int, a float, a short
string per row; CSV with a header) are written once under ``--dir``. Then, interleaved over
``--repeats`` rounds:

- ours: ``create_dataloader(format=..., num_workers=N, persistent_workers=True)``, the second
  epoch (the first starts the workers), every batch counted (untouched: the peer hands over
  nothing either);
- peer: N processes, each parsing its share of the files whole with ``pyarrow.csv.read_csv`` /
  ``pyarrow.json.read_json`` (``use_threads=False``, as our workers parse).

Each with all columns (the string column becomes a list of Python strings in our batches, which
the peer does not build) and with the two numeric ones (the CSV peer projects them too;
pyarrow.json cannot project).

The ratio is ours / peer (the issue's target: >= 0.8x). Planning: ``StructuredDataset(...)``
with a fresh ``cache_dir`` (the row index is built by a scan) against the same ``cache_dir``
again (the index is read from the cache). Prints a markdown table; writes JSON to
benchmarks/results/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time

import pyarrow as pa
from pyarrow import csv
from pyarrow import json as pjson

HERE = os.path.dirname(os.path.abspath(__file__))


def _write(root: str, fmt: str, files: int, size_mb: float) -> list[str]:
    """Files of about size_mb MB in all (rows of ~40 bytes), written once."""
    rows = max(1, int(size_mb * 1e6 / 40 / files))
    paths = []
    for index in range(files):
        path = os.path.join(root, f"{fmt}-{files}x{rows}", f"part-{index:03d}.{fmt}")
        paths.append(path)
        if os.path.exists(path):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        first = index * rows
        with open(path + ".tmp", "w") as handle:
            if fmt == "csv":
                handle.write("id,x,s\n")
                handle.writelines(f"{i},{i * 0.25},w{i % 977}\n" for i in range(first, first + rows))
            else:
                handle.writelines(f'{{"id":{i},"x":{i * 0.25},"s":"w{i % 977}"}}\n' for i in range(first, first + rows))
        os.replace(path + ".tmp", path)
    return paths


def _peer_read(job: tuple[str, str, list[str] | None]) -> int:
    fmt, path, columns = job
    if fmt == "csv":
        convert = csv.ConvertOptions(include_columns=columns) if columns else None
        return csv.read_csv(path, read_options=csv.ReadOptions(use_threads=False), convert_options=convert).num_rows
    return pjson.read_json(path, read_options=pjson.ReadOptions(use_threads=False)).num_rows


def peer(fmt: str, paths: list[str], processes: int, columns: list[str] | None) -> tuple[float, int]:
    """Seconds and rows of N processes parsing the files (started before the clock: a pool's start is not reading)."""
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        pool.map(abs, range(processes))
        started = time.perf_counter()
        rows = sum(pool.map(_peer_read, [(fmt, p, columns) for p in paths], chunksize=1))
        return time.perf_counter() - started, rows


def ours(fmt: str, root: str, workers: int, batch_size: int, columns: list[str] | None = None) -> tuple[float, int]:
    from torch_dataloader_utils import StructuredDataset

    loader, dataset = StructuredDataset.create_dataloader(
        root, format=fmt, num_workers=workers, batch_size=batch_size, columns=columns, persistent_workers=workers > 0
    )
    for _ in loader:  # epoch 0 starts the workers (the peer's pool is started before its clock too)
        pass
    dataset.set_epoch(1)
    started = time.perf_counter()
    rows = sum(len(batch["id"]) for batch in loader)
    return time.perf_counter() - started, rows


def planning(fmt: str, root: str) -> tuple[float, float]:
    """Seconds to plan with a fresh cache_dir (scan) and with that cache_dir again (cached index)."""
    from torch_dataloader_utils import StructuredDataset

    cache = tempfile.mkdtemp(prefix="tdu-index-")
    try:
        started = time.perf_counter()
        StructuredDataset(root, format=fmt, num_workers=0, cache_dir=cache)
        cold = time.perf_counter() - started
        started = time.perf_counter()
        StructuredDataset(root, format=fmt, num_workers=0, cache_dir=cache)
        return cold, time.perf_counter() - started
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=64.0, help="MB of text per format, in all (default 64)")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--num-workers", type=int, default=2, help="our workers, and the peer's processes")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "tdu-text-bench"))
    parser.add_argument("--name", default="text_formats")
    args = parser.parse_args()
    results = {}
    for fmt in ("csv", "jsonl"):
        paths = _write(args.dir, fmt, args.files, args.size_mb)
        root = os.path.dirname(paths[0])
        ours(fmt, root, args.num_workers, args.batch_size)  # warm-up: page cache, imports
        plans = [planning(fmt, root) for _ in range(args.repeats)]
        for columns in (None, ["id", "x"]):
            times: dict[str, list[float]] = {"ours": [], "peer": []}
            rows = 0
            for _ in range(args.repeats):
                seconds, rows = ours(fmt, root, args.num_workers, args.batch_size, columns)
                times["ours"].append(seconds)
                seconds, peer_rows = peer(fmt, paths, args.num_workers, columns)
                times["peer"].append(seconds)
                assert peer_rows == rows, (peer_rows, rows)
            ours_s, peer_s = statistics.median(times["ours"]), statistics.median(times["peer"])
            results[f"{fmt} {','.join(columns or ['id', 'x', 's'])}"] = {
                "rows": rows,
                "bytes": sum(os.path.getsize(p) for p in paths),
                "ours_rows_per_s": rows / ours_s,
                "peer_rows_per_s": rows / peer_s,
                "ratio": peer_s / ours_s,
                "plan_scan_s": statistics.median(p[0] for p in plans),
                "plan_cached_s": statistics.median(p[1] for p in plans),
            }
    print(f"| format, columns | rows | MB | ours rows/s | pyarrow x{args.num_workers} processes rows/s | ratio | plan, scan | plan, cached index |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['rows']:,} | {r['bytes'] / 1e6:.0f} | {r['ours_rows_per_s'] / 1e6:.2f}M | {r['peer_rows_per_s'] / 1e6:.2f}M "
            f"| {r['ratio']:.2f}x | {r['plan_scan_s'] * 1000:.0f} ms | {r['plan_cached_s'] * 1000:.0f} ms |"
        )
    out = os.path.join(HERE, "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{args.name}.json"), "w") as handle:
        json.dump({"config": vars(args), "results": results, "pyarrow": pa.__version__}, handle, indent=2)


if __name__ == "__main__":
    sys.exit(main())

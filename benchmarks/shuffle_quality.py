"""Shuffle quality and per-worker memory of shuffle=True, against reference orders.

Builds (once, cached) a dataset of many small Parquet files, runs the real loader
(2 worker processes) at several ``shuffle_buffer_rows`` settings and compares the
delivered order with: an ideal random permutation, split-order-only shuffling
(random order of the splits, rows in file order) and Hugging Face datasets'
streaming shuffle buffer over the same files. Ids are global row positions, so for
an output order ``ids``:

* Spearman: rank correlation of output position and original position;
* files/batch: mean number of distinct source files in each batch of 1024 rows;
* longest run: the longest stretch of output rows with ``ids[i+1] == ids[i] + 1``.

Memory per worker: the decoded Arrow bytes of the largest window (rows x bytes/row)
and the peak RSS growth of each worker process (VmHWM minus its first sampled RSS).

    python benchmarks/shuffle_quality.py [--data DIR] [--files 384] [--buffers 1,16384,65536,262144] [--chunk-rows 65536] [--no-hf]
        [--canonical-lanes 128]

``--canonical-lanes C`` also measures the loader with ``canonical_lanes=C`` (one rank), side by
side with its own order.

Prints a Markdown table and writes benchmarks/results/shuffle_quality.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from proc_stats import RssSampler

BATCH = 1024
FEAT_DIM = 64
TEXT_CHARS = 200
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BUFFER = 1 << 18


# ------------------------------------------------------------------ data
def make_file_table(index: int, rows: int) -> pa.Table:
    """Rows of file ``index``: id (global row position), label, feat[64] float32, ~200-char text."""
    rng = np.random.default_rng([7, index])
    ids = np.arange(index * rows, (index + 1) * rows, dtype=np.int64)
    feat = pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(rows * FEAT_DIM, dtype=np.float32)), FEAT_DIM)
    lengths = rng.integers(TEXT_CHARS - 20, TEXT_CHARS + 21, rows)
    letters = rng.integers(97, 123, int(lengths.sum()), dtype=np.uint8).tobytes()
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    text = pa.StringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(letters))
    label = rng.integers(0, 1000, rows, dtype=np.int32)
    return pa.table({"id": ids, "label": label, "feat": feat, "text": text})


def ensure_data(root: str, files: int, rows_per_file: int, row_group_rows: int) -> list[str]:
    """Write the dataset unless a manifest with the same parameters is there; return the paths."""
    params = {"files": files, "rows_per_file": rows_per_file, "row_group_rows": row_group_rows, "v": 1}
    manifest = os.path.join(root, "manifest.json")
    paths = [os.path.join(root, f"part-{i:05d}.parquet") for i in range(files)]
    if os.path.exists(manifest) and json.load(open(manifest)) == params and all(map(os.path.exists, paths)):
        return paths
    os.makedirs(root, exist_ok=True)
    for name in os.listdir(root):
        if name.startswith("part-"):
            os.remove(os.path.join(root, name))
    for i, path in enumerate(paths):
        pq.write_table(make_file_table(i, rows_per_file), path, row_group_size=row_group_rows, compression="zstd")
    with open(manifest, "w") as f:
        json.dump(params, f)
    return paths


def bytes_per_row(path: str) -> float:
    """Decoded Arrow bytes per row (all columns) of one file."""
    table = pq.read_table(path)
    return table.nbytes / table.num_rows


# --------------------------------------------------------------- metrics
def spearman(ids: np.ndarray) -> float:
    """Rank correlation of output position and id; ids are a permutation of 0..N-1 (ranks already)."""
    pos = np.arange(len(ids), dtype=np.float64)
    return float(np.corrcoef(pos, ids.astype(np.float64))[0, 1])


def files_per_batch(batches: Iterable[np.ndarray], rows_per_file: int) -> tuple[float, int]:
    """Mean and minimum of the distinct source files in batches of exactly BATCH rows."""
    counts = [len(np.unique(b // rows_per_file)) for b in batches if len(b) == BATCH]
    return float(np.mean(counts)), int(np.min(counts))


def longest_run(ids: np.ndarray) -> int:
    """Longest stretch of output rows that are consecutive original rows."""
    step = np.diff(ids) == 1
    if not step.any():
        return 1
    edges = np.flatnonzero(np.diff(np.concatenate([[0], step.astype(np.int8), [0]])))
    return int((edges[1::2] - edges[0::2]).max()) + 1


def cut(ids: np.ndarray) -> list[np.ndarray]:
    return [ids[i : i + BATCH] for i in range(0, len(ids), BATCH)]


def measures(batches: list[np.ndarray], rows_per_file: int, total: int) -> dict[str, Any]:
    ids = np.concatenate(batches)
    assert len(ids) == total and len(np.unique(ids)) == total, "not every row exactly once"
    mean, least = files_per_batch(batches, rows_per_file)
    return {"spearman": spearman(ids), "files_per_batch": mean, "min_files_per_batch": least, "longest_run": longest_run(ids)}


# ------------------------------------------------------ reference orders
def ideal_order(total: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 99]).permutation(total)


def split_order_only(total: int, rows_per_file: int, seed: int) -> np.ndarray:
    """Splits (here: files) in a random order, rows of each in file order."""
    files = total // rows_per_file
    order = np.random.default_rng([seed, 98]).permutation(files)
    return (order[:, None] * rows_per_file + np.arange(rows_per_file)[None, :]).ravel()


# ------------------------------------------------------- worker memory
# ------------------------------------------------------------ this loader
def run_loader(root: str, buffer_rows: int, seed: int, workers: int, **options: Any) -> tuple[list[np.ndarray], dict]:
    """All batches of epoch 0 (their ids) and the workers' memory."""
    from torch_dataloader_utils import StructuredDataset

    loader, dataset = StructuredDataset.create_dataloader(
        root, batch_size=BATCH, num_workers=workers, shuffle=True, shuffle_seed=seed, shuffle_buffer_rows=buffer_rows, **options
    )
    start = time.perf_counter()
    with RssSampler() as sampler:
        batches = [batch["id"].numpy().copy() for batch in loader]
    info = {"seconds": time.perf_counter() - start, "splits": len(dataset.splits), **sampler.summary()}
    return batches, info


def max_window_rows(buffer_rows: int, row_group_rows: int, worker_rows: int) -> int:
    """Rows of the largest window: whole row groups (all of one size here) up to the buffer, at least one."""
    return min(worker_rows, max(row_group_rows, buffer_rows // row_group_rows * row_group_rows))


# ------------------------------------------------------------ Hugging Face
def run_hf(paths: list[str], buffer_rows: int, seed: int) -> tuple[list[np.ndarray], float]:
    """Ids in the order of datasets' IterableDataset.shuffle(buffer_size) over the Parquet files."""
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.load_dataset("parquet", data_files=paths, split="train", streaming=True, columns=["id"])
    ds = ds.shuffle(seed=seed, buffer_size=buffer_rows)
    start = time.perf_counter()
    batches = [np.asarray(b["id"], dtype=np.int64) for b in ds.iter(batch_size=BATCH)]  # same order as row by row
    return batches, time.perf_counter() - start


_HF_MEMORY = r"""
import sys, psutil, datasets
datasets.disable_progress_bars()
paths, buffer = sys.argv[2:], int(sys.argv[1])
ds = datasets.load_dataset("parquet", data_files=paths, split="train", streaming=True).shuffle(seed=0, buffer_size=buffer)
it = iter(ds)
def anon():
    return sum(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(("RssAnon", "RssShmem")))
base = anon()
next(it)  # the first example comes out once the buffer is full
print(anon() - base)
"""


class HfMemory:
    """Private memory (RssAnon + RssShmem) that HF's full shuffle buffer adds, all columns, fresh processes.

    Growth is taken when the first example comes out (the buffer is then full)
    minus the growth with a one-row buffer (reader overhead).
    """

    def __init__(self, paths: list[str], rows_per_file: int):
        self.paths, self.rows_per_file = paths, rows_per_file
        self._base = self._growth(1)

    def buffer_mib(self, rows: int) -> float:
        return max(self._growth(rows) - self._base, 0) / 2**20

    def bytes_per_row(self, small: int = 32768, large: int = 131072) -> float:
        """Slope between two buffer sizes (the base cancels out)."""
        return (self._growth(large) - self._growth(small)) / (large - small)

    def _growth(self, rows: int) -> int:
        files = self.paths[: rows // self.rows_per_file + 2]
        out = subprocess.run([sys.executable, "-c", _HF_MEMORY, str(rows), *files], capture_output=True, text=True, check=True)
        return int(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ report
HEADER = [
    "| order | decoded window | worker memory | buffer memory | Spearman | files/batch (min) | longest run | time |",
    "|---|---|---|---|---|---|---|---|",
]


def mib(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.0f} MiB"


def row(r: dict[str, Any]) -> str:
    return (
        f"| {r['name']} | {r.get('window', '-')} | {mib(r.get('worker_private_growth_mib'))} | {mib(r.get('buffer_mib'))} "
        f"| {r['spearman']:+.4f} | {r['files_per_batch']:.1f} ({r['min_files_per_batch']}) | {r['longest_run']} "
        f"| {r['seconds']:.1f} s |" if "seconds" in r else
        f"| {r['name']} | {r.get('window', '-')} | - | {mib(r.get('buffer_mib'))} "
        f"| {r['spearman']:+.4f} | {r['files_per_batch']:.1f} ({r['min_files_per_batch']}) | {r['longest_run']} | - |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "tdu_shuffle_bench"))
    parser.add_argument("--files", type=int, default=384)
    parser.add_argument("--rows-per-file", type=int, default=4096)
    parser.add_argument("--row-group-rows", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--buffers", default="1,16384,65536,262144", help="shuffle_buffer_rows settings (1 is the baseline)")
    parser.add_argument("--chunk-rows", type=int, default=65536, help="the loader's chunk_rows (default 65536, the loader's default when docs/shuffling.md's table was measured)")
    parser.add_argument("--no-hf", action="store_true", help="skip Hugging Face datasets")
    parser.add_argument("--canonical-lanes", type=int, default=0, help="also measure canonical_lanes=C (docs/reproducible-order.md)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "shuffle_quality.json"))
    args = parser.parse_args(argv)
    buffers = sorted({1, *(int(b) for b in args.buffers.split(","))})
    paths = ensure_data(args.data, args.files, args.rows_per_file, args.row_group_rows)
    total, rpf = args.files * args.rows_per_file, args.rows_per_file
    row_bytes = bytes_per_row(paths[0])
    results: dict[str, Any] = {
        "dataset": {"files": args.files, "rows": total, "rows_per_file": rpf, "row_group_rows": args.row_group_rows,
                    "decoded_bytes_per_row": row_bytes, "batch_size": BATCH, "workers": args.workers, "seed": args.seed},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "arrow_pool": pa.default_memory_pool().backend_name},
        "rows": [],
    }
    table = list(HEADER)

    def add(r: dict[str, Any]) -> dict[str, Any]:
        results["rows"].append(r)
        table.append(row(r))
        print(table[-1], file=sys.stderr, flush=True)
        return r

    ideal = add({"name": "ideal random permutation", "window": "whole dataset",
                 **measures(cut(ideal_order(total, args.seed)), rpf, total)})
    split_only = add({"name": "split order only (computed)", "window": "-",
                      **measures(cut(split_order_only(total, rpf, args.seed)), rpf, total)})

    def loader_rows(label: str, **options: Any) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for buffer in buffers:
            batches, info = run_loader(args.data, buffer, args.seed, args.workers, chunk_rows=args.chunk_rows, **options)
            window = max_window_rows(buffer, args.row_group_rows, total // args.workers)
            name = f"{label}, shuffle_buffer_rows={buffer:,}" + (" (default)" if buffer == DEFAULT_BUFFER else "")
            r = {"name": name, "buffer_rows": buffer, "window_rows": window, "window_mib": window * row_bytes / 2**20,
                 "window": f"{window:,} rows = {window * row_bytes / 2**20:.0f} MiB", **measures(batches, rpf, total), **info}
            r["buffer_mib"] = r["worker_private_growth_mib"] - out[1]["worker_private_growth_mib"] if buffer > 1 else 0.0
            out[buffer] = add(r)
        return out

    mine = loader_rows("this loader")
    if args.canonical_lanes:
        lanes = args.canonical_lanes
        # a lane's windows hold buffer / C rows (whole row groups, at least one) and a worker keeps one of each lane
        for r in loader_rows(f"canonical_lanes={lanes}", canonical_lanes=lanes).values():
            r["window"] = f"{lanes} lanes, windows of {max(1, r['buffer_rows'] // lanes):,} rows (>= 1 row group)"
        table[-len(buffers):] = [row(r) for r in results["rows"][-len(buffers):]]
    splits = mine[1]["splits"]

    hf: dict[str, Any] = {}
    if not args.no_hf:
        hf_memory = HfMemory(paths, rpf)
        hf_row_bytes = hf_memory.bytes_per_row()
        results["hf_bytes_per_buffered_row"] = hf_row_bytes
        ref = mine.get(DEFAULT_BUFFER) or mine[max(mine)]
        sizes = {"equal rows": ref["buffer_rows"], "equal decoded bytes": int(ref["window_mib"] * 2**20 / hf_row_bytes)}
        if ref["buffer_rows"] in mine:
            sizes["equal buffer memory"] = int(mine[ref["buffer_rows"]]["buffer_mib"] * 2**20 / hf_row_bytes)
        for label, size in sizes.items():
            batches, seconds = run_hf(paths, size, args.seed)
            hf[label] = add({"name": f"HF datasets shuffle(buffer_size={size:,}), {label}", "buffer_rows": size,
                             "buffer_mib": hf_memory.buffer_mib(size), "seconds": seconds,
                             **measures(batches, rpf, total)})

    results["splits"] = splits
    results["spearman_split_bound"] = 1 / np.sqrt(splits)
    results["targets"] = targets(mine.get(DEFAULT_BUFFER), ideal, hf, splits)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"{args.files} files x {rpf} rows ({total:,} rows, row groups of {args.row_group_rows} rows), "
          f"{row_bytes:.0f} decoded bytes/row, {splits} splits, {args.workers} workers, batch {BATCH}, seed {args.seed}; "
          f"1/sqrt(splits) = {1 / np.sqrt(splits):.4f}; split order only measured |Spearman| = {abs(split_only['spearman']):.4f}"
          + (f"; HF's buffer costs ~{results['hf_bytes_per_buffered_row']:.0f} bytes per row (slope; sizes chosen with it, memory column measured)" if hf else "") + "\n")
    print("\n".join(table))
    print()
    for line in results["targets"]:
        print(f"- {line}")


def targets(default: dict | None, ideal: dict, hf: dict[str, dict], splits: int) -> list[str]:
    """The issue's targets at the default setting, each with its numbers and verdict."""
    out = []
    bound = 1 / np.sqrt(splits)
    for label, r in (("this loader", default),):
        if r is None:
            continue
        checks = [
            (r["worker_private_growth_mib"] < 256, f"per-worker memory < 256 MiB: +{r['worker_private_growth_mib']:.0f} MiB private "
             f"(buffer {r['buffer_mib']:.0f} MiB, decoded window {r['window_mib']:.0f} MiB)"),
            (r["files_per_batch"] >= 16, f"files/batch >= 16: {r['files_per_batch']:.1f} (min {r['min_files_per_batch']})"),
            (abs(r["spearman"]) <= bound, f"|Spearman| <= 1/sqrt(splits): {abs(r['spearman']):.4f} vs {bound:.4f}"),
            (r["longest_run"] <= 2 * ideal["longest_run"], f"longest run <= 2x ideal: {r['longest_run']} vs {ideal['longest_run']}"),
        ]
        if "equal decoded bytes" in hf:
            h = hf["equal decoded bytes"]
            checks.append((r["files_per_batch"] > h["files_per_batch"], f"more files/batch than HF at equal decoded bytes "
                           f"(our window {r['window_mib']:.0f} MiB; HF {h['buffer_rows']:,} rows, {h['buffer_mib']:.0f} MiB measured): "
                           f"{r['files_per_batch']:.1f} vs {h['files_per_batch']:.1f}"))
        if len(hf) >= 2:
            points = sorted((h["buffer_mib"], h["files_per_batch"]) for h in hf.values())
            at = float(np.interp(r["buffer_mib"], [m for m, _ in points], [f for _, f in points]))
            checks.append((r["files_per_batch"] > at, f"more files/batch than HF at equal measured buffer memory "
                           f"({r['buffer_mib']:.0f} MiB; HF interpolated between its measured rows): "
                           f"{r['files_per_batch']:.1f} vs {at:.1f}"))
        out += [f"{label}: {'MET' if ok else 'NOT MET'} - {text}" for ok, text in checks]
    return out


if __name__ == "__main__":
    main()

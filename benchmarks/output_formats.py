"""Rows per second of each output_format (and of a transform), every byte of every batch read.

    python benchmarks/output_formats.py [--size-gb 0.1] [--columns numeric|text] [--batch-size 1024] \
        [--num-workers 2] [--rounds 2] [--compare-pickle]

One epoch of generate.py's files per format, rounds interleaved after one warm-up epoch; the consumer reads every value of
every batch in the main process (``consume.read_batch`` for torch and numpy numbers; every
Python value of a list; every buffer of an Arrow batch), so a format that crosses cheaply but
leaves work to the loop does not look faster than it is. Ratios are to output_format="torch"
of the same round. ``--compare-pickle`` adds numpy and arrow batches crossing in the workers'
pickle instead of their shared buffers (read/packed_batches.py), in the same rounds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from consume import read_column  # noqa: E402
from generate import ensure_dataset, rows_for  # noqa: E402

COLUMN_SETS = {"numeric": ["id", "label", "feat"], "text": ["id", "label", "feat", "text"]}
FORMATS = ["torch", "numpy", "arrow", "dict"]


def read_value(value: Any) -> float:
    """Read every byte of one column in any output format."""
    if isinstance(value, np.ndarray) and value.dtype == object:
        return float(sum(read_value(item) if isinstance(item, np.ndarray) else len(item) for item in value if item is not None))
    if isinstance(value, (pa.Array, pa.ChunkedArray)):
        if pa.types.is_fixed_size_list(value.type) or pa.types.is_list(value.type):
            return read_value(value.flatten())
        if pa.types.is_string(value.type) or pa.types.is_binary(value.type):
            return float(pc.sum(pc.binary_length(value)).as_py() or 0)
        return float(pc.sum(value).as_py() or 0)
    if isinstance(value, list) and value and isinstance(value[0], (int, float)):
        return float(sum(value))
    if isinstance(value, list) and value and isinstance(value[0], list):
        return float(sum(sum(item) for item in value))
    return read_column(value)


def read_any(batch: Any) -> float:
    if isinstance(batch, pa.RecordBatch):
        return sum(read_value(column) for column in batch.columns)
    return sum(read_value(value) for value in batch.values())


def first_text_lengths(batch: dict) -> dict:
    """A transform: the batch with its text replaced by each string's length (a stand-in for a tokenizer)."""
    out = dict(batch)
    if "text" in out:
        out["text"] = torch.tensor([len(text) for text in batch["text"]])
    return out


def epoch(files: list[str], columns: list[str], fmt: str, batch_size: int, workers: int, transform: Any = None) -> tuple[float, int]:
    from torch_dataloader_utils import StructuredDataset

    loader, dataset = StructuredDataset.create_dataloader(
        files, columns=columns, batch_size=batch_size, num_workers=workers, output_format=fmt, transform=transform
    )
    start = time.perf_counter()
    rows = 0
    for batch in loader:
        read_any(batch)
    rows = len(dataset)
    return time.perf_counter() - start, rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=0.1)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--columns", choices=sorted(COLUMN_SETS), default="numeric")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data-dir", default=os.path.join(HERE, "results", "data-formats"))
    parser.add_argument("--compare-pickle", action="store_true", help="also numpy and arrow batches crossing pickled, as before packed_batches.py")
    args = parser.parse_args(argv)
    from torch_dataloader_utils.read import chunks

    torch.set_num_threads(1)  # as run.py: the loop's reads on its own thread, like numpy's
    files = ensure_dataset(args.data_dir, args.files, rows_for(args.size_gb, args.files), 65536)
    columns = COLUMN_SETS[args.columns]
    runs: list[tuple[str, Any, bool]] = [(fmt, None, True) for fmt in FORMATS] + [("torch", first_text_lengths, True)]
    if args.compare_pickle:
        runs += [("numpy", None, False), ("arrow", None, False)]
    packed = chunks.PACKED_FORMATS
    seconds: dict[str, list[float]] = {}
    epoch(files, columns, "torch", args.batch_size, args.num_workers)  # warm-up: page cache, imports
    rows = 0
    for _ in range(args.rounds):
        for fmt, transform, shared in runs:
            name = (fmt if transform is None else f"{fmt} + transform") + ("" if shared else " (pickled)")
            chunks.PACKED_FORMATS = packed if shared else ()  # (read when a worker packs a chunk: forked workers see it)
            took, rows = epoch(files, columns, fmt, args.batch_size, args.num_workers, transform)
            seconds.setdefault(name, []).append(took)
    base = float(np.median(seconds["torch"]))
    print(f"{rows:,} rows, columns={args.columns}, batch_size={args.batch_size}, num_workers={args.num_workers}, {args.rounds} rounds (median)")
    print("| output_format | rows/s | x torch |")
    print("|---|---|---|")
    for name, values in seconds.items():
        median = float(np.median(values))
        print(f"| {name} | {rows / median:,.0f} | {base / median:.2f} |")


if __name__ == "__main__":
    main()

"""How many rows/s the loader's main process can take in: the loader with workers whose decoding
is cached (each worker decodes a chunk of each size once and then only copies it into its shared
buffer for every later task), so that the workers are as cheap as they can be and the main
process (taking chunks in, cutting batches, the loop reading them) sets the pace. Against the
same loader decoding for real, on the same files, with persistent workers; the first epoch of each
loader (forking the workers) is left out.

    python benchmarks/main_capacity.py [--size-gb 1] [--workers 2,8] [--batch-size 4096] \
        [--columns label,feat] [--epochs 3]

On a machine of many cores this tells whether one main process can take in what many workers
decode (docs/performance.md, "Feeding a GPU"). The rows delivered are the real epoch's rows in the
real order; only their values repeat.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

import torch
from torch.utils.data import get_worker_info

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from consume import read_batch  # noqa: E402
from generate import ensure_dataset, rows_for  # noqa: E402

from torch_dataloader_utils import StructuredDataset  # noqa: E402
from torch_dataloader_utils.read import chunks  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = 8


def cached_decode(read: Callable[..., chunks.Chunk]) -> Callable[..., chunks.Chunk]:
    """``ChunkReader.read`` that, in a DataLoader worker, decodes a chunk of each row count once and
    hands its columns out again for later tasks of that count (the worker still copies them into
    its shared buffer each time). In the main process it reads as usual."""
    cache: dict[int, chunks.Chunk] = {}

    def cached(reader: chunks.ChunkReader, task: Any, joined: bool = False) -> chunks.Chunk:
        if get_worker_info() is None or not joined:
            return read(reader, task, joined)
        rows = task.stop - task.start
        if rows not in cache:
            cache[rows] = read(reader, task, joined)
        return chunks.Chunk(task.lane, task.start, task.stop, dict(cache[rows].columns))

    return cached


def epochs_rows_per_s(paths: list[str], columns: list[str], batch_size: int, workers: int, epochs: int, touch: bool) -> list[float]:
    """Rows/s of each epoch after the first of one loader with persistent workers."""
    loader, dataset = StructuredDataset.create_dataloader(paths, batch_size=batch_size, num_workers=workers, columns=columns, persistent_workers=True)
    rates = []
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        rows, start = 0, time.perf_counter()
        for batch in loader:
            if touch:
                read_batch(batch)
            rows += len(batch[columns[0]])
        if epoch:
            rates.append(rows / (time.perf_counter() - start))
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--workers", default="2,8")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--columns", default="label,feat")
    parser.add_argument("--epochs", type=int, default=3, help="per loader; the first is left out")
    parser.add_argument("--data-dir", default=os.path.join(HERE, "results", "data"))
    args = parser.parse_args(argv)
    rows = rows_for(args.size_gb, FILES)
    paths = ensure_dataset(os.path.join(args.data_dir, f"rows{rows}-rg65536"), FILES, rows, 65536)
    columns = args.columns.split(",")
    torch.set_num_threads(1)  # the loop reads on one core, as a loop feeding a GPU does
    real = chunks.ChunkReader.read
    print(f"{'workers':>7}  {'batches':<14} {'decoding':>10} {'decode cached':>14}  ratio")
    for workers in [int(w) for w in args.workers.split(",")]:
        for touch in (False, True):
            figures = []
            for cached in (False, True):
                chunks.ChunkReader.read = cached_decode(real) if cached else real  # type: ignore[method-assign]
                try:
                    figures.append(statistics.median(epochs_rows_per_s(paths, columns, args.batch_size, workers, args.epochs, touch)))
                finally:
                    chunks.ChunkReader.read = real  # type: ignore[method-assign]
            shown = "every one read" if touch else "not read"
            print(f"{workers:>7}  {shown:<14} {figures[0] / 1e6:>9.2f}M {figures[1] / 1e6:>13.2f}M  {figures[0] / figures[1]:.2f}", flush=True)


if __name__ == "__main__":
    main()

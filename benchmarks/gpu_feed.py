"""Feeding a GPU: a small-model training loop fed by this loader, against what the GPU and an
ideal feeder allow, and against a hand-written IterableDataset.

The training step is an MLP 64-1024-1024-1000 in bf16 on ``feat`` -> ``label`` (the typical
tabular / click-through shape: a small model that a slow feeder starves). Rows:

- gpu only: the step on one fixed batch already on the GPU (the bound of the step itself);
- ideal feeder: batches decoded beforehand into the loop's ordinary memory, copied with
  ``.to(device)`` each step (the bound a loop that feeds itself can see);
- this loader with pin_memory off / on, and with ``device="cuda"``, at each worker count;
- a hand-written IterableDataset (pyarrow iter_batches per file in DataLoader workers, pinned);
- loader only: this loader and a ceiling of raw pyarrow decoding in as many processes (each
  reading every batch it decodes), without a model: the same epochs for both, timed from before
  their processes start to the last row.

On a machine without CUDA only the loader-only rows run; the GPU rows are reported as skipped.

    python benchmarks/gpu_feed.py DATA_DIR [--size-gb 4] [--files 32] [--workers 2,8,15] \
        [--batch-size 4096] [--seconds 12] [--loader-epochs 3] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Iterable, Iterator

import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate import rows_for, write_file  # noqa: E402

from torch_dataloader_utils import StructuredDataset  # noqa: E402

COLUMNS = ["label", "feat"]


def ensure_data(root: str, size_gb: float, files: int) -> list[str]:
    os.makedirs(root, exist_ok=True)
    rows = rows_for(size_gb, files)
    paths = [os.path.join(root, f"part-{i:05d}.parquet") for i in range(files)]
    missing = [(p, i) for i, p in enumerate(paths) if not os.path.exists(p)]
    if missing:
        with ProcessPoolExecutor(max(1, min(len(missing), os.cpu_count() or 1))) as pool:
            list(pool.map(_write, [(p, i, rows) for p, i in missing]))
    return paths


def _write(args: tuple[str, int, int]) -> None:
    path, index, rows = args
    write_file(path, index, rows, 65536, "parquet")


# ------------------------------------------------------------------ the training step
def make_step(device: torch.device) -> Callable[[torch.Tensor, torch.Tensor], None]:
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1000)
    ).to(device=device, dtype=torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(feat: torch.Tensor, label: torch.Tensor) -> None:
        logits = model(feat.to(torch.bfloat16))
        loss = torch.nn.functional.cross_entropy(logits.float(), label.long())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def timed_loop(batches: Iterable[dict[str, Any]], step: Callable[[dict[str, Any]], None], seconds: float, warmup: int = 5) -> dict[str, float]:
    """Rows/s of ``step`` over ``batches`` after ``warmup`` batches, for about ``seconds``; and the
    loop's main-thread CPU per step."""
    iterator = iter(batches)
    for _ in range(warmup):
        step(next(iterator))
    torch.cuda.synchronize()
    rows, steps = 0, 0
    start, cpu = time.perf_counter(), time.thread_time()
    for batch in iterator:
        step(batch)
        rows += len(batch["label"])
        steps += 1
        if steps % 16 == 0 and time.perf_counter() - start > seconds:
            break
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return {"rows_per_s": rows / elapsed, "cpu_ms_per_step": (time.thread_time() - cpu) / max(1, steps) * 1e3, "steps": steps}


def on_device(device: torch.device, non_blocking: bool) -> Callable[[dict[str, Any]], dict[str, torch.Tensor]]:
    def move(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {k: batch[k].to(device, non_blocking=non_blocking) for k in COLUMNS}

    return move


def train_rows(device: torch.device, batches: Iterable[dict[str, Any]], seconds: float, move: Callable | None) -> dict[str, float]:
    step = make_step(device)

    def one(batch: dict[str, Any]) -> None:
        moved = move(batch) if move is not None else batch
        step(moved["feat"], moved["label"])

    return timed_loop(batches, one, seconds)


# ------------------------------------------------------------------ feeders
def ours(paths: list[str], batch_size: int, workers: int, **options: Any) -> Iterator[dict[str, Any]]:
    """Epoch after epoch from one loader with persistent workers, as a training job runs."""
    loader, dataset = StructuredDataset.create_dataloader(
        paths, batch_size=batch_size, num_workers=workers, columns=COLUMNS, persistent_workers=True, **options
    )
    epoch = 0
    while True:
        dataset.set_epoch(epoch)
        yield from loader
        epoch += 1


class HandWritten(IterableDataset):
    """pyarrow iter_batches over this worker's files, converted to tensors."""

    def __init__(self, paths: list[str], batch_size: int):
        self.paths, self.batch_size = paths, batch_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        mine = self.paths if info is None else self.paths[info.id :: info.num_workers]
        for path in mine:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=self.batch_size, columns=COLUMNS):
                feat = batch.column("feat")
                yield {
                    "label": torch.from_numpy(batch.column("label").to_numpy()),
                    "feat": torch.from_numpy(feat.values.to_numpy(zero_copy_only=False).reshape(len(batch), -1)),
                }


def handwritten(paths: list[str], batch_size: int, workers: int) -> Iterator[dict[str, Any]]:
    loader = DataLoader(HandWritten(paths, batch_size), batch_size=None, num_workers=workers, pin_memory=torch.cuda.is_available(), persistent_workers=True)
    while True:
        yield from loader


def ideal_batches(paths: list[str], batch_size: int, count: int) -> list[dict[str, torch.Tensor]]:
    out: list[dict[str, torch.Tensor]] = []
    for batch in HandWritten(paths[:2], batch_size):
        out.append({k: v.clone() for k, v in batch.items()})
        if len(out) == count:
            break
    return out


def cycle(items: list[dict[str, torch.Tensor]]) -> Iterator[dict[str, torch.Tensor]]:
    while True:
        yield from items


# ------------------------------------------------------------------ loader only
def read_all(batch: dict[str, Any]) -> None:
    for key in COLUMNS:
        batch[key].sum()


def loader_only(paths: list[str], batch_size: int, workers: int, epochs: int, touch: bool, mode: str = "process") -> float:
    """Rows/s of ``epochs`` epochs of this loader (persistent workers, ``set_epoch`` each epoch),
    from creating the loader to the last batch, as a training job sees them."""
    torch.set_num_threads(1)  # the reading consumer takes one core, as a loop feeding a GPU does
    rows, start = 0, time.perf_counter()
    loader, dataset = StructuredDataset.create_dataloader(
        paths, batch_size=batch_size, num_workers=workers, columns=COLUMNS, persistent_workers=True, worker_mode=mode
    )
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        for batch in loader:
            if touch:
                read_all(batch)
            rows += len(batch["label"])
    elapsed = time.perf_counter() - start
    del loader
    return rows / elapsed


def deal_row_groups(paths: list[str], workers: int) -> list[list[tuple[str, int]]]:
    """The row groups of ``paths``, file after file, dealt round robin to ``workers`` shares."""
    groups = [(path, group) for path in paths for group in range(pq.ParquetFile(path).metadata.num_row_groups)]
    return [groups[w::workers] for w in range(workers)]


def _ceiling_share(args: tuple[list[tuple[str, int]], int]) -> int:
    """Decode one process's row groups into tensors and read every batch; its rows."""
    groups, batch_size = args
    torch.set_num_threads(1)
    rows, files = 0, {}
    for path, group in groups:
        source = files.get(path) or files.setdefault(path, pq.ParquetFile(path))
        for batch in source.iter_batches(batch_size=batch_size, row_groups=[group], columns=COLUMNS, use_threads=False):
            read_all({"label": torch.from_numpy(batch.column("label").to_numpy()), "feat": torch.from_numpy(batch.column("feat").values.to_numpy())})
            rows += len(batch)
    return rows


def ceiling(paths: list[str], batch_size: int, workers: int, epochs: int) -> float:
    """Rows/s of raw pyarrow decoding in ``workers`` forked processes that read every batch they
    decode, over the same epochs as ``loader_only`` and timed the same way (from before the
    processes start to the last row): each epoch the row groups are dealt round robin (the most
    even share), and the processes, kept from one epoch to the next, finish it before the next
    starts, as the loader's persistent workers do."""
    shares = [(share, batch_size) for share in deal_row_groups(paths, workers)]
    rows, start = 0, time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        for _ in range(epochs):
            rows += sum(pool.map(_ceiling_share, shares))
    return rows / (time.perf_counter() - start)


# ------------------------------------------------------------------ driver
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data")
    parser.add_argument("--size-gb", type=float, default=4.0)
    parser.add_argument("--files", type=int, default=32)
    parser.add_argument("--workers", default="2,8,15")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--seconds", type=float, default=12.0, help="per training-loop row")
    parser.add_argument("--loader-epochs", type=int, default=3, help="epochs of the data per loader-only row")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    paths = ensure_data(args.data, args.size_gb, args.files)
    workers = [int(w) for w in args.workers.split(",")]
    cuda = torch.cuda.is_available()
    device = torch.device("cuda") if cuda else None
    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name() if cuda else None, "cpus": os.cpu_count(), "batch_size": args.batch_size, "rows": {}}
    table: list[tuple[str, str]] = []

    def record(name: str, value: dict[str, float] | float | None, note: str = "") -> None:
        results["rows"][name] = value
        if value is None:
            shown = "skipped (no CUDA)"
        elif isinstance(value, dict):
            shown = f"{value['rows_per_s'] / 1e6:6.2f}M rows/s  {value['cpu_ms_per_step']:5.2f} ms CPU/step"
        else:
            shown = f"{value / 1e6:6.2f}M rows/s"
        table.append((name, shown + note))
        print(f"{name:<40} {shown}{note}", flush=True)

    seconds = args.seconds
    if cuda:
        assert device is not None
        fixed = {k: v.to(device) for k, v in ideal_batches(paths, args.batch_size, 1)[0].items()}
        record("gpu only (fixed batch on the GPU)", train_rows(device, cycle([fixed]), seconds / 2, None))
        ideal = ideal_batches(paths, args.batch_size, 256)
        record("ideal feeder (pageable .to)", train_rows(device, cycle(ideal), seconds, on_device(device, False)))
        pinned = [{k: v.pin_memory() for k, v in b.items()} for b in ideal]
        record("ideal feeder (pinned, non_blocking)", train_rows(device, cycle(pinned), seconds, on_device(device, True)))
    else:
        for name in ("gpu only (fixed batch on the GPU)", "ideal feeder (pageable .to)", "ideal feeder (pinned, non_blocking)"):
            record(name, None)
    for w in workers:
        if cuda:
            assert device is not None
            record(f"ours w={w} pin_memory=False", train_rows(device, ours(paths, args.batch_size, w), seconds, on_device(device, False)))
            record(f"ours w={w} pin_memory=True", train_rows(device, ours(paths, args.batch_size, w, pin_memory=True), seconds, on_device(device, True)))
            record(f"ours w={w} device='cuda'", train_rows(device, ours(paths, args.batch_size, w, device="cuda"), seconds, None))
            threaded = ours(paths, args.batch_size, w, device="cuda", worker_mode="thread")
            record(f"ours w={w} device='cuda' worker_mode='thread'", train_rows(device, threaded, seconds, None))
            record(f"hand-written IterableDataset w={w}", train_rows(device, handwritten(paths, args.batch_size, w), seconds, on_device(device, True)))
        else:
            for name in ("pin_memory=False", "pin_memory=True", "device='cuda'", "device='cuda' worker_mode='thread'"):
                record(f"ours w={w} {name}", None)
            record(f"hand-written IterableDataset w={w}", None)
    for w in [w for w in workers if w >= 8] or workers[-1:]:
        top = ceiling(paths, args.batch_size, w, args.loader_epochs)
        untouched, touched = (loader_only(paths, args.batch_size, w, args.loader_epochs, touch) for touch in (False, True))
        record(f"loader only: ours w={w}, batches not read", untouched, f"  ({untouched / top:.2f}x of the ceiling)")
        record(f"loader only: ours w={w}, every batch read", touched, f"  ({touched / top:.2f}x of the ceiling)")
        threaded = loader_only(paths, args.batch_size, w, args.loader_epochs, True, "thread")
        record(f"loader only: ours w={w} threads, every batch read", threaded, f"  ({threaded / top:.2f}x of the ceiling)")
        record(f"loader only: ceiling, {w} processes reading", top)
    if cuda:
        rows = results["rows"]
        for w in workers:
            for name in ("pin_memory=False", "pin_memory=True", "device='cuda'", "device='cuda' worker_mode='thread'"):
                value = rows[f"ours w={w} {name}"]
                ratio = value["rows_per_s"] / rows["ideal feeder (pinned, non_blocking)"]["rows_per_s"]
                print(f"ours w={w} {name}: {ratio:.2f}x of the ideal feeder (pinned)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

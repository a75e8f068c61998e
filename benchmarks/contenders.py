"""The contenders and the ideal feeder behind one interface: ``start(cfg, state) -> (batches, save_state)``.

``batches`` yields dicts of tensors / lists (or, for the ceiling, a row count per decoded
batch); ``save_state()`` returns a picklable resume state taken after the batches
received so far. Optional dependencies are imported inside each contender. The training loop's
reading of the batches (``consume.read_batch``) is run.py's, except in the ceiling, which reads
what it decodes in the processes that decode it (``touch=True``).
"""

from __future__ import annotations

import ctypes
import math
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from consume import read_batch, slices
from torch.utils.data import Dataset, IterableDataset, get_worker_info

warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
Started = tuple[Iterable[Any], Callable[[], Any]]


@dataclass
class Config:
    files: list[str]
    columns: list[str]
    batch_size: int = 1024
    num_workers: int = 2


def one_array(column: pa.ChunkedArray) -> pa.Array:
    """``combine_chunks`` copies even a single chunk."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def to_torch(table: pa.Table | pa.RecordBatch) -> dict[str, Any]:
    """What a user writes: numbers and fixed-size lists to tensors (zero-copy), strings to list[str]."""
    out: dict[str, Any] = {}
    for name in table.column_names:
        array = table.column(name)
        if isinstance(array, pa.ChunkedArray):
            array = one_array(array)
        if pa.types.is_string(array.type):
            out[name] = array.to_pylist()
        elif pa.types.is_fixed_size_list(array.type) or pa.types.is_list(array.type):
            values = torch.from_numpy(array.flatten().to_numpy(zero_copy_only=False))
            out[name] = values.reshape(len(array), -1)
        else:
            out[name] = torch.from_numpy(array.to_numpy(zero_copy_only=False))
    return out


def _my_files(files: list[str]) -> tuple[list[str], int]:
    """This DataLoader worker's files (round robin) and the worker count."""
    info = get_worker_info()
    worker, workers = (info.id, info.num_workers) if info else (0, 1)
    return files[worker::workers], workers


# ----------------------------------------------------------------- (a) ceiling
CEILING_BATCH_ROWS = 16384  # iter_batches at 16,384 rows decoded faster than read_row_group (text: 1.7 vs 2.5 CPU s)


def _decode_files(files: list[str], columns: list[str], touch: bool, batch_size: int, queue: Any) -> None:
    """Decode ``files`` into tensors; with ``touch``, read them too, as the training loop reads
    (``read_batch`` on each ``batch_size``-row slice, so that the ceiling pays as many reads of
    the same size as a loop that gets batches of ``batch_size``)."""
    torch.set_num_threads(1)  # as in a DataLoader worker
    if sys.platform.startswith("linux"):  # as (d)'s workers do (PR_SET_THP_DISABLE): text decodes ~7% cheaper
        ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)
    for path in files:
        source = pq.ParquetFile(path)
        for group in range(source.metadata.num_row_groups):
            for batch in source.iter_batches(batch_size=CEILING_BATCH_ROWS, row_groups=[group], columns=columns, use_threads=False):
                tensors = to_torch(batch)
                if touch:
                    for part in slices(tensors, batch.num_rows, batch_size):
                        read_batch(part)
                queue.put(batch.num_rows)  # per decoded batch, so its first batch means what (d)'s does
    queue.put(None)


def _from_processes(target: Callable[..., None], args_per_worker: list[tuple]) -> Iterator[int]:
    """Fork one process per ``args_per_worker`` entry running ``target(*args, queue)``; yield
    what they put on the queue until each has put ``None``, then join them."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, queue)) for args in args_per_worker]
    for proc in procs:
        proc.start()
    running = len(procs)
    while running:
        item = queue.get()
        if item is None:
            running -= 1
        else:
            yield item
    for proc in procs:
        proc.join()


def start_ceiling(cfg: Config, state: Any = None, touch: bool = True) -> Started:
    """Raw decode into tensors in num_workers processes, read there when ``touch``; nothing
    crosses a process boundary."""
    workers = max(1, cfg.num_workers)
    args = [(cfg.files[w::workers], cfg.columns, touch, cfg.batch_size) for w in range(workers)]
    return _from_processes(_decode_files, args), lambda: None


# --------------------------------------------------------- (b) hand-written
class HandWrittenDataset(IterableDataset):
    """Files round robin over workers, ``iter_batches`` per file; resume skips each worker's
    share of the delivered batches (whole row groups by metadata, then the rest decoded and dropped)."""

    def __init__(self, cfg: Config, skip_batches: int = 0):
        self.cfg = cfg
        self.skip_batches = skip_batches

    def __iter__(self) -> Iterator[dict[str, Any]]:
        files, workers = _my_files(self.cfg.files)
        worker = get_worker_info().id if get_worker_info() else 0
        skip = self.skip_batches // workers + (worker < self.skip_batches % workers)  # DataLoader's round robin
        size = self.cfg.batch_size
        for path in files:
            source = pq.ParquetFile(path)
            meta = source.metadata
            batches = math.ceil(meta.num_rows / size)
            if skip >= batches:
                skip -= batches
                continue
            rows, skip, first = skip * size, 0, 0
            while rows >= meta.row_group(first).num_rows:
                rows -= meta.row_group(first).num_rows
                first += 1
            groups = range(first, meta.num_row_groups)
            for batch in source.iter_batches(batch_size=size, row_groups=groups, columns=self.cfg.columns, use_threads=False):
                if rows >= batch.num_rows:
                    rows -= batch.num_rows
                    continue
                yield to_torch(batch.slice(rows))
                rows = 0


def start_handwritten(cfg: Config, state: Any = None) -> Started:
    from torch.utils.data import DataLoader

    skipped = state or 0
    loader = DataLoader(HandWrittenDataset(cfg, skipped), batch_size=None, num_workers=cfg.num_workers)
    delivered = [skipped]

    def batches() -> Iterator[dict[str, Any]]:
        for batch in loader:
            delivered[0] += 1
            yield batch

    return batches(), lambda: delivered[0]


# ------------------------------------------- (c) Hugging Face datasets streaming
def _hf_collate(table: pa.Table) -> dict[str, Any]:
    """``ds.batch(n)`` in arrow format yields one row of lists: flatten, then convert."""
    return to_torch(pa.table({name: one_array(table.column(name)).flatten() for name in table.column_names}))


def start_hf(cfg: Config, state: Any = None) -> Started:
    """``load_dataset("parquet", streaming=True)`` batched in arrow format, StatefulDataLoader for resume.
    (``with_format("torch")`` + per-row collation, the documented default, runs at ~3k rows/s here.)"""
    import datasets
    from torchdata.stateful_dataloader import StatefulDataLoader

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    stream = datasets.load_dataset("parquet", data_files=cfg.files, split="train", streaming=True, columns=cfg.columns)
    batched = stream.batch(cfg.batch_size).with_format("arrow")
    loader = StatefulDataLoader(batched, batch_size=None, num_workers=cfg.num_workers, collate_fn=_hf_collate)
    if state is not None:
        loader.load_state_dict(state)
    return loader, loader.state_dict


# ------------------------------------------------------------ (d) this library
def start_ours(cfg: Config, state: Any = None, **options: Any) -> Started:
    from torch_dataloader_utils import StructuredDataset

    loader, dataset = StructuredDataset.create_dataloader(
        cfg.files, batch_size=cfg.batch_size, num_workers=cfg.num_workers, columns=cfg.columns, **options
    )
    if state is not None:
        dataset.load_state_dict(state)
    return loader, dataset.state_dict


def start_ours_threads(cfg: Config, state: Any = None, **options: Any) -> Started:
    """(d) with its readers as threads of the loop's process instead of worker processes."""
    return start_ours(cfg, state, worker_mode="thread", **options)


# ------------------------------------------------------------- the ideal feeder
def prepare_ideal(cfg: Config) -> list[dict[str, Any]]:
    """The epoch's batches (``batch_size`` rows, file after file), decoded in this process
    before the clock starts and copied into memory of its own (``clone``: torch's allocator,
    pages already faulted in), as a loader that costs the training loop nothing would hand them
    over. Not cache-warm: the set is far larger than the caches, as the loaders' batches are."""
    out = []
    for path in cfg.files:
        source = pq.ParquetFile(path)
        for batch in source.iter_batches(batch_size=cfg.batch_size, columns=cfg.columns, use_threads=False):
            out.append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in to_torch(batch).items()})
    return out


def start_ideal(cfg: Config, state: Any = None, prepared: list[dict[str, Any]] | None = None) -> Started:
    """The batches ``prepare_ideal`` made, handed over one by one: the upper bound a training
    loop can see (its own reading of ordinary memory, nothing else)."""
    return iter(prepared if prepared is not None else prepare_ideal(cfg)), lambda: None


# ------------------------------------- references: the scaffolding, nothing read
def _send_nothing(items: int, queue: Any) -> None:
    for _ in range(items):
        queue.put(0)
    queue.put(None)


def start_bare_processes(cfg: Config, state: Any = None) -> Started:
    """The ceiling's scaffolding alone: num_workers processes that each send one empty item per
    file of theirs through the queue."""
    workers = max(1, cfg.num_workers)
    return _from_processes(_send_nothing, [(len(cfg.files[w::workers]),) for w in range(workers)]), lambda: None


class _Nothing(Dataset):
    def __init__(self, items: int):
        self.items = items

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> int:
        return 0


def start_bare_dataloader(cfg: Config, state: Any = None) -> Started:
    """A torch DataLoader's scaffolding alone: num_workers workers, one empty item per file."""
    from torch.utils.data import DataLoader

    return DataLoader(_Nothing(len(cfg.files)), batch_size=None, num_workers=cfg.num_workers), lambda: None


CONTENDERS: dict[str, Callable[..., Started]] = {
    "a_ceiling": start_ceiling,
    "b_handwritten": start_handwritten,
    "c_hf_datasets": start_hf,
    "d_this_library": start_ours,
    "e_reader_threads": start_ours_threads,
    "i_ideal_feeder": start_ideal,
}
# not in the table: what an epoch with nothing to read costs (run.py's fixed-cost line)
REFERENCES: dict[str, Callable[..., Started]] = {
    "x_bare_processes": start_bare_processes,
    "x_bare_dataloader": start_bare_dataloader,
}
def warm_hf(cfg: Config) -> None:
    """The first load_dataset of a process imports ~270 more modules (0.1 s): not part of any batch."""
    import datasets

    datasets.disable_progress_bars()
    datasets.load_dataset("parquet", data_files=cfg.files[:1], split="train", streaming=True, columns=cfg.columns)


# run before the clock starts, like the imports
WARMUPS: dict[str, Callable[[Config], None]] = {"c_hf_datasets": warm_hf}
# run before the clock starts; what they return is passed to the contender's start as ``prepared``
PREPARES: dict[str, Callable[[Config], Any]] = {"i_ideal_feeder": prepare_ideal}
# read what they decode in their own processes (their start takes ``touch``), not in run.py's loop
READS_IN_WORKERS = ("a_ceiling",)
# have no untouched figure (an ideal feeder that nobody reads measures nothing)
TOUCHED_ONLY = ("i_ideal_feeder",)
# imported before the clock starts (pyarrow imports pandas lazily, in whichever process converts first)
IMPORTS: dict[str, tuple[str, ...]] = {
    "a_ceiling": ("pandas",),
    "b_handwritten": ("pandas",),
    "c_hf_datasets": ("pandas", "datasets", "torchdata.stateful_dataloader"),
    "i_ideal_feeder": ("pandas",),
    "d_this_library": (
        "pandas",
        "torch_dataloader_utils.dataset",
        "torch_dataloader_utils.runtime.loader",
        "torch_dataloader_utils.formats.parquet",  # imported by the first plan, like (a)'s and (b)'s pyarrow.parquet here
        "fsspec.implementations.local",
        "pyarrow.fs",
        "pyarrow.pandas_compat",  # imported by the loader's first numpy conversion in the main process
        "pyarrow.vendored.version",
    ),
}
IMPORTS["e_reader_threads"] = IMPORTS["d_this_library"]
LABELS = {
    "a_ceiling": "(a) pyarrow ceiling",
    "b_handwritten": "(b) hand-written IterableDataset",
    "c_hf_datasets": "(c) HF datasets + StatefulDataLoader",
    "d_this_library": "(d) torch_dataloader_utils",
    "e_reader_threads": "(e) torch_dataloader_utils, worker_mode=\"thread\"",
    "i_ideal_feeder": "ideal feeder (pre-decoded, in memory)",
}

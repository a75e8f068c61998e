"""StructuredDataset: the plan, the progress of one rank, and reading in any process."""

from __future__ import annotations

import hashlib
import json
import logging
import operator
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .catalog.build import Catalog, build_catalog
from .read.convert import Where, check_batch_forms, replace_leaves, slice_columns, table_to_columns, table_to_joined
from .state.elastic import check_global, deal, merge_states, rank_part, rank_parts, remaining_units, topology_changed, uneven_steps
from .plan.lanes import Lane, Segment, StreamBook
from .plan.splits import DEFAULT_SPLIT_BYTES, MAX_ROW_COUNT, MAX_SEED_WORD, MAX_SPLIT_BYTES, Split
from .read.reader import StreamReader
from .storage.remote import IOOptions
from .catalog.schema import check_missing_columns, check_repeated_columns
from .runtime.stats import LoaderStats
from .state.checkpoint import (
    MAX_EPOCH,
    RankProgress,
    build_rank_state,
    build_worker_state,
    check_header,
    is_count,
    is_integer,
    mismatch,
    validate_rank_state,
    validate_worker_state,
)
from .plan.schedule import PADDING_LANE, ChunkTask, cap_batches, lane_schedule, padding_schedule, quick_start

log = logging.getLogger(__name__)

DEFAULT_SHUFFLE_BUFFER_ROWS = 1 << 18
DEFAULT_CHUNK_ROWS = 1 << 15  # measured: fewer crossings of the DataLoader than 16384 (-5% CPU on 2 cores), half as much in flight as 65536
# Where chunks are copied into shared buffers (workers, read_chunk(joined=True)), streamed
# Parquet pieces decode in batches of this many rows and a chunk joins several: that costs
# nothing extra there, and the decoder's buffers stay small and are reused instead of faulted
# in anew. Measured (0.5 GiB numeric, 7 epochs): worker page faults 54.5k -> 42.3k, epoch
# 0.713 -> 0.672 s. Elsewhere a chunk of one decoded batch needs no copy, so the decode batch
# is the chunk.
WORKER_DECODE_ROWS = 1 << 12
EQUALIZE_POLICIES = ("pad", "drop", "none")
# DataLoader arguments the loader sets itself (create_dataloader refuses them by name)
_FIXED_LOADER_OPTIONS = {"collate_fn", "worker_init_fn", "sampler", "batch_sampler", "generator", "in_order"}
ON_ERROR_POLICIES = ("raise", "skip")


@dataclass
class Chunk:
    """Converted rows [start, stop) of one lane, sent from a worker to the main process."""

    lane: int
    start: int
    stop: int
    columns: dict[str, Any]
    present: np.ndarray | None = None  # offsets (from start) of the rows read, when some were skipped
    skipped: dict[int, str] = field(default_factory=dict)  # split -> error, with on_error="skip"

    @property
    def num_read(self) -> int:
        return self.stop - self.start if self.present is None else len(self.present)

    def pin_memory(self) -> Chunk:
        """The chunk with its tensors in pinned memory (the DataLoader's pin_memory=True calls
        this in its pinning thread); its batches are then views of pinned memory."""
        columns = {name: replace_leaves(value, torch.Tensor, torch.Tensor.pin_memory) for name, value in self.columns.items()}
        return Chunk(self.lane, self.start, self.stop, columns, self.present, self.skipped)

    def batches(self, size: int, where: Where | None = None) -> Iterator[tuple[dict[str, Any], int]]:
        """(batch, lane row after it); the last batch also passes any skipped rows at the end.
        ``where`` describes the chunk's rows for an error message."""
        read = self.num_read
        for offset in range(0, read, size):
            stop = min(offset + size, read)
            if stop == read:
                end = self.stop
            else:
                end = self.start + (stop if self.present is None else int(self.present[stop - 1]) + 1)
            yield slice_columns(self.columns, offset, stop, where), end


def _deal_digest(lanes: list[Lane] | None, target: int | None) -> str | None:
    """A digest of the lanes and batch target an elastic resume set (None: the planned ones): a
    worker state's rows_delivered counts along its lane, so it fits only the same deal."""
    if lanes is None and target is None:
        return None
    text = json.dumps({"lanes": None if lanes is None else [[s.to_list() for s in lane.segments] for lane in lanes], "batch_target": target})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _integer(name: str, value: Any) -> int:
    """``value`` as an int (numpy and torch integers too); a ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return operator.index(value)


def _boolean(name: str, value: Any) -> bool:
    """``value`` as a bool (numpy's, 0 and 1 too); a ValueError naming ``name`` otherwise (it is
    saved in the state and compared at a resume, so "yes" must not pass as true)."""
    if not isinstance(value, (bool, np.bool_, int, np.integer)) or value not in (0, 1):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _at_least(name: str, value: Any, least: int, most: int | None = None) -> int:
    """``value`` as an int >= ``least`` (and <= ``most``); a ValueError naming ``name`` otherwise."""
    value = _integer(name, value)
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")
    if most is not None and value > most:
        raise ValueError(f"{name} must be <= {most:,}, got {value}")
    return value


def default_topology(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world_size): the given values, else torch.distributed's when initialized, else (0, 1)."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        initialized = dist.is_available() and dist.is_initialized()
        if not initialized:
            _warn_if_launched_without_process_group()
        if rank is None:
            rank = dist.get_rank() if initialized else 0
        if world_size is None:
            world_size = dist.get_world_size() if initialized else 1
    rank, world_size = _integer("rank", rank), _integer("world_size", world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size): got rank={rank}, world_size={world_size}")
    return rank, world_size


def _warn_if_launched_without_process_group() -> None:
    launched = os.environ.get("WORLD_SIZE", "1")
    if launched.isdigit() and int(launched) > 1:
        log.warning(
            "WORLD_SIZE=%s is set but torch.distributed is not initialized, so this process reads every row as rank 0 "
            "of 1 (each process would deliver the whole epoch). Call torch.distributed.init_process_group() before "
            "creating the dataset, or pass rank= and world_size=",
            launched,
        )


def _round_robin_counts(batches: Sequence[int], total: int) -> list[int]:
    """How many of the first ``total`` batches of a round-robin over workers each worker gives."""
    counts, turn = [0] * len(batches), 0
    while total > 0 and any(n > turn for n in batches):
        for worker, n in enumerate(batches):
            if n > turn and total > 0:
                counts[worker] += 1
                total -= 1
        turn += 1
    return counts


class StructuredDataset(IterableDataset):
    """Parquet or ORC files as a stream of batches (dicts of tensors) with exact resume.

    Use ``StructuredDataset.create_dataloader(...)`` for the fast loader. The dataset
    is also an ``IterableDataset`` of batches for torchdata's ``StatefulDataLoader``
    (``batch_size=None``, ``num_workers`` equal to the dataset's) or direct iteration.

    Under DDP every rank delivers the same number of batches: ``equalize="pad"``
    (default) repeats rows of the rank's own epoch at its end, ``"drop"`` stops every
    rank at the smallest count, ``"none"`` leaves counts as they fall.
    """

    def __init__(
        self,
        path: str | Sequence[str],
        format: str | None = "parquet",
        *,
        batch_size: int = 1024,
        num_workers: int = 2,
        shuffle: bool = False,
        shuffle_seed: int = 0,
        columns: Sequence[str] | None = None,
        split_bytes: int = DEFAULT_SPLIT_BYTES,
        rank: int | None = None,
        world_size: int | None = None,
        storage_options: dict | None = None,
        drop_last: bool = False,
        equalize: str = "pad",
        on_error: str = "raise",
        shuffle_buffer_rows: int = DEFAULT_SHUFFLE_BUFFER_ROWS,
        chunk_rows: int = DEFAULT_CHUNK_ROWS,
        download_retry: int = 2,
        download_timeout: float | None = 60.0,
        cache_dir: str | None = None,
        cache_limit_bytes: int | None = None,
    ):
        batch_size = _at_least("batch_size", batch_size, 1, MAX_ROW_COUNT)
        shuffle, drop_last = _boolean("shuffle", shuffle), _boolean("drop_last", drop_last)
        num_workers = _at_least("num_workers", num_workers, 0)
        shuffle_seed = _at_least("shuffle_seed", shuffle_seed, 0)
        if shuffle and shuffle_seed > MAX_SEED_WORD:  # a larger seed would give the order of another (seed, epoch)
            raise ValueError(
                f"shuffle_seed must be <= {MAX_SEED_WORD} (32 bits) with shuffle=True, got {shuffle_seed}; e.g. use seed % 2**32 "
                "(a checkpoint an earlier version saved with a larger seed cannot be resumed exactly: start its epoch fresh)"
            )
        shuffle_buffer_rows = _at_least("shuffle_buffer_rows", shuffle_buffer_rows, 1, MAX_ROW_COUNT)
        chunk_rows = _at_least("chunk_rows", chunk_rows, 1, MAX_ROW_COUNT)
        split_bytes = _at_least("split_bytes", split_bytes, 1, MAX_SPLIT_BYTES)
        if isinstance(columns, (str, bytes)):
            raise ValueError(f"columns must be a list of column names, got {columns!r}; e.g. columns=[{columns!r}]")
        if columns is not None and not list(columns):
            raise ValueError(f"columns must be a non-empty list of column names, got {columns!r}; pass None for all columns")
        if equalize not in EQUALIZE_POLICIES:
            raise ValueError(f"equalize must be one of {EQUALIZE_POLICIES}, got {equalize!r}")
        if on_error not in ON_ERROR_POLICIES:
            raise ValueError(f"on_error must be one of {ON_ERROR_POLICIES}, got {on_error!r}")
        topology = default_topology(rank, world_size)
        self.rank: int = topology[0]
        """This process's rank (given, or torch.distributed's when it is initialized, else 0)."""
        self.world_size: int = topology[1]
        """The number of ranks (given, or torch.distributed's when it is initialized, else 1)."""
        if on_error == "skip" and self.world_size > 1 and equalize != "none":
            raise ValueError(
                "on_error='skip' can leave ranks with different batch counts, which would hang DDP; "
                "use on_error='raise', or equalize='none' and handle uneven ends yourself (e.g. torch's Join)"
            )
        self.batch_size = batch_size
        """Rows per batch."""
        self.num_workers = num_workers
        """DataLoader worker processes per rank (0: read in the main process); part of the plan."""
        self.shuffle = shuffle
        self.shuffle_seed = shuffle_seed
        self.columns = list(columns) if columns is not None else None
        self.drop_last = drop_last
        self.equalize = equalize
        self.on_error = on_error
        self.shuffle_buffer_rows = shuffle_buffer_rows
        self.chunk_rows = batch_size * max(1, chunk_rows // batch_size)
        self._catalog: Catalog = build_catalog(
            path, format, storage_options, split_bytes, IOOptions(download_retry, download_timeout, cache_dir, cache_limit_bytes)
        )
        self._check_columns()
        self._book = StreamBook(self._catalog.split_rows, self._catalog.file_offsets, shuffle, shuffle_seed, shuffle_buffer_rows)
        self._epoch = 0
        self._pass = (0, "")  # (number, what started it): an iterator delivers only while its pass is current
        self._reset_progress()
        self._epoch_cell = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._reader: StreamReader | None = None
        self.last_batch_is_padding = False
        """Whether the batch just delivered repeats rows to give every rank the same batch count
        (equalize="pad"): such a batch is not progress. See docs/ddp.md."""
        self._worker_passes = 0  # passes this copy started inside a DataLoader worker
        self._restored_epoch: int | None = None  # epoch of a worker state loaded since the last pass
        self._digest: tuple[Catalog, str] | None = None
        self._warned_repeat = False  # "epoch is read again" was logged
        self._epoch_set_since_load = True  # set_epoch was called after the last load_state_dict (or none came)
        self._warned_drop = False  # "equalize='drop' leaves out most of this rank's batches" was logged
        self._canonical_target: tuple[int, int] | None = None  # (epoch, batches every rank delivers) of the plan

    # ----------------------------------------------------------- public API
    @classmethod
    def create_dataloader(cls, path: str | Sequence[str], format: str | None = "parquet", **kwargs: Any):
        """Build the dataset and its loader; returns ``(loader, dataset)``.

        Takes the dataset's arguments plus the DataLoader's ``pin_memory``,
        ``prefetch_factor``, ``persistent_workers``, ``timeout`` and
        ``multiprocessing_context``.
        """
        from .runtime.loader import StructuredDataLoader

        loader_keys = ("pin_memory", "prefetch_factor", "persistent_workers", "timeout", "multiprocessing_context")
        loader_kwargs = {k: kwargs.pop(k) for k in loader_keys if k in kwargs}
        fixed = sorted(set(kwargs) & _FIXED_LOADER_OPTIONS)
        if fixed:
            raise TypeError(
                f"create_dataloader does not take the DataLoader option(s) {fixed}: the loader sets them itself "
                f"(batches come from the dataset's batch_size, order from its plan). It takes {list(loader_keys)}; "
                "for a DataLoader of your own, see docs/stateful-dataloader.md"
            )
        dataset = cls(path, format, **kwargs)
        return StructuredDataLoader(dataset, **loader_kwargs), dataset

    @property
    def epoch(self) -> int:
        """The epoch being read: the one set_epoch selected, or the one load_state_dict restored."""
        return self._epoch

    @property
    def logical_workers(self) -> int:
        """Lanes per rank: num_workers, or 1 when reading in the main process."""
        return max(1, self.num_workers)

    @property
    def splits(self) -> list[Split]:
        """The planned splits (all ranks), in file order."""
        return list(self._catalog.splits)

    @property
    def files(self) -> list[str]:
        """The dataset's files (URLs), in plan order."""
        return [f.url for f in self._catalog.files]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to read. The current epoch keeps its progress (one restored by
        load_state_dict, or one a loop left part-way); any other epoch starts fresh."""
        epoch = _integer("epoch", epoch)
        if not 0 <= epoch <= MAX_EPOCH:
            raise ValueError(f"epoch must be in [0, {MAX_EPOCH}], got {epoch}")
        self._epoch_set_since_load = True
        if epoch != self._epoch:
            if self._just_restored and self._restored_partly():
                log.warning(
                    "set_epoch(%d) drops the progress load_state_dict restored for epoch %d, whose remaining rows are "
                    "then never delivered. To continue the restored epoch, start your epoch loop at dataset.epoch: "
                    "for epoch in range(dataset.epoch, num_epochs)",
                    epoch,
                    self._epoch,
                )
            self._epoch = epoch
            self._reset_progress()
        self._epoch_cell[0] = epoch

    def __len__(self) -> int:
        """Rows this rank delivers in the current epoch (padding included)."""
        schedule = self._schedule([0] * self.logical_workers, 0, 0, keep_slots=False)
        return sum(stop - start for _, start, stop in schedule)

    def num_batches(self) -> int:
        """Batches this rank delivers in the current epoch (padding included)."""
        schedule = self._schedule([0] * self.logical_workers, 0, 0, keep_slots=False)
        return sum(-(-(stop - start) // self.batch_size) for _, start, stop in schedule)

    def state_dict(self) -> dict:
        """JSON-serializable progress: a rank state in the main process, a worker state inside a worker."""
        info = get_worker_info()
        if info is not None:
            self._check_loader_workers(info.num_workers)
            return build_worker_state(self._config(), self._files_digest(), self._epoch, info.id, self._positions[info.id], self._deal)
        progress = RankProgress(self._epoch, self._lanes_override, list(self._positions), self._next_lane, self._padding_delivered)
        state = build_rank_state(self._config(), self._catalog.fingerprint, progress, self._lanes(), self._book, self._catalog.splits)
        state["rows_total"] = [self._lane_length(lane) for lane in self._lanes()]  # informational (tdu inspect)
        state["skipped_splits"] = [{**split.to_dict(), "error": message} for split, message in self.skipped_splits]
        state["batches_delivered"] = self._batches_delivered  # a global state's ranks must agree on it to resume in place
        state["chunk_rows"] = self.chunk_rows  # no mismatch: another value keeps every row, in another order (load_state_dict warns)
        if self._target_override is not None:
            state["batch_target"] = self._target_override
        return state

    def load_state_dict(self, state: Mapping[str, Any], elastic: bool = False) -> None:
        """Restore progress; raises CheckpointMismatchError when it cannot resume exactly.

        Accepts this rank's ``state_dict()``, or a global state from
        ``torch_dataloader_utils.distributed.merge_states``. With ``elastic=True`` a
        global state taken with another world size or num_workers is re-dealt: every
        row not yet delivered in that epoch is delivered exactly once across the new ranks.
        """
        scope = check_header(state)
        if scope == "worker":
            self._load_worker_state(state)
            return
        if scope == "global":
            check_global(state)
            first = state["ranks"][0]
            same = first.get("_world_size") == self.world_size and first.get("_num_workers") == self.num_workers
            uneven = uneven_steps(state) if same else None
            if uneven and not elastic:
                raise mismatch(
                    "Checkpoint state's ranks were saved at different steps.",
                    [],
                    [uneven],
                    "Save every rank's state at the same step (gather_state(dataset) on every rank does), or pass "
                    "elastic=True to deal the remaining rows evenly again.",
                )
            if (same and not uneven) or not elastic:
                self._load_rank_state(rank_part(state, self.rank) if same else self._strict_part(state))
            else:
                self._load_elastic(state)
            return
        changed = state.get("_world_size") != self.world_size or state.get("_num_workers") != self.num_workers
        if elastic and changed and state.get("_world_size") == 1 and state.get("_rank") == 0:
            self.load_state_dict(merge_states([state]), elastic=True)  # a one-rank job's state is its global state
            return
        if elastic and changed:
            raise mismatch(
                "An elastic resume needs every rank's progress.",
                [],
                ["this is one rank's state; the topology changed, so the others' remaining rows are unknown"],
                "Save torch_dataloader_utils.distributed.gather_state(dataset) (or merge_states of all ranks) and load that.",
            )
        self._load_rank_state(state)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        if info is None:
            tasks = self.begin_pass(keep_slots=False)
            return self.deliver(tasks, (self.read_chunk(task) for task in tasks))
        restored, self._restored_epoch = self._restored_epoch, None
        self._worker_passes += 1
        # Settled before the first batch: StatefulDataLoader asks for state_dict() right after iter().
        self._begin_worker_pass(info.id, info.num_workers, restored, first=self._worker_passes == 1)
        return self._worker_batches(info.id)

    # ------------------------------------------------- used by the loader
    def begin_pass(self, keep_slots: bool, warn_if_nothing_restored: bool = False) -> list[ChunkTask]:
        """Start (or continue) the epoch: the chunk tasks still to deliver, in order.

        An epoch whose every batch was delivered starts again (also when the loop stopped
        after the last batch without running the loader to its end); an epoch restored as
        complete by load_state_dict delivers nothing in the pass right after the load; with
        ``warn_if_nothing_restored`` (create_dataloader's loader) a warning says so when no
        set_epoch came in between. (torchdata's StatefulDataLoader asks again at once and reads
        the epoch anew, as docs/stateful-dataloader.md describes.)
        """
        restored, self._just_restored = self._just_restored, False
        schedule = self._schedule(self._positions, self._next_lane, self._padding_delivered, keep_slots)
        if warn_if_nothing_restored and restored and not schedule and not self._epoch_set_since_load:
            log.warning(
                "load_state_dict restored epoch %d after its last batch, so this pass delivers nothing. To read epoch %d, "
                "call dataset.set_epoch(%d) first; a loop over range(dataset.epoch, num_epochs) that calls set_epoch "
                "every epoch does this (unlike the upstream package, set_epoch keeps a restored epoch's progress)",
                self._epoch,
                self._epoch + 1,
                self._epoch + 1,
            )
        if not restored and not schedule:  # (empty slots come only while some lane has rows left)
            if self.shuffle and not self._warned_repeat and (any(self._positions) or self._padding_delivered):
                self._warned_repeat = True
                log.warning(
                    "epoch %d is read again, and with shuffle=True in the previous pass's order exactly. Call "
                    "dataset.set_epoch(epoch) with each new epoch number before the epoch for a new order",
                    self._epoch,
                )
            self._reset_progress()
            schedule = self._schedule(self._positions, self._next_lane, self._padding_delivered, keep_slots)
        self._supersede("a newer iter(loader)")
        self._warn_if_drop_cuts_most()
        if keep_slots and self.on_error != "skip":  # (skipped rows would move the batch boundaries of a cut chunk)
            # the pass's first batches wait for one decode batch or a quarter of a chunk (whole batches), not a whole chunk
            first_rows = max(1, min(self.chunk_rows // 4, WORKER_DECODE_ROWS) // self.batch_size) * self.batch_size
            schedule = quick_start(schedule, first_rows, self.num_workers)
        lanes = self._lanes()
        padding = self._padding_lane()
        tasks = []
        for lane, start, stop in schedule:
            source = padding if lane == PADDING_LANE else lanes[lane]
            tasks.append(ChunkTask(lane, start, stop, tuple(source.slice(start, stop))))
        return tasks

    def read_chunk(self, task: ChunkTask, joined: bool = False) -> Chunk:
        """Read and convert one chunk (in whatever process runs it); with ``joined``, tensors are
        left as ``convert.Joined`` for transfer.py to build in shared memory."""
        if task.stop <= task.start:
            return Chunk(task.lane, task.start, task.stop, {})
        if self._reader is None:
            decode_rows = min(self.chunk_rows, WORKER_DECODE_ROWS) if joined else self.chunk_rows
            in_main = get_worker_info() is None
            self._reader = StreamReader(self._catalog, self.columns, in_main, self.on_error == "skip", stream_rows=decode_rows)
        try:
            rows = self._reader.read_segments(self._book, task.segments)
        except BaseException:
            # Its open streams may stop mid-piece (a generator an exception went through is finished,
            # e.g. after a KeyboardInterrupt in the main process): the next read starts afresh.
            self._reader = None
            raise
        where = lambda: self._describe_rows(task)  # noqa: E731 - asked only for an error message
        if joined:
            columns = table_to_joined(rows.table, where)
        else:  # in a worker of a plain or Stateful DataLoader, torch copies the batch into shared memory anyway
            columns = table_to_columns(rows.table, where, copy=get_worker_info() is None)
        return Chunk(task.lane, task.start, task.stop, columns, rows.present, rows.skipped)

    def deliver(self, tasks: Sequence[ChunkTask], chunks: Iterable[Chunk], stats: LoaderStats | None = None) -> Iterator[dict[str, Any]]:
        """Slice chunks into batches and count each batch as delivered just before yielding it
        (and in ``stats``).

        Only the newest pass delivers: once a newer ``iter(loader)``, ``load_state_dict`` or
        ``set_epoch`` changed the progress, this iterator raises instead of booking its rows there.
        """
        return self._delivered(tasks, chunks, self._pass[0], stats)  # the pass is taken now, not at the first next()

    def _delivered(
        self, tasks: Sequence[ChunkTask], chunks: Iterable[Chunk], current: int, stats: LoaderStats | None
    ) -> Iterator[dict[str, Any]]:
        following = self._following_lanes(tasks)
        if stats is not None:
            stats.start_pass()
        for index, chunk in enumerate(self._pulled(chunks, len(tasks), current)):
            if chunk.stop <= chunk.start:
                continue
            padding = chunk.lane == PADDING_LANE
            expected = self._padding_delivered if padding else self._positions[chunk.lane]
            if chunk.start != expected:
                raise RuntimeError(f"internal error: chunk of lane {chunk.lane} starts at row {chunk.start} but {expected} rows were delivered")
            self._note_skipped(chunk.skipped)
            if not padding:
                self._next_lane = chunk.lane
            if chunk.num_read == 0:
                self._advance(chunk, chunk.stop, following[index])
                continue
            for batch, end in chunk.batches(self.batch_size, lambda: self._describe_rows(tasks[index])):
                self._check_pass(current)
                if stats is not None:
                    stats.handing_out(batch)
                self.last_batch_is_padding = padding
                # Counted last, with nothing between the count and the hand-off: no outer generator,
                # no call after it, so an exception that strikes while the loop waits for a batch
                # (KeyboardInterrupt, a signal handler's) comes before the count or after the loop got it.
                self._advance(chunk, end, following[index], batches=1)
                yield batch
                if stats is not None:
                    stats.asked()
        if stats is not None:
            stats.end_pass()

    @property
    def skipped_splits(self) -> list[tuple[Split, str]]:
        """Splits that lost rows to read errors this epoch (on_error="skip"), with the error."""
        return [(self._catalog.splits[i], message) for i, message in sorted(self._skipped.items())]

    # ------------------------------------------------------------ internals
    def _check_columns(self) -> None:
        catalog = self._catalog
        if catalog.schema is None:
            return
        unknown = [c for c in self.columns or () if c not in catalog.schema.names]
        if unknown:
            raise ValueError(f"columns {unknown} are not in the data; its columns are {catalog.schema.names}")
        files = [(entry.url, layout.num_rows) for entry, layout in zip(catalog.files, catalog.layouts)]
        if not any(rows for _, rows in files):
            return  # nothing will be converted (files without rows may type a column as null)
        check_repeated_columns(catalog.schema, self.columns, catalog.repeated_columns)
        check_batch_forms(catalog.schema, self.columns)
        check_missing_columns(catalog.schema, self.columns, catalog.missing_columns, files)

    def _describe_rows(self, task: ChunkTask) -> str:
        urls = [self._catalog.files[f].url for f in self._book.files_of(task.segments)]
        shown = ", ".join(urls[:3]) + (f" and {len(urls) - 3} more" if len(urls) > 3 else "")
        return f"rows read from {shown} (epoch {task.segments[0].key.epoch})"

    def _pulled(self, chunks: Iterable[Chunk], count: int, current: int) -> Iterator[Chunk]:
        """The ``count`` chunks of a pass, each taken only while the pass is current (persistent
        workers serve every iterator of a loader from one stream, so a superseded iterator must not
        take the newer one's chunk), then the source run to its end."""
        source = iter(chunks)
        for _ in range(count):
            self._check_pass(current)
            yield next(source)
        yield from source

    def _supersede(self, cause: str) -> None:
        """Start a new pass: iterators of earlier passes stop delivering (see deliver)."""
        self._pass = (self._pass[0] + 1, cause)

    def _check_pass(self, current: int) -> None:
        if self._pass[0] != current:
            raise RuntimeError(
                f"this iterator was superseded by {self._pass[1]} on the same dataset, which changed the progress "
                "it counts batches against; going on would deliver rows twice or book them to the wrong rows, so it "
                "stops. Use one iterator at a time, and iterate the loader anew (for batch in loader) after "
                "set_epoch or load_state_dict"
            )

    def _advance(self, chunk: Chunk, end: int, following: int, batches: int = 0) -> None:
        if self._batches_delivered is not None:
            self._batches_delivered += batches
        if chunk.lane == PADDING_LANE:
            self._padding_delivered = end
            return
        self._positions[chunk.lane] = end
        if end == chunk.stop:
            self._next_lane = following

    def _note_skipped(self, skipped: Mapping[int, str]) -> None:
        for split, message in skipped.items():
            if split not in self._skipped:
                self._skipped[split] = message
                log.warning("on_error='skip': leaving out unreadable rows of split %s: %s", self._catalog.splits[split].describe(), message)

    def _schedule(self, positions: Sequence[int], next_lane: int, padding_delivered: int, keep_slots: bool) -> list[tuple[int, int, int]]:
        lanes = self._lanes()
        lengths = [self._lane_length(lane) for lane in lanes]
        schedule = lane_schedule(positions, lengths, next_lane, self.chunk_rows, keep_slots)
        target = self._batch_target()
        if target is not None and self.equalize == "drop":
            schedule = self._capped(schedule, positions, target)
        padding_rows = self._padding_rows()
        return schedule + padding_schedule(padding_delivered, padding_rows, self.chunk_rows)

    def _capped(self, schedule: list[tuple[int, int, int]], positions: Sequence[int], target: int) -> list[tuple[int, int, int]]:
        """The schedule cut where a rank at ``positions`` has delivered ``target`` batches (equalize="drop")."""
        return cap_batches(schedule, self.batch_size, target - self._real_batches(positions))

    def _real_batches(self, positions: Sequence[int]) -> int:
        """Batches already delivered from real rows (positions are batch-aligned except at lane ends)."""
        return sum(-(-p // self.batch_size) for p in positions)

    def _lanes(self) -> list[Lane]:
        if self._lanes_override is not None:
            return self._lanes_override
        return self._book.canonical_lanes(self._epoch, self.rank, self.world_size, self.num_workers)

    def _lane_length(self, lane: Lane) -> int:
        """Rows a lane delivers: with drop_last, the whole batches of a planned lane; every row of a
        lane dealt by an elastic resume (the old plan already left out its partial batches)."""
        rows = lane.num_rows
        return rows - rows % self.batch_size if self.drop_last and not lane.dealt else rows

    def _lane_batches(self, lanes: Sequence[Lane]) -> int:
        return sum(-(-self._lane_length(lane) // self.batch_size) for lane in lanes)

    def _batch_target(self) -> int | None:
        """Batches every rank delivers this epoch, or None when counts are not equalized."""
        if self.world_size == 1 or self.equalize == "none":
            return None
        if self._target_override is not None:
            return self._target_override
        if self._canonical_target is None or self._canonical_target[0] != self._epoch:
            counts = self._canonical_batches(self._epoch, self.world_size, self.num_workers)
            self._canonical_target = (self._epoch, max(counts) if self.equalize == "pad" else min(counts))
        return self._canonical_target[1]

    def _canonical_batches(self, epoch: int, world_size: int, num_workers: int) -> list[int]:
        """Batches each rank of a topology delivers in ``epoch`` before equalizing (no elastic lanes)."""
        return [self._lane_batches(self._book.canonical_lanes(epoch, rank, world_size, num_workers)) for rank in range(world_size)]

    def _padding_for(self, epoch: int, lanes: list[Lane] | None, target: int | None, positions: Sequence[int]) -> tuple[int, bool]:
        """(padding rows this rank owes, whether every lane is delivered at ``positions``) with the
        given plan applied (no side effects)."""
        saved = (self._epoch, self._lanes_override, self._target_override)
        self._epoch, self._lanes_override, self._target_override = epoch, lanes, target
        try:
            lengths = [self._lane_length(lane) for lane in self._lanes()]
            return self._padding_rows(), all(p >= n for p, n in zip(positions, lengths))
        finally:
            self._epoch, self._lanes_override, self._target_override = saved

    def _padding_rows(self) -> int:
        target = self._batch_target()
        if target is None or self.equalize != "pad":
            return 0
        return max(0, target - self._lane_batches(self._lanes())) * self.batch_size

    def _padding_lane(self) -> Lane:
        """Rows to repeat as padding: this rank's own rows, cycled (another rank's if it has none)."""
        rows = self._padding_rows()
        if rows == 0:
            return Lane(())
        source = [s for lane in self._lanes() for s in lane.segments if s.num_rows]
        if not source:
            source = [
                s
                for rank in range(self.world_size)
                for lane in self._book.canonical_lanes(self._epoch, rank, self.world_size, self.num_workers)
                for s in lane.segments
                if s.num_rows
            ]
        segments: list[Segment] = []
        while rows > 0:
            for segment in source:
                take = min(rows, segment.num_rows)
                segments.append(Segment(segment.key, segment.start, segment.start + take))
                rows -= take
                if rows == 0:
                    break
        return Lane(tuple(segments))

    def _following_lanes(self, tasks: Sequence[ChunkTask]) -> list[int]:
        following, upcoming = [0] * len(tasks), 0
        for i in range(len(tasks) - 1, -1, -1):
            following[i] = upcoming
            if tasks[i].stop > tasks[i].start and tasks[i].lane != PADDING_LANE:
                upcoming = tasks[i].lane
        return following

    def _reset_progress(self) -> None:
        self._supersede("set_epoch")
        self._positions = [0] * self.logical_workers
        self._next_lane = 0
        self._padding_delivered = 0
        self._batches_delivered: int | None = 0  # None: restored from a state that did not count them
        self._lanes_override: list[Lane] | None = None
        self._target_override: int | None = None
        self._deal: str | None = None  # digest of the overrides, kept with each worker state (see _deal_digest)
        self._skipped: dict[int, str] = {}
        self._just_restored = False  # progress came from load_state_dict and no pass has started since

    def _warn_if_drop_cuts_most(self) -> None:
        """Once per dataset: equalize="drop" leaves out more than half of this rank's batches."""
        target = self._batch_target() if self.equalize == "drop" else None
        if target is None or self._warned_drop:
            return
        own = self._lane_batches(self._lanes())
        if own and target * 2 < own:
            self._warned_drop = True
            log.warning(
                "equalize='drop': rank %d delivers %d of its %d batches in epoch %d, because the smallest rank has %d; "
                "the rest of its rows are left out this epoch. Use equalize='pad', a smaller split_bytes (more, "
                "evener splits), or fewer ranks",
                self.rank, target, own, self._epoch, target,
            )

    def _restored_partly(self) -> bool:
        """Whether the restored progress is inside its epoch: some rows delivered (or dealt by an
        elastic resume) and some left."""
        started = any(self._positions) or self._padding_delivered or self._lanes_override is not None
        return bool(started and self._schedule(self._positions, self._next_lane, self._padding_delivered, keep_slots=False))

    def _config(self, **topology: int) -> dict:
        return {
            "_num_workers": topology.get("num_workers", self.num_workers),
            "_shuffle": self.shuffle,
            "_shuffle_seed": self.shuffle_seed,
            "_world_size": topology.get("world_size", self.world_size),
            "_rank": topology.get("rank", self.rank),
            "_split_bytes": self._catalog.split_bytes,
            "_drop_last": self.drop_last,
            "_equalize": self.equalize,
            "_batch_size": self.batch_size,
            "_on_error": self.on_error,
            "_shuffle_buffer_rows": self.shuffle_buffer_rows,
        }

    def _load_rank_state(self, state: Mapping[str, Any]) -> None:
        selected = self._epoch
        progress = validate_rank_state(state, self._config(), self._catalog.fingerprint, self._book, self._catalog.splits, self._lane_length)
        target = state.get("batch_target") if progress.lanes is not None else None
        if progress.lanes is not None and (not isinstance(target, int) or isinstance(target, bool) or target < 0):
            raise mismatch("Checkpoint state key 'batch_target' is missing or damaged.", [], ["a state with 'lanes' must carry its batch target"])
        padding_rows, lanes_done = self._padding_for(progress.epoch, progress.lanes, target, progress.positions)
        padding = progress.padding_delivered
        if padding > padding_rows or padding % self.batch_size or (padding and not lanes_done):
            if padding > padding_rows:
                cause = f"{padding} rows, but this rank pads {padding_rows} rows in epoch {progress.epoch}"
            elif padding % self.batch_size:
                cause = f"{padding} rows is not a whole number of batches of {self.batch_size}"
            else:
                cause = f"{padding} rows, but padding comes after the rank's own rows, and rows_delivered says some are left"
            raise mismatch("Checkpoint state key 'padding_delivered' is out of range.", [], [cause + ": the state is damaged"])
        counted = state.get("batches_delivered")
        if counted is not None and not is_count(counted):
            raise mismatch("Checkpoint state key 'batches_delivered' is damaged.", [], [f"found {counted!r:.40}: the state is damaged"])
        skipped = self._restore_skipped(state.get("skipped_splits"))
        self._warn_if_other_chunk_rows(state.get("chunk_rows"), len(progress.positions))
        self._apply(progress, target, counted)
        self._skipped = skipped
        if progress.epoch < selected and not self._schedule(self._positions, self._next_lane, self._padding_delivered, keep_slots=False):
            self.set_epoch(selected)  # that epoch is over and set_epoch already chose a later one (StatefulDataLoader loads late)

    def _warn_if_other_chunk_rows(self, saved: Any, lanes: int) -> None:
        """Workers' chunks interleave chunk by chunk, so with several lanes the order after a resume
        is the uninterrupted run's only with the same ``chunk_rows`` (states before it was recorded: None)."""
        if saved is None:
            return
        if not is_count(saved) or saved < 1:
            raise mismatch("Checkpoint state key 'chunk_rows' is damaged.", [], [f"found {saved!r:.40}: the state is damaged"])
        if saved != self.chunk_rows and lanes > 1:
            log.warning(
                "the checkpoint was saved with chunk_rows=%d and this loader reads chunks of %d rows: every row is still "
                "delivered exactly once, but the workers' rows now interleave in another order than the uninterrupted "
                "run's. Pass chunk_rows=%d to keep that order",
                saved,
                self.chunk_rows,
                saved,
            )

    def _restore_skipped(self, saved: Any) -> dict[int, str]:
        """The skipped-split report of a state (informational: unknown entries are ignored)."""
        index = {split: i for i, split in enumerate(self._catalog.splits)}
        restored = {}
        for entry in saved if isinstance(saved, list) else []:
            if not isinstance(entry, Mapping):
                continue
            path, offset, length = entry.get("path"), entry.get("row_offset"), entry.get("row_length")
            if isinstance(path, str) and all(v is None or is_integer(v) for v in (offset, length)):
                split = Split(path, offset, length)
                if split in index:
                    restored[index[split]] = str(entry.get("error", ""))
        return restored

    def _apply(self, progress: RankProgress, target: int | None, batches_delivered: int | None) -> None:
        self._epoch_cell[0] = progress.epoch
        self._batches_delivered = batches_delivered
        self._epoch = progress.epoch
        self._positions = list(progress.positions)
        self._next_lane = progress.next_lane
        self._padding_delivered = progress.padding_delivered
        self._lanes_override = progress.lanes
        self._target_override = target
        self._deal = _deal_digest(progress.lanes, target)
        self._just_restored = True
        self._epoch_set_since_load = False
        self._supersede("load_state_dict")

    def _strict_part(self, state: Mapping[str, Any]) -> dict:
        causes = topology_changed(state, self.num_workers)
        if len(state["ranks"]) != self.world_size:
            causes.insert(0, f"world_size changed: checkpoint={len(state['ranks'])}, current={self.world_size}")
        raise mismatch(
            "Checkpoint shard does not match any current split.",
            [],
            causes,
            "Resume with the checkpoint's topology, or pass elastic=True to deal the remaining rows to the new one.",
        )

    def _load_elastic(self, state: Mapping[str, Any]) -> None:
        """Validate every old rank against its own plan, then deal what remains to this topology."""
        units = []
        canonical_targets: dict[tuple[int, int, int], int] = {}  # the same for every old rank without lanes
        for part in rank_parts(state):
            topology = dict(rank=part.get("_rank"), world_size=part.get("_world_size"), num_workers=part.get("_num_workers"))
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in topology.values()):
                raise mismatch("Checkpoint state has a damaged topology.", [], [f"rank entry says {topology}"])
            lane_length = self._lane_length
            progress = validate_rank_state(part, self._config(**topology), self._catalog.fingerprint, self._book, self._catalog.splits, lane_length)
            lanes = progress.lanes or self._book.canonical_lanes(progress.epoch, topology["rank"], topology["world_size"], topology["num_workers"])
            ends = [lane_length(lane) for lane in lanes]
            old_target = self._old_drop_target(part, progress, topology["world_size"], topology["num_workers"], canonical_targets)
            if old_target is not None:
                ends = self._owed_ends(progress, ends, old_target)
            units += remaining_units(self._book, lanes, progress.positions, ends)
        dealt = deal(units, self.world_size, self.num_workers, self.batch_size)
        counts = [self._lane_batches(lanes) for lanes in dealt]
        target = max(counts) if self.equalize == "pad" else min(counts)
        epoch = state["epoch"]
        self._apply(RankProgress(epoch, dealt[self.rank], [0] * self.logical_workers, 0, 0), target, 0)

    def _old_drop_target(
        self, part: Mapping[str, Any], progress: RankProgress, world_size: int, num_workers: int, known: dict[tuple[int, int, int], int]
    ) -> int | None:
        """Under equalize="drop", the batches each rank of the saved plan delivers (None: no cap);
        ``known`` keeps the canonical plans' targets already computed."""
        if self.equalize != "drop" or world_size == 1:
            return None
        if progress.lanes is not None:  # a plan dealt by an earlier elastic resume carries its target
            target = part.get("batch_target")
            if not isinstance(target, int) or isinstance(target, bool) or target < 0:
                raise mismatch("Checkpoint state key 'batch_target' is missing or damaged.", [], ["a state with 'lanes' must carry its batch target"])
            return target
        key = (progress.epoch, world_size, num_workers)
        if key not in known:
            known[key] = min(self._canonical_batches(*key))
        return known[key]

    def _owed_ends(self, progress: RankProgress, ends: Sequence[int], target: int) -> list[int]:
        """Where each lane of a saved rank stops when the rank delivers only ``target`` batches
        (equalize="drop"): the rows past it were never going to be delivered this epoch."""
        schedule = lane_schedule(progress.positions, ends, progress.next_lane, self.chunk_rows, keep_slots=False)
        owed = list(progress.positions)
        for lane, _, stop in self._capped(schedule, progress.positions, target):
            owed[lane] = max(owed[lane], stop)
        return owed

    def _load_worker_state(self, state: Mapping[str, Any]) -> None:
        info = get_worker_info()
        if info is None:
            raise mismatch(
                "Checkpoint state is one DataLoader worker's state, not a rank's.",
                [],
                [f"it holds only worker {state.get('worker')}'s progress: loaded here, the other workers' rows would be delivered again"],
                "Resume a StatefulDataLoader with loader.load_state_dict(...) of its own loader.state_dict(), which hands "
                "each worker its state; with create_dataloader, save and load dataset.state_dict() of the main process.",
            )
        epoch, worker, position = self._check_worker_state(state)
        self._check_loader_workers(info.num_workers)
        if worker != info.id:
            raise mismatch(
                f"Checkpoint state of worker {worker} was handed to DataLoader worker {info.id}.",
                [],
                ["each worker resumes only from its own state"],
                "Load the loader's state as loader.state_dict() saved it, without moving worker entries.",
            )
        if epoch != self._epoch:
            self._epoch = epoch
            self._reset_progress()
        self._positions[worker] = position
        self._just_restored = True
        self._supersede("load_state_dict")
        self._restored_epoch = epoch

    def _check_worker_state(self, state: Mapping[str, Any]) -> tuple[int, int, int]:
        """(epoch, worker, rows delivered) of a worker state that fits this plan; else CheckpointMismatchError."""
        # an elastic load re-deals its epoch only: a state of any other epoch counts along the planned lanes
        deal = self._deal if state.get("epoch") == self._epoch else None
        epoch, worker, position = validate_worker_state(state, self._config(), self._files_digest(), self.logical_workers, deal)
        selected = self._epoch
        self._epoch = epoch  # measure the worker's rows in the state's epoch, without touching progress
        try:
            length = sum(rows for _, rows in self._worker_parts(worker))
        finally:
            self._epoch = selected
        if position > length:
            raise mismatch(
                f"Checkpoint state of worker {worker} is out of range.",
                [],
                [f"rows_delivered={position} but the worker has {length} rows in epoch {epoch}"],
            )
        return epoch, worker, position

    def _check_loader_workers(self, num_workers: int) -> None:
        if num_workers != self.logical_workers:
            raise ValueError(
                f"this dataset was planned for num_workers={self.num_workers} but runs in a DataLoader with "
                f"{num_workers} workers; create it with num_workers={num_workers}"
            )

    def _files_digest(self) -> str:
        """The file-list digest, computed once per catalog (state_dict runs after every batch)."""
        if self._digest is None or self._digest[0] is not self._catalog:
            self._digest = (self._catalog, self._catalog.files_digest)
        return self._digest[1]

    def _begin_worker_pass(self, worker: int, num_workers: int, restored: int | None, first: bool) -> None:
        """Where a worker's pass starts. The pass right after a worker state was loaded resumes
        that state's epoch; the first pass of a fresh copy continues the progress it was copied
        with; any later pass starts the selected epoch over, because rows this process read
        ahead in an abandoned pass may never have reached the training loop."""
        self._check_loader_workers(num_workers)
        epoch = int(self._epoch_cell[0]) if restored is None else restored
        if epoch != self._epoch:
            self._epoch = epoch
            self._reset_progress()
        elif restored is None and not first:
            self._positions[worker] = 0

    def _worker_batches(self, worker: int) -> Iterator[dict[str, Any]]:
        """One worker's batches, from its position in the epoch."""
        size, base = self.batch_size, 0
        for lane, length in self._worker_parts(worker):
            while self._positions[worker] < base + length:
                start = self._positions[worker] - base
                # chunks aligned to the part's start, as in the uninterrupted run: a chunk's last
                # batch may be short when on_error="skip" left rows out, so a resume must cut the same chunks
                stop = min(length, (start // self.chunk_rows + 1) * self.chunk_rows)
                task = ChunkTask(worker, start, stop, tuple(lane.slice(start, stop)))
                chunk = self.read_chunk(task)
                self._note_skipped(chunk.skipped)
                if chunk.num_read == 0:
                    self._positions[worker] = base + stop
                for batch, end in chunk.batches(size, lambda: self._describe_rows(task)):
                    self._positions[worker] = base + end
                    yield batch
            base += length

    def _worker_parts(self, worker: int) -> list[tuple[Lane, int]]:
        """(lane, rows) a worker delivers this epoch: its own rows, then its share of the padding.

        Under DDP the rank's batches still add up to the target: with equalize="pad" padding
        batch j goes to worker j % W; with "drop" the rank keeps the first target batches of a
        round-robin over its workers.
        """
        lanes, size = self._lanes(), self.batch_size
        lengths = [self._lane_length(lane) for lane in lanes]
        target = self._batch_target()
        if target is not None and self.equalize == "drop":
            caps = _round_robin_counts([-(-n // size) for n in lengths], target)
            lengths = [min(n, cap * size) for n, cap in zip(lengths, caps)]
        parts = [(lanes[worker], lengths[worker])]
        padding = self._padding_rows() // size
        if padding:
            source = self._padding_lane()
            mine = range(worker, padding, len(lanes))
            parts.append((Lane(tuple(s for j in mine for s in source.slice(j * size, (j + 1) * size))), len(mine) * size))
        return parts

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_reader"] = None
        return state

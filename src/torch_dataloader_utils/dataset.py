"""StructuredDataset: the public face that wires the plan, the progress and the readers together."""

from __future__ import annotations

import functools
import logging
from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import dataset_state, loaders
from .catalog.build import Catalog, build_catalog
from .catalog.memory import return_freed_memory
from .catalog.mixture import MixCatalog, MixtureSettings, build_mixture_catalog, check_mixture_arguments, is_mixture, mixture_book
from .catalog.progress_bar import planning_started
from .catalog.sources import SourceOptions
from .options import DEFAULT_CHUNK_ROWS, DEFAULT_SHUFFLE_BUFFER_ROWS, check_options, integer
from .plan.canonical import CanonicalBook, check_canonical, check_canonical_workers
from .plan.canonical_plan import CanonicalPlan
from .plan.epoch import Batching, EpochPlan, Topology
from .plan.lanes import StreamBook
from .plan.splits import DEFAULT_SPLIT_BYTES, Split
from .read import column_check, nested
from .read.chunks import ChunkReader
from .read.filtering import filter_catalog
from .read.output_formats import check_output
from .read.random_access import DEFAULT_ROW_CACHE_BYTES, RowAccess
from .read.rows_dataset import RowsDataset
from .runtime.delivery import RankDelivery
from .runtime.worker_stream import WorkerStream
from .state.canonical import check_lanes_key, restore_canonical, saved_lanes
from .state.progress import Progress
from .state.restore import PlanCheck, check_worker_state, restore_progress
from .state.validate import MAX_EPOCH, check_header
from .storage.remote import IOOptions

log = logging.getLogger(__name__)

# DataLoader arguments the loader sets itself (create_dataloader refuses them by name)


class StructuredDataset(IterableDataset):
    """Parquet, ORC, Arrow IPC, CSV or JSON Lines files as a stream of batches (by default dicts of tensors) with exact resume.

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
        split_bytes: int | str = DEFAULT_SPLIT_BYTES,
        split_rows: int | None = None,
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
        output_format: str = "torch",
        transform: Callable[[Any], Any] | None = None,
        filters: Any = None,
        row_cache_bytes: int = DEFAULT_ROW_CACHE_BYTES,
        canonical_lanes: int | None = None,
        csv_options: Mapping[str, Any] | None = None,
        json_options: Mapping[str, Any] | None = None,
        partitioning: str | None = None,
        nulls: str = "raise",
        fill_values: Mapping[str, float | int | bool] | None = None,
        decimals: str = "float64",
        epoch_rows: int | None = None,
    ):
        options = check_options(
            batch_size=batch_size, num_workers=num_workers, shuffle=shuffle, shuffle_seed=shuffle_seed, columns=columns,
            split_bytes=split_bytes, rank=rank, world_size=world_size, drop_last=drop_last, equalize=equalize,
            on_error=on_error, shuffle_buffer_rows=shuffle_buffer_rows, chunk_rows=chunk_rows, split_rows=split_rows,
            nulls=nulls, fill_values=fill_values, decimals=decimals,
        )  # fmt: skip
        self.rank: int = options.rank
        """This process's rank (given, or torch.distributed's when it is initialized, else 0)."""
        self.world_size: int = options.world_size
        """The number of ranks (given, or torch.distributed's when it is initialized, else 1)."""
        self.batch_size = options.batch_size
        """Rows per batch."""
        self.num_workers = options.num_workers
        """DataLoader worker processes per rank (0: read in the main process); part of the plan."""
        self.shuffle = options.shuffle
        self.shuffle_seed = options.shuffle_seed
        self.columns = options.columns
        self.drop_last = options.drop_last
        self.equalize = options.equalize
        self.on_error = options.on_error
        self.shuffle_buffer_rows = options.shuffle_buffer_rows
        self.chunk_rows = options.chunk_rows
        self._output = check_output(output_format, transform, self.num_workers, self.batch_size)
        self.output_format = output_format
        """What a batch is: "torch" (dict of tensors), "numpy", "arrow" (a RecordBatch) or "dict" (of lists)."""
        self._options = options
        self.policy = options.policy
        """What nulls and decimals become (``nulls=``, ``fill_values=``, ``decimals=``; docs/types.md)."""
        self.canonical_lanes = canonical_lanes
        """C: the epoch's rows in C canonical lanes, the same global batches for every valid topology
        (docs/reproducible-order.md); None: the topology's own order."""
        if canonical_lanes is not None:
            check_canonical(canonical_lanes, self.world_size, self.num_workers, self.batch_size)
        io = IOOptions(download_retry, download_timeout, cache_dir, cache_limit_bytes)
        self._source = SourceOptions(csv_options, json_options, partitioning)
        self._max_split_rows = options.split_rows
        self._selected: list[nested.BatchColumn] = []
        self._epoch_rows = check_mixture_arguments(path, epoch_rows)
        self._mixture_filters = (filters, functools.partial(filter_catalog, io=io, skip_errors=options.on_error == "skip"))  # per source
        catalog: Catalog
        with planning_started():  # the delay of a progress bar (footers, filter counts) counts from here
            stored = self._make_catalog(path, format, storage_options, options.split_bytes, io)
            if isinstance(stored, MixCatalog):
                catalog, stored = stored, stored.unfiltered or stored
            else:
                catalog = filter_catalog(stored, filters, io, options.on_error == "skip") if filters is not None else stored
        book = self._use_catalog(catalog)
        read_columns, selected = nested.read_selection(self._selected, self.columns)
        reader = ChunkReader(self._catalog, book, read_columns, self.on_error == "skip", self.chunk_rows, self._output, selected, self.policy)
        self._delivery = RankDelivery(self._plan_for, reader, self.num_workers, self.shuffle, self.on_error == "skip")
        self._worker = WorkerStream(self._delivery, torch.zeros(1, dtype=torch.int64).share_memory_())
        self._files_digest: tuple[Catalog, str] | None = None
        # random access numbers every stored row: filters= choose what the loader delivers, not the index
        self._rows = RowAccess(self._rows_catalog(stored), read_columns, row_cache_bytes, selected, self.policy, output_format)
        return_freed_memory(len(stored.files))

    # ----------------------------------------------------------- public API
    @classmethod
    def create_dataloader(cls, path: str | Sequence[str], format: str | None = "parquet", **kwargs: Any):
        """Build the dataset and its loader; returns ``(loader, dataset)``.

        Takes the dataset's arguments plus the DataLoader's ``pin_memory``,
        ``prefetch_factor``, ``persistent_workers``, ``timeout`` and
        ``multiprocessing_context``; ``device``: None (batches in host memory) or a
        CUDA device the batches arrive on, copied ahead of the loop on a side stream;
        ``worker_mode``: "process" (DataLoader worker processes) or "thread" (threads of
        this process; same plan, order and state).
        """
        return loaders.create_dataloader(cls, path, format, kwargs)

    def stateful_dataloader(self, **kwargs: Any) -> Any:
        """torchdata's ``StatefulDataLoader`` over this dataset (``batch_size=None``, the dataset's
        ``num_workers``; other keyword arguments are the loader's): ``loader.state_dict()`` then
        checkpoints the dataset. Needs torchdata (the ``torchdata`` extra)."""
        return loaders.stateful_dataloader(self, **kwargs)

    @property
    def epoch(self) -> int:
        """The epoch being read: the one set_epoch selected, or the one load_state_dict restored."""
        return self._delivery.progress.epoch

    @property
    def logical_workers(self) -> int:
        """Lanes per rank: num_workers, or 1 when reading in the main process."""
        return max(1, self.num_workers)

    @property
    def schema(self) -> Any:
        """The batch's columns and their Arrow types (``pyarrow.Schema``), in batch order: a struct's
        leaves as ``parent.child``, a map as ``m.keys`` / ``m.values``, the files' own types (a
        timestamp with its unit and time zone: its tensor counts that unit since 1970-01-01 UTC)."""
        return nested.batch_schema(self._selected, self.policy.masks and self.output_format in ("torch", "numpy"))

    @property
    def splits(self) -> list[Split]:
        """The planned splits (all ranks), in file order."""
        return list(self._catalog.splits)

    @property
    def files(self) -> list[str]:
        """The dataset's files (URLs), in plan order."""
        return [f.url for f in self._catalog.files]

    @property
    def num_rows(self) -> int:
        """Rows in all files (all ranks), from their footers: the range of ``dataset[i]``."""
        return self._rows.num_rows

    def __getitem__(self, key: Any) -> Any:
        """Random access by global row number (file order, then stored order; the same for every
        rank, worker, shuffle and epoch). An int (negative: from the end) gives one row as
        column -> value; a slice, list, 1-d integer numpy array or tensor gives a batch in the
        loader's form for ``output_format`` (no ``transform``), rows in the order asked. See
        docs/random-access.md."""
        return self._rows[key]

    def locate(self, index: int) -> tuple[str, int]:
        """(file URL, row within that file) of global row ``index``."""
        return self._rows.locate(index)

    @property
    def rows(self) -> RowsDataset:
        """The rows as a map-style torch ``Dataset`` (all files), for a DataLoader with any Sampler."""
        return RowsDataset(self._rows)

    @property
    def last_batch_is_padding(self) -> bool:
        """Whether the batch just delivered repeats rows to give every rank the same batch count
        (equalize="pad"): such a batch is not progress. See docs/ddp.md."""
        return self._delivery.last_batch_is_padding

    @property
    def skipped_splits(self) -> list[tuple[Split, str]]:
        """With on_error="skip": files left out at planning (whole-file splits) and splits that lost
        rows to read errors this epoch, each with the error."""
        splits = self._catalog.splits_at(self._delivery.progress.epoch)
        unreadable = [(Split(url), message) for url, message in self._catalog.unreadable]  # left out at planning
        return unreadable + [(splits[i], message) for i, message in sorted(self._delivery.progress.skipped.items())]

    @property
    def delivery(self) -> RankDelivery:
        """The rank's delivery (chunk tasks of a pass, reading them, counting each batch as
        delivered): what StructuredDataLoader and the CLI drive. Internal, not a stable API."""
        return self._delivery

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to read. The current epoch keeps its progress (one restored by
        load_state_dict, or one a loop left part-way); any other epoch starts fresh."""
        epoch = integer("epoch", epoch)
        if not 0 <= epoch <= MAX_EPOCH:
            raise ValueError(f"epoch must be in [0, {MAX_EPOCH}], got {epoch}")
        delivery = self._delivery
        delivery.epoch_set_since_load = True
        if epoch != delivery.progress.epoch:
            if delivery.restored_partly():
                log.warning(
                    "set_epoch(%d) drops the progress load_state_dict restored for epoch %d, whose remaining rows are then never "
                    "delivered. To continue the restored epoch, start your epoch loop at dataset.epoch: for epoch in range(dataset.epoch, "
                    "num_epochs)", epoch, delivery.progress.epoch,
                )  # fmt: skip
            delivery.reset(epoch)
        self._worker.epoch_cell[0] = epoch

    def __len__(self) -> int:
        """Rows this rank delivers in the current epoch (padding included)."""
        return self._delivery.plan().total_rows()

    def num_batches(self) -> int:
        """Batches this rank delivers in the current epoch (padding included)."""
        return self._delivery.plan().total_batches()

    def state_dict(self, form: str = "auto") -> dict:
        """JSON-serializable progress: a rank state in the main process, a worker state inside a worker.

        ``form``: "full" lists completed splits and files by content (the reference's
        ``completed_shards``), "compact" keeps ranges and digests of a size that does not grow
        with the epoch (docs/checkpoint-resume.md), "auto" is full up to 1,000 splits."""
        return dataset_state.checkpoint(self._checkpoint_view(), form)

    def load_state_dict(self, state: Mapping[str, Any], elastic: bool = False) -> None:
        """Restore progress; raises CheckpointMismatchError when it cannot resume exactly.

        Accepts this rank's ``state_dict()``, or a global state from
        ``torch_dataloader_utils.distributed.merge_states``. With ``elastic=True`` a
        global state taken with another world size or num_workers is re-dealt: every
        row not yet delivered in that epoch is delivered exactly once across the new ranks.
        """
        scope = check_header(state)
        if scope == "worker":
            dataset_state.load_worker_state(self._checkpoint_view(), state)
            return
        selected = self.epoch
        progress = self._restore(state, scope, elastic)
        self._delivery.restore(progress)
        self._worker.epoch_cell[0] = progress.epoch
        if progress.epoch < selected and not self._delivery.remaining():
            self.set_epoch(selected)  # that epoch is over and set_epoch already chose a later one (StatefulDataLoader loads late)

    def check_state_dict(self, state: Mapping[str, Any], elastic: bool = False) -> None:
        """Raise CheckpointMismatchError when ``load_state_dict(state, elastic)`` would refuse
        ``state``; change nothing. A worker state is checked against its worker's share of the plan."""
        scope = check_header(state)
        if scope == "worker":
            check_lanes_key(state, self.canonical_lanes)
            check_worker_state(state, self._plan_check(), self._digest(), self._delivery.progress)
        else:
            self._restore(state, scope, elastic)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        if info is None:
            tasks = self._delivery.begin_pass(keep_slots=False)
            reader = self._delivery.reader
            return self._delivery.deliver(tasks, (reader.read(task) for task in tasks))
        # Settled before the first batch: StatefulDataLoader asks for state_dict() right after iter().
        dataset_state.check_loader_workers(self.num_workers, info.num_workers)
        check_canonical_workers(self.canonical_lanes, info.num_workers, self.chunk_rows, self.batch_size)
        return self._worker.begin(info.id)

    # ------------------------------------------------------------ internals
    def _make_catalog(self, path: Any, format: str | None, storage_options: dict | None, split_bytes: int, io: IOOptions) -> Catalog:
        """The files to plan (table datasets list a snapshot's files instead of discovering them; a
        list of Sources is a mixture, catalog/mixture.py)."""
        skip = self.on_error == "skip"  # a file that cannot be read is left out at planning
        if is_mixture(path):
            nulls_ok = self.output_format != "torch" or self.policy.nulls != "raise"
            order = (self.shuffle, self.shuffle_seed, self.shuffle_buffer_rows)
            settings = MixtureSettings(split_bytes, format, storage_options, self._max_split_rows, self._source, io, self.columns,
                                       self._epoch_rows, *order, *self._mixture_filters, self.canonical_lanes, nulls_ok, skip)
            return build_mixture_catalog(path, settings)
        return build_catalog(path, format, storage_options, split_bytes, io, self._max_split_rows, self._source, skip)

    def _rows_catalog(self, catalog: Catalog) -> Catalog | Callable[[], Catalog]:
        """What random access numbers for ``catalog`` (a table dataset's: its snapshot without filters)."""
        return catalog

    def _use_catalog(self, catalog: Catalog) -> StreamBook:
        """Plan ``catalog``'s files; a table dataset re-plans another snapshot through this."""
        catalog_before = getattr(self, "_catalog", None)
        self._catalog = catalog
        try:
            self._check_columns()
        except Exception:
            if catalog_before is not None:
                self._catalog = catalog_before
            raise
        book_args = (catalog.split_rows, catalog.file_offsets, self.shuffle, self.shuffle_seed, self.shuffle_buffer_rows)
        lanes = self.canonical_lanes
        book = StreamBook(*book_args) if lanes is None else CanonicalBook(*book_args, lanes=lanes)
        book = mixture_book(catalog, lanes) or book
        if lanes is not None:
            book.reader_windows = lanes // self.world_size + 2  # a worker reads its rank's lanes in turn
        self._base_plan = (EpochPlan if lanes is None else CanonicalPlan)(
            book,
            0,
            Topology(self.rank, self.world_size, self.num_workers),
            Batching(self.batch_size, self.chunk_rows, self.drop_last, self.equalize),
        )
        self._plan = self._base_plan  # the plan of the progress delivered last (rebuilt when that changes)
        if hasattr(self, "_delivery"):  # (another snapshot's columns may be named or nested otherwise)
            read_columns, selected = nested.read_selection(self._selected, self.columns)
            self._delivery.reader.replan(catalog, book, read_columns, selected)
            self._rows = self._rows.replanned(self._rows_catalog(catalog), read_columns, selected)
        return book

    def _restore(self, state: Mapping[str, Any], scope: str, elastic: bool) -> Progress:
        if self.canonical_lanes is None and saved_lanes(state) is None:
            return restore_progress(state, scope, self._plan_check(), elastic)
        return restore_canonical(state, scope, self._plan_check(), self.canonical_lanes, elastic)

    def _plan_for(self, progress: Progress) -> EpochPlan:
        """The epoch plan for progress: the planned lanes of its epoch, or the lanes an elastic resume dealt."""
        plan = self._plan
        if plan.epoch != progress.epoch or plan.dealt is not progress.dealt or plan.dealt_target != progress.dealt_target:
            plan = replace(self._base_plan, epoch=progress.epoch, dealt=progress.dealt, dealt_target=progress.dealt_target)
            self._plan = plan
        return plan

    def _plan_check(self) -> PlanCheck:
        return PlanCheck(self._base_plan, self._config, self._catalog.fingerprint, self._catalog.splits, self._catalog.splits_at)

    def _check_columns(self) -> None:
        tensors, nulls_apply = self.output_format == "torch", self.output_format in ("torch", "numpy")
        selected = column_check.checked_selection(self._catalog, self.columns, tensors, self.policy, nulls_apply)
        if selected is not None:
            self._selected = selected

    def _checkpoint_view(self) -> dataset_state.CheckpointView:
        parts = (self._catalog, self._delivery, self._worker, self._config(), self._digest(), self._plan_check)
        return dataset_state.CheckpointView(*parts, self.canonical_lanes, self.chunk_rows, self.num_workers)

    def _digest(self) -> str:
        """The file-list digest, computed once per catalog (state_dict runs after every batch)."""
        if self._files_digest is None or self._files_digest[0] is not self._catalog:
            self._files_digest = (self._catalog, self._catalog.files_digest)
        return self._files_digest[1]

    def _config(self, **topology: int) -> dict:
        """The settings as states record them (CONFIG_KEYS), with another topology where given."""
        return dataset_state.config(self._options, self._catalog, self._source, **topology)


StructuredDataset.create_dataloader.__func__.__signature__ = loaders.create_dataloader_signature(StructuredDataset)  # type: ignore[attr-defined]

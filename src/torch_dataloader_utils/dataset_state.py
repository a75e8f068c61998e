"""The dataset's checkpoints: the state it writes, a worker's state it loads, and the settings a
state records. Pure functions of a ``CheckpointView`` (dataset.py keeps the public methods)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from torch.utils.data import get_worker_info

from .catalog.build import Catalog
from .catalog.mixture import MixCatalog
from .catalog.sources import SourceOptions, options_identity
from .options import DatasetOptions
from .plan.splits import Split
from .runtime.delivery import RankDelivery
from .runtime.worker_stream import WorkerStream
from .state.canonical import CANONICAL_LANES, check_lanes_key
from .state.compact import cached_summary, use_compact
from .state.restore import PlanCheck, check_worker_state
from .state.schema import FILTERS, MIXTURE, READER_OPTIONS, SKIPPED_SPLITS, rank_state, worker_state
from .state.validate import mismatch


@dataclass(frozen=True)
class CheckpointView:
    """What a checkpoint reads or restores: the dataset's plan, progress and recorded settings now."""

    catalog: Catalog
    delivery: RankDelivery
    worker: WorkerStream
    config: dict
    files_digest: str
    plan_check: Callable[[], PlanCheck]  # built only to load a state (it lists every file)
    canonical_lanes: int | None
    chunk_rows: int
    num_workers: int


def checkpoint(view: CheckpointView, form: str) -> dict:
    """``dataset.state_dict(form)``: a rank state in the main process, a worker state in a worker."""
    progress = view.delivery.progress
    info = get_worker_info()
    if info is not None:
        check_loader_workers(view.num_workers, info.num_workers)
        state = worker_state(view.config, view.files_digest, progress.epoch, info.id, progress.positions[info.id], progress.deal_digest)
        if view.canonical_lanes is not None:  # as a rank state records it: load_worker_state checks it
            state[CANONICAL_LANES] = view.canonical_lanes
        return state
    catalog = view.catalog
    splits = catalog.splits_at(progress.epoch)
    compact = use_compact(form, len(splits), mixture=isinstance(catalog, MixCatalog))
    if compact and view.canonical_lanes is not None:
        if form == "compact":
            raise ValueError("state_dict(form='compact') is not available with canonical_lanes; use form='full'")
        compact = False
    files = cached_summary(catalog) if compact else catalog.fingerprint
    state = rank_state(view.config, files, progress, view.delivery.plan(), splits, view.chunk_rows, compact)
    if catalog.unreadable:  # files left out at planning (on_error="skip"): reported, not restored (planning leaves them out again)
        state[SKIPPED_SPLITS] = [{**Split(url).to_dict(), "error": message} for url, message in catalog.unreadable] + state[SKIPPED_SPLITS]
    if view.canonical_lanes is not None:
        state[CANONICAL_LANES] = view.canonical_lanes
    return state


def load_worker_state(view: CheckpointView, state: Mapping[str, Any]) -> None:
    """Load one DataLoader worker's state inside that worker."""
    info = get_worker_info()
    if info is None:
        raise mismatch(
            "Checkpoint state is one DataLoader worker's state, not a rank's.",
            [],
            [f"it holds only worker {state.get('worker')}'s progress: loaded here, the other workers' rows would be delivered again"],
            "Resume a StatefulDataLoader with loader.load_state_dict(...) of its own loader.state_dict(), which hands "
            "each worker its state; with create_dataloader, save and load dataset.state_dict() of the main process.",
        )
    check_lanes_key(state, view.canonical_lanes)
    epoch, worker, position = check_worker_state(state, view.plan_check(), view.files_digest, view.delivery.progress)
    check_loader_workers(view.num_workers, info.num_workers)
    if worker != info.id:
        raise mismatch(
            f"Checkpoint state of worker {worker} was handed to DataLoader worker {info.id}.",
            [],
            ["each worker resumes only from its own state"],
            "Load the loader's state as loader.state_dict() saved it, without moving worker entries.",
        )
    view.worker.load(epoch, worker, position)


def check_loader_workers(planned: int, running: int) -> None:
    """ValueError when a DataLoader runs ``running`` workers for a dataset planned for ``planned``."""
    if running != max(1, planned):
        raise ValueError(
            f"this dataset was planned for num_workers={planned} but runs in a DataLoader with "
            f"{running} workers; create it with num_workers={running}"
        )


def config(options: DatasetOptions, catalog: Catalog, source: SourceOptions, **topology: int) -> dict:
    """The settings as states record them (CONFIG_KEYS), with another topology where given."""
    return {
        "_num_workers": topology.get("num_workers", options.num_workers),
        "_shuffle": options.shuffle,
        "_shuffle_seed": options.shuffle_seed,
        "_world_size": topology.get("world_size", options.world_size),
        "_rank": topology.get("rank", options.rank),
        "_split_bytes": catalog.split_bytes,
        "_split_rows": catalog.max_split_rows,
        "_drop_last": options.drop_last,
        "_equalize": options.equalize,
        "_batch_size": topology.get("batch_size", options.batch_size),
        "_on_error": options.on_error,
        "_shuffle_buffer_rows": options.shuffle_buffer_rows,
        **({FILTERS: catalog.row_filter.digest} if catalog.row_filter is not None else {}),
        **({READER_OPTIONS: _options_digest(source)} if source.csv_options or source.json_options else {}),
        **({MIXTURE: catalog.sources} if isinstance(catalog, MixCatalog) else {}),
    }


def _options_digest(source: SourceOptions) -> str:
    """A digest of the text readers' options as given (``options_identity``)."""
    options = {"csv_options": dict(source.csv_options or {}), "json_options": dict(source.json_options or {})}
    return hashlib.sha256(options_identity(options).encode()).hexdigest()[:16]

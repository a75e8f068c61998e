"""The dataset's checkpoints: the state it writes, a worker's state it loads, and the settings a
state records. Functions of a ``StructuredDataset`` (dataset.py keeps the public methods)."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from torch.utils.data import get_worker_info

from .catalog.mixture import MixCatalog
from .state.canonical import CANONICAL_LANES, check_lanes_key
from .state.compact import cached_summary, use_compact
from .state.restore import check_worker_state
from .state.schema import FILTERS, MIXTURE, READER_OPTIONS, rank_state, worker_state
from .state.validate import mismatch


def checkpoint(dataset: Any, form: str) -> dict:
    """``dataset.state_dict(form)``: a rank state in the main process, a worker state in a worker."""
    progress = dataset._delivery.progress
    info = get_worker_info()
    if info is not None:
        dataset._check_loader_workers(info.num_workers)
        state = worker_state(dataset._config(), dataset._digest(), progress.epoch, info.id, progress.positions[info.id], progress.deal_digest)
        if dataset.canonical_lanes is not None:  # as a rank state records it: load_worker_state checks it
            state[CANONICAL_LANES] = dataset.canonical_lanes
        return state
    splits = dataset._catalog.splits_at(progress.epoch)
    compact = use_compact(form, len(splits), mixture=isinstance(dataset._catalog, MixCatalog))
    if compact and dataset.canonical_lanes is not None:
        if form == "compact":
            raise ValueError("state_dict(form='compact') is not available with canonical_lanes; use form='full'")
        compact = False
    files = cached_summary(dataset._catalog) if compact else dataset._catalog.fingerprint
    state = rank_state(dataset._config(), files, progress, dataset._delivery.plan(), splits, dataset.chunk_rows, compact)
    if dataset.canonical_lanes is not None:
        state[CANONICAL_LANES] = dataset.canonical_lanes
    return state


def load_worker_state(dataset: Any, state: Mapping[str, Any]) -> None:
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
    check_lanes_key(state, dataset.canonical_lanes)
    epoch, worker, position = check_worker_state(state, dataset._plan_check(), dataset._digest(), dataset._delivery.progress)
    dataset._check_loader_workers(info.num_workers)
    if worker != info.id:
        raise mismatch(
            f"Checkpoint state of worker {worker} was handed to DataLoader worker {info.id}.",
            [],
            ["each worker resumes only from its own state"],
            "Load the loader's state as loader.state_dict() saved it, without moving worker entries.",
        )
    dataset._worker.load(epoch, worker, position)


def check_loader_workers(dataset: Any, num_workers: int) -> None:
    """ValueError when the DataLoader runs another number of workers than the dataset planned."""
    if num_workers != dataset.logical_workers:
        raise ValueError(
            f"this dataset was planned for num_workers={dataset.num_workers} but runs in a DataLoader with "
            f"{num_workers} workers; create it with num_workers={num_workers}"
        )


def config(dataset: Any, **topology: int) -> dict:
    """The settings as states record them (CONFIG_KEYS), with another topology where given."""
    return {
        "_num_workers": topology.get("num_workers", dataset.num_workers),
        "_shuffle": dataset.shuffle,
        "_shuffle_seed": dataset.shuffle_seed,
        "_world_size": topology.get("world_size", dataset.world_size),
        "_rank": topology.get("rank", dataset.rank),
        "_split_bytes": dataset._catalog.split_bytes,
        "_split_rows": dataset._catalog.max_split_rows,
        "_drop_last": dataset.drop_last,
        "_equalize": dataset.equalize,
        "_batch_size": topology.get("batch_size", dataset.batch_size),
        "_on_error": dataset.on_error,
        "_shuffle_buffer_rows": dataset.shuffle_buffer_rows,
        **({FILTERS: dataset._catalog.row_filter.digest} if dataset._catalog.row_filter is not None else {}),
        **({READER_OPTIONS: _options_digest(dataset._source)} if dataset._source.csv_options or dataset._source.json_options else {}),
        **({MIXTURE: dataset._catalog.sources} if isinstance(dataset._catalog, MixCatalog) else {}),
    }


def _options_digest(source: Any) -> str:
    """A digest of the text readers' options as given (their values by repr: pyarrow types, schemas)."""
    options = {"csv_options": dict(source.csv_options or {}), "json_options": dict(source.json_options or {})}
    return hashlib.sha256(json.dumps(options, sort_keys=True, default=repr).encode()).hexdigest()[:16]

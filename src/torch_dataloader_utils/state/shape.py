"""The shape of a saved dataset state: which keys it holds and what type each value has.

This checks the structure alone, without the data: a state that passes can be read
key by key (to describe it, or to build a dataset with its configuration); whether it
fits the files is ``load_state_dict``'s check. Rank states (``dataset.state_dict()``)
and worker states (what a StatefulDataLoader worker saves, ``scope: "worker"``) have
different keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .schema import (
    BATCHES_DELIVERED,
    COMPLETED_RANGES,
    COMPLETED_SHARDS,
    EPOCH,
    FILES,
    FILES_SUMMARY,
    IN_PROGRESS,
    NEXT_WORKER,
    PADDING_DELIVERED,
    ROWS_DELIVERED,
    ROWS_TOTAL,
    SCOPE,
    SKIPPED_SPLITS,
    WORKER,
)
from .validate import is_count


class StateShapeError(ValueError):
    """A state key is missing or holds a value of the wrong type or range.

    ``key`` names the first damaged key, ``detail`` what it should hold and what it holds.
    """

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"state key {key!r} is damaged: {detail}")
        self.key = key
        self.detail = detail


_MISSING = object()
_Check = Callable[[Any], bool]
_Field = tuple[_Check, str]  # (check, what the value must be)


def _are_counts(value: Any) -> bool:
    return isinstance(value, list) and all(map(is_count, value))


def _is_split(value: Any) -> bool:
    """A split as states store it: a dict with, if cut from a file, an integer row range."""
    if not isinstance(value, dict):
        return False
    offset = value.get("row_offset")
    return (offset is None or is_count(offset) and is_count(value.get("row_length"))) and is_count(value.get("rows_done", 0))


def _are_worker_splits(value: Any) -> bool:
    """'completed_shards' / 'in_progress': per worker, a dict whose 'splits' is a list of splits."""
    return isinstance(value, list) and all(
        isinstance(entry, dict) and isinstance(entry.get("splits", []), list) and all(map(_is_split, entry.get("splits", [])))
        for entry in value
    )


def _are_pairs(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 and all(map(is_count, p)) for p in value)


def _are_range_entries(value: Any) -> bool:
    """'completed_ranges': per worker, a dict of [start, stop] ranges and [position, rows_done]
    pairs (empty where a digest stands for them), their counts and the digest (not in states of
    earlier versions)."""
    return isinstance(value, list) and all(
        isinstance(entry, dict)
        and _are_pairs(entry.get("ranges"))
        and _are_pairs(entry.get("in_progress"))
        and all(is_count(entry.get(key, 0)) for key in ("completed", "in_progress_count"))
        and isinstance(entry.get("progress_digest"), (str, type(None)))
        for entry in value
    )


def _optional(check: _Check) -> _Check:
    return lambda value: value is _MISSING or value is None or check(value)


def _absent_or(check: _Check) -> _Check:
    """A key a state of some form leaves out, but never saves as null."""
    return lambda value: value is _MISSING or check(value)


_RANGE_ENTRIES = (
    "a list of {'worker': N, 'ranges': [[start, stop], ...], 'in_progress': [[position, rows_done], ...], "
    "'completed': N, 'in_progress_count': N, 'progress_digest': null or a digest} entries"
)
_COUNTS = "a list of row counts (integers >= 0), one per worker"
_WORKER_SPLITS = "a list of {'worker': N, 'splits': [...]} entries"
# configuration values that become dataset arguments and must be integers or booleans
_TOPOLOGY_FIELDS: dict[str, _Field] = {
    **{
        key: (lambda v: v is _MISSING or is_count(v), "an integer >= 0")
        for key in ("_num_workers", "_world_size", "_rank", "_split_bytes", "_batch_size", "_shuffle_seed", "_shuffle_buffer_rows")
    },
    **{key: (lambda v: v is _MISSING or v in (True, False), "true or false") for key in ("_shuffle", "_drop_last")},
    "_split_rows": (lambda v: v is _MISSING or v is None or is_count(v), "an integer >= 1, or null"),
    EPOCH: (is_count, "an epoch number (an integer >= 0)"),
}
_RANK_FIELDS: dict[str, _Field] = {
    ROWS_DELIVERED: (_are_counts, _COUNTS),
    NEXT_WORKER: (_optional(is_count), "the index of a worker (an integer >= 0)"),
    PADDING_DELIVERED: (_optional(is_count), "a row count (an integer >= 0)"),
    ROWS_TOTAL: (_optional(_are_counts), _COUNTS),
    BATCHES_DELIVERED: (_optional(is_count), "a batch count (an integer >= 0)"),
    FILES: (_absent_or(lambda v: isinstance(v, list)), "a list of [path, size, tag] entries"),
    COMPLETED_SHARDS: (_absent_or(_are_worker_splits), _WORKER_SPLITS),
    IN_PROGRESS: (_absent_or(_are_worker_splits), _WORKER_SPLITS),
    COMPLETED_RANGES: (_absent_or(_are_range_entries), _RANGE_ENTRIES),
    FILES_SUMMARY: (_absent_or(lambda v: isinstance(v, dict) and is_count(v.get("count"))), "a dict with the file count and digests"),
    SKIPPED_SPLITS: (_absent_or(lambda v: isinstance(v, list) and all(map(_is_split, v))), "a list of splits"),
    **_TOPOLOGY_FIELDS,
}
_WORKER_FIELDS: dict[str, _Field] = {
    WORKER: (is_count, "the worker's index (an integer >= 0)"),
    "rows_delivered": (is_count, "a row count (an integer >= 0)"),
    **_TOPOLOGY_FIELDS,
}


def check_state_shape(state: Mapping[str, Any]) -> None:
    """Raise StateShapeError naming the first key of ``state`` whose value cannot be read as saved."""
    worker = state.get(SCOPE) == "worker"
    for key, (valid, expected) in (_WORKER_FIELDS if worker else _RANK_FIELDS).items():
        value = state.get(key, _MISSING)
        if not valid(value):
            found = "it is missing" if value is _MISSING else f"found {value!r:.80}"
            raise StateShapeError(key, f"expected {expected}, {found}")
    _check_topology(state)
    if worker:
        return
    # the per-worker lists must agree with each other and with the number of workers
    delivered, next_worker = state[ROWS_DELIVERED], state.get(NEXT_WORKER)
    workers: Any = state.get("_num_workers")
    if is_count(workers) and len(delivered) != max(1, workers):  # (a rank without workers reads one lane)
        raise StateShapeError("_num_workers", f"'rows_delivered' has one entry per worker ({len(delivered)}), found {workers!r:.40}")
    for key in (COMPLETED_SHARDS, IN_PROGRESS, COMPLETED_RANGES):
        entries = state.get(key)
        if isinstance(entries, list) and len(entries) != len(delivered):
            raise StateShapeError(key, f"expected one entry per worker ({len(delivered)}), found {len(entries)}")
    if isinstance(next_worker, int) and next_worker >= max(1, len(delivered)):
        raise StateShapeError(NEXT_WORKER, f"there are {len(delivered)} workers, found {next_worker}")
    totals = state.get(ROWS_TOTAL)
    if isinstance(totals, list) and len(totals) != len(delivered):
        raise StateShapeError(ROWS_TOTAL, f"expected one total per worker ({len(delivered)}), found {totals!r:.80}")
    if isinstance(totals, list) and any(d > t for d, t in zip(delivered, totals)):
        raise StateShapeError(ROWS_DELIVERED, f"expected at most each worker's rows_total ({totals!r:.80}), found {delivered!r:.80}")
    listed = len(state[FILES]) if FILES in state else state[FILES_SUMMARY]["count"] if FILES_SUMMARY in state else None
    if listed == 0 and (any(delivered) or isinstance(totals, list) and any(totals)):
        raise StateShapeError(FILES_SUMMARY if FILES not in state else FILES, "the state counts rows but lists no file they came from")


def _check_topology(state: Mapping[str, Any]) -> None:
    """The rank within the world size (both already checked to be integers, where present)."""
    world_size: Any = state.get("_world_size")
    rank: Any = state.get("_rank")
    if is_count(world_size) and world_size < 1:
        raise StateShapeError("_world_size", f"expected an integer >= 1, found {world_size}")
    if is_count(world_size) and is_count(rank) and rank >= world_size:
        raise StateShapeError("_rank", f"expected a rank in [0, world_size={world_size}), found {rank}")
    worker: Any = state.get(WORKER)
    workers: Any = state.get("_num_workers")
    if state.get(SCOPE) == "worker" and is_count(worker) and is_count(workers) and worker >= max(1, workers):
        raise StateShapeError(WORKER, f"expected a worker in [0, num_workers={workers}), found {worker!r:.40}")

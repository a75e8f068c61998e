"""The checkpoint state's JSON schema: every key in one place, and the builders of each scope.

Three scopes share the header (``format_version``, ``scope``, ``epoch``) and the settings
(``CONFIG_KEYS``):

- ``rank``: one rank's progress (``dataset.state_dict()`` in the main process);
- ``global``: every rank's state in one dict (``distributed.merge_states``);
- ``worker``: one DataLoader worker's progress (torchdata's StatefulDataLoader saves one per worker).

docs/checkpoint-resume.md describes every key; docs/architecture.md maps each to its name in the code.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..plan.epoch import EpochPlan
from ..plan.lanes import Lane, StreamBook
from ..plan.splits import Split
from .compact import lane_progress
from .progress import Progress

FORMAT_VERSION = 2  # the newest this library reads: compact rank states (older versions refuse them by this number)
PLAIN_VERSION = 1  # states without the compact form's keys (full rank states, worker states)

# ----------------------------------------------------------------- keys of every scope
VERSION = "format_version"
SCOPE = "scope"
EPOCH = "epoch"
FILES = "files"  # [[url, size, content tag], ...] in plan order

# ----------------------------------------------------------------- rank states
COMPLETED_SHARDS = "completed_shards"  # per worker: the splits it delivered completely
IN_PROGRESS = "in_progress"  # per worker: splits it delivered part of, with rows_done
ROWS_DELIVERED = "rows_delivered"  # per worker (lane): rows the loop received; one int in a worker state
NEXT_WORKER = "next_worker"  # the lane whose chunk comes next
PADDING_DELIVERED = "padding_delivered"  # rows repeated so far to meet the batch target (equalize="pad")
LANES = "lanes"  # lanes an elastic resume dealt, as [stream key..., start, stop] segments; None: planned
BATCH_TARGET = "batch_target"  # batches every rank delivers, with dealt lanes (null with planned lanes)
ROWS_TOTAL = "rows_total"  # informational: rows per lane this epoch
SKIPPED_SPLITS = "skipped_splits"  # informational: splits that lost rows to on_error="skip"
BATCHES_DELIVERED = "batches_delivered"  # ranks of a global state must agree on it to resume in place
CHUNK_ROWS = "chunk_rows"  # another value keeps every row but interleaves workers in another order
FILES_SUMMARY = "files_summary"  # compact form: digests standing in for FILES (state/compact.py)
COMPLETED_RANGES = "completed_ranges"  # compact form: per worker, completed splits as ranges of its lane order
SPLITS = "splits"  # inside each completed_shards / in_progress entry
ROWS_DONE = "rows_done"  # inside an in_progress split

# ----------------------------------------------------------------- worker states
WORKER = "worker"
FILES_DIGEST = "files_digest"
DEAL = "deal"  # digest of the lanes an elastic resume dealt (None: planned lanes)

# ----------------------------------------------------------------- global states
WORLD_SIZE = "world_size"
RANKS = "ranks"

# ----------------------------------------------------------------- table datasets (Iceberg, Delta Lake)
# {"format", "name", "snapshot", "uuid", "schema_id"}: the table, the snapshot (Iceberg) or version (Delta) and the Iceberg schema read
TABLE = "table"
TABLE_KEYS = ("format", "name", "snapshot", "uuid")
TABLE_OPTIONAL_KEYS = ("schema_id",)  # Iceberg's schema read with (states of earlier versions lack it: the snapshot's)

SCOPES = ("rank", "worker", "global")

#: state key -> the dataset argument it records (named in diagnoses)
CONFIG_KEYS = {
    "_num_workers": "num_workers",
    "_shuffle": "shuffle",
    "_shuffle_seed": "shuffle_seed",
    "_world_size": "world_size",
    "_rank": "rank",
    "_split_bytes": "split_bytes",
    "_split_rows": "split_rows",
    "_drop_last": "drop_last",
    "_equalize": "equalize",
    "_batch_size": "batch_size",
    "_on_error": "on_error",
    "_shuffle_buffer_rows": "shuffle_buffer_rows",
}
OPTIONAL_CONFIG_KEYS = ("_split_rows",)  # absent from states of earlier versions: read as None
SHUFFLE_ONLY_KEYS = ("_shuffle_seed", "_shuffle_buffer_rows")  # compared only when shuffling
#: digest of the row filter (read/filtering.py), present only with a filter: positions count matching rows
FILTERS = "_filters"
#: digest of csv_options / json_options, present only when given: they decide which records a text file holds
READER_OPTIONS = "_reader_options"
CANONICAL_LANES = "canonical_lanes"  # C of a state saved with canonical lanes (absent: the planned order)
MIXTURE = "_mixture"  # a mixture's sources and their rows per epoch (state/mixture.py); absent for a plain dataset


def split_entry(split: Split, rows_done: int | None = None) -> dict:
    entry = split.to_dict()
    if rows_done is not None:
        entry[ROWS_DONE] = rows_done
    return entry


def progress_content(book: StreamBook, lane: Lane, position: int, splits: Sequence[Split]) -> tuple[list[dict], list[dict]]:
    """(completed splits, in-progress splits with rows_done) of a lane at ``position``."""
    completed, in_progress = [], []
    for index, (done, total) in book.rows_done(lane, position).items():
        if done >= total:
            completed.append(split_entry(splits[index]))
        elif done > 0:
            in_progress.append(split_entry(splits[index], done))
    return completed, in_progress


def lanes_to_json(lanes: Sequence[Lane] | None) -> list | None:
    return None if lanes is None else [[s.to_list() for s in lane.segments] for lane in lanes]


def rank_state(
    config: Mapping[str, Any], files: Any, progress: Progress, plan: EpochPlan, splits: Sequence[Split], chunk_rows: int, compact: bool = False
) -> dict:
    """The JSON-serializable state of one rank. ``files`` is the fingerprint (full form) or
    its ``files_summary`` (``compact``: state/compact.py)."""
    content: dict[str, Any]
    if compact:
        ranges = [{WORKER: w, **lane_progress(plan.book, lane, p, splits)} for w, (lane, p) in enumerate(zip(plan.lanes, progress.positions))]
        content = {FILES_SUMMARY: files, COMPLETED_RANGES: ranges}
    else:
        completed_shards, in_progress = [], []
        for worker, (lane, position) in enumerate(zip(plan.lanes, progress.positions)):
            completed, partial = progress_content(plan.book, lane, position, splits)
            completed_shards.append({WORKER: worker, SPLITS: completed})
            in_progress.append({WORKER: worker, SPLITS: partial})
        content = {FILES: files, COMPLETED_SHARDS: completed_shards, IN_PROGRESS: in_progress}
    state = {
        VERSION: FORMAT_VERSION if compact else PLAIN_VERSION,
        SCOPE: "rank",
        EPOCH: progress.epoch,
        **config,
        **content,
        ROWS_DELIVERED: list(progress.positions),
        NEXT_WORKER: progress.next_lane,
        PADDING_DELIVERED: progress.padding_delivered,
        LANES: lanes_to_json(progress.dealt),
        ROWS_TOTAL: list(plan.lengths),
        SKIPPED_SPLITS: [{**splits[i].to_dict(), "error": message} for i, message in sorted(progress.skipped.items())],
        BATCHES_DELIVERED: progress.batches_delivered,
        CHUNK_ROWS: chunk_rows,
        BATCH_TARGET: progress.dealt_target,  # null with the planned lanes: every state has the same keys
    }
    return state


def worker_state(config: Mapping[str, Any], files_digest: str, epoch: int, worker: int, position: int, deal: str | None) -> dict:
    """The small state of one worker's stream (what StatefulDataLoader saves per worker).
    ``deal`` identifies the lanes an elastic resume re-dealt (None: the planned lanes)."""
    return {
        VERSION: PLAIN_VERSION,
        SCOPE: "worker",
        EPOCH: epoch,
        WORKER: worker,
        ROWS_DELIVERED: position,
        **config,
        FILES_DIGEST: files_digest,
        DEAL: deal,
    }

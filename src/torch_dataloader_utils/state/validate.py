"""Checking a saved state against the current plan, with a diagnosis that names the key or split.

A rank's state stores, per logical worker, how many rows of that worker's stream the
training loop has received, plus the content it implies (completed and in-progress splits by
path and row range) and the configuration it was taken with, so that ``validate_*`` can tell
exactly why a checkpoint does not fit the current plan.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from ..errors import CheckpointMismatchError
from ..plan.lanes import Lane, Segment, StreamBook, StreamKey
from ..plan.splits import MAX_SEED_WORD, Split
from .causes import config_causes, file_causes, summary_file_causes
from .compact import lane_progress, same_files_in_order, same_progress
from .progress import Progress
from .schema import (
    COMPLETED_RANGES,
    COMPLETED_SHARDS,
    CONFIG_KEYS,
    DEAL,
    EPOCH,
    FILES,
    FILES_DIGEST,
    FILES_SUMMARY,
    FORMAT_VERSION,
    IN_PROGRESS,
    LANES,
    NEXT_WORKER,
    OPTIONAL_CONFIG_KEYS,
    PADDING_DELIVERED,
    RANKS,
    ROWS_DELIVERED,
    ROWS_TOTAL,
    SCOPE,
    SCOPES,
    SPLITS,
    TABLE,
    TABLE_KEYS,
    TABLE_OPTIONAL_KEYS,
    VERSION,
    WORKER,
    progress_content,
)


def _describe(entry: Any) -> str:
    if isinstance(entry, Mapping) and "path" in entry:
        try:
            return Split(entry["path"], entry.get("row_offset"), entry.get("row_length")).describe()
        except (TypeError, ValueError):
            pass
    return repr(entry)


def mismatch(headline: str, shard: Sequence[Any], causes: Sequence[str], advice: str | None = None) -> CheckpointMismatchError:
    """A CheckpointMismatchError laid out like the reference's diagnosis."""
    lines = [headline, ""]
    if shard:
        lines.append("  Checkpoint shard:")
        lines += [f"    {_describe(entry)}" for entry in list(shard)[:8]]
        if len(shard) > 8:
            lines.append(f"    ... and {len(shard) - 8} more")
        lines.append("")
    for i, cause in enumerate(causes):
        lines.append(f"  {'Likely cause' if i == 0 else 'Also'}: {cause}")
    lines += ["", "  " + (advice or "Reconstruct the dataset with matching parameters or discard this checkpoint.")]
    return CheckpointMismatchError("\n".join(lines))


#: The largest epoch: it seeds the epoch's permutations (planner.MAX_SEED_WORD).
MAX_EPOCH = MAX_SEED_WORD


def is_integer(value: Any) -> bool:
    """An int that is not a bool (True is an int to Python, never a count in a state)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value: Any) -> bool:
    """An integer >= 0: a row count or position as states store it."""
    return is_integer(value) and value >= 0


def _require(state: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if key not in state:
        raise mismatch(f"Checkpoint state is missing key {key!r}.", [], [f"the state is damaged or not a torch_dataloader_utils {what} state"])
    value = state[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))):
        raise mismatch(
            f"Checkpoint state key {key!r} has the wrong type.",
            [],
            [f"expected {getattr(kind, '__name__', kind)}, found {type(value).__name__} ({value!r:.60})"],
        )
    return value


def check_header(state: Any) -> str:
    """Check the format version and return the state's scope ("rank", "global" or "worker")."""
    if not isinstance(state, Mapping):
        raise mismatch("Checkpoint state is not a dict.", [], [f"got {type(state).__name__}; pass dataset.state_dict() as saved"])
    if VERSION not in state and COMPLETED_SHARDS in state and "_num_workers" in state:
        raise mismatch(
            "Checkpoint state was written by the upstream torch_dataloader_utils.",
            [],
            ["its progress is whole shards per worker, without the row positions an exact resume needs"],
            f"Start epoch {state.get('epoch')!r} from its beginning (set_epoch) with this library, and save its states from now on.",
        )
    if VERSION not in state and ("_snapshot" in state or "_num_yielded" in state):  # torchdata's StatefulDataLoader.state_dict()
        raise mismatch(
            "Checkpoint state is a StatefulDataLoader's state, not this dataset's.",
            [],
            ["it holds the loader's own progress, with the dataset's state (or each worker's) inside it"],
            "Pass it to the StatefulDataLoader's own load_state_dict(), which hands each worker its dataset state; "
            "dataset.load_state_dict() takes what dataset.state_dict() returned in the main process.",
        )
    version = _require(state, VERSION, int, "dataset")
    if version > FORMAT_VERSION:
        raise mismatch(
            f"Checkpoint state has format_version {version}, newer than this library reads ({FORMAT_VERSION}).",
            [],
            ["the checkpoint was written by a newer torch_dataloader_utils"],
            "Upgrade torch_dataloader_utils to resume from it.",
        )
    if version < 1:
        raise mismatch(f"Checkpoint state has an invalid format_version {version}.", [], ["the state is damaged"])
    scope = state.get(SCOPE, "rank")
    if scope not in SCOPES:
        raise mismatch(f"Checkpoint state key 'scope' holds an unknown scope {scope!r}.", [], ["the state is damaged"])
    return scope


def _some_shard(state: Mapping[str, Any]) -> list:
    """The first non-empty list of completed (else in-progress) splits, to show in a diagnosis."""
    for key in (COMPLETED_SHARDS, IN_PROGRESS):
        entries = state.get(key)
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, Mapping) and isinstance(entry.get(SPLITS), list) and entry[SPLITS]:
                return entry[SPLITS]
    return []


def _parse_lanes(saved: Any, epoch: int, book: StreamBook, workers: int) -> list[Lane] | None:
    """Lanes stored by a state taken after an elastic resume (None: the canonical lanes)."""
    if saved is None:
        return None
    damaged = lambda why: mismatch("Checkpoint state key 'lanes' is damaged.", [], [why])  # noqa: E731
    if not isinstance(saved, list) or len(saved) != workers:
        raise damaged(f"expected a list of {workers} lanes")
    lanes = []
    for lane in saved:
        segments = []
        for entry in lane if isinstance(lane, list) else [None]:
            if not isinstance(entry, list) or len(entry) != 7 or not all(map(is_integer, entry)):
                raise damaged(f"a segment must be 7 integers, found {entry!r:.80}")
            key = StreamKey(*entry[:5])
            if key.epoch != epoch or not 0 <= key.rank < key.world_size or not 0 <= key.worker < max(1, key.num_workers) or key.num_workers < 0:
                raise damaged(f"segment {entry} does not name a stream of epoch {epoch}")
            if not 0 <= entry[5] <= entry[6] <= book.stream_rows(key):
                raise damaged(f"segment {entry} lies outside its stream of {book.stream_rows(key)} rows")
            segments.append(Segment(key, entry[5], entry[6]))
        lanes.append(Lane(tuple(segments), dealt=True))
    return lanes


def validate_rank_state(
    state: Mapping[str, Any],
    config: Mapping[str, Any],
    fingerprint: list[list],
    book: StreamBook,
    splits: Sequence[Split],
    lane_length: Callable[[Lane], int],
) -> Progress:
    """Check a rank state against the plan ``config`` describes; return its progress (without
    the batch count and skipped splits, which the caller checks)."""
    epoch = _require(state, EPOCH, int, "rank")
    compact = COMPLETED_RANGES in state or FILES_SUMMARY in state  # the compact form (state/compact.py)
    content_key = COMPLETED_RANGES if compact else COMPLETED_SHARDS
    completed = _require(state, content_key, list, "rank")
    _check_same_plan(state, config, fingerprint, compact)
    if epoch < 0:
        raise mismatch(f"Checkpoint state key 'epoch' is negative ({epoch}).", [], ["the state is damaged"])
    if epoch > MAX_EPOCH:
        raise mismatch(f"Checkpoint state key 'epoch' is out of range ({epoch}).", [], [f"epochs go up to {MAX_EPOCH}; the state is damaged"])
    positions = _require(state, ROWS_DELIVERED, list, "rank")
    next_lane = _require(state, NEXT_WORKER, int, "rank")
    padding = state.get(PADDING_DELIVERED, 0)
    if not is_count(padding):
        raise mismatch("Checkpoint state key 'padding_delivered' is damaged.", [], [f"found {padding!r:.40}"])
    saved_lanes = _parse_lanes(state.get(LANES), epoch, book, max(1, config["_num_workers"]))
    totals = state.get(ROWS_TOTAL)
    if saved_lanes is not None and isinstance(totals, list) and totals != [lane_length(lane) for lane in saved_lanes]:
        lengths = [lane_length(lane) for lane in saved_lanes]
        raise mismatch("Checkpoint state key 'lanes' is damaged.", [], [f"its lanes hold {lengths} rows, but 'rows_total' says {totals}"])
    lanes = saved_lanes or book.canonical_lanes(epoch, config["_rank"], config["_world_size"], config["_num_workers"])
    if len(positions) != len(lanes) or len(completed) != len(lanes):
        raise mismatch(
            "Checkpoint state does not have one entry per worker.",
            _some_shard(state),
            [f"'rows_delivered' has {len(positions)} entries and {content_key!r} {len(completed)}, but there are {len(lanes)} workers"],
        )
    if not 0 <= next_lane < len(lanes):
        raise mismatch(f"Checkpoint state key 'next_worker' is out of range ({next_lane}).", [], ["the state is damaged"])
    for worker, (position, lane) in enumerate(zip(positions, lanes)):
        entry = completed[worker] if isinstance(completed[worker], Mapping) else {}
        _check_position(worker, position, lane_length(lane), entry)
        if compact:
            _check_compact_entry(entry, worker, lane_progress(book, lane, position, splits), position)
        else:
            _check_full_entry(state, entry, worker, progress_content(book, lane, position, splits), position)
    return Progress(epoch, [int(p) for p in positions], next_lane, padding, dealt=None if saved_lanes is None else tuple(saved_lanes))


def _check_same_plan(state: Mapping[str, Any], config: Mapping[str, Any], fingerprint: list[list], compact: bool) -> None:
    """The state's settings and files against the dataset's: a mismatch naming what changed."""
    for key in CONFIG_KEYS:
        if key not in state and key not in OPTIONAL_CONFIG_KEYS:
            raise mismatch(f"Checkpoint state is missing key {key!r}.", _some_shard(state), ["the state is damaged or from another library"])
    if FILES not in state and FILES_SUMMARY not in state:  # merge_states keeps the files once, beside 'ranks'
        raise mismatch(
            "Checkpoint state has no 'files': it is one rank's entry of a global state (merge_states keeps the file list once, beside 'ranks').",
            [],
            ["an entry of a global state's 'ranks' was passed on its own"],
            "Load the whole global state (load_state_dict picks this rank's part), or take one rank's complete state with "
            "torch_dataloader_utils.distributed.local_state(global_state, rank).",
        )
    changed_files = summary_file_causes(state.get(FILES_SUMMARY), fingerprint) if compact else file_causes(state.get(FILES), fingerprint)
    causes = config_causes(state, config, lambda: same_files_in_order(state.get(FILES), state.get(FILES_SUMMARY), fingerprint)) + changed_files
    if not causes:
        return
    advice = None
    if changed_files and len(changed_files) == len(causes):
        advice = "The data changed since the checkpoint: resume on the files it was taken with, or discard this checkpoint and start the epoch fresh."
    elif any(cause.startswith(("world_size changed", "num_workers changed")) for cause in causes):
        advice = (
            "Resume with the checkpoint's world_size and num_workers, or continue on the new ones: merge every "
            "rank's state (torch_dataloader_utils.distributed.merge_states) and load that with elastic=True."
        )
    raise mismatch("Checkpoint shard does not match any current split.", _some_shard(state), causes, advice)


def _check_position(worker: int, position: Any, length: int, entry: Mapping[str, Any]) -> None:
    """A worker's 'rows_delivered' entry: an integer within its lane's ``length`` rows."""
    if not is_integer(position):
        raise mismatch(
            f"Checkpoint state key 'rows_delivered[{worker}]' has the wrong type.",
            entry.get(SPLITS, []),
            [f"expected int, found {type(position).__name__} ({position!r:.60}); the state is damaged"],
        )
    if not 0 <= position <= length:
        raise mismatch(
            f"Checkpoint state key 'rows_delivered[{worker}]' is out of range ({position!r}).",
            entry.get(SPLITS, []),
            [f"worker {worker} has {length} rows this epoch; the state is damaged or from another dataset"],
        )


def _check_full_entry(state: Mapping[str, Any], entry: Mapping[str, Any], worker: int, expected: tuple[list[dict], list[dict]], position: int) -> None:
    """A worker's completed and in-progress splits (the full form) against the plan at ``position``."""
    completed, partial = expected
    in_progress = state.get(IN_PROGRESS)
    saved_partial = None
    if isinstance(in_progress, list) and worker < len(in_progress) and isinstance(in_progress[worker], Mapping):
        saved_partial = in_progress[worker].get(SPLITS)
    if entry.get(SPLITS) != completed or saved_partial != partial:
        saved = entry.get(SPLITS)
        where = _first_difference(f"{COMPLETED_SHARDS}[{worker}].{SPLITS}", saved, completed) or _first_difference(
            f"{IN_PROGRESS}[{worker}].{SPLITS}", saved_partial, partial
        )
        raise mismatch(
            "Checkpoint shard does not match any current split.",
            saved if isinstance(saved, list) else [],
            [
                f"worker {worker}'s completed or in-progress splits do not match the plan at {position} rows delivered "
                f"(first at key {where}; the data or the state was changed, or the state is damaged)"
            ],
        )


def _first_difference(key: str, saved: Any, expected: list[dict]) -> str | None:
    """Where ``saved`` (a state's list of split entries) first differs from the plan's, with both values."""
    if not isinstance(saved, list):
        return f"{key!r}: checkpoint={saved!r:.80}, plan={expected!r:.80}"
    for index, (got, wanted) in enumerate(zip(saved, expected)):
        if got != wanted:
            fields = sorted(set(got) | set(wanted)) if isinstance(got, Mapping) else []
            name = next((f for f in fields if got.get(f) != wanted.get(f)), None)
            if name is not None:
                return f"'{key}[{index}].{name}': checkpoint={got.get(name)!r:.80}, plan={wanted.get(name)!r:.80}"
            return f"'{key}[{index}]': checkpoint={got!r:.120}, plan={wanted!r:.120}"
    if len(saved) != len(expected):
        return f"{key!r}: {len(saved)} splits in the checkpoint, {len(expected)} in the plan"
    return None


def _check_compact_entry(saved: Mapping[str, Any], worker: int, expected: Mapping[str, Any], position: int) -> None:
    """A compact worker entry must equal what the plan gives at its position (state/compact.py)."""
    if saved.get("lane_digest") != expected["lane_digest"]:
        cause = (
            f"worker {worker}'s splits are not the ones the checkpoint's plan gave it (key 'lane_digest': checkpoint="
            f"{saved.get('lane_digest')!r:.40}, current={expected['lane_digest']!r}): another split plan or order of the same files"
        )
    elif not same_progress(saved, expected):
        cause = f"worker {worker}'s completed or in-progress splits do not match the plan at {position} rows delivered (the state is damaged)"
    else:
        return
    raise mismatch("Checkpoint shard does not match any current split.", [], [cause])


def validate_worker_state(state: Mapping[str, Any], config: Mapping[str, Any], files_digest: str, num_workers: int, deal: str | None) -> tuple[int, int, int]:
    """Check a worker state; return (epoch, worker, position)."""
    epoch = _require(state, EPOCH, int, "worker")
    worker = _require(state, WORKER, int, "worker")
    position = _require(state, ROWS_DELIVERED, int, "worker")
    causes = config_causes(state, config, lambda: state.get(FILES_DIGEST) == files_digest)
    if state.get(FILES_DIGEST) != files_digest:
        causes.append(f"file list changed: checkpoint digest={state.get('files_digest')}, current={files_digest}")
    advice = None
    if state.get(DEAL) != deal:
        saved = "lanes an elastic resume re-dealt" if state.get(DEAL) is not None else "the planned lanes"
        current = "lanes an elastic resume re-dealt" if deal is not None else "the planned lanes"
        if deal is not None and state.get(DEAL) is not None:
            saved, current = f"lanes re-dealt as {state.get('deal')!r}", f"lanes re-dealt as {deal!r}"
        causes.append(f"the state's rows_delivered count along {saved}; this dataset reads {current} (key 'deal')")
        advice = (
            "Before loader.load_state_dict(...), restore the dataset as the saved job did: if it resumed elastically, "
            "dataset.load_state_dict(global_state, elastic=True) with the same global state, else a newly built dataset."
        )
    if causes:
        raise mismatch(f"Checkpoint state of worker {worker} does not match the current plan.", [], causes, advice)
    if not 0 <= worker < num_workers or not 0 <= epoch <= MAX_EPOCH or position < 0:
        raise mismatch(f"Checkpoint state of worker {worker} is out of range.", [], [f"epoch={epoch}, rows_delivered={position}: the state is damaged"])
    return epoch, worker, position


def table_entry(state: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The table and snapshot a table dataset's state was planned on (a global state: its ranks');
    None for a state of plain files."""
    parts = state.get(RANKS) if state.get(SCOPE) == "global" else [state]
    entries = [part.get(TABLE) for part in parts if isinstance(part, Mapping)] if isinstance(parts, list) else []
    if not entries or all(entry is None for entry in entries):
        return None
    first = entries[0]
    if any(entry != first for entry in entries):
        raise mismatch("Checkpoint state's ranks were planned on different table snapshots.", [], [f"{TABLE!r} entries: {entries[:4]}"])
    if (
        not isinstance(first, Mapping)
        or not set(TABLE_KEYS) <= set(first) <= {*TABLE_KEYS, *TABLE_OPTIONAL_KEYS}
        or not isinstance(first["name"], str)
        or not is_count(first["snapshot"])
        or not is_count(first.get("schema_id", 0))
    ):
        raise mismatch(
            f"Checkpoint state key {TABLE!r} is damaged.", [], [f"expected {{{', '.join(TABLE_KEYS)}}} with a snapshot number, found {first!r:.120}"]
        )
    return first

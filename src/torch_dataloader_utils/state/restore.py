"""Turning a saved state into progress on the current plan: a rank's own state, a global
state's part, an elastic re-deal, or one worker's state; CheckpointMismatchError otherwise."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from ..plan.epoch import EpochPlan, Topology, equal_batch_count
from ..plan.schedule import lane_schedule
from ..plan.splits import Split
from .elastic import deal, remaining_units
from .merge import check_global, merge_states, rank_part, rank_parts, topology_changed, uneven_steps
from .progress import Progress
from .schema import BATCH_TARGET, BATCHES_DELIVERED, CHUNK_ROWS, EPOCH, RANKS, SKIPPED_SPLITS
from .validate import MAX_EPOCH, is_count, is_integer, mismatch, validate_rank_state, validate_worker_state

log = logging.getLogger("torch_dataloader_utils.dataset")


@dataclass(frozen=True)
class PlanCheck:
    """What a state is checked against: the current plan (any epoch of it is derived), the
    settings as states record them, the file fingerprint and the planned splits."""

    plan: EpochPlan
    config: Callable[..., dict]  # config(rank=, world_size=, num_workers=) -> the CONFIG_KEYS values
    fingerprint: list[list]
    splits: Sequence[Split]
    epoch_splits: Callable[[int], Sequence[Split]] | None = None  # a mixture's splits change with the epoch

    def splits_at(self, epoch: Any) -> Sequence[Split]:
        """The splits a state of ``epoch`` refers to (a damaged epoch is refused by the validation)."""
        if self.epoch_splits is None:
            return self.splits
        return self.epoch_splits(epoch) if is_count(epoch) and epoch <= MAX_EPOCH else []


def restore_rank(state: Mapping[str, Any], check: PlanCheck) -> Progress:
    """The progress a rank state of this topology records."""
    progress = validate_rank_state(state, check.config(), check.fingerprint, check.plan.book, check.splits_at(state.get(EPOCH)), check.plan.lane_length)
    target = _saved_target(state) if progress.dealt is not None else None
    plan = replace(check.plan, epoch=progress.epoch, dealt=progress.dealt, dealt_target=target)
    padding_rows = plan.padding_rows
    padding = progress.padding_delivered
    size = plan.batching.batch_size
    if padding > padding_rows or padding % size or (padding and not plan.lanes_done(progress.positions)):
        if padding > padding_rows:
            cause = f"{padding} rows, but this rank pads {padding_rows} rows in epoch {progress.epoch}"
        elif padding % size:
            cause = f"{padding} rows is not a whole number of batches of {size}"
        else:
            cause = f"{padding} rows, but padding comes after the rank's own rows, and rows_delivered says some are left"
        raise mismatch("Checkpoint state key 'padding_delivered' is out of range.", [], [cause + ": the state is damaged"])
    counted = state.get(BATCHES_DELIVERED)
    if counted is not None and not is_count(counted):
        raise mismatch("Checkpoint state key 'batches_delivered' is damaged.", [], [f"found {counted!r:.40}: the state is damaged"])
    skipped = _restore_skipped(state.get(SKIPPED_SPLITS), check.splits_at(progress.epoch))
    _warn_if_other_chunk_rows(state.get(CHUNK_ROWS), plan.batching.chunk_rows, len(progress.positions))
    return replace(progress, batches_delivered=counted, skipped=skipped, dealt_target=target)


def restore_elastic(state: Mapping[str, Any], check: PlanCheck) -> Progress:
    """Validate every old rank of a global state against its own plan, then deal what remains
    to this topology."""
    base = check.plan
    units = []
    known_targets: dict[tuple[int, int, int], int] = {}  # the same for every old rank without dealt lanes
    for part in rank_parts(state):
        saved: dict[str, Any] = dict(rank=part.get("_rank"), world_size=part.get("_world_size"), num_workers=part.get("_num_workers"))
        if not all(is_count(v) for v in saved.values()):
            raise mismatch("Checkpoint state has a damaged topology.", [], [f"rank entry says {saved}"])
        progress = validate_rank_state(part, check.config(**saved), check.fingerprint, base.book, check.splits_at(part.get(EPOCH)), base.lane_length)
        old = Topology(int(saved["rank"]), int(saved["world_size"]), int(saved["num_workers"]))
        lanes = list(progress.dealt) if progress.dealt is not None else base.book.canonical_lanes(progress.epoch, old.rank, old.world_size, old.num_workers)
        ends = [base.lane_length(lane) for lane in lanes]
        old_target = _old_drop_target(part, progress, old, base, known_targets)
        if old_target is not None:
            ends = _owed_ends(progress, ends, old_target, base)
        units += remaining_units(base.book, lanes, progress.positions, ends)
    topology = base.topology
    dealt = deal(units, topology.world_size, topology.num_workers, base.batching.batch_size)
    counts = [base.batches_of([base.lane_length(lane) for lane in lanes]) for lanes in dealt]
    target = max(counts) if base.batching.equalize == "pad" else min(counts)
    return Progress(state[EPOCH], [0] * topology.lanes, dealt=tuple(dealt[topology.rank]), dealt_target=target, batches_delivered=0)


def check_worker_state(state: Mapping[str, Any], check: PlanCheck, files_digest: str, current: Progress) -> tuple[int, int, int]:
    """(epoch, worker, rows delivered) of a worker state that fits this plan; else CheckpointMismatchError.
    An elastic resume re-deals its own epoch only: a state of any other epoch counts along the planned lanes."""
    same_epoch = state.get(EPOCH) == current.epoch
    deal_digest = current.deal_digest if same_epoch else None
    epoch, worker, position = validate_worker_state(state, check.config(), files_digest, check.plan.topology.lanes, deal_digest)
    if same_epoch:
        plan = replace(check.plan, epoch=epoch, dealt=current.dealt, dealt_target=current.dealt_target)
    else:
        plan = check.plan.with_epoch(epoch)
    length = plan.worker_rows(worker)
    if position > length:
        raise mismatch(
            f"Checkpoint state of worker {worker} is out of range.",
            [],
            [f"rows_delivered={position} but the worker has {length} rows in epoch {epoch}"],
        )
    return epoch, worker, position


def _saved_target(state: Mapping[str, Any]) -> int:
    """The batch target a state with dealt lanes must carry."""
    target: Any = state.get(BATCH_TARGET)
    if not is_count(target):
        raise mismatch("Checkpoint state key 'batch_target' is missing or damaged.", [], ["a state with 'lanes' must carry its batch target"])
    return int(target)


def _old_drop_target(part: Mapping[str, Any], progress: Progress, old: Topology, base: EpochPlan, known: dict[tuple[int, int, int], int]) -> int | None:
    """Under equalize="drop", the batches each rank of the saved plan delivers (None: no cap);
    ``known`` keeps the planned topologies' targets already computed."""
    if base.batching.equalize != "drop" or old.world_size == 1:
        return None
    if progress.dealt is not None:  # a plan dealt by an earlier elastic resume carries its target
        return _saved_target(part)
    key = (progress.epoch, old.world_size, old.num_workers)
    if key not in known:
        known[key] = equal_batch_count(base.book, base.batching, *key)
    return known[key]


def _owed_ends(progress: Progress, ends: Sequence[int], target: int, base: EpochPlan) -> list[int]:
    """Where each lane of a saved rank stops when the rank delivers only ``target`` batches
    (equalize="drop"): the rows past it were never going to be delivered this epoch."""
    schedule = lane_schedule(progress.positions, ends, progress.next_lane, base.batching.chunk_rows, keep_slots=False)
    owed = list(progress.positions)
    for lane, _, stop in base.capped(schedule, progress.positions, target):
        owed[lane] = max(owed[lane], stop)
    return owed


def _restore_skipped(saved: Any, splits: Sequence[Split]) -> dict[int, str]:
    """The skipped-split report of a state (informational: unknown entries are ignored)."""
    if not saved or not isinstance(saved, list):
        return {}  # (no index of every split to build)
    index = {_entry_key(split.to_dict()): i for i, split in enumerate(splits)}
    restored = {}
    for entry in saved if isinstance(saved, list) else []:
        if not isinstance(entry, Mapping):
            continue
        path, offset, length = entry.get("path"), entry.get("row_offset"), entry.get("row_length")
        if isinstance(path, str) and all(v is None or is_integer(v) for v in (offset, length)):
            found = index.get(_entry_key({k: v for k, v in entry.items() if k != "error"}))
            if found is not None:
                restored[found] = str(entry.get("error", ""))
    return restored


def _entry_key(entry: Mapping[str, Any]) -> tuple:
    """A split's state entry as a dict key (a mixture's entries also hold source and copy)."""
    return tuple(sorted((k, v) for k, v in entry.items() if isinstance(v, (str, int, type(None)))))


def _warn_if_other_chunk_rows(saved: Any, chunk_rows: int, lanes: int) -> None:
    """Workers' chunks interleave chunk by chunk, so with several lanes the order after a resume
    is the uninterrupted run's only with the same ``chunk_rows`` (states before it was recorded: None)."""
    if saved is None:
        return
    if not is_count(saved) or saved < 1:
        raise mismatch("Checkpoint state key 'chunk_rows' is damaged.", [], [f"found {saved!r:.40}: the state is damaged"])
    if saved != chunk_rows and lanes > 1:
        log.warning(
            "the checkpoint was saved with chunk_rows=%d and this loader reads chunks of %d rows: every row is still "
            "delivered exactly once, but the workers' rows now interleave in another order than the uninterrupted "
            "run's. Pass chunk_rows=%d to keep that order",
            saved,
            chunk_rows,
            saved,
        )


def restore_progress(state: Mapping[str, Any], scope: str, check: PlanCheck, elastic: bool) -> Progress:
    """The progress a rank or global state gives this rank; with ``elastic``, a global state of
    another topology is re-dealt (a one-rank job's own state counts as its global state)."""
    topology = check.plan.topology
    if scope == "global":
        check_global(state)
        first = state[RANKS][0]
        same = first.get("_world_size") == topology.world_size and first.get("_num_workers") == topology.num_workers
        uneven = uneven_steps(state) if same else None
        if uneven and not elastic:
            raise mismatch(
                "Checkpoint state's ranks were saved at different steps.",
                [],
                [uneven],
                "Save every rank's state at the same step (gather_state(dataset) on every rank does), or pass "
                "elastic=True to deal the remaining rows evenly again.",
            )
        if same and not uneven:
            return restore_rank(rank_part(state, topology.rank), check)
        if not elastic:
            raise _strict_mismatch(state, topology)
        return restore_elastic(state, check)
    changed = state.get("_world_size") != topology.world_size or state.get("_num_workers") != topology.num_workers
    if elastic and changed and state.get("_world_size") == 1 and state.get("_rank") == 0:
        return restore_progress(merge_states([state]), "global", check, elastic=True)
    if elastic and changed:
        raise mismatch(
            "An elastic resume needs every rank's progress.",
            [],
            ["this is one rank's state; the topology changed, so the others' remaining rows are unknown"],
            "Save torch_dataloader_utils.distributed.gather_state(dataset) (or merge_states of all ranks) and load that.",
        )
    return restore_rank(state, check)


def _strict_mismatch(state: Mapping[str, Any], topology: Topology) -> Exception:
    causes = topology_changed(state, topology.num_workers)
    if len(state[RANKS]) != topology.world_size:
        causes.insert(0, f"world_size changed: checkpoint={len(state[RANKS])}, current={topology.world_size}")
    return mismatch(
        "Checkpoint shard does not match any current split.",
        [],
        causes,
        "Resume with the checkpoint's topology, or pass elastic=True to deal the remaining rows to the new one.",
    )

"""Restoring progress under canonical lanes: a state's progress is the global step it reached.

Under canonical lanes every rank's batch s is its share of global step s, a function of the
plan alone, so a saved rank state is checked by recomputing its lanes' positions from its
``batches_delivered`` (the step) under the saved topology, and any valid topology with the same
global batch resumes at that step: each rank's positions are recomputed for its own lanes. Same
topology or not, the rows that follow are the uninterrupted run's global steps.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Mapping, cast

from ..plan.canonical_plan import CanonicalPlan
from ..plan.epoch import Topology
from .causes import config_causes, file_causes
from .compact import same_files_in_order
from .merge import check_global, rank_parts
from .mixture import mixture_causes
from .progress import Progress
from .restore import PlanCheck
from .schema import BATCHES_DELIVERED, CANONICAL_LANES, CHUNK_ROWS, EPOCH, FILES, MIXTURE, NEXT_WORKER, RANKS, ROWS_DELIVERED
from .validate import MAX_EPOCH, is_count, mismatch


def saved_lanes(state: Mapping[str, Any]) -> Any:
    """The canonical_lanes a rank, worker or global state was saved with (None: none)."""
    ranks = state.get(RANKS)
    if isinstance(ranks, list) and ranks and isinstance(ranks[0], Mapping):
        return ranks[0].get(CANONICAL_LANES)
    return state.get(CANONICAL_LANES)


def check_lanes_key(state: Mapping[str, Any], lanes: int | None, config: Mapping[str, Any] | None = None) -> None:
    """CheckpointMismatchError unless the state was saved with ``canonical_lanes=lanes``; with
    the current settings ``config``, a mixture's other changes are named too."""
    saved = saved_lanes(state)
    if saved == lanes:
        return
    others = mixture_causes(state.get(MIXTURE), config.get(MIXTURE)) if config is not None and MIXTURE in state and MIXTURE in config else []
    def shown(value: Any) -> str:
        return "None (the topology's own order)" if value is None else f"{value!r:.40}"
    raise mismatch(
        "Checkpoint state was saved with another canonical order.",
        [],
        [f"canonical_lanes changed: checkpoint={shown(saved)}, current={shown(lanes)}", *others],
        f"Create the dataset with canonical_lanes={saved!r} to resume this checkpoint exactly."
        if saved is None or is_count(saved) else None,
    )


def restore_canonical(state: Mapping[str, Any], scope: str, check: PlanCheck, lanes: int | None, elastic: bool) -> Progress:
    """The progress a rank or global state saved under canonical lanes gives this rank. Another
    world size or num_workers needs ``elastic=True`` (a global state, or any one rank's state:
    they all record the same step)."""
    if scope == "global":
        check_global(state)
        parts = rank_parts(state)
    else:
        parts = [dict(state)]
    for part in parts:
        check_lanes_key(part, lanes, check.config())
    plan = cast(CanonicalPlan, check.plan)
    steps = [_saved_steps(part, check) for part in parts]
    epoch = parts[0][EPOCH]
    reached = max(steps)
    for rank, (part, count) in enumerate(zip(parts, steps)):
        if count != min(reached, _plan_of(part, check).rank_steps):
            raise mismatch(
                "Checkpoint state's ranks were saved at different steps.",
                [],
                [f"ranks[{rank}] has delivered {count} batches of epoch {epoch} but another rank {reached} (key 'batches_delivered')"],
                "Save every rank's state at the same step (gather_state(dataset) on every rank does).",
            )
    topology = plan.topology
    first = parts[0]
    changed = first.get("_world_size") != topology.world_size or first.get("_num_workers") != topology.num_workers
    if changed and not elastic:
        raise mismatch(
            "Checkpoint shard does not match any current split.",
            [],
            [
                f"world_size or num_workers changed: checkpoint={first.get('_world_size')} x {first.get('_num_workers')}, "
                f"current={topology.world_size} x {topology.num_workers}"
            ],
            "Resume with the checkpoint's topology, or pass elastic=True: with canonical lanes the resumed run continues "
            "with the same global steps.",
        )
    if scope == "rank" and not changed and first.get("_rank") != topology.rank:
        raise mismatch(
            f"Checkpoint state is rank {first.get('_rank')}'s, loaded on rank {topology.rank}.",
            [],
            ["each rank resumes from its own state (or from a global state)"],
            "Load this rank's own state_dict(), or merge_states of every rank's.",
        )
    current = replace(plan, epoch=epoch)
    positions, next_lane = current.progress_after(reached)
    mine = parts[topology.rank] if scope == "global" and not changed else first
    if not changed and mine.get(CHUNK_ROWS) == plan.batching.chunk_rows:
        if mine.get(ROWS_DELIVERED) != positions or mine.get(NEXT_WORKER) != next_lane:
            raise mismatch("Checkpoint state's rows_delivered or next_worker do not match its step.", [], ["the state is damaged"])
    return Progress(epoch, positions, next_lane, 0, batches_delivered=min(reached, current.rank_steps))


def _plan_of(part: Mapping[str, Any], check: PlanCheck) -> CanonicalPlan:
    """The plan a saved rank ran: its topology, batch size and chunk size, in its epoch."""
    plan = cast(CanonicalPlan, check.plan)
    topology = Topology(part["_rank"], part["_world_size"], part["_num_workers"])
    batching = replace(plan.batching, batch_size=part["_batch_size"], chunk_rows=part[CHUNK_ROWS])
    return replace(plan, epoch=part[EPOCH], topology=topology, batching=batching)


def _saved_steps(part: Mapping[str, Any], check: PlanCheck) -> int:
    """The global step a rank state reached, once its settings, files and positions are checked
    against the plan it was saved under."""
    saved: dict[str, Any] = {key: part.get(f"_{key}") for key in ("rank", "world_size", "num_workers", "batch_size")}
    chunk_rows: Any = part.get(CHUNK_ROWS)
    if not all(is_count(v) for v in (*saved.values(), chunk_rows)) or not saved["world_size"] or not saved["batch_size"]:
        raise mismatch("Checkpoint state has a damaged topology.", [], [f"it says {saved}, chunk_rows={chunk_rows!r:.20}"])
    same = functools.partial(same_files_in_order, part.get(FILES), None, check.fingerprint)  # asked only of a mixture
    causes = config_causes(part, check.config(**saved), same) + file_causes(part.get(FILES), check.fingerprint)
    if causes:
        raise mismatch("Checkpoint shard does not match any current split.", [], causes)
    plan = cast(CanonicalPlan, check.plan)
    saved_global = saved["batch_size"] * saved["world_size"]
    current_global = plan.batching.batch_size * plan.topology.world_size
    if saved_global != current_global:
        raise mismatch(
            "Checkpoint state has another global batch.",
            [],
            [
                f"global batch (batch_size x world_size) changed: checkpoint={saved['batch_size']} x {saved['world_size']} = "
                f"{saved_global}, current={plan.batching.batch_size} x {plan.topology.world_size} = {current_global}"
            ],
            f"The global steps are the same only with the same global batch: use batch_size={saved_global // plan.topology.world_size}"
            if saved_global % plan.topology.world_size == 0 else None,
        )
    epoch: Any = part.get(EPOCH)
    steps: Any = part.get(BATCHES_DELIVERED)
    if not is_count(epoch) or epoch > MAX_EPOCH:
        raise mismatch(f"Checkpoint state key 'epoch' is out of range ({epoch!r:.20}).", [], ["the state is damaged"])
    if not is_count(steps) or chunk_rows < saved["batch_size"] or chunk_rows % saved["batch_size"]:
        raise mismatch("Checkpoint state key 'batches_delivered' or 'chunk_rows' is damaged.", [], [f"found {steps!r:.20}, {chunk_rows!r:.20}"])
    old = _plan_of(part, check)
    if steps > old.rank_steps or part.get(ROWS_DELIVERED) != old.progress_after(steps)[0]:
        raise mismatch(
            "Checkpoint state key 'rows_delivered' does not match its step.",
            [],
            [f"{steps} global steps of epoch {epoch} put rank {saved['rank']}'s lanes at {old.progress_after(steps)[0]}; the state is damaged"],
        )
    return steps

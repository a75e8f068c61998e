"""Global states (all ranks in one dict) and the re-dealing of an epoch's remaining work.

Pure functions: the lead rank can merge states for one checkpoint file, any rank can
take its part, and every rank of a resized job computes the same new lanes from the
same global state, without talking to the others.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

from ..plan.lanes import Lane, Segment, StreamBook
from .checkpoint import CONFIG_KEYS, FORMAT_VERSION, SHUFFLE_ONLY_KEYS, is_count, mismatch


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict:
    """One global state from every rank's ``state_dict()`` (index = rank)."""
    if not states:
        raise ValueError("merge_states needs the state of every rank; got an empty list")
    for rank, state in enumerate(states):
        if not isinstance(state, Mapping) or state.get("scope", "rank") != "rank":
            raise ValueError(f"states[{rank}] is not a rank state from dataset.state_dict()")
        if state.get("_rank") != rank or state.get("_world_size") != len(states):
            world = state.get("_world_size")
            raise ValueError(
                f"states[{rank}] was saved by rank {state.get('_rank')} of {world}; pass the list of all "
                f"{world if isinstance(world, int) else 'the'} ranks' states in rank order (all_gather_object gives that)"
            )
        if state.get("epoch") != states[0].get("epoch"):
            raise ValueError(
                f"states[{rank}] is from epoch {state.get('epoch')} but states[0] from epoch {states[0].get('epoch')}; "
                "take every rank's state at the same step (gather_state(dataset) on every rank does)"
            )
        if (state.get("lanes") is None) != (states[0].get("lanes") is None) or state.get("batch_target") != states[0].get("batch_target"):
            raise ValueError(
                f"states[{rank}] and states[0] come from different plans of epoch {state.get('epoch')}: one rank resumed "
                "elastically and the other did not, or they loaded different checkpoints. Every rank must load the same "
                "checkpoint; resume them all from one global state and save again"
            )
    differences = plan_differences(states)
    if differences:
        raise ValueError(
            "the ranks' states do not plan the same epoch: " + "; ".join(differences[:6])
            + ". Every rank must build the dataset with the same arguments and see the same files "
            "(pass an explicit list of files, or make sure no files are added while the job starts)"
        )
    files = states[0].get("files")
    return {
        "format_version": FORMAT_VERSION,
        "scope": "global",
        "epoch": states[0].get("epoch"),
        "world_size": len(states),
        "files": files,
        "ranks": [{k: v for k, v in s.items() if k != "files"} for s in states],
    }


def uneven_steps(state: Mapping[str, Any]) -> str | None:
    """Why a global state's ranks cannot resume in place: under equalize "pad" or "drop" every rank
    delivers one batch per step, so states taken at one step count the same batches; resumed from
    states of different steps, the ranks would deliver different numbers of batches and a DDP job
    would hang at the end of the epoch. None when they agree (or do not count: older versions)."""
    counts = [part.get("batches_delivered") for part in state["ranks"]]
    if state["ranks"][0].get("_equalize") == "none" or not all(is_count(c) for c in counts):
        return None
    for rank, count in enumerate(counts):
        if count != counts[0]:
            return f"ranks[{rank}] has delivered {count} batches of epoch {state.get('epoch')} but ranks[0] {counts[0]} (key 'batches_delivered')"
    return None


def plan_summary(state: Mapping[str, Any]) -> dict:
    """What must agree across ranks, in a few hundred bytes: a rank state's settings (all but the
    rank) and a digest of its file list."""
    summary = {key: state.get(key) for key in CONFIG_KEYS if key != "_rank"}
    if not state.get("_shuffle"):
        summary.update(dict.fromkeys(SHUFFLE_ONLY_KEYS))  # unused without shuffling: ranks may differ there
    summary["files_digest"] = hashlib.sha256(json.dumps(state.get("files")).encode()).hexdigest()
    return summary


def plan_differences(states: Sequence[Mapping[str, Any]]) -> list[str]:
    """How each rank's fresh ``state_dict()`` plans the epoch differently from rank 0's: one line
    per setting or set of files that differs (empty when every rank plans the same epoch)."""
    differences = []
    first = states[0]
    first_files = _by_url(first.get("files"))
    for rank, state in enumerate(states[1:], start=1):
        for key, name in CONFIG_KEYS.items():
            if key == "_rank" or (key in SHUFFLE_ONLY_KEYS and not (state.get("_shuffle") or first.get("_shuffle"))):
                continue
            if state.get(key) != first.get(key):
                differences.append(f"{name}: rank 0 has {first.get(key)!r}, rank {rank} {state.get(key)!r}")
        files = _by_url(state.get("files"))
        if files == first_files and state.get("files") != first.get("files"):
            differences.append(f"rank 0 and rank {rank} list the same files in another order, or a damaged list")
        for what, urls in (
            (f"only rank {rank} has", [url for url in files if url not in first_files]),
            ("only rank 0 has", [url for url in first_files if url not in files]),
            (f"rank 0 and rank {rank} see other versions of", [url for url in files if url in first_files and files[url] != first_files[url]]),
        ):
            if urls:
                differences.append(f"{what} {', '.join(urls[:3])}" + (f" and {len(urls) - 3} more" if len(urls) > 3 else ""))
    return differences


def _by_url(files: Any) -> dict[Any, Any]:
    """A state's file entries by URL (malformed entries left out)."""
    if not isinstance(files, list):
        return {}
    return {entry[0]: entry for entry in files if isinstance(entry, (list, tuple)) and entry and isinstance(entry[0], str)}


def rank_part(state: Mapping[str, Any], rank: int) -> dict:
    """This rank's state out of a global state (same topology)."""
    ranks = state.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        raise mismatch("Checkpoint state key 'ranks' is missing or empty.", [], ["the global state is damaged"])
    if not 0 <= rank < len(ranks):
        raise mismatch(
            "Checkpoint shard does not match any current split.",
            [],
            [f"world_size changed: checkpoint={len(ranks)}, current has rank {rank}"],
            "Resume with the checkpoint's world size, or pass elastic=True to deal the remaining rows to the new topology.",
        )
    return _with_files(state, ranks[rank])


def _with_files(state: Mapping[str, Any], part: Mapping[str, Any]) -> dict:
    """A rank part of a global state with the shared file list put back."""
    return {**part, "files": state.get("files", part.get("files"))}


def rank_parts(state: Mapping[str, Any]) -> list[dict]:
    """Every rank's state out of a global state."""
    return [_with_files(state, part) for part in state["ranks"]]


def topology_changed(state: Mapping[str, Any], num_workers: int) -> list[str]:
    """Causes for a strict mismatch between a global state's topology and the current one."""
    first = state["ranks"][0]
    causes = []
    if len(state["ranks"]) != first.get("_world_size"):
        causes.append("the global state's ranks do not agree with its world size")
    if first.get("_num_workers") != num_workers:
        causes.append(f"num_workers changed: checkpoint={first.get('_num_workers')}, current={num_workers}")
    return causes


def remaining_units(book: StreamBook, lanes: Sequence[Lane], positions: Sequence[int], lengths: Sequence[int]) -> list[list[Segment]]:
    """Per old lane, the units (segments) it had not delivered, in its order."""
    return [
        [unit for segment in lane.slice(position, length) for unit in book.deal_units(segment)]
        for lane, position, length in zip(lanes, positions, lengths)
    ]


def deal(units_per_lane: Sequence[Sequence[Segment]], world_size: int, num_workers: int, batch_size: int) -> list[list[Lane]]:
    """Deal remaining units to the new topology: [rank][worker] -> Lane.

    Units are taken round-robin across the old lanes (so each new lane mixes them) and laid end
    to end; the new lanes, rank by rank and worker by worker, take shares of that sequence in whole
    batches, and a unit is cut where a share ends. The batches are split evenly over the ranks
    first, then each rank's over its workers, so ranks end within one batch of each other (and
    a rank's workers too), whatever the units' sizes (whole shuffle windows may be larger than a
    share). A cut shuffle window is decoded by each lane that reads a part of it.
    """
    workers = max(1, num_workers)
    depth = max((len(u) for u in units_per_lane), default=0)
    order = [units[i] for i in range(depth) for units in units_per_lane if i < len(units)]
    total = sum(unit.num_rows for unit in order)
    batches = -(-total // batch_size)
    ends, taken = [], 0
    for rank in range(world_size):
        rank_batches = batches // world_size + (rank < batches % world_size)
        for worker in range(workers):
            taken += rank_batches // workers + (worker < rank_batches % workers)
            ends.append(min(total, taken * batch_size))
    dealt: list[list[Segment]] = [[] for _ in ends]
    lane = position = 0
    for unit in order:
        start = unit.start
        while start < unit.stop:
            while position >= ends[lane]:
                lane += 1
            take = min(unit.stop - start, ends[lane] - position)
            dealt[lane].append(Segment(unit.key, start, start + take))
            start += take
            position += take
    return [[Lane(tuple(_join(dealt[rank * workers + worker])), dealt=True) for worker in range(workers)] for rank in range(world_size)]


def _join(segments: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for segment in segments:
        if out and out[-1].key == segment.key and out[-1].stop == segment.start:
            out[-1] = Segment(segment.key, out[-1].start, segment.stop)
        else:
            out.append(segment)
    return out


def check_global(state: Mapping[str, Any]) -> None:
    ranks = state.get("ranks")
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, Mapping) for r in ranks):
        raise mismatch("Checkpoint state key 'ranks' is missing or damaged.", [], ["expected the list of every rank's state"])
    for rank, part in enumerate(ranks):
        if part.get("_rank") != rank or part.get("_world_size") != len(ranks):
            raise mismatch(
                f"Checkpoint state 'ranks[{rank}]' belongs to rank {part.get('_rank')} of {part.get('_world_size')}.",
                [],
                ["the global state was assembled in the wrong order or is damaged"],
            )
        if part.get("epoch") != state.get("epoch"):
            raise mismatch(f"Checkpoint state 'ranks[{rank}]' is from another epoch.", [], ["the global state is damaged"])


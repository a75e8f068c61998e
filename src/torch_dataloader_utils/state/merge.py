"""Global states: every rank's state in one dict, checked and taken apart again.

Pure functions: the lead rank can merge states for one checkpoint file, and any rank can
take its part, without talking to the others.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

from .mixture import mixture_causes
from .schema import (
    BATCH_TARGET,
    BATCHES_DELIVERED,
    CANONICAL_LANES,
    CONFIG_KEYS,
    EPOCH,
    FILES,
    FILES_DIGEST,
    FILES_SUMMARY,
    FILTERS,
    LANES,
    MIXTURE,
    RANKS,
    READER_OPTIONS,
    SCOPE,
    SHUFFLE_ONLY_KEYS,
    VERSION,
    WORLD_SIZE,
)
from .validate import is_count, mismatch


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict:
    """One global state from every rank's ``state_dict()`` (index = rank)."""
    if not states:
        raise ValueError("merge_states needs the state of every rank; got an empty list")
    for rank, state in enumerate(states):
        if not isinstance(state, Mapping) or state.get(SCOPE, "rank") != "rank":
            raise ValueError(f"states[{rank}] is not a rank state from dataset.state_dict()")
        if state.get("_rank") != rank or state.get("_world_size") != len(states):
            world = state.get("_world_size")
            given = f"got {len(states)} state{'s' if len(states) != 1 else ''}: " if isinstance(world, int) and world != len(states) else ""
            raise ValueError(
                f"{given}states[{rank}] was saved by rank {state.get('_rank')} of {world}; pass the list of all "
                f"{world if isinstance(world, int) else 'the'} ranks' states in rank order (all_gather_object gives that)"
            )
        if state.get(EPOCH) != states[0].get(EPOCH):
            raise ValueError(
                f"states[{rank}] is from epoch {state.get('epoch')} but states[0] from epoch {states[0].get('epoch')}; "
                "take every rank's state at the same step (gather_state(dataset) on every rank does)"
            )
        if (state.get(LANES) is None) != (states[0].get(LANES) is None) or state.get(BATCH_TARGET) != states[0].get(BATCH_TARGET):
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
    files_key = FILES_SUMMARY if FILES_SUMMARY in states[0] else FILES  # the full form's list or the compact form's summary
    return {
        VERSION: max(s.get(VERSION, 1) for s in states),
        SCOPE: "global",
        EPOCH: states[0].get(EPOCH),
        WORLD_SIZE: len(states),
        files_key: states[0].get(files_key),
        RANKS: [{k: v for k, v in s.items() if k not in (FILES, FILES_SUMMARY)} for s in states],
    }


def uneven_steps(state: Mapping[str, Any]) -> str | None:
    """Why a global state's ranks cannot resume in place: under equalize "pad" or "drop" every rank
    delivers one batch per step, so states taken at one step count the same batches; resumed from
    states of different steps, the ranks would deliver different numbers of batches and a DDP job
    would hang at the end of the epoch. None when they agree (or do not count: older versions)."""
    counts = [part.get(BATCHES_DELIVERED) for part in state[RANKS]]
    if state[RANKS][0].get("_equalize") == "none" or not all(is_count(c) for c in counts):
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
    for key in (FILTERS, READER_OPTIONS, CANONICAL_LANES):
        summary[key] = state.get(key)
    files = state[FILES_SUMMARY].get("digest") if isinstance(state.get(FILES_SUMMARY), Mapping) else state.get(FILES)
    summary[FILES_DIGEST] = hashlib.sha256(json.dumps(files).encode()).hexdigest()
    if state.get(MIXTURE) is not None:
        summary[MIXTURE] = state.get(MIXTURE)
    return summary


def plan_differences(states: Sequence[Mapping[str, Any]]) -> list[str]:
    """How each rank's fresh ``state_dict()`` plans the epoch differently from rank 0's: one line
    per setting or set of files that differs (empty when every rank plans the same epoch)."""
    differences = []
    first = states[0]
    first_files = _by_url(first.get(FILES))
    for rank, state in enumerate(states[1:], start=1):
        for key, name in CONFIG_KEYS.items():
            if key == "_rank" or (key in SHUFFLE_ONLY_KEYS and not (state.get("_shuffle") or first.get("_shuffle"))):
                continue
            if state.get(key) != first.get(key):
                differences.append(f"{name}: rank 0 has {first.get(key)!r}, rank {rank} {state.get(key)!r}")
        for key, name in ((FILTERS, "filters"), (READER_OPTIONS, "csv_options/json_options"), (CANONICAL_LANES, "canonical_lanes")):
            if state.get(key) != first.get(key):
                differences.append(f"{name}: rank 0 has {first.get(key)!r}, rank {rank} {state.get(key)!r}")
        differences += [f"rank {rank}: {cause}" for cause in mixture_causes(first.get(MIXTURE), state.get(MIXTURE))]
        if (FILES_SUMMARY in state or FILES_SUMMARY in first) and plan_summary(state)[FILES_DIGEST] != plan_summary(first)[FILES_DIGEST]:
            differences.append(f"rank 0 and rank {rank} see different files (their states' files_summary digests differ)")
        files = _by_url(state.get(FILES))
        if files == first_files and state.get(FILES) != first.get(FILES):
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
    ranks = state.get(RANKS)
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
    """A rank part of a global state with the shared file list (or compact summary) put back."""
    if FILES_SUMMARY in state:
        return {**part, FILES_SUMMARY: state[FILES_SUMMARY]}
    return {**part, FILES: state.get(FILES, part.get(FILES))}


def rank_parts(state: Mapping[str, Any]) -> list[dict]:
    """Every rank's state out of a global state."""
    return [_with_files(state, part) for part in state[RANKS]]


def topology_changed(state: Mapping[str, Any], num_workers: int) -> list[str]:
    """Causes for a strict mismatch between a global state's topology and the current one."""
    first = state[RANKS][0]
    causes = []
    if len(state[RANKS]) != first.get("_world_size"):
        causes.append("the global state's ranks do not agree with its world size")
    if first.get("_num_workers") != num_workers:
        causes.append(f"num_workers changed: checkpoint={first.get('_num_workers')}, current={num_workers}")
    return causes


def check_global(state: Mapping[str, Any]) -> None:
    """CheckpointMismatchError unless a global state lists every rank, in order, of one epoch."""
    ranks = state.get(RANKS)
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, Mapping) for r in ranks):
        raise mismatch("Checkpoint state key 'ranks' is missing or damaged.", [], ["expected the list of every rank's state"])
    for rank, part in enumerate(ranks):
        if part.get("_rank") != rank or part.get("_world_size") != len(ranks):
            raise mismatch(
                f"Checkpoint state 'ranks[{rank}]' belongs to rank {part.get('_rank')} of {part.get('_world_size')}.",
                [],
                ["the global state was assembled in the wrong order or is damaged"],
            )
        if part.get(EPOCH) != state.get(EPOCH):
            raise mismatch(f"Checkpoint state 'ranks[{rank}]' is from another epoch.", [], ["the global state is damaged"])
        if (part.get(LANES) is None) != (ranks[0].get(LANES) is None) or part.get(BATCH_TARGET) != ranks[0].get(BATCH_TARGET):
            raise mismatch(
                f"Checkpoint state 'ranks[{rank}]' and 'ranks[0]' disagree on 'lanes' or 'batch_target'.",
                [],
                [f"batch_target {part.get(BATCH_TARGET)!r} against {ranks[0].get(BATCH_TARGET)!r}: the ranks of one deal share it; the state is damaged"],
            )


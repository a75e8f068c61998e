"""Helpers for torch.distributed jobs: one checkpoint for all ranks, and each rank's part of it.

The core package calls no collective (it only reads the rank and world size when they are not
passed); these helpers do, when you call them.

    check_same_plan(dataset)                 # once, on every rank: same files and settings
    state = gather_state(dataset)            # on every rank (a collective)
    if dist.get_rank() == 0:
        torch.save({"dataset": state, ...}, path)
    ...
    dataset.load_state_dict(state)           # same topology: this rank's part
    dataset.load_state_dict(state, elastic=True)  # another world size / num_workers
"""

from __future__ import annotations

from typing import Any, Mapping

from .state.merge import merge_states, plan_differences, plan_summary, rank_part


def gather_states(dataset: Any) -> list[dict]:
    """Every rank's ``dataset.state_dict()``, in rank order, on every rank (all_gather_object)."""
    import torch.distributed as dist

    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, dataset.state_dict())
    return states


def gather_state(dataset: Any) -> dict:
    """One global state holding every rank's progress (a collective: call it on every rank)."""
    return merge_states(gather_states(dataset))


def check_same_plan(dataset: Any) -> None:
    """Raise ValueError on every rank unless all ranks planned the same epoch: the same files
    (path, size and version) and the same settings. A collective: call it on every rank after
    building the dataset. Ranks that plan differently deliver some rows twice and others never,
    and equalize their batch counts to different targets, which hangs DDP.

    Ranks first exchange a few hundred bytes each (their settings and a digest of their file
    list); the file lists themselves are gathered only when those differ, to name the files."""
    import torch.distributed as dist

    summaries: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(summaries, plan_summary(dataset.state_dict()))
    if all(summary == summaries[0] for summary in summaries):
        return
    differences = plan_differences(gather_states(dataset))  # every rank takes this branch: the summaries agree
    if differences:
        raise ValueError(
            "ranks planned different epochs:\n  " + "\n  ".join(differences) + "\nEvery rank must build the dataset "
            "from the same files and arguments; if a directory may change while the job starts, pass an explicit list of files."
        )


def local_state(global_state: Mapping[str, Any], rank: int | None = None) -> dict:
    """This rank's part of a global state (for one-file-per-rank checkpoints or inspection)."""
    if rank is None:
        import torch.distributed as dist

        rank = dist.get_rank()
    return rank_part(global_state, rank)


__all__ = ["check_same_plan", "gather_state", "gather_states", "local_state", "merge_states"]

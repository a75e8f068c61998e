"""One rank of a real torch.distributed (gloo) job, driven by tests/test_ddp.py.

    python tests/ddp_job.py SPEC.json RANK

The spec names the data, the world size, an output directory (which also holds the rendezvous file) and
a list of tasks. Rank and world size reach the dataset only through the process group
(create_dataloader is called without them). Every batch is followed by an all_reduce,
as a DDP step would be, so a rank with more batches than the others hangs the job (the
gloo timeout then fails it). Results go to OUT/result-RANK.json.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset
from torch_dataloader_utils.distributed import check_same_plan, gather_state, local_state


def _json(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def _read(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def _write(path: str, obj: Any) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def run(loader, dataset, stop: int | None = None) -> list[list]:
    """[ids, is_padding] per batch; one all_reduce per step, like a DDP backward."""
    batches = []
    for batch in loader:
        batches.append([batch["id"].tolist(), dataset.last_batch_is_padding])
        assert batch["text"] == [f"row-{i}" for i in batches[-1][0]], "text out of step with id"
        dist.all_reduce(torch.ones(1))
        if stop is not None and len(batches) == stop:
            break
    return batches


def counts_agree(n: int) -> list[int]:
    """[min, max] of ``n`` over ranks (a collective after the loop: proves every rank got here)."""
    low, high = torch.tensor([n]), torch.tensor([n])
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    return [int(low), int(high)]


def checkpoint(spec: dict, task: dict, rank: int) -> dict:
    """An uninterrupted epoch, then a fresh loader stopped after ``stop`` batches and checkpointed."""
    loader, dataset = StructuredDataset.create_dataloader(spec["data"], **task["config"])
    assert (dataset.rank, dataset.world_size) == (rank, dist.get_world_size())
    full = run(loader, dataset)
    out = {"len": len(loader), "full": full, "full_counts": counts_agree(len(full))}
    loader, dataset = StructuredDataset.create_dataloader(spec["data"], **task["config"])
    out["before"] = run(loader, dataset, stop=task["stop"])
    out["before_counts"] = counts_agree(len(out["before"]))
    own = _json(dataset.state_dict())
    state = _json(gather_state(dataset))
    out["local_part_matches"] = local_state(state) == own
    out["padding_delivered"] = own["padding_delivered"]
    if rank == 0:
        _write(task["global_file"], state)
    _write(task["rank_file"].format(rank=rank), own)
    dist.barrier()
    return out


def resume(spec: dict, task: dict, rank: int) -> dict:
    """Load a checkpoint (global, per-rank, or elastic) in a fresh loader and run to the end."""
    loader, dataset = StructuredDataset.create_dataloader(spec["data"], **task["config"])
    out: dict = {}
    state = _read(task["state_file"].format(rank=rank))
    if task.get("elastic"):
        try:
            dataset.load_state_dict(state)
            out["strict_error"] = None
        except CheckpointMismatchError as error:
            out["strict_error"] = str(error)
        dataset.load_state_dict(state, elastic=True)
    else:
        dataset.load_state_dict(state)
    out["len"] = len(loader)
    out["after"] = run(loader, dataset)
    out["after_counts"] = counts_agree(len(out["after"]))
    return out


def check_plan(spec: dict, task: dict, rank: int) -> dict:
    """check_same_plan on datasets built from ``task["data"][rank]``: the error each rank got, if any."""
    _, dataset = StructuredDataset.create_dataloader(task["data"][rank], **task["config"])
    try:
        check_same_plan(dataset)
        return {"error": None}
    except ValueError as error:
        return {"error": str(error)}


def main(spec_path: str, rank: int) -> None:
    spec = _read(spec_path)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{spec['out']}/rendezvous",  # a file store: no port that another process could take first
        rank=rank,
        world_size=spec["world_size"],
        timeout=datetime.timedelta(seconds=spec.get("timeout", 60)),
    )
    try:
        results = {}
        for task in spec["tasks"]:
            step = {"checkpoint": checkpoint, "resume": resume, "check_plan": check_plan}[task["kind"]]
            results[task["name"]] = step(spec, task, rank)
        dist.barrier()
        _write(os.path.join(spec["out"], f"result-{rank}.json"), results)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

"""One rank of a torchrun (gloo) job for tests/test_canonical.py: an epoch under canonical lanes.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/canonical_job.py DATA OUT LANES GLOBAL_BATCH

Rank and world size come from the process group. Every batch is followed by an all_reduce, as a
DDP step would be. After step 2 every rank gathers the global state (rank 0 writes OUT/state.json);
each rank writes its batches' ids to OUT/batches-RANK.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.distributed import gather_state


def main() -> None:
    data, out, lanes, global_batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader, dataset = StructuredDataset.create_dataloader(
        data, batch_size=global_batch // world, num_workers=1, canonical_lanes=lanes, shuffle=True, shuffle_seed=5,
        split_bytes=2500, shuffle_buffer_rows=40, chunk_rows=2 * global_batch // world,
    )  # fmt: skip
    batches = []
    for batch in loader:
        batches.append(batch["id"].tolist())
        dist.all_reduce(torch.ones(1))
        if len(batches) == 2:
            state = gather_state(dataset)
            if rank == 0:
                with open(os.path.join(out, "state.json"), "w") as f:
                    json.dump(state, f)
    with open(os.path.join(out, f"batches-{rank}.json"), "w") as f:
        json.dump(batches, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

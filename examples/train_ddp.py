"""Train a tiny model with DistributedDataParallel, checkpoint, and resume exactly where it stopped.

    torchrun --standalone --nproc_per_node 2 examples/train_ddp.py --data /tmp/tdu-ddp-data \
        --make-data 3000 --checkpoint /tmp/tdu-ddp.pt

Run it again with the same command after stopping it (Ctrl-C, a crash, a pre-empted node):
it resumes from the last checkpoint at the exact next batch of the epoch. It may be
relaunched with another ``--nproc_per_node`` or ``--num-workers``: the dataset state is
loaded with ``elastic=True``, which deals the rows the stopped run had not delivered to
the new ranks and workers, each row once.

Every rank delivers the same number of batches per epoch (the shorter ranks repeat some
of their own rows at the end of the epoch; ``dataset.last_batch_is_padding`` marks those
batches). Checkpoints: every ``--checkpoint-every`` steps all ranks call ``gather_state``
(a collective) and rank 0 writes one file with ``torch.save``.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.distributed import check_same_plan, gather_state

NUM_FEATURES = 8


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="directory of Parquet files (id, features, target)")
    p.add_argument("--make-data", type=int, default=0, metavar="ROWS", help="write ROWS rows of sample data to --data if it does not exist")
    p.add_argument("--checkpoint", required=True, help="checkpoint file: resumed from when it exists")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--checkpoint-every", type=_positive, default=10, help="steps between checkpoints")
    p.add_argument("--log-ids", help="directory: each rank appends the ids of every batch to ids-rank<R>.jsonl")
    p.add_argument("--die-after-steps", type=int, default=0, help="testing: every rank exits abruptly after this many steps of this run")
    return p.parse_args()


def write_sample_data(root: str, rows: int) -> None:
    """Five Parquet files of uneven sizes: unique int64 ``id``, 8 float ``features``, a ``target``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(root + ".tmp", exist_ok=True)
    rng = np.random.default_rng(0)
    weights = rng.normal(size=NUM_FEATURES).astype(np.float32)
    shares = np.array([0.3, 0.1, 0.25, 0.15, 0.2])
    sizes = np.diff(np.round(np.concatenate([[0], np.cumsum(shares)]) * rows).astype(int))
    first = 0
    for index, size in enumerate(sizes):
        features = rng.normal(size=(size, NUM_FEATURES)).astype(np.float32)
        table = pa.table(
            {
                "id": np.arange(first, first + size, dtype=np.int64),
                "features": pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), NUM_FEATURES),
                "target": features @ weights,
            }
        )
        pq.write_table(table, os.path.join(root + ".tmp", f"part-{index:05d}.parquet"), row_group_size=max(1, rows // 20))
        first += size
    os.replace(root + ".tmp", root)


def save_atomic(obj: dict, path: str) -> None:
    """torch.save to a temporary file, then rename: a crash never leaves a torn checkpoint."""
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank == 0 and args.make_data and not os.path.exists(args.data):
        write_sample_data(args.data, args.make_data)
    dist.barrier()

    # rank and world_size come from the process group; every rank gets its own splits
    loader, dataset = StructuredDataset.create_dataloader(
        args.data,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        shuffle=True,
        shuffle_seed=42,
        columns=["id", "features", "target"],
        # workers forked once per job, not at every epoch while the process group's threads run
        persistent_workers=args.num_workers > 0,
    )
    check_same_plan(dataset)  # collective: every rank lists the same files with the same settings
    model = DistributedDataParallel(torch.nn.Linear(NUM_FEATURES, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    first_epoch, step = 0, 0  # step counts optimizer steps over the whole job
    if os.path.exists(args.checkpoint):
        checkpoint = torch.load(args.checkpoint)
        model.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        first_epoch, step = checkpoint["epoch"], checkpoint["step"]
        # same topology: this rank's part; another world size or num_workers: re-dealt
        dataset.load_state_dict(checkpoint["dataset"], elastic=True)
        if rank == 0:
            print(f"resumed from {args.checkpoint}: epoch {first_epoch}, step {step}, world size {world_size}", flush=True)

    id_log = None
    if args.log_ids:
        os.makedirs(args.log_ids, exist_ok=True)
        id_log = open(os.path.join(args.log_ids, f"ids-rank{rank}.jsonl"), "a")
    steps_this_run = 0

    for epoch in range(first_epoch, args.epochs):
        dataset.set_epoch(epoch)  # keeps the progress just restored for this epoch
        for batch in loader:
            padding = dataset.last_batch_is_padding
            step += 1
            steps_this_run += 1
            if id_log:
                id_log.write(json.dumps({"epoch": epoch, "step": step, "padding": padding, "ids": batch["id"].tolist()}) + "\n")
                id_log.flush()

            prediction = model(batch["features"]).squeeze(1)
            loss = torch.nn.functional.mse_loss(prediction, batch["target"])
            # padding batches repeat rows of this rank: every rank still steps (DDP needs the
            # same number of backward passes on all ranks), here with zero weight
            (loss * (0.0 if padding else 1.0)).backward()
            optimizer.step()
            optimizer.zero_grad()

            if step % args.checkpoint_every == 0:
                state = gather_state(dataset)  # collective: every rank calls it
                if rank == 0:
                    save_atomic(
                        {"epoch": epoch, "step": step, "dataset": state, "model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                        args.checkpoint,
                    )
                    print(f"epoch {epoch} step {step} loss {loss.item():.4f}: checkpoint saved", flush=True)
            if args.die_after_steps and steps_this_run == args.die_after_steps:
                os._exit(3)  # no cleanup, no final checkpoint: like a crash or a pre-emption

    dist.barrier()
    if rank == 0:
        print(f"done: {args.epochs} epochs, {step} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

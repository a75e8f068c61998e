"""Interrupts a loader with persistent workers while its passes start; run by tests/test_loader.py
in a process of its own (an interrupt may also strike inside torch's worker bookkeeping, and what
it leaves behind must not reach other tests).

    python tests/interrupt_job.py DATA_DIR

Exits 0 and prints the number of interrupts when every pass after an interrupt went on exactly.
"""

from __future__ import annotations

import collections
import random
import sys

from interrupts import interrupted_at

from torch_dataloader_utils import StructuredDataset


def main(path: str) -> int:
    config = dict(batch_size=50, chunk_rows=100, num_workers=2, persistent_workers=True)
    full = [batch["id"].tolist() for batch in StructuredDataset.create_dataloader(path, **config)[0]]
    loader, dataset = StructuredDataset.create_dataloader(path, **config)
    received: collections.deque = collections.deque([next(iter(loader))])  # the workers are up
    rng = random.Random(5)
    interrupts = 0
    for _ in range(40):
        # iter() resets torch's persistent iterator for a new pass: the interrupt strikes in it or in the first batch
        interrupts += interrupted_at(lambda: received.append(next(iter(loader))), rng.randint(1, 900))
        delivered = sum(dataset.state_dict()["rows_delivered"])
        if delivered != 50 * len(received):
            print(f"after {interrupts} interrupts the state counts {delivered} rows, the loop received {50 * len(received)}")
            return 1
    received.extend(loader)
    if [batch["id"].tolist() for batch in received] != full:
        print(f"after {interrupts} interrupts the epoch differs from the uninterrupted one")
        return 1
    print(interrupts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

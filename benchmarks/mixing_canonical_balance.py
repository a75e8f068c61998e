"""How close a mixture's batches are to its proportion under ``canonical_lanes=C``. Planning only:
no files are read, so it runs in seconds and its figures do not depend on the machine.

    python benchmarks/mixing_canonical_balance.py [--name mixing_canonical_balance]

For a few mixtures (sources of given rows, rows per epoch, split_rows 5,000, shuffle on,
shuffle_buffer_rows 10,000), epoch 0: the largest and the mean difference, over every source
and every full global step (G = batch_size x world_size rows) or rank batch (batch_size rows),
between the rows of a source and its share ``rows x n_k / sum(n)``. Three rows per mixture:

- ``canonical``: canonical lanes as the library plans them (each lane merges its windows with
  phases of its own, plan/mixing_canonical.py);
- ``canonical, one phase``: the same lanes with every lane merged alike (phase 1/2, as without
  canonical lanes): the ablation that shows why the lanes' phases differ;
- ``topology's order``: the mixture without canonical lanes, batches of batch_size rows of one
  worker's stream (global step: ``world_size`` such batches).

The table of docs/mixing.md: ``python benchmarks/mixing_canonical_balance.py``.
Prints a markdown table; writes JSON to benchmarks/results/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

import torch_dataloader_utils.plan.mixing as mixing
import torch_dataloader_utils.plan.mixing_canonical as mixing_canonical
from torch_dataloader_utils.plan.lanes import StreamKey
from torch_dataloader_utils.plan.mixing import MixtureBook, MixturePlan, SourceLayout
from torch_dataloader_utils.plan.streams import SplitRows

SPLIT_ROWS, BUFFER_ROWS = 5000, 10000
# (sources' rows, rows per epoch, canonical_lanes C, world_size R, batch_size b)
CASES = [
    ((300_000, 50_000, 1_000_000), (300_000, 200_000, 400_000), 64, 8, 256),
    ((300_000, 50_000, 1_000_000), (300_000, 200_000, 400_000), 16, 4, 128),
    ((100_000, 20_000, 50_000, 70_000), (100_000, 30_000, 5_000, 70_000), 32, 4, 128),
]


def make_plan(sizes: tuple[int, ...], per_epoch: tuple[int, ...], lanes: int | None) -> MixturePlan:
    layouts, offsets, file = [], [], 0
    for size, rows in zip(sizes, per_epoch):
        splits = []
        for start in range(0, size, SPLIT_ROWS):
            n = min(SPLIT_ROWS, size - start)
            splits.append(SplitRows(file, 0, n))
            offsets.append(np.array([0, n]))
            file += 1
        layouts.append(SourceLayout(tuple(splits), tuple(f"file{i}" for i in range(len(splits))), rows))
    return MixturePlan(layouts, offsets, True, 7, BUFFER_ROWS, lanes)


def labels(stream) -> np.ndarray:
    """The source of every row of a mixed stream, in delivery order."""
    out = [np.searchsorted(np.cumsum(stream.window_sources[w]), stream.window_permutation(w), side="right") for w in range(stream.num_windows)]
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def deviations(groups: list[np.ndarray], share: np.ndarray) -> tuple[float, float]:
    """(largest, mean) |rows of a source - its share| over the groups of rows and the sources."""
    found = np.array([np.abs(np.bincount(g, minlength=len(share)) - len(g) * share) for g in groups])
    return float(found.max()), float(found.mean())


def canonical(sizes, per_epoch, lanes, world, batch) -> tuple[tuple[float, float], tuple[float, float]]:
    book = mixing_canonical.CanonicalMixtureBook(make_plan(sizes, per_epoch, lanes), lanes=lanes)
    lane_labels = [labels(s) for s in book.lane_streams(0)]
    q = batch * world // lanes
    steps = min(len(x) for x in lane_labels) // q  # the body: every lane has q rows left
    share = np.array(per_epoch) / sum(per_epoch)
    per_rank = lanes // world
    step_groups = [np.concatenate([x[s * q : (s + 1) * q] for x in lane_labels]) for s in range(steps)]
    batch_groups = [g[r * per_rank * q : (r + 1) * per_rank * q] for g in step_groups for r in range(world)]
    return deviations(step_groups, share), deviations(batch_groups, share)


def topology_order(sizes, per_epoch, world, batch) -> tuple[tuple[float, float], tuple[float, float]]:
    book = MixtureBook(make_plan(sizes, per_epoch, None))
    ranks = [labels(book.stream(StreamKey(0, r, world, 0, 0))) for r in range(world)]
    steps = min(len(x) for x in ranks) // batch
    share = np.array(per_epoch) / sum(per_epoch)
    batch_groups = [x[s * batch : (s + 1) * batch] for s in range(steps) for x in ranks]
    step_groups = [np.concatenate([x[s * batch : (s + 1) * batch] for x in ranks]) for s in range(steps)]
    return deviations(step_groups, share), deviations(batch_groups, share)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", default="mixing_canonical_balance")
    args = parser.parse_args()
    results = []
    print("| sources' rows per epoch | C | world_size x batch_size | order | global step: largest / mean difference | rank batch: largest / mean |")
    print("|---|---:|---|---|---|---|")
    one_phase = lambda lane, lanes, sources: ((1,) * sources, 2)  # noqa: E731 - the merge without canonical lanes
    for sizes, per_epoch, lanes, world, batch in CASES:
        found = {"canonical": canonical(sizes, per_epoch, lanes, world, batch)}
        library_phase = mixing.lane_phase
        mixing.lane_phase = mixing_canonical.lane_phase = one_phase
        try:
            found["canonical, one phase"] = canonical(sizes, per_epoch, lanes, world, batch)
        finally:
            mixing.lane_phase = mixing_canonical.lane_phase = library_phase
        found["topology's order"] = topology_order(sizes, per_epoch, world, batch)
        for order, ((step_max, step_mean), (batch_max, batch_mean)) in found.items():
            shares = " / ".join(f"{n:,}" for n in per_epoch)
            print(f"| {shares} | {lanes} | {world} x {batch} | {order} | {step_max:.1f} / {step_mean:.2f} | {batch_max:.1f} / {batch_mean:.2f} |")
            results.append(dict(rows_per_epoch=per_epoch, lanes=lanes, world_size=world, batch_size=batch, order=order,
                                step_max=step_max, step_mean=step_mean, batch_max=batch_max, batch_mean=batch_mean))  # fmt: skip
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", f"{args.name}.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

"""Canonical lanes of a mixture: its epoch in C lanes that do not depend on the topology. Pure.

A mixture planned for C canonical lanes has a block count that is a multiple of C (see
``MixturePlan.block_count``), and lane ``l`` is the contiguous range of blocks
``[l B / C, (l + 1) B / C)``, read in the epoch's block order, as one mixed stream. Block ``b``
holds rows ``[b n_k / B, (b + 1) n_k / B)`` of every source's epoch sequence, so lane ``l`` holds
rows ``[l n_k / C, (l + 1) n_k / C)`` of each: the lanes differ by at most a row per source, each
holds every source in proportion, and together they hold the epoch's rows once, as the mixture
plans them (each row's multiplicity exact). Lane ``l`` cuts its blocks into windows and merges
the windows' sources with phases of its own (``lane_phase``, ``merge_positions``): a global step
takes the same rows of every lane, and with the same merge in every lane, each lane's rounding of
the proportion would fall on the same rows and add up instead of cancelling. The global
sequence, the steps and the restore are then those of a plain dataset's canonical lanes
(plan/canonical.py, state/canonical.py).
"""

from __future__ import annotations

import numpy as np

from .canonical import _SEED_MARK, CanonicalBook
from .mixing import MixtureBook, MixturePlan, lane_of_block, lane_phase
from .streams import Stream


def lane_blocks(order: np.ndarray, lanes: int) -> list[list[int]]:
    """The blocks of each lane: lane ``l`` holds block indices [l B / C, (l + 1) B / C), in the
    order ``order`` (the epoch's block order) gives them."""
    out: list[list[int]] = [[] for _ in range(lanes)]
    for block in order.tolist():  # (B is not a multiple of C only for an epoch of fewer rows than blocks)
        out[lane_of_block(int(block), len(order), lanes)].append(int(block))
    return out


class CanonicalMixtureBook(CanonicalBook, MixtureBook):
    """A mixture's stream book that serves its C canonical lanes (StreamKey with num_workers
    CANONICAL_STREAM, rank = lane, world_size = C) as mixed streams of whole blocks."""

    def __init__(self, plan: MixturePlan, *, lanes: int):
        if plan.lanes != lanes:
            raise ValueError(f"a mixture read in {lanes} canonical lanes must be planned for them (its plan has lanes={plan.lanes})")
        super().__init__(plan, lanes=lanes)

    def lane_streams(self, epoch: int) -> list[Stream]:
        plan = self.mix
        return self._layouts.get(
            epoch,
            lambda: [
                plan.build_stream((plan.seed, epoch, self.lanes, lane, _SEED_MARK), epoch, blocks, lane_phase(lane, self.lanes, len(plan.sources)))
                for lane, blocks in enumerate(lane_blocks(plan.epoch(epoch).order, self.lanes))
            ],
        )

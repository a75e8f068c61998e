"""Live progress of one rank: what the training loop has received of the current epoch.

Its JSON form (state/schema.py) uses other words for the same things: ``positions`` is
``rows_delivered`` (rows of each lane received), ``next_lane`` is ``next_worker``; see the
glossary in docs/architecture.md.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property

from ..plan.lanes import Lane


@dataclass
class Progress:
    """Rows received per lane of one epoch, the lane whose chunk comes next, padding rows
    received, and (after an elastic resume) the lanes that resume dealt this rank."""

    epoch: int
    positions: list[int]
    next_lane: int = 0
    padding_delivered: int = 0
    batches_delivered: int | None = 0  # None: restored from a state that did not count them
    skipped: dict[int, str] = field(default_factory=dict)  # split -> error (on_error="skip")
    dealt: tuple[Lane, ...] | None = None  # lanes an elastic resume dealt (None: the planned ones)
    dealt_target: int | None = None  # the batch count every rank meets with those lanes
    restored: bool = False  # came from load_state_dict and no pass has started since

    @classmethod
    def fresh(cls, epoch: int, lanes: int) -> Progress:
        return cls(epoch, [0] * lanes)

    @property
    def started(self) -> bool:
        """Whether any row was delivered (or the epoch's lanes were re-dealt)."""
        return bool(any(self.positions) or self.padding_delivered or self.dealt is not None)

    @cached_property
    def deal_digest(self) -> str | None:
        """A digest of the lanes and batch target an elastic resume set (None: the planned ones): a
        worker state's rows_delivered counts along its lane, so it fits only the same deal."""
        if self.dealt is None and self.dealt_target is None:
            return None
        lanes = None if self.dealt is None else [[s.to_list() for s in lane.segments] for lane in self.dealt]
        text = json.dumps({"lanes": lanes, "batch_target": self.dealt_target})
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def advance(self, lane: int, end: int, chunk_stop: int, following: int, batches: int = 0, padding: bool = False) -> None:
        """Count rows of ``lane`` up to ``end`` (and ``batches`` batches) as received; when the
        chunk is done, ``following`` is the lane whose chunk comes next."""
        if self.batches_delivered is not None:
            self.batches_delivered += batches
        if padding:
            self.padding_delivered = end
            return
        self.positions[lane] = end
        if end == chunk_stop:
            self.next_lane = following

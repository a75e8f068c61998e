"""Loader statistics: what the training loop received, and who waited for whom.

``loader.stats`` (a :class:`LoaderStats`) is updated as batches are handed to the
training loop. It is kept apart from the checkpoint state (``state_dict`` never
contains it) and costs two clock reads per batch.

Two times tell whether the loader is the bottleneck:

- ``wait_s``: time the loop spent inside ``next(iterator)`` waiting for a batch;
- ``loop_s``: time between receiving a batch and asking for the next one (the
  loop's own work: forward, backward, optimizer step, logging, ...).

The wait for the first batch of each pass (worker start-up, first reads) is kept
apart in ``startup_s`` so that it does not blur the steady-state picture.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: Share of the steady-state time spent waiting above which the loader is called the bottleneck.
BOTTLENECK_WAIT_SHARE = 0.10


def batch_rows(batch: Any) -> int:
    """Rows in a batch (a dict of tensors, lists or ``Ragged`` pairs)."""
    if isinstance(batch, dict):
        for value in batch.values():
            return batch_rows(value)
        return 0
    offsets = getattr(batch, "offsets", None)
    if offsets is not None:  # Ragged(values, offsets)
        return max(0, len(offsets) - 1)
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    return len(batch)


@dataclass
class StatsSnapshot:
    """Counters over some span of iteration (a pass, or everything since the last reset)."""

    batches: int = 0
    """Batches delivered."""
    rows: int = 0
    """Rows in them (padding included)."""
    startup_s: float = 0.0
    """Time to the first batch of each pass (planning, starting workers, the first read)."""
    wait_s: float = 0.0
    """Time the loop waited for a batch after the first."""
    loop_s: float = 0.0
    """Time spent in the loop's own body between batches."""

    @property
    def elapsed_s(self) -> float:
        """Time spent iterating: start-up, waiting and the loop's own work."""
        return self.startup_s + self.wait_s + self.loop_s

    @property
    def rows_per_s(self) -> float:
        """Rows per second of ``elapsed_s``."""
        return self.rows / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        """Batches per second of ``elapsed_s``."""
        return self.batches / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def wait_share(self) -> float:
        """Share of the steady-state time (``wait_s + loop_s``) the loop spent waiting."""
        total = self.wait_s + self.loop_s
        return self.wait_s / total if total > 0 else 0.0

    @property
    def loader_bound(self) -> bool:
        """True when the loop waited for data more than ``BOTTLENECK_WAIT_SHARE`` of the time."""
        return self.wait_share > BOTTLENECK_WAIT_SHARE

    def as_dict(self) -> dict[str, float | int | bool]:
        """Plain numbers, for logging or a metrics system."""
        out: dict[str, Any] = asdict(self)
        out.update(
            elapsed_s=self.elapsed_s,
            rows_per_s=self.rows_per_s,
            batches_per_s=self.batches_per_s,
            wait_share=self.wait_share,
            loader_bound=self.loader_bound,
        )
        return out

    def summary(self) -> str:
        """One line a person can read."""
        if not self.batches:
            return "no batches delivered yet"
        verdict = (
            "the loader is the bottleneck (try more num_workers, fewer columns, or a larger chunk_rows)"
            if self.loader_bound
            else "the loader keeps up"
        )
        return (
            f"{self.batches:,} batches, {self.rows:,} rows in {self.elapsed_s:.2f} s "
            f"({self.rows_per_s:,.0f} rows/s); start-up {self.startup_s:.2f} s; "
            f"waited {self.wait_s:.2f} s for batches vs {self.loop_s:.2f} s between them "
            f"({self.wait_share:.0%} waiting): {verdict}"
        )

    def _minus(self, other: "StatsSnapshot") -> "StatsSnapshot":
        return StatsSnapshot(
            self.batches - other.batches,
            self.rows - other.rows,
            self.startup_s - other.startup_s,
            self.wait_s - other.wait_s,
            self.loop_s - other.loop_s,
        )


@dataclass
class LoaderStats(StatsSnapshot):
    """Running totals since the loader was created (or since :meth:`reset`).

    ``last_pass`` holds the counters of the most recent pass over the loader
    (one ``for batch in loader`` loop), also while it is running. Set
    ``enabled = False`` to stop counting.
    """

    enabled: bool = True
    passes: int = 0
    _pass_start: StatsSnapshot = field(default_factory=StatsSnapshot, repr=False)
    _asked: float = field(default=0.0, repr=False)  # when the loop last asked for a batch
    _handed_out: float | None = field(default=None, repr=False)  # when the last batch went to it
    _first: bool = field(default=True, repr=False)  # no batch handed out yet in this pass

    def reset(self) -> None:
        """Zero all counters (``enabled`` is kept)."""
        self.batches = self.rows = self.passes = 0
        self.startup_s = self.wait_s = self.loop_s = 0.0
        self._pass_start = StatsSnapshot()

    @property
    def last_pass(self) -> StatsSnapshot:
        """The counters of the latest pass over the loader (the current one while it runs)."""
        return self._totals()._minus(self._pass_start)

    def as_dict(self) -> dict[str, float | int | bool]:
        """Every counter and derived figure by name, and the number of passes (for a metrics system)."""
        out = self._totals().as_dict()
        out["passes"] = self.passes
        return out

    def _totals(self) -> StatsSnapshot:
        return StatsSnapshot(self.batches, self.rows, self.startup_s, self.wait_s, self.loop_s)

    # --- called as batches are handed to the loop (runtime/delivery.py: RankDelivery._delivered)
    def start_pass(self) -> None:
        """A pass begins: the loop asks for its first batch now."""
        if not self.enabled:
            return
        self.passes += 1
        self._pass_start = self._totals()
        self._asked, self._handed_out, self._first = time.perf_counter(), None, True

    def handing_out(self, batch: Any, rows: int | None = None) -> None:
        """``batch`` goes to the loop next; ``rows``: its source rows, where the batch itself may
        not tell (a transform's output)."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if self._first:
            self.startup_s += now - self._asked
            self._first = False
        else:
            self.wait_s += now - self._asked
        self.batches += 1
        self.rows += batch_rows(batch) if rows is None else rows
        self._handed_out = now

    def asked(self) -> None:
        """The loop asks for the next batch."""
        if not self.enabled:
            return
        self._asked = time.perf_counter()
        if self._handed_out is not None:
            self.loop_s += self._asked - self._handed_out

    def end_pass(self) -> None:
        """The pass delivered its last batch."""
        if self.enabled:
            log.info("pass %d finished: %s", self.passes, self.last_pass.summary())

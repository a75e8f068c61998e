"""The loader's background threads (a device feed, reader threads) are stopped before the
interpreter exits: a daemon thread frozen inside torch or pyarrow while the interpreter shuts
down can abort the process."""

from __future__ import annotations

import atexit
import weakref
from typing import Protocol


class Stoppable(Protocol):
    def close(self, timeout: float | None = None) -> None: ...


_live: weakref.WeakSet = weakref.WeakSet()


def track(owner: Stoppable) -> None:
    """Close ``owner``'s threads at exit (it is forgotten when it is garbage collected)."""
    _live.add(owner)


@atexit.register
def _close_all() -> None:
    for owner in list(_live):
        owner.close(timeout=1.0)

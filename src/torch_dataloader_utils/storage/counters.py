"""Named counts that several threads add to at once (a store's reads: decode-ahead threads share it)."""

from __future__ import annotations

import os
import threading

_LOCK = threading.Lock()


def _new_lock() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # a fork's child: another thread of the parent may have held the old one


os.register_at_fork(after_in_child=_new_lock)


class Counters(dict[str, int]):
    """A dict of counts; ``add`` adds to several at once, whatever other threads add meanwhile."""

    def add(self, **amounts: int) -> None:
        with _LOCK:
            for key, amount in amounts.items():
                self[key] += amount

"""The loader's background threads (a device feed, a host feed, reader threads) are stopped and
joined before the interpreter exits, whether or not the loader that started them still exists: a
daemon thread still inside torch or pyarrow while the interpreter shuts down can abort the process
("terminate called without an active exception")."""

from __future__ import annotations

import atexit
import threading
import time
import weakref

EXIT_JOIN_S = 2.0  # at most this long, for all of them together: one reader may be mid-chunk

_running: weakref.WeakKeyDictionary[threading.Thread, threading.Event] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def start(thread: threading.Thread, stop: threading.Event) -> None:
    """Start ``thread``, which ends soon after ``stop`` is set; at exit, ``stop`` is set and the
    thread joined."""
    with _lock:
        _running[thread] = stop
    thread.start()


@atexit.register
def stop_all(timeout: float = EXIT_JOIN_S) -> None:
    """Stop every running background thread and wait for them (up to ``timeout`` seconds in all)."""
    with _lock:
        running = list(_running.items())
    for _, stop in running:
        stop.set()
    deadline = time.monotonic() + timeout
    for thread, _ in running:
        thread.join(max(0.0, deadline - time.monotonic()))

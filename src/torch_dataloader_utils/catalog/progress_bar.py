"""A progress bar for slow planning (thousands of files, remote footers); silent otherwise.

The bar (tqdm, imported only when needed) appears on stderr once planning has
run for ``PROGRESS_DELAY_S`` seconds (counted from the start of planning, listing
included: ``planning_started``). On a terminal it is redrawn as tqdm does; on any
other stream (a job log, a notebook) it is written at most every
``LOG_INTERVAL_S`` seconds. The environment variable ``TDU_PROGRESS=0`` never
shows it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

T = TypeVar("T")

#: Seconds of planning after which the bar appears.
PROGRESS_DELAY_S = 2.0
#: Seconds between two updates of a bar written to a stream that is not a terminal.
LOG_INTERVAL_S = 10.0

_planning = threading.local()  # .started: when the planning under way in this thread began


@contextlib.contextmanager
def planning_started() -> Iterator[None]:
    """Planning in this thread starts now: a bar within it counts its delay from here (the
    outermost start counts, as a mixture plans its sources one after another)."""
    outer = getattr(_planning, "started", None)
    if outer is None:
        _planning.started = time.monotonic()
    try:
        yield
    finally:
        if outer is None:
            _planning.started = None


def _is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _tqdm() -> Any:
    """tqdm's class, or None when it is not installed or TDU_PROGRESS=0 turns bars off."""
    if os.environ.get("TDU_PROGRESS", "").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # optional: pip install tqdm (the [progress] extra)
        return None
    return tqdm


def _delay() -> float:
    """Seconds until the bar may appear: PROGRESS_DELAY_S from the start of planning."""
    started = getattr(_planning, "started", None)
    return PROGRESS_DELAY_S if started is None else max(0.0, PROGRESS_DELAY_S - (time.monotonic() - started))


@contextlib.contextmanager
def waiting(total: int, desc: str, stream: IO[str] | None = None) -> Iterator[None]:
    """A bar for ``total`` files done in one call that reports no progress (a concurrent batch of
    requests): drawn with its elapsed time once planning has lasted the delay, then every half
    second (every LOG_INTERVAL_S on a stream that is not a terminal), complete when the call returns."""
    stream = stream if stream is not None else sys.stderr
    tqdm = _tqdm()
    if tqdm is None or total == 0:
        yield
        return
    terminal = _is_terminal(stream)
    delay = _delay()
    bar = tqdm(total=total, desc=desc, unit="file", delay=delay, file=stream, leave=not terminal, mininterval=0.0)
    done = threading.Event()

    def tick() -> None:
        if not done.wait(delay):
            bar.refresh()
            while not done.wait(0.5 if terminal else LOG_INTERVAL_S):
                bar.refresh()

    ticker = threading.Thread(target=tick, name="tdu-planning-bar", daemon=True)
    ticker.start()
    try:
        yield
        bar.update(total)
    finally:
        done.set()
        ticker.join()
        bar.close()


def progress(iterable: Iterable[T], total: int, desc: str, stream: IO[str] | None = None) -> Iterator[T]:
    """Yield ``iterable`` unchanged, with a bar on ``stream`` (stderr) if planning lasts long enough."""
    stream = stream if stream is not None else sys.stderr
    tqdm = _tqdm()
    if tqdm is None:
        yield from iterable
        return
    delay = _delay()
    terminal = _is_terminal(stream)
    # tqdm draws only when ``mininterval`` has passed since the last draw (the start, at first):
    # a log's bar waits for the delay alone once, then draws every LOG_INTERVAL_S
    first = 0.1 if terminal else max(delay, 0.1)
    with tqdm(total=total, desc=desc, unit="file", delay=delay, file=stream, leave=not terminal, mininterval=first) as bar:
        for item in iterable:
            bar.update(1)
            if not terminal and bar.last_print_n:
                bar.mininterval = LOG_INTERVAL_S
            yield item

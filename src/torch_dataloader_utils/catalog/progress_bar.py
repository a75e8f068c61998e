"""A progress bar for slow planning (thousands of files, remote footers); silent otherwise.

The bar (tqdm, imported only when needed) appears on stderr once planning has
run for ``PROGRESS_DELAY_S`` seconds, and only when stderr is a terminal.
The environment variable ``TDU_PROGRESS`` overrides that: ``0`` never shows a
bar, ``1`` shows it on any stream (for example in a job log).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import IO, TypeVar

T = TypeVar("T")

#: Seconds of planning after which the bar appears.
PROGRESS_DELAY_S = 2.0


def _wanted(stream: IO[str]) -> bool:
    forced = os.environ.get("TDU_PROGRESS", "").strip().lower()
    if forced in ("0", "false", "no", "off"):
        return False
    if forced in ("1", "true", "yes", "on"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def progress(iterable: Iterable[T], total: int, desc: str, stream: IO[str] | None = None) -> Iterator[T]:
    """Yield ``iterable`` unchanged, with a bar on ``stream`` (stderr) if it lasts long enough."""
    stream = stream if stream is not None else sys.stderr
    if not _wanted(stream):
        yield from iterable
        return
    try:
        from tqdm import tqdm
    except ImportError:  # optional: pip install tqdm (the [progress] extra)
        yield from iterable
        return
    with tqdm(total=total, desc=desc, unit="file", delay=PROGRESS_DELAY_S, file=stream, leave=False) as bar:
        for item in iterable:
            bar.update(1)
            yield item

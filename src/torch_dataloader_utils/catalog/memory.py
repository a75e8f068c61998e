"""Handing memory that planning freed back to the system."""

from __future__ import annotations

import ctypes
import gc

#: Planning this many files frees enough of the C heap to be worth handing back
TRIM_AFTER_FILES = 10_000


def return_freed_memory(files: int) -> None:
    """After planning ``files`` files: the pages the C allocator keeps of what parsing footers and
    planning freed, handed back to the system (glibc keeps freed memory in its heap: about 18 MB
    after 100,000 footers, a tenth of what planning adds to the process). Nothing for fewer
    files, or where the C library has no ``malloc_trim``. The cycles planning left (pyarrow's
    file objects, swept only young while it ran) are collected first, so that their memory is
    free when it is handed back."""
    if files < TRIM_AFTER_FILES:
        return
    gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)

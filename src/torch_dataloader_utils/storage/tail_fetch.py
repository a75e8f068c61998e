"""Tails (footers) of many files fetched by a client other than fsspec's, with our retries.

``RemoteStore.prefetch_tails`` takes a ``TailFetcher`` (catalog/arrow_tails.py gives one that
uses pyarrow's C++ S3 client); ``fetch_retrying`` retries its transient faults as ``retry_call``
retries fsspec's, and hands back the reads it could not make for good, for fsspec to make.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from ..errors import FileChangedError, RemoteReadError
from .retry import ShortReadError, backoff, is_transient, retries_spent_advice

log = logging.getLogger(__name__)


class TailFetcher(Protocol):
    requests_per_read: int  # requests the store receives per range read

    def fetch(self, requests: Sequence[tuple[str, int, int, int]]) -> list:
        """Bytes of each (path, start, end, listed size), or the exception its read raised."""
        ...


def fetch_retrying(
    tails: TailFetcher, requests: Sequence[tuple[str, int, int, int]], retries: int, on_retry: Callable[[], None], protocol: str
) -> tuple[list, list[int]]:
    """``tails.fetch(requests)`` with transient faults retried as ``retry_call`` retries them
    (each attempt fetches the ranges still missing; backoff between attempts). Returns the
    results (None where a read failed for a reason retrying cannot help) and the indices of those
    reads, for the caller to make through fsspec, whose errors name the file as every read's do.
    ``FileChangedError`` is raised; a fault still there after ``retries`` retries is
    ``RemoteReadError`` naming the file."""
    results: list = [None] * len(requests)
    pending, permanent, attempts = list(range(len(requests))), [], 0
    while pending:
        attempts += 1
        outcomes = tails.fetch([requests[i] for i in pending])
        transient = []
        for i, outcome in zip(pending, outcomes):
            path, start, end, _ = requests[i]
            if isinstance(outcome, FileChangedError):
                raise outcome
            if not isinstance(outcome, BaseException) and len(outcome) != end - start:
                outcome = ShortReadError(f"got {len(outcome)} of {end - start} bytes")
            if not isinstance(outcome, BaseException):
                results[i] = outcome
            elif is_transient(outcome):
                transient.append((i, outcome))
            else:
                permanent.append(i)
        pending = [i for i, _ in transient]
        if not transient:
            break
        first, error = transient[0]
        if attempts > retries:
            path, start, end, _ = requests[first]
            raise RemoteReadError(
                f"reading {protocol}://{path} bytes [{start}, {end}) failed after {attempts} attempt(s): {type(error).__name__}: {error}"
                f"{retries_spent_advice(error)}"
            ) from error
        delay = backoff(attempts - 1)
        log.warning("reading %d range(s) failed (%s: %s); retry %d/%d in %.1fs", len(pending), type(error).__name__, error, attempts, retries, delay)
        on_retry()
        time.sleep(delay)
    return results, permanent

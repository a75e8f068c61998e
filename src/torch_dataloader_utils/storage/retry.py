"""Retrying I/O against object stores: which faults are transient, the backoff, and the one
retry loop (``retry_call``) that every read, listing and metadata call of ``RemoteStore`` goes
through.

A fault is transient when retrying may help: timeouts, connection resets, a cut-off response
(``ShortReadError``), HTTP 5xx, 408 and 429. The client libraries that raise connection-level
faults (aiohttp, botocore, azure-core, ...) are optional, so their exception classes are
recognised by name. Everything else (a missing file, a permission, a bad argument, a file that
changed after planning) fails at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import FileChangedError

log = logging.getLogger(__name__)
T = TypeVar("T")

BACKOFF_FIRST_S = 0.2  # the delay before the first retry (then doubling), scaled by 0.5 to 1.5 at random
BACKOFF_MAX_S = 5.0
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileChangedError, ValueError, TypeError)
_TRANSIENT_NAMES = {  # connection-level faults, by class name (their libraries are optional)
    "ServerDisconnectedError",
    "ClientPayloadError",
    "ClientOSError",
    "ClientConnectionError",
    "ServerTimeoutError",
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "ResponseStreamingError",
    "IncompleteRead",
    "ServiceRequestError",
    "ServiceResponseError",
    "TransientError",
}


class ShortReadError(OSError):
    """The server returned fewer bytes than the range asked for (a cut-off response)."""


def http_status(error: BaseException) -> int | None:
    """The HTTP status of a response error (botocore, gcsfs, azure, aiohttp), else None."""
    if type(error).__module__.startswith("aiohttp.http"):  # parser errors carry a fake 400
        return None
    for attr in ("status", "status_code", "code"):
        value = getattr(error, attr, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        value = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(value, int):
            return value
    return None


def error_chain(error: BaseException) -> list[BaseException]:
    """``error`` and the errors it was raised from or while handling (at most 10)."""
    seen: list[BaseException] = []
    item: BaseException | None = error
    while item is not None and all(item is not s for s in seen) and len(seen) < 10:
        seen.append(item)
        item = item.__cause__ or item.__context__
    return seen


def store_error(what: str, error: BaseException, storage_options: dict) -> OSError:
    """The error to raise when ``what`` (a listing, a file's metadata) failed at the store with
    one of the store's own error types: it names ``what`` and says what to check (a
    PermissionError stays one)."""
    advice = refusal_advice(error, storage_options) or (
        "; check the endpoint, region and credentials in storage_options, and that the store is reachable from here"
    )
    kind = PermissionError if isinstance(error, PermissionError) else OSError
    return kind(f"{what} failed ({type(error).__name__}: {error}){advice}")


def refusal_advice(error: BaseException, storage_options: dict) -> str:
    """What to check when the store refused access (a permission error, HTTP 401 or 403); "" otherwise."""
    if not any(isinstance(e, PermissionError) or http_status(e) in (401, 403) for e in error_chain(error)):
        return ""
    anonymous = " (anon=True sends none)" if storage_options.get("anon") else ""
    return f". The store refused access: check the credentials in storage_options{anonymous}"


def retries_spent_advice(error: BaseException) -> str:
    """What to do when a transient fault outlasted the retries; "" for other errors."""
    if not is_transient(error):
        return ""
    return (
        ". The store kept failing: once it answers again, resume from the last state_dict(); download_retry sets how "
        "often a read is retried, and on_error='skip' leaves a split that cannot be read out of the epoch"
    )


def is_transient(error: BaseException) -> bool:
    """Whether retrying may help: timeouts, resets and cut-off responses, HTTP 5xx, 408 and 429."""
    chain = error_chain(error)
    for item in chain:
        if isinstance(item, (TimeoutError, asyncio.TimeoutError, ConnectionError, ShortReadError)):
            return True
        if any(cls.__name__ in _TRANSIENT_NAMES for cls in type(item).__mro__):
            return True
    for item in chain:
        status = http_status(item)
        if status is not None:
            return status >= 500 or status in (408, 429)
    if isinstance(error, _PERMANENT):
        return False
    return isinstance(error, OSError)


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt + 1``: exponential with jitter (so that many workers
    retrying at once do not hit the store in step), at most ``BACKOFF_MAX_S``."""
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**attempt * (0.5 + random.random()))


def retry_call(fn: Callable[[], T], what: str | Callable[[], str], retries: int, on_retry: Callable[[], None] | None = None) -> T:
    """Call ``fn``, retrying transient errors ``retries`` times with backoff; the last error (or a
    permanent one) is raised as it is. ``what`` names the call in the warning logged before each
    retry (a callable: evaluated then); ``on_retry`` is called before each retry."""
    for attempt in range(retries + 1):
        try:
            return fn()
        except Exception as error:
            if attempt >= retries or not is_transient(error):
                raise
            delay = backoff(attempt)
            name = what() if callable(what) else what
            log.warning("%s failed (%s: %s); retry %d/%d in %.1fs", name, type(error).__name__, error, attempt + 1, retries, delay)
            if on_retry is not None:
                on_retry()
            time.sleep(delay)
    raise AssertionError("unreachable")

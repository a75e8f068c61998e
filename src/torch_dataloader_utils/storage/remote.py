"""Remote files through fsspec: concurrent ranged reads with retries, timeouts and a disk cache.

``RemoteStore`` wraps an fsspec filesystem of an object store (s3, gs, az,
...). It is what the catalog keeps as its ``fs`` for remote paths: it pickles
without its client (and recreates it in a new process, including a forked
DataLoader worker), forwards other attributes to the fsspec filesystem, and
reads byte ranges of files concurrently on fsspec's event loop, retrying
transient faults with backoff (retry.py) and serving repeated reads from ``RangeCache``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import FileChangedError, RemoteReadError
from .cache import RangeCache, entry_key
from .counters import Counters
from .pinned_reads import PinnedRead, pinned_read_for
from .retry import ShortReadError, error_chain, http_status, is_transient, refusal_advice, retries_spent_advice, retry_call
from .tail_fetch import TailFetcher, fetch_retrying
from .versions import check_version

log = logging.getLogger(__name__)
T = TypeVar("T")

TAIL_BYTES = 64 * 1024
#: Footer requests in flight while planning, per ``max_concurrency``: a tail is small, so its
#: request is mostly waiting on the store's latency, and more of them in flight hide more of it
TAILS_IN_FLIGHT = 2
PART_BYTES = 8 * 1024 * 1024  # the most one request asks for; a longer range goes out as parts at once


@dataclass(frozen=True)
class IOOptions:
    """How remote files are read. ``download_retry``: retries after the first attempt of a
    request; ``download_timeout``: seconds per request (None: no limit); ``cache_dir`` and
    ``cache_limit_bytes``: a local disk cache of the byte ranges read (None: no cache / no limit)."""

    download_retry: int = 2
    download_timeout: float | None = 60.0
    cache_dir: str | None = None
    cache_limit_bytes: int | None = None
    max_concurrency: int = 64

    def __post_init__(self) -> None:
        for name in ("download_retry", "max_concurrency", *(("cache_limit_bytes",) if self.cache_limit_bytes is not None else ())):
            if isinstance(getattr(self, name), bool) or not hasattr(getattr(self, name), "__index__"):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if self.download_timeout is not None and (isinstance(self.download_timeout, bool) or not isinstance(self.download_timeout, (int, float))):
            raise ValueError(f"download_timeout must be a number of seconds or None, got {self.download_timeout!r}")
        if self.download_retry < 0:
            raise ValueError(f"download_retry must be >= 0, got {self.download_retry}")
        if self.download_timeout is not None and not self.download_timeout > 0:  # (NaN too)
            raise ValueError(f"download_timeout must be positive or None, got {self.download_timeout}")
        if self.cache_limit_bytes is not None and self.cache_limit_bytes <= 0:
            raise ValueError(f"cache_limit_bytes must be positive or None, got {self.cache_limit_bytes}")
        if self.cache_dir is not None and (not isinstance(self.cache_dir, (str, os.PathLike)) or not os.fspath(self.cache_dir)):
            raise ValueError(f"cache_dir must be a directory path or None, got {self.cache_dir!r}")
        if self.cache_limit_bytes is not None and self.cache_dir is None:
            raise ValueError("cache_limit_bytes needs cache_dir")


async def _within(coroutine: Any, timeout: float) -> Any:
    if _timeout_scope is None:  # Python 3.10
        return await asyncio.wait_for(coroutine, timeout)
    async with _timeout_scope(timeout):  # no task of its own per request, unlike wait_for
        return await coroutine


_timeout_scope = getattr(asyncio, "timeout", None)


async def _gather(fs: Any, requests: Sequence[tuple[str, int, int, str | None]], timeout: float | None, limit: int, pinned: PinnedRead | None) -> list:
    """Each request's bytes or exception, at most ``limit`` in flight: ``limit`` workers take
    the next request as they finish one (a task and a semaphore wait per request cost the
    event-loop thread as much CPU as a third of the request itself, at 100,000 small files)."""
    results: list = [None] * len(requests)
    order = iter(range(len(requests)))

    async def worker() -> None:
        for i in order:
            path, start, end, tag = requests[i]
            read = pinned(fs, path, start, end, tag) if pinned and tag else fs._cat_file(path, start=start, end=end)
            try:
                results[i] = await (_within(read, timeout) if timeout else read)
            except Exception as error:  # noqa: BLE001 - returned: the caller retries or names the file
                results[i] = error

    await asyncio.gather(*(worker() for _ in range(min(limit, len(requests)))))
    return results


def protocol_of(fs: Any) -> str:
    """The first protocol name of an fsspec filesystem (``"s3"`` for s3fs, ``"file"`` for local)."""
    if isinstance(fs, RemoteStore):  # asked per file while planning: not through __getattr__
        return fs.protocol_name
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


class RemoteStore:
    """An fsspec object-store filesystem plus how to read it (retries, timeout, cache)."""

    def __init__(self, fs: Any, options: IOOptions | None = None):
        self.options = options or IOOptions()
        self.protocol_name = protocol_of(fs)
        self._fs_class = type(fs)
        self._storage_options = dict(fs.storage_options)
        self._fs: Any = fs
        self._pid = os.getpid()
        self._cache: RangeCache | None = None
        self._tails: dict[str, tuple[int, bytes]] = {}
        self._files: dict[str, tuple[str, str | None, int]] = {}
        self.stats = Counters(requests=0, bytes=0, cache_hits=0, cache_bytes=0, retries=0, fetcher_reads=0)

    # ----------------------------------------------------------- plumbing
    @property
    def fs(self) -> Any:
        """The fsspec filesystem of this process (recreated after fork or unpickling)."""
        if self._fs is None or self._pid != os.getpid():
            self._fs = self._fs_class(**self._storage_options)
            self._pid = os.getpid()
            self._cache = None
        return self._fs

    @property
    def cache(self) -> RangeCache | None:
        """The disk cache of this process (None without ``cache_dir``)."""
        if self.options.cache_dir is None:
            return None
        if self._cache is None or self._pid != os.getpid():
            self._cache = RangeCache(self.options.cache_dir, self.options.cache_limit_bytes)
        return self._cache

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_fs", "_fs_class", "_storage_options", "_pid", "_cache", "_tails", "_files", "options"):
            raise AttributeError(name)
        return getattr(self.fs, name)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_fs=None, _cache=None, _tails={})
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    # Listing and metadata calls, bounded by download_timeout like the reads (discovery uses these)
    def find(self, path: str, **kwargs: Any) -> Any:
        return self._bounded("find", path, **kwargs)

    def glob(self, path: str, **kwargs: Any) -> Any:
        return self._bounded("glob", path, **kwargs)

    def isdir(self, path: str) -> bool:
        return self._bounded("isdir", path)

    def info(self, path: str, **kwargs: Any) -> dict:
        return self._bounded("info", path, **kwargs)

    def _bounded(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``fs.<name>(...)``; on an async filesystem its coroutine under ``download_timeout``
        (the client's own retries included), so that a store that never answers is an error."""
        fs, timeout = self.fs, self.options.download_timeout
        if not timeout or not getattr(fs, "async_impl", False):
            return getattr(fs, name)(*args, **kwargs)
        from fsspec.asyn import sync

        try:
            return sync(fs.loop, _within, getattr(fs, "_" + name)(*args, **kwargs), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no answer within download_timeout={timeout}s") from None

    def call(self, fn: Callable[[Any], T], what: str) -> T:
        """``fn(fs)`` with transient faults retried (for listing and metadata calls)."""
        return retry_call(lambda: fn(self.fs), what, self.options.download_retry)

    # -------------------------------------------------------------- reads
    def read_ranges(self, path: str, ranges: Sequence[tuple[int, int]], ident: tuple[str, str | None, int]) -> list[bytes]:
        """Bytes of each [start, end) of one file; ``ident`` = (url, tag, size) keys the cache."""
        return self.read_many([(path, start, end) for start, end in ranges], [ident] * len(ranges))

    def read_many(
        self, requests: Sequence[tuple[str, int, int]], idents: Sequence[tuple[str, str | None, int]], verify: bool = True, fetcher: TailFetcher | None = None,
        in_flight: int | None = None,
    ) -> list[bytes]:
        """Bytes of many (path, start, end) ranges, fetched concurrently, retried, cached.

        A range fetched from a file with a known tag is the planned version's bytes, or the read
        raises FileChangedError: on S3 and Azure every request carries the planned ETag as its
        condition (pinned_reads.py); on other stores, with ``verify``, each file's size and tag are
        fetched again after its ranges, before any of them is used or cached (otherwise the planned
        footer would be applied to other bytes, and the cache would keep them under the planned
        version's key). Ranges served from the cache are the planned version's bytes. ``fetcher``:
        the ranges not cached are fetched by it (retried; a file's size is checked instead of
        its tag), those it cannot make for good through fsspec. ``in_flight``: the most requests
        through fsspec at once (default ``max_concurrency``)."""
        cache = self.cache
        keys = [entry_key(url, tag, size, s, e) for (_, s, e), (url, tag, size) in zip(requests, idents)] if cache else []
        results: list[bytes | None] = [None] * len(requests)
        pending = []
        for i, (_, start, end) in enumerate(requests):
            hit = cache.get(keys[i], end - start) if cache else None
            if hit is None:
                pending.append(i)
            else:
                results[i] = hit
                self.stats.add(cache_hits=1, cache_bytes=len(hit))
        if not pending:
            return results  # type: ignore[return-value]
        pinned = pinned_read_for(self.fs)
        if fetcher is not None:
            fetched = self._fetch_with(fetcher, [(*requests[i], idents[i][2]) for i in pending], pinned, [idents[i][1] for i in pending])
        else:
            fetched = self._fetch_ranges([(*requests[i], idents[i][1]) for i in pending], pinned, in_flight)
        if verify and pinned is None:
            self._check_versions({requests[i][0]: idents[i] for i in pending})
        for i, data in zip(pending, fetched):
            results[i] = data
            self.stats.add(bytes=len(data))
            if cache:
                cache.put_or_log(keys[i], data)
        return results  # type: ignore[return-value]

    def _fetch_with(
        self, fetcher: TailFetcher, requests: Sequence[tuple[str, int, int, int]], pinned: PinnedRead | None, tags: Sequence[str | None]
    ) -> list[bytes]:
        """Ranges of (path, start, end, size) through ``fetcher``, retried; those it could not
        read for good (a permission, a missing file, a redirect) through fsspec, whose error names them."""
        self.stats.add(fetcher_reads=len(requests), requests=fetcher.requests_per_read * len(requests))
        results, refused = fetch_retrying(fetcher, requests, self.options.download_retry, self._count_retry, self.protocol_name)
        if refused:
            again = self._fetch_ranges([(*requests[i][:3], tags[i]) for i in refused], pinned)
            for i, data in zip(refused, again):
                results[i] = data
        return results

    def _fetch_ranges(
        self, requests: Sequence[tuple[str, int, int, str | None]], pinned: PinnedRead | None, in_flight: int | None = None
    ) -> list[bytes]:
        """Bytes of each (path, start, end, tag), fetched in parts of at most PART_BYTES."""
        parts: list[tuple[str, int, int, str | None]] = []
        spans: list[tuple[int, int]] = []
        for path, start, end, tag in requests:
            first = len(parts)
            parts += [(path, s, min(s + PART_BYTES, end), tag) for s in range(start, end, PART_BYTES)]
            spans.append((first, len(parts)))
        data = self._fetch_parts(parts, pinned, in_flight)
        return [data[a] if b == a + 1 else b"".join(data[a:b]) for a, b in spans]

    def _fetch_parts(
        self, requests: Sequence[tuple[str, int, int, str | None]], pinned: PinnedRead | None, in_flight: int | None = None
    ) -> list[bytes]:
        """Bytes of each (path, start, end, tag). Each attempt fetches the parts still missing
        at once; the first part's failure decides whether to retry (``retry_call``), and a part
        that failed for good raises RemoteReadError naming it."""
        results: list[bytes | None] = [None] * len(requests)
        pending = list(range(len(requests)))
        attempts = 0

        def attempt() -> None:
            nonlocal pending, attempts
            attempts += 1
            try:
                outcomes = self._fetch([requests[i] for i in pending], pinned, in_flight)
            except Exception as error:  # noqa: BLE001 - the whole batch failed: retried like one range
                outcomes = [error] * len(pending)
            failed: list[tuple[int, BaseException]] = []
            for i, outcome in zip(pending, outcomes):
                path, start, end, tag = requests[i]
                if pinned and isinstance(outcome, BaseException) and any(http_status(e) == 412 for e in error_chain(outcome)):
                    raise FileChangedError(
                        f"the file changed after planning (the ETag of {path} is no longer {tag}, or it was deleted); create the loader again"
                    )
                if not isinstance(outcome, BaseException) and len(outcome) != end - start:
                    outcome = ShortReadError(f"got {len(outcome)} of {end - start} bytes")
                if isinstance(outcome, BaseException):
                    failed.append((i, outcome))
                else:
                    results[i] = outcome
            pending = [i for i, _ in failed]
            if failed:
                raise failed[0][1]

        try:
            retry_call(attempt, lambda: f"reading {len(pending)} range(s)", self.options.download_retry, self._count_retry)
        except FileChangedError:
            raise
        except Exception as error:
            path, start, end, _ = requests[pending[0]]
            detail = str(error) or (f"not complete within download_timeout={self.options.download_timeout}s" if is_transient(error) else "")
            raise RemoteReadError(
                f"reading {self.protocol_name}://{path} bytes [{start}, {end}) failed after {attempts} attempt(s): "
                f"{type(error).__name__}: {detail}{refusal_advice(error, self.storage_options)}{retries_spent_advice(error)}"
            ) from error
        return results  # type: ignore[return-value]

    def _count_retry(self) -> None:
        self.stats.add(retries=1)

    def _check_versions(self, files: dict[str, tuple[str, str | None, int]]) -> None:
        """FileChangedError unless each file still has its planned size and tag."""
        for path, (url, tag, size) in files.items():
            if tag is None:
                continue
            self.fs.invalidate_cache(path)  # fsspec may answer from the listing made at planning
            try:
                info = self._info(path, url)
            except Exception as error:  # re-raised as the read failure it is
                raise RemoteReadError(f"checking the version of {url} after reading it failed: {type(error).__name__}: {error}") from error
            check_version(info, size, tag)

    def _info(self, path: str, url: str) -> dict:
        """``info(path)``, transient faults retried."""
        return self.call(lambda fs: self.info(path), f"info of {url}")

    def _fetch(self, requests: Sequence[tuple[str, int, int, str | None]], pinned: PinnedRead | None, in_flight: int | None = None) -> list:
        fs = self.fs
        self.stats.add(requests=len(requests))
        if getattr(fs, "async_impl", False):
            from fsspec.asyn import sync

            return sync(fs.loop, _gather, fs, requests, self.options.download_timeout, in_flight or self.options.max_concurrency, pinned)
        outcomes: list = []
        for path, start, end, _ in requests:
            try:
                outcomes.append(fs.cat_file(path, start=start, end=end))
            except Exception as error:  # noqa: BLE001 - returned like the async path does
                outcomes.append(error)
        return outcomes

    # -------------------------------------------------------------- files
    def register(self, entries: Sequence[Any]) -> None:
        """Remember (url, tag, size) of discovered files: reads need no size request and the
        cache keys entries by content version."""
        self._files.update({e.fs_path: (e.url, e.tag, e.size) for e in entries})

    def ident(self, path: str) -> tuple[str, str | None, int]:
        """(url, tag, size) of a registered file, else asked of the store."""
        known = self._files.get(path)
        if known is None:
            info = self.call(lambda fs: fs.info(path), f"info of {path}")
            known = (f"{self.protocol_name}://{path}", None, int(info["size"]))
            self._files[path] = known
        return known

    # -------------------------------------------------------------- tails
    @property
    def storage_options(self) -> dict:
        """The fsspec filesystem's settings (what it is recreated from)."""
        return self._storage_options

    def prefetch_tails(self, entries: Sequence[Any], fetcher: TailFetcher | None = None) -> None:
        """Fetch the last TAIL_BYTES of every file in one concurrent batch (footers live there),
        by ``fetcher`` where one is given, else through fsspec."""
        self.register(entries)
        requests = [(e.fs_path, max(0, e.size - TAIL_BYTES), e.size) for e in entries if e.size > 0]
        idents = [(e.url, e.tag, e.size) for e in entries if e.size > 0]
        data = self.read_many(requests, idents, verify=False, fetcher=fetcher, in_flight=TAILS_IN_FLIGHT * self.options.max_concurrency)  # just listed
        self._tails = {path: (start, blob) for (path, start, _), blob in zip(requests, data)}

    def has_tails(self) -> bool:
        """Whether prefetched tails are waiting to be taken."""
        return bool(self._tails)

    def take_tail(self, path: str) -> tuple[int, bytes] | None:
        """The prefetched tail of ``path`` (handed out once), or None."""
        return self._tails.pop(path, None)

    def drop_tails(self) -> None:
        """Forget the prefetched tails not taken (planning is over)."""
        self._tails = {}


def open_store(fs: Any, options: IOOptions | None) -> Any:
    """A RemoteStore for object-store filesystems; local and in-memory filesystems as they are."""
    if isinstance(fs, RemoteStore):
        return fs
    if protocol_of(fs) in ("file", "local", "memory"):
        return fs
    options = options or IOOptions()
    return RemoteStore(_with_pool(fs, options.max_concurrency), options)


def _with_pool(fs: Any, connections: int) -> Any:
    """s3fs with botocore's connection pool (10 by default) as large as our concurrency,
    unless the user chose a size in storage_options' config_kwargs."""
    if protocol_of(fs) not in ("s3", "s3a"):
        return fs
    config = dict(fs.storage_options.get("config_kwargs") or {})
    if "max_pool_connections" in config:
        return fs
    config["max_pool_connections"] = connections
    return type(fs)(**{**fs.storage_options, "config_kwargs": config})

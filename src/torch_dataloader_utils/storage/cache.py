"""A local disk cache of byte ranges of remote files, bounded in bytes, least recently used out.

Safe for many processes at once without locks: an entry is written to a
temporary file in the cache directory and renamed into place (atomic on
POSIX), so readers see a whole entry or none. A process killed mid-write
leaves only a temporary file, which later sweeps remove. Recency is the
entry's mtime, refreshed on every hit; eviction deletes the oldest entries
until the directory holds at most 90% of ``limit_bytes`` (so that a full cache
is not scanned again at the very next write).

Each entry starts with the CRC-32 of its bytes: a damaged entry (a bad disk, a stray write) is
a miss, removed and fetched again, never served. An entry that cannot be read, or whose
recency cannot be refreshed (a read-only cache directory), is a miss or a plain hit: the cache
never fails a read.

A process does not scan the directory on every write: it adds what it writes
to the total of its last scan and scans again when that passes the limit, when
it has written a tenth of the limit since (other processes write too), or every
``_RESCAN_PUTS`` writes (to sweep abandoned temporary files).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
import zlib
from collections.abc import Iterable

log = logging.getLogger(__name__)

_TMP_SUFFIX = ".tmp"
_ENTRY_SUFFIX = ".bin"
_STALE_TMP_SECONDS = 3600.0
_RESCAN_PUTS = 256
_RESCAN_SHARE_OF_LIMIT = 0.1
_EVICT_TO_SHARE_OF_LIMIT = 0.9  # eviction leaves room for several writes before the next scan
_CHECKSUM_BYTES = 4  # the CRC-32 of the entry's data, before the data


def entry_key(url: str, tag: str | None, size: int, start: int, end: int) -> str:
    """A file name for bytes [start, end) of one version of a remote file."""
    text = f"{url}\0{tag}\0{size}\0{start}\0{end}"
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RangeCache:
    """Byte ranges on local disk under ``root``, at most ``limit_bytes`` in total (None: no limit)."""

    def __init__(self, root: str, limit_bytes: int | None = None):
        if limit_bytes is not None and limit_bytes <= 0:
            raise ValueError(f"cache_limit_bytes must be positive or None, got {limit_bytes}")
        self.root = os.path.abspath(os.path.expanduser(root))
        self.limit_bytes = limit_bytes
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as error:
            raise ValueError(f"cache_dir {root!r} cannot be created ({error}): pass a directory this process can write, or cache_dir=None") from error
        self._scanned_bytes: int | None = None  # the directory's bytes at this process's last scan
        self._written_since_scan = 0
        self._puts_since_scan = 0
        self._warned: set[str] = set()  # the warnings given (each once)

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key + _ENTRY_SUFFIX)

    def get(self, key: str, length: int | None = None) -> bytes | None:
        """The entry's bytes, or None when absent, unreadable, not exactly ``length`` bytes long
        (when given) or damaged (its checksum differs)."""
        path = self._path(key)
        try:
            with open(path, "rb") as handle:
                checksum = handle.read(_CHECKSUM_BYTES)
                data = handle.read()
        except FileNotFoundError:
            return None
        except OSError as error:
            self._warn_once("read", "cannot read cache entry %s (reading from the store instead): %s", path, error)
            return None
        if (length is not None and len(data) != length) or checksum != _checksum(data):
            self._remove(path)
            return None
        try:
            os.utime(path)  # recency for eviction; best effort
        except OSError:
            pass
        return data

    def put(self, key: str, data: bytes | bytearray | memoryview | Iterable[bytes]) -> None:
        """Store an entry (bytes or an iterable of byte chunks), then evict down to the limit."""
        chunks: Iterable[bytes | bytearray | memoryview]
        if isinstance(data, (bytes, bytearray, memoryview)):
            if self.limit_bytes is not None and len(data) + _CHECKSUM_BYTES > self.limit_bytes:
                return
            chunks = [data]
        else:
            chunks = data
        tmp = os.path.join(self.root, f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}{_TMP_SUFFIX}")
        written, crc = 0, 0
        try:
            with open(tmp, "wb") as handle:
                handle.write(bytes(_CHECKSUM_BYTES))
                for chunk in chunks:
                    written += handle.write(chunk)
                    crc = zlib.crc32(chunk, crc)
                handle.seek(0)
                handle.write(crc.to_bytes(_CHECKSUM_BYTES, "big"))
        except BaseException:
            self._remove(tmp)
            raise
        try:
            os.replace(tmp, self._path(key))
        except FileNotFoundError:  # swept by another process: skip caching this entry
            return
        self._written_since_scan += written + _CHECKSUM_BYTES
        self._puts_since_scan += 1
        if self._scan_due():
            self.evict()

    def put_or_log(self, key: str, data: bytes | bytearray | memoryview | Iterable[bytes]) -> None:
        """``put``, where a failure (a full or read-only disk) does not fail the read: logged, as a
        warning the first time."""
        try:
            self.put(key, data)
        except OSError as error:
            if "write" in self._warned:
                log.debug("cannot write cache entry in %s: %s", self.root, error)
            self._warn_once("write", "cannot write cache entry in %s: %s; reads go on without caching what cannot be written", self.root, error)

    def _warn_once(self, kind: str, message: str, *args: object) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message, *args)

    def _scan_due(self) -> bool:
        if self._scanned_bytes is None or self._puts_since_scan >= _RESCAN_PUTS:
            return True
        if self.limit_bytes is None:
            return False
        return (
            self._scanned_bytes + self._written_since_scan > self.limit_bytes
            or self._written_since_scan > _RESCAN_SHARE_OF_LIMIT * self.limit_bytes
        )

    def usage(self) -> int:
        """Bytes held by entries and temporary files."""
        return sum(size for _, size, _ in self._scan())

    def evict(self) -> None:
        """Remove abandoned temporary files, then the least recently used entries above the limit."""
        entries = []
        total = 0
        now = time.time()
        for path, size, mtime in self._scan():
            if path.endswith(_TMP_SUFFIX):
                if self._abandoned(path, mtime, now):
                    self._remove(path)
                    continue
            else:
                entries.append((mtime, path, size))
            total += size
        if self.limit_bytes is not None and total > self.limit_bytes:
            for _, path, size in sorted(entries):
                if total <= _EVICT_TO_SHARE_OF_LIMIT * self.limit_bytes:
                    break
                self._remove(path)
                total -= size
        self._scanned_bytes, self._written_since_scan, self._puts_since_scan = total, 0, 0

    def _abandoned(self, path: str, mtime: float, now: float) -> bool:
        try:
            pid = int(os.path.basename(path).split(".")[1])
        except (IndexError, ValueError):
            return True
        return not _pid_alive(pid) or now - mtime > _STALE_TMP_SECONDS

    def _scan(self) -> list[tuple[str, int, float]]:
        found = []
        try:
            with os.scandir(self.root) as it:
                for item in it:
                    if not item.name.endswith((_ENTRY_SUFFIX, _TMP_SUFFIX)):
                        continue
                    try:
                        stat = item.stat()
                    except FileNotFoundError:
                        continue
                    found.append((item.path, stat.st_size, stat.st_mtime))
        except FileNotFoundError:
            os.makedirs(self.root, exist_ok=True)
        return found

    @staticmethod
    def _remove(path: str) -> None:
        try:
            os.remove(path)
        except OSError:  # gone already, or a read-only cache: nothing to do
            pass


def _checksum(data: bytes) -> bytes:
    return zlib.crc32(data).to_bytes(_CHECKSUM_BYTES, "big")

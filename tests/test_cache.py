"""The disk cache of remote byte ranges: limit, LRU order, many processes, killed writers."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import time
import zlib

import pytest

from torch_dataloader_utils.storage.cache import RangeCache, entry_key


def _content(key: str, size: int) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def _held(root) -> list[str]:
    return sorted(name for name in os.listdir(root) if name.endswith(".bin"))


def test_round_trip_and_wrong_length_is_a_miss(tmp_path):
    cache = RangeCache(str(tmp_path))
    key = entry_key("s3://b/f.parquet", "etag1", 100, 4, 20)
    assert cache.get(key, 16) is None
    cache.put(key, b"x" * 16)
    assert cache.get(key, 16) == b"x" * 16
    assert cache.get(key, 17) is None, "an entry of the wrong length must not be served"
    assert _held(tmp_path) == [], "and it is removed"
    assert entry_key("s3://b/f.parquet", "etag2", 100, 4, 20) != key, "a new version of the file is a new key"


def test_a_damaged_entry_of_the_right_length_is_a_miss_and_removed(tmp_path):
    cache = RangeCache(str(tmp_path))
    for position in (0, 1, 2000, 4099):  # in the checksum, at the data's start, middle and end
        cache.put("k", _content("k", 4096))
        path = tmp_path / "k.bin"
        stored = bytearray(path.read_bytes())
        stored[position] ^= 0x40
        path.write_bytes(stored)
        assert cache.get("k", 4096) is None, f"a flipped bit at byte {position} was served"
        assert _held(tmp_path) == []


def test_an_unreadable_or_read_only_cache_never_fails_a_read(tmp_path, monkeypatch, caplog):
    """Root reads files whatever their mode, so the operating system's refusals are injected."""
    import errno

    cache = RangeCache(str(tmp_path))
    cache.put("k", b"data")

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "utime", read_only)
    monkeypatch.setattr(os, "remove", read_only)
    assert cache.get("k", 4) == b"data", "a hit whose recency cannot be refreshed is still a hit"
    assert cache.get("k", 5) is None, "a wrong length is a miss even when the entry cannot be removed"
    real_open = open

    def unreadable(path, *args, **kwargs):
        if str(path).endswith(".bin"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", unreadable)
    with caplog.at_level("WARNING", logger="torch_dataloader_utils.storage.cache"):
        assert cache.get("k", 4) is None and cache.get("k", 4) is None
    assert [r.getMessage() for r in caplog.records if "cannot read cache entry" in r.getMessage()][:2] == [
        f"cannot read cache entry {tmp_path / 'k.bin'} (reading from the store instead): [Errno 13] Permission denied: '{tmp_path / 'k.bin'}'"
    ], "one warning, naming the entry"


def test_least_recently_used_entries_go_first(tmp_path):
    cache = RangeCache(str(tmp_path), limit_bytes=340)  # eviction goes down to 90%: 306 bytes
    for name in ("a", "b", "c"):
        cache.put(name, b"0" * 98)  # 102 bytes with the checksum
        time.sleep(0.01)
    assert cache.get("a", 98) is not None  # a is now the most recent
    time.sleep(0.01)
    cache.put("d", b"0" * 98)
    assert _held(tmp_path) == ["a.bin", "c.bin", "d.bin"]
    assert cache.usage() <= 340
    cache.put("huge", b"0" * 337)  # with its checksum larger than the limit: not cached, nothing evicted for it
    assert _held(tmp_path) == ["a.bin", "c.bin", "d.bin"]


def _size(key: str) -> int:
    return 1000 + int(key[1:]) * 97


def _halves(data: bytes):
    yield data[: len(data) // 2]
    time.sleep(0.002)  # widen the window in which a non-atomic writer would expose half an entry
    yield data[len(data) // 2 :]


def _hammer(root: str, limit: int, worker: int, rounds: int, errors) -> None:
    cache = RangeCache(root, limit)
    for i in range(rounds):
        key = f"k{(i * 7 + worker) % 23}"
        data = cache.get(key, _size(key))
        if data is None:
            cache.put(key, _halves(_content(key, _size(key))))
        elif data != _content(key, _size(key)):
            errors.put(f"worker {worker} read a corrupt entry {key}")
    errors.put(None)


def _observe(root: str, stop, errors) -> None:
    """Reads entry files directly (not through get): each must be whole whenever it is visible."""
    seen = 0
    while not stop.is_set():
        for name in os.listdir(root):
            if not name.endswith(".bin"):
                continue
            try:
                with open(os.path.join(root, name), "rb") as handle:
                    data = handle.read()
            except FileNotFoundError:
                continue
            seen += 1
            key = name[:-4]
            if data != zlib.crc32(_content(key, _size(key))).to_bytes(4, "big") + _content(key, _size(key)):
                errors.put(f"observer saw a torn entry {key} ({len(data)} bytes)")
    errors.put(("seen", seen))


def test_many_processes_at_once_never_expose_a_torn_entry(tmp_path):
    limit = 12_000
    ctx = mp.get_context("fork")
    errors, stop = ctx.Queue(), ctx.Event()
    observer = ctx.Process(target=_observe, args=(str(tmp_path), stop, errors))
    observer.start()
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path), limit, w, 150, errors)) for w in range(4)]
    for p in procs:
        p.start()
    problems, done, seen = [], 0, 0
    while done < len(procs):
        item = errors.get(timeout=120)
        if item is None:
            done += 1
        else:
            problems.append(item)
    stop.set()
    while True:
        item = errors.get(timeout=60)
        if isinstance(item, tuple):
            seen = item[1]
            break
        problems.append(item)
    for p in procs + [observer]:
        p.join(30)
        assert p.exitcode == 0
    assert problems == []
    assert seen > 50, "the observer hardly looked"
    RangeCache(str(tmp_path), limit).evict()
    assert 0 < RangeCache(str(tmp_path), limit).usage() <= limit
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def _slow_writer(root: str, ready) -> None:
    cache = RangeCache(root, 10_000_000)

    def chunks():
        yield b"a" * 4096
        ready.set()
        time.sleep(60)  # killed here, mid-write
        yield b"b" * 4096

    cache.put("victim", chunks())


def test_writer_killed_mid_write_leaves_no_entry_and_its_temp_is_swept(tmp_path):
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_slow_writer, args=(str(tmp_path), ready))
    proc.start()
    assert ready.wait(30)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    temps = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert len(temps) == 1 and temps[0].startswith(f"victim.{proc.pid}.")
    cache = RangeCache(str(tmp_path), 10_000_000)
    assert cache.get("victim", 8192) is None and cache.get("victim", 4096) is None
    cache.put("other", b"x" * 10)  # any later write sweeps temporaries of dead processes
    assert os.listdir(tmp_path) == ["other.bin"]


def test_live_writers_temporaries_are_kept(tmp_path):
    cache = RangeCache(str(tmp_path), 10_000_000)
    live = tmp_path / f"k.{os.getpid()}.abcd1234.tmp"
    live.write_bytes(b"partial")
    cache.put("other", b"x")
    assert live.exists(), "a temporary of a running process must not be swept"


def test_limit_must_be_positive(tmp_path):
    with pytest.raises(ValueError):
        RangeCache(str(tmp_path), 0)


@pytest.mark.parametrize("limit", [None, 10**9])
def test_writes_do_not_scan_the_directory_each_time(tmp_path, monkeypatch, limit):
    """A scan stats every entry: once per write made filling a large cache quadratic."""
    cache = RangeCache(str(tmp_path), limit_bytes=limit)
    scans = []
    scan = cache._scan
    monkeypatch.setattr(cache, "_scan", lambda: scans.append(1) or scan())
    for index in range(500):
        cache.put(f"k{index}", b"0" * 1000)
    assert len(_held(tmp_path)) == 500
    assert len(scans) <= 3, f"{len(scans)} scans for 500 writes"


def test_a_full_cache_is_not_scanned_at_every_write(tmp_path, monkeypatch):
    """Eviction leaves the cache at 90% of its limit, so the next writes need no scan (it evicted
    exactly to the limit before, and a cache of 30,000 entries spent 90 ms per write scanning)."""
    cache = RangeCache(str(tmp_path), limit_bytes=100_000)
    for index in range(300):
        cache.put(f"k{index}", b"0" * 996)  # 1,000 bytes with the checksum
    scans = []
    scan = cache._scan
    monkeypatch.setattr(cache, "_scan", lambda: scans.append(1) or scan())
    for index in range(300, 400):
        cache.put(f"k{index}", b"0" * 996)
    assert cache.usage() <= 100_000
    assert len(scans) <= 12, f"{len(scans)} scans for 100 writes at the limit"


def test_one_writer_never_leaves_more_than_the_limit(tmp_path):
    cache = RangeCache(str(tmp_path), limit_bytes=50_000)
    for index in range(300):
        cache.put(f"k{index}", b"0" * (1000 + index))
        assert cache.usage() <= 50_000
    assert "k299.bin" in _held(tmp_path) and "k0.bin" not in _held(tmp_path)


def test_a_cache_dir_that_cannot_be_created_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"cache_dir .*file/cache' cannot be created .*Not a directory"):
        RangeCache(str(tmp_path / "file" / "cache"))

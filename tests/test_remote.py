"""storage/remote.py's concurrent range reads: order, errors returned in place, the limit in flight, the timeout."""

from __future__ import annotations

import asyncio

from torch_dataloader_utils.storage.remote import _gather


class _FakeAsyncFs:
    """``_cat_file`` answering after ``delay`` seconds, failing for paths named "bad"."""

    def __init__(self, delay: float = 0.001, slow: str = ""):
        self.delay, self.slow, self.in_flight, self.most = delay, slow, 0, 0

    async def _cat_file(self, path: str, start: int, end: int) -> bytes:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(10 if path == self.slow else self.delay)
            if path == "bad":
                raise FileNotFoundError(path)
            return f"{path}:{start}-{end}".encode()
        finally:
            self.in_flight -= 1


def test_gather_keeps_order_returns_errors_and_bounds_in_flight():
    fs = _FakeAsyncFs()
    requests = [(f"f{i}" if i != 7 else "bad", i, i + 1, None) for i in range(50)]
    results = asyncio.run(_gather(fs, requests, None, 4, None))
    assert [r for i, r in enumerate(results) if i != 7] == [f"f{i}:{i}-{i + 1}".encode() for i in range(50) if i != 7]
    assert isinstance(results[7], FileNotFoundError)
    assert fs.most == 4


def test_gather_times_out_one_request_not_the_others():
    fs = _FakeAsyncFs(slow="f1")
    results = asyncio.run(_gather(fs, [("f0", 0, 1, None), ("f1", 0, 1, None), ("f2", 0, 1, None)], 0.2, 2, None))
    assert results[0] == b"f0:0-1" and results[2] == b"f2:0-1"
    assert isinstance(results[1], asyncio.TimeoutError)  # TimeoutError from Python 3.11
    assert asyncio.run(_gather(fs, [], None, 4, None)) == []

"""A store's counters, added to by several threads at once (decode-ahead threads share a store)."""

from __future__ import annotations

import pickle
import threading

from torch_dataloader_utils.storage.counters import Counters


def test_adds_from_many_threads_are_all_counted():
    counts = Counters(requests=0, bytes=0)

    def add() -> None:
        for _ in range(20_000):
            counts.add(requests=1, bytes=len(b"abc"))

    threads = [threading.Thread(target=add) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counts == {"requests": 160_000, "bytes": 480_000}
    copy = pickle.loads(pickle.dumps(counts))
    copy.add(requests=1)
    assert isinstance(copy, Counters) and copy["requests"] == 160_001 and counts["requests"] == 160_000

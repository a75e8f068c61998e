"""The bounded memo the planners and readers keep their decoded and planned values in."""

from __future__ import annotations

import pickle

from torch_dataloader_utils.lru import Lru


def test_values_are_made_once_and_the_least_recently_used_is_forgotten():
    made: list[str] = []
    memo: Lru[str, str] = Lru(2)

    def make(key: str):
        return lambda: made.append(key) or key.upper()

    assert memo.get("a", make("a")) == "A" and memo.get("b", make("b")) == "B"
    assert memo.get("a", make("a")) == "A"  # kept: "a" is now the most recent
    memo.get("c", make("c"))  # forgets "b"
    assert "b" not in memo and "a" in memo and len(memo) == 2
    memo.get("b", make("b"))
    assert made == ["a", "b", "c", "b"]


def test_find_put_update_pop_and_pickling():
    memo: Lru[int, int | None] = Lru(3)
    assert memo.find(1) is None
    memo.update((k, k * 10) for k in range(5))
    assert [memo.find(k) for k in range(5)] == [None, None, 20, 30, 40]
    memo.find(2)  # most recent now
    memo.put(5, 50)  # forgets 3
    assert 3 not in memo and memo.find(2) == 20 and memo.values() == [40, 50, 20]
    memo.pop(2)
    memo.pop(99)  # absent: nothing to do
    assert len(memo) == 2
    copy = pickle.loads(pickle.dumps(memo))
    assert copy.find(5) == 50 and copy.capacity == 3
    memo.clear()
    assert len(memo) == 0 and copy.find(4) == 40

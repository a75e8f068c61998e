"""A bounded memo: values by key, the least recently used forgotten first. Threads may share
one: a value another thread forgot in between is made again, never an error."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Hashable, Iterable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """At most ``capacity`` values by key; using one (``get``, ``find``) makes it the most recent."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        return key in self._entries

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value of ``key``, made (and kept) when there is none yet (or it is None)."""
        found = self.find(key)
        if found is not None:
            return found
        value = make()
        self.put(key, value)
        return value

    def find(self, key: K) -> V | None:
        """The value of ``key``, None when there is none."""
        try:
            self._entries.move_to_end(key)
            return self._entries[key]
        except KeyError:
            return None

    def put(self, key: K, value: V) -> None:
        self._entries[key] = value
        try:
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        except KeyError:  # another thread forgot it, or emptied the memo, in between: nothing is left to forget
            pass

    def update(self, items: Iterable[tuple[K, V]]) -> None:
        for key, value in items:
            self.put(key, value)

    def keys(self) -> list[K]:
        """The keys kept, least recently used first."""
        return list(self._entries)

    def values(self) -> list[V]:
        """The values kept, least recently used first."""
        return list(self._entries.values())

    def pop(self, key: K) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

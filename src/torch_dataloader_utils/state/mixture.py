"""What changed between the mixture a state was saved with and the current one (``_mixture``:
per source its path, format, rows, rows per epoch and weight; absent for a plain dataset)."""

from __future__ import annotations

from typing import Any

_FIELDS = ("path", "format", "rows_per_epoch", "weight", "rows")


def mixture_causes(saved: Any, current: Any) -> list[str]:
    """One line per change of the mixture: sources added or removed, a source's path, format,
    rows_per_epoch, weight or row count (empty when they agree)."""
    if saved == current:
        return []
    if saved is None or current is None:
        which = ("a mixture of sources", "a plain dataset") if current is None else ("a plain dataset", "a mixture of sources")
        return [f"the checkpoint was saved by {which[0]}, this dataset is {which[1]}"]
    if not isinstance(saved, list) or not all(isinstance(entry, dict) for entry in saved):
        return ["the state's '_mixture' entry is damaged (a list of one dict per source)"]
    causes = []
    if len(saved) != len(current):
        causes.append(f"the number of sources changed: checkpoint={len(saved)}, current={len(current)}")
    for index, (old, new) in enumerate(zip(saved, current)):
        for key in _FIELDS:
            if old.get(key) != new.get(key):
                what = "rows (its data changed)" if key == "rows" else key
                causes.append(f"source {index}'s {what} changed: checkpoint={old.get(key)!r}, current={new.get(key)!r}")
    return causes or ["the sources changed"]

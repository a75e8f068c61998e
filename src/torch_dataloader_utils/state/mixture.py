"""What changed between the mixture a state was saved with and the current one (``_mixture``:
per source its path, format, rows, rows per epoch and weight; absent for a plain dataset)."""

from __future__ import annotations

from typing import Any, Callable

#: causes before their effects: a weight or a source's row count (its data) sets its rows per epoch
_FIELDS = ("path", "format", "weight", "rows", "rows_per_epoch")


def mixture_causes(saved: Any, current: Any, same_files: Callable[[], bool] | None = None) -> list[str]:
    """One line per change of the mixture: sources added or removed, a source's path, format,
    rows_per_epoch, weight or row count (empty when they agree). Where ``same_files()`` says the
    state's files are the current ones in their order, a source's path spelled otherwise (``dir/``,
    a glob, a relative path) names the same source: not a change."""
    if saved == current or (same_files is not None and _without_paths(saved) == _without_paths(current) and same_files()):
        return []
    if saved is None or current is None:
        which = ("a mixture of sources", "a plain dataset") if current is None else ("a plain dataset", "a mixture of sources")
        return [f"the checkpoint was saved by {which[0]}, this dataset is {which[1]}"]
    if not isinstance(saved, list) or not all(isinstance(entry, dict) for entry in saved):
        return ["the state's '_mixture' entry is damaged (a list of one dict per source)"]
    causes = []
    if len(saved) != len(current):
        causes.append(f"the number of sources changed: checkpoint={len(saved)}, current={len(current)}")
    same_rows = len(saved) == len(current) and all(old.get("rows") == new.get("rows") for old, new in zip(saved, current))
    if same_rows and _weighted(saved) and _weighted(current) and _epoch_rows(saved) != _epoch_rows(current):  # (a default follows the data)
        causes.append(f"epoch_rows changed: checkpoint={_epoch_rows(saved)}, current={_epoch_rows(current)}")
    for key in _FIELDS:  # a field's changes in every source before the next field's: the cause before its effects
        for index, (old, new) in enumerate(zip(saved, current)):
            if old.get(key) != new.get(key):
                what = "rows (its data changed)" if key == "rows" else key
                causes.append(f"source {index}'s {what} changed: checkpoint={old.get(key)!r}, current={new.get(key)!r}")
    return causes or ["the sources changed"]


def _without_paths(sources: Any) -> Any:
    if not isinstance(sources, list) or not all(isinstance(entry, dict) for entry in sources):
        return sources
    return [{key: value for key, value in entry.items() if key != "path"} for entry in sources]


def _weighted(sources: list[dict]) -> bool:
    return any(entry.get("weight") is not None for entry in sources)


def _epoch_rows(sources: list[dict]) -> Any:
    """A weighted mixture's epoch_rows: the weights' shares and the other sources' rows add up to it."""
    counts = [entry.get("rows_per_epoch") for entry in sources]
    return sum(counts) if all(isinstance(count, int) for count in counts) else None

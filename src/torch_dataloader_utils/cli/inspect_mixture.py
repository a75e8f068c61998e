"""``tdu inspect`` of a mixture's state: its sources (``_mixture``), the rows each has delivered,
and the mixture rebuilt from the state to check it against the data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import UsageError


def mixture_sources(state: dict) -> list[dict] | None:
    """The sources a state records (None for a plain dataset's state or a damaged entry)."""
    from ..state.schema import MIXTURE

    sources = state.get(MIXTURE)
    if not isinstance(sources, list) or not all(isinstance(s, dict) for s in sources):
        return None
    return sources


def source_progress(state: dict, sources: list[dict]) -> list[int] | None:
    """Rows each source has delivered in the state's epoch, from a full-form state's split lists
    (None for a compact state: its splits are named by position, so the plan is needed; and for
    a state of canonical lanes, which records the global step instead of splits)."""
    from ..state.canonical import CANONICAL_LANES
    from ..state.schema import COMPLETED_SHARDS, IN_PROGRESS, LANES

    if COMPLETED_SHARDS not in state or state.get(LANES) is not None or state.get(CANONICAL_LANES) is not None:
        return None  # (lanes an elastic resume dealt may share a split)
    rows = [0] * len(sources)
    for key, counted in ((COMPLETED_SHARDS, "row_length"), (IN_PROGRESS, "rows_done")):
        for entry in state.get(key) or []:
            for split in entry.get("splits", []) if isinstance(entry, dict) else []:
                source, count = split.get("source"), split.get(counted)
                if isinstance(source, int) and 0 <= source < len(rows) and isinstance(count, int):
                    rows[source] += count
    return rows


def describe_mixture(state: dict) -> list[dict] | None:
    """Per source: path, format, rows, rows per epoch, weight and rows delivered (None: unknown)."""
    sources = mixture_sources(state)
    if sources is None:
        return None
    delivered = source_progress(state, sources)
    return [{**source, "rows_delivered": None if delivered is None else delivered[i]} for i, source in enumerate(sources)]


def print_mixture(mixture: list[dict]) -> None:
    total = sum(s.get("rows_per_epoch") or 0 for s in mixture)
    print(f"  mixture    {len(mixture)} sources, {total:,} rows per epoch")
    for index, source in enumerate(mixture):
        path = source.get("path")
        path = " ".join(map(str, path)) if isinstance(path, list) else path
        share = "" if source.get("weight") is None else f", weight {source['weight']}"
        done = source.get("rows_delivered")
        progress = "" if done is None else f"; {done:,} delivered"
        print(f"  source {index:<3} {source.get('rows_per_epoch', 0):,} of its {source.get('rows', 0):,} rows per epoch{share}{progress}  {path}")


def mixture_sources_of(path: Any) -> bool:
    """Whether a dataset path is a list of Sources."""
    from ..catalog.mixture import is_mixture

    return is_mixture(path)


def mixture_for_state(state: dict, paths: Sequence[str]) -> tuple[list[Any], int | None]:
    """The Sources (and epoch_rows) the state's mixture was built from, with ``paths`` (one per
    source) in place of the recorded paths when given."""
    from .. import Source

    sources = mixture_sources(state)
    assert sources is not None
    if paths and len(paths) != len(sources):
        listed = "; ".join(f"source {i}: {s.get('path')}" for i, s in enumerate(sources))
        raise UsageError(f"the state is a mixture of {len(sources)} sources ({listed}): give one PATH per source, or none to use the recorded paths")
    weighted = any(s.get("weight") is not None for s in sources)
    out = []
    for index, source in enumerate(sources):
        path: Any = paths[index] if paths else source.get("path")
        share = {"weight": source["weight"]} if source.get("weight") is not None else {} if weighted else {"rows_per_epoch": source.get("rows_per_epoch")}
        out.append(Source(path, format=source.get("format"), **share))
    epoch_rows = sum(int(s.get("rows_per_epoch") or 0) for s in sources) if weighted else None
    return out, epoch_rows


def rows_by_source(dataset: Any) -> list[int]:
    """Rows each source of a mixture dataset has delivered in its epoch (after load_state_dict)."""
    plan, progress = dataset.delivery.plan(), dataset.delivery.progress
    splits = dataset._catalog.splits_at(progress.epoch)
    rows = [0] * len(dataset._catalog.sources)
    for lane, position in zip(plan.lanes, progress.positions):
        if getattr(lane, "canonical", False):  # slices of every canonical lane: their rows, segment by segment
            from ..plan.streams import split_rows_between

            for segment in lane.slice(0, position):
                for split, done in split_rows_between(plan.book.stream(segment.key), segment.start, segment.stop).items():
                    rows[splits[split].source] += done
            continue
        for split, (done, _) in plan.book.rows_done(lane, position).items():
            rows[splits[split].source] += done
    return rows

"""The compact form of a rank state: progress content as ranges, the file list as group digests.

The full form lists every completed split by content and every file's fingerprint, so it
grows with the dataset and the epoch (12 MB at 100,000 files mid-epoch). The compact form
keeps the same checks in a size that does not grow with completed splits:

- ``completed_ranges``: per worker, the completed splits as ``[start, stop)`` ranges of
  positions in the worker's *lane order* (its splits ordered by where the lane last reads
  them: without shuffling the order it reads them, so the completed splits are one range),
  the splits in progress as ``[position, rows_done]``, and ``lane_digest``, a digest of the
  lane's splits by content in that order. Equal digests and equal ranges mean the same
  completed splits by content, as the full form's list would. A shuffle window over many small
  splits leaves thousands of them in progress at once (and its completed ones in as many
  ranges): beyond ``LISTED_MAX`` ranges and splits in progress, an entry keeps their counts
  (always there) and a digest of both lists (``progress_digest``) instead of the lists, which
  checks them as strictly.
- ``files_summary``: the file count, a digest of every ``[url, size, tag]`` in plan order,
  and one digest per group of consecutive files (sorted by URL, at most ``MAX_GROUPS``
  groups), so that a change is located to the group of files it happened in; local files'
  newest modification time names the files modified after the checkpoint exactly. Up to
  ``NAMED_FILES_MAX`` files, the summary also lists every ``[url, size, tag]`` (``files``), so
  that every added, removed or rewritten file is named, as the full form names them.

Both are pure functions of the plan and a lane's position; the full list is recovered on
demand from the plan (``dataset.state_dict(form="full")``).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import weakref
from typing import Any, Mapping, Sequence

import numpy as np

from ..plan.columns import split_entries
from ..plan.lanes import Lane, Segment, StreamBook
from ..plan.splits import Split
from ..plan.streams import Stream

#: the most file groups a summary keeps (each about 60 bytes of JSON)
MAX_GROUPS = 1024
MIN_GROUP_FILES = 16
#: up to this many files, a summary lists them all (about 100 bytes each), naming every change
NAMED_FILES_MAX = 256
#: ``form="auto"`` writes the full form up to this many splits, the compact form above
AUTO_FULL_MAX_SPLITS = 1000
#: a worker entry lists up to this many ranges and splits in progress, else their digest
LISTED_MAX = 64
FORMS = ("auto", "full", "compact")
_CACHED_LANES = 32


def _digest(value: Any, chars: int = 32) -> str:
    return hashlib.sha256(json.dumps(value, separators=(",", ":")).encode()).hexdigest()[:chars]


def use_compact(form: str, num_splits: int, mixture: bool = False) -> bool:
    """Whether ``state_dict(form=...)`` writes the compact form for a plan of ``num_splits`` splits.
    A mixture's is compact under "auto" at any size: its full form lists a split per upsampled
    copy, and a mixture's state must not grow with the upsampling (no upstream tool reads it)."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {list(FORMS)}, got {form!r}")
    return form == "compact" or (form == "auto" and (mixture or num_splits > AUTO_FULL_MAX_SPLITS))


# ----------------------------------------------------------------------------- lanes
class LaneOrder:
    """A lane's splits in lane order, each split's position, and the digest of their content.

    ``bounds``: for a lane of unshuffled streams whose every split is one run of lane rows, the
    (first, end) lane rows of each split in lane order, so that ``lane_progress`` finds the
    completed splits by a binary search (a lane of 50,000 splits: microseconds instead of
    walking its pieces after every batch); None otherwise."""

    def __init__(self, book: StreamBook, lane: Lane, splits: Sequence[Split]):
        segments = [s for s in lane.segments if s.num_rows > 0]
        runs = _whole_stream_runs(book, segments)
        streams = [] if runs is not None else [book.stream(s.key) for s in segments]
        if runs is None and not any(s.shuffle for s in streams):
            runs = _unshuffled_runs(segments, streams)
        if runs is not None:
            self.splits = runs[0]
            self.bounds: tuple[list[int], list[int]] | None = (runs[1], runs[2])
        else:
            read: list[np.ndarray] = []  # the split of every piece the lane reads, in order
            for segment, stream in zip(segments, streams):
                first, final = stream.window_of(segment.start), stream.window_of(segment.stop - 1)
                read.append(stream.piece_arrays()[0][int(stream.window_pieces[first]) : int(stream.window_pieces[final + 1])])
            ids = np.concatenate(read) if read else np.zeros(0, dtype=np.int64)
            unique, from_end = np.unique(ids[::-1], return_index=True)
            self.splits, self.bounds = unique[np.argsort(-from_end, kind="stable")].tolist(), None  # ordered by the last read of each split
        self.position = {split: i for i, split in enumerate(self.splits)}
        self.digest = _digest(split_entries(splits, self.splits))  # (a mixture's: also source and copy)
        self._positions = np.zeros(0, dtype=np.int64)

    def positions_of(self, splits: np.ndarray) -> np.ndarray:
        """The lane-order position of each of these splits (all of them the lane's)."""
        if len(self._positions) == 0 and self.splits:
            self._positions = np.full(max(self.splits) + 1, -1, dtype=np.int64)
            self._positions[np.asarray(self.splits, dtype=np.int64)] = np.arange(len(self.splits))
        return self._positions[splits]


def _whole_stream_runs(book: StreamBook, segments: Sequence[Segment]) -> tuple[list[int], list[int], list[int]] | None:
    """``_unshuffled_runs`` of a planned lane (one whole unshuffled stream), from its splits' row
    counts alone: its splits are read whole, one after another, in the order they were dealt."""
    if book.shuffled or len(segments) != 1 or not book.deals_splits:
        return None
    key = segments[0].key
    order = book.assignment(key.epoch, key.rank, key.world_size, key.num_workers)[key.worker]
    lengths = book.split_lengths(order)
    ends = np.cumsum(lengths)
    if segments[0].start != 0 or segments[0].stop != (int(ends[-1]) if len(ends) else 0):
        return None
    return list(order), (ends - lengths).tolist(), ends.tolist()


def _unshuffled_runs(segments: Sequence[Segment], streams: Sequence[Stream]) -> tuple[list[int], list[int], list[int]] | None:
    """For unshuffled streams (one piece per window): the splits of the lane in order with the
    lane rows [first, end) of each, when every split is one run of rows; None otherwise."""
    order: list[np.ndarray] = []
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    offset = 0
    for segment, stream in zip(segments, streams):
        first, final = stream.window_of(segment.start), stream.window_of(segment.stop - 1)
        ids = np.fromiter((p.split for p in stream.pieces[first : final + 1]), dtype=np.int64, count=final + 1 - first)
        rows = stream.window_rows[first : final + 2].astype(np.int64)
        rows[0], rows[-1] = segment.start, segment.stop  # clipped to the segment
        rows += offset - segment.start
        change = np.flatnonzero(np.diff(ids)) + 1
        begin = np.concatenate([[0], change])
        order.append(ids[begin])
        starts.append(rows[begin])
        ends.append(rows[np.concatenate([change, [len(ids)]])])
        offset += segment.num_rows
    splits = np.concatenate(order) if order else np.zeros(0, dtype=np.int64)
    if len(np.unique(splits)) != len(splits):
        return None  # a split in two places of the lane: the general count
    return splits.tolist(), np.concatenate(starts).tolist() if starts else [], np.concatenate(ends).tolist() if ends else []


_lane_orders: weakref.WeakKeyDictionary[StreamBook, dict[Lane, tuple[Sequence[Split], LaneOrder]]] = weakref.WeakKeyDictionary()


def lane_order(book: StreamBook, lane: Lane, splits: Sequence[Split]) -> LaneOrder:
    """The lane's order, computed once per plan (state_dict runs after every batch); kept while
    the plan's book lives."""
    orders = _lane_orders.setdefault(book, {})
    found = orders.get(lane)
    if found is not None and found[0] is splits:
        return found[1]
    if len(orders) >= _CACHED_LANES:
        orders.clear()
    order = LaneOrder(book, lane, splits)
    orders[lane] = (splits, order)
    return order


def _ranges(positions: np.ndarray) -> list[list[int]]:
    """Sorted positions as [start, stop) runs."""
    if not len(positions):
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = positions[np.concatenate([[0], breaks])]
    stops = positions[np.concatenate([breaks - 1, [len(positions) - 1]])] + 1
    return [[int(a), int(b)] for a, b in zip(starts, stops)]


def lane_progress(book: StreamBook, lane: Lane, position: int, splits: Sequence[Split]) -> dict:
    """A worker's compact progress content at ``position`` (without the ``worker`` key)."""
    order = lane_order(book, lane, splits)
    if order.bounds is not None:
        starts, ends = order.bounds
        done = bisect.bisect_right(ends, position)
        partial = [[done, position - starts[done]]] if done < len(starts) and starts[done] < position else []
        return _entry(order.digest, [[0, done]] if done else [], partial)
    touched, rows_done, rows_total = book.split_progress(lane, position)
    positions = order.positions_of(touched)
    completed = np.sort(positions[rows_done >= rows_total])
    started = (rows_done > 0) & (rows_done < rows_total)
    by_position = np.argsort(positions[started])
    in_progress = np.stack([positions[started][by_position], rows_done[started][by_position]], axis=1).tolist()
    return _entry(order.digest, _ranges(completed), in_progress)


def _entry(lane_digest: str, ranges: list[list[int]], partial: list[list[int]]) -> dict:
    entry = {
        "lane_digest": lane_digest, "ranges": ranges, "in_progress": partial,
        "completed": sum(stop - start for start, stop in ranges), "in_progress_count": len(partial), "progress_digest": None,
    }
    if len(ranges) + len(partial) > LISTED_MAX:  # the same keys either way: a state keeps one shape (docs/testing.md)
        entry.update(ranges=[], in_progress=[], progress_digest=_digest([ranges, partial]))
    return entry


def same_progress(saved: Mapping[str, Any], expected: Mapping[str, Any]) -> bool:
    """Whether a saved worker entry holds the progress ``expected`` (``lane_progress``'s entry at
    the saved position) holds: the same lists, or the same digest, and the same counts. States of
    earlier versions have no counts, and list everything: their lists are checked."""
    if any(saved.get(key, expected[key]) != expected[key] for key in ("completed", "in_progress_count")):
        return False
    if expected["progress_digest"] is None:
        return saved.get("ranges") == expected["ranges"] and saved.get("in_progress") == expected["in_progress"] and saved.get("progress_digest") is None
    if saved.get("progress_digest") is not None:
        return bool(saved["progress_digest"] == expected["progress_digest"])
    return _digest([saved.get("ranges"), saved.get("in_progress")]) == expected["progress_digest"]


def count_completed(entry: Any) -> int:
    """Splits a compact worker entry counts as completed (0 when damaged)."""
    if isinstance(entry, Mapping) and isinstance(entry.get("completed"), int):
        return entry["completed"]
    ranges = entry.get("ranges") if isinstance(entry, Mapping) else None
    if not isinstance(ranges, list):
        return 0
    return sum(r[1] - r[0] for r in ranges if isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) for v in r))


# ----------------------------------------------------------------------------- files
_summary: list[tuple[weakref.ref, dict]] = []  # the last owner's summary (owners are not hashable)


def cached_summary(owner: Any) -> dict:
    """``files_summary(owner.fingerprint)``, computed once per owner (the dataset's catalog)."""
    if not _summary or _summary[0][0]() is not owner:
        _summary[:] = [(weakref.ref(owner), files_summary(owner.fingerprint))]
    return _summary[0][1]


def _mtime(tag: Any) -> float | None:
    if isinstance(tag, str) and tag.startswith("mtime:"):
        try:
            return float(tag[6:])
        except ValueError:
            return None
    return None


def files_summary(fingerprint: Sequence[Sequence[Any]]) -> dict:
    """The compact stand-in for the ``files`` list (see the module's docstring)."""
    ordered = sorted(fingerprint, key=lambda f: f[0])
    size = max(MIN_GROUP_FILES, math.ceil(len(ordered) / MAX_GROUPS))
    urls = [f[0] for f in ordered]
    prefix = os.path.commonprefix(urls) if urls else ""
    groups = [[ordered[i][0][len(prefix):], len(ordered[i : i + size]), _digest(ordered[i : i + size], 12)] for i in range(0, len(ordered), size)]
    times = [_mtime(f[2]) for f in ordered]
    newest = max((t for t in times if t is not None), default=None)
    summary = {
        "count": len(ordered),
        "digest": _digest([list(f) for f in fingerprint]),
        "prefix": prefix,
        "groups": groups,
        "newest_mtime": newest,
        "total_bytes": sum(int(f[1]) for f in ordered),
    }
    if len(ordered) <= NAMED_FILES_MAX:
        summary["files"] = [list(f) for f in ordered]
    return summary


def _well_formed(summary: Any) -> bool:
    if not isinstance(summary, Mapping) or not isinstance(summary.get("prefix"), str) or not isinstance(summary.get("digest"), str):
        return False
    groups = summary.get("groups")
    return isinstance(groups, list) and all(
        isinstance(g, list) and len(g) == 3 and isinstance(g[0], str) and isinstance(g[1], int) and isinstance(g[2], str) for g in groups
    )


def same_files_in_order(files: Any, summary: Any, fingerprint: Sequence[Sequence[Any]]) -> bool:
    """Whether a state's files (the full form's ``files``, or the compact form's ``files_summary``)
    are the current ``fingerprint``, in its order."""
    if summary is not None:
        return isinstance(summary, Mapping) and summary.get("digest") == _digest([list(f) for f in fingerprint])
    return isinstance(files, list) and files == [list(f) for f in fingerprint]


def summary_causes(summary: Any, fingerprint: Sequence[Sequence[Any]], limit: int = 6) -> list[str]:
    """What changed between a saved ``files_summary`` and the current files, as named as the
    summary allows: files modified after the checkpoint by name (local files), otherwise the
    group of files (first and last URL) where files were added, removed or rewritten."""
    if not _well_formed(summary):
        return ["the state's 'files_summary' entry is damaged"]
    if summary["digest"] == _digest([list(f) for f in fingerprint]):
        return []
    causes: list[str] = []
    newest = summary.get("newest_mtime")
    if isinstance(newest, (int, float)):
        later = [f[0] for f in fingerprint if (_mtime(f[2]) or 0) > newest]
        if later:
            causes.append(f"files modified after the checkpoint's newest file ({len(later)}), rewritten or added: {', '.join(later[:3])}")
    prefix, groups = summary["prefix"], summary["groups"]
    firsts = [prefix + g[0] for g in groups]
    members: list[list[Sequence[Any]]] = [[] for _ in groups]
    for entry in sorted(fingerprint, key=lambda f: f[0]) if groups else ():
        members[max(0, bisect.bisect_right(firsts, entry[0]) - 1)].append(entry)
    changed = 0
    for group, now in zip(groups, members):
        if len(now) == group[1] and _digest([list(f) for f in now], 12) == group[2]:
            continue
        changed += 1
        if len(causes) >= limit:
            continue
        where = f"files from {prefix + group[0]}" + (f" to {now[-1][0]}" if now else "")
        if len(now) > group[1]:
            what = f"{len(now) - group[1]} added ({group[1]} files then, {len(now)} now)"
        elif len(now) < group[1]:
            what = f"{group[1] - len(now)} removed ({group[1]} files then, {len(now)} now)"
        else:
            what = f"one or more of its {len(now)} files rewritten or renamed"
        causes.append(f"{where}: {what}")
    if not groups and fingerprint:
        causes.append(f"files added since the checkpoint ({len(fingerprint)}): {', '.join(f[0] for f in fingerprint[:3])}")
    if changed > limit:
        causes.append(f"and {changed - limit} more groups of files changed")
    if not causes:
        causes.append("the same files are listed in another order")
    if changed:
        causes.append(
            "a compact state keeps one digest per group of files, so it locates a change to its group; "
            "save states with state_dict(form='full') to have every file named"
        )
    return causes

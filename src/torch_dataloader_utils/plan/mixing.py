"""Mixtures of several sources in given proportions: pure planning, no I/O.

Source ``k`` contributes ``n_k`` rows per epoch. Its *epoch sequence* is ``q = n_k // N_k``
whole passes over its ``N_k`` rows (each pass a copy of its base splits) followed by
``r = n_k % N_k`` rows of a *walk*: the source's base splits laid end to end in one fixed
order, cycled forever; epoch ``e`` takes the walk's rows ``[e r, (e + 1) r)``. So every row
appears ``q`` or ``q + 1`` times, which rows get the extra copy changes with the epoch, and a
downsampled source (``q = 0``) is covered once before any row repeats.

The epoch is cut into *blocks*, each holding the same fraction of every source's sequence
(about one split of each); blocks are what ranks and workers are dealt. Every range of a source's
epoch sequence, cut where a block ends, is a split of the epoch (``MixSplit``, told apart from
another copy of the same rows by ``copy``). A block is cut into windows of about ``buffer_rows`` rows, again in proportion, and a window's rows come out
interleaved by a proportional merge (rows of each source permuted first when shuffling), so any
run of rows of a window holds every source in proportion to within a row or two.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Sequence

import numpy as np

from ..lru import Lru
from .lanes import StreamBook, StreamKey
from .splits import Split, stable_permutation
from .streams import Piece, SplitRows, Stream, split_pieces

_CACHED_EPOCHS = 2
_CACHED_STREAMS = 16
# the last seed word of each permutation, so that no two of them share a seed
_PASS_ORDER, _WALK_ORDER, _BLOCK_ORDER, _WINDOW_ROWS, _LANE_PHASE = 11, 12, 13, 14, 15
#: the merge's phases: per source the numerator a_k of a_k / m, and m
Phase = tuple[tuple[int, ...], int]


@dataclass(frozen=True)
class MixSplit(Split):
    """A split of a mixture's epoch: a row range of one file of source ``source``; ``copy``
    tells apart the occurrences of the same rows in one epoch (upsampling)."""

    source: int = 0
    copy: int = 0

    def to_dict(self) -> dict:
        return {**super().to_dict(), "source": self.source, "copy": self.copy}

    def describe(self) -> str:
        return f"{super().describe()}  source {self.source}, copy {self.copy}"


@dataclass(frozen=True)
class SourceLayout:
    """One source as the planner sees it: its base splits (file indices of the whole mixture),
    the path of each, and the rows it contributes per epoch."""

    splits: tuple[SplitRows, ...]
    paths: tuple[str, ...]
    rows_per_epoch: int

    @property
    def num_rows(self) -> int:
        return sum(s.num_rows for s in self.splits)


def largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """Integers proportional to ``weights`` that sum to ``total``: each share's floor, then one
    more row for the largest fractional parts (ties: the earlier source)."""
    exact = [Fraction(w) for w in weights]
    whole = sum(exact)
    quotas = [w * total / whole for w in exact]
    counts = [math.floor(q) for q in quotas]
    left = total - sum(counts)
    by_remainder = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[:left]:
        counts[i] += 1
    return counts


def allocate_rows(sizes: Sequence[int], rows_per_epoch: Sequence[int | None], weights: Sequence[float | None], epoch_rows: int | None) -> list[int]:
    """Rows each source contributes per epoch; ValueError for arguments that cannot be met.

    ``rows_per_epoch`` is taken as given; ``weight`` shares ``epoch_rows`` (default: every
    source's rows) less the rows of sources given neither, which contribute all their rows once.
    """
    if any(n is not None for n in rows_per_epoch) and any(w is not None for w in weights):
        raise ValueError(
            "pass rows_per_epoch= or weight= to the sources of one mixture, not both: weights share epoch_rows, rows_per_epoch fixes each source's rows"
        )
    if not any(w is not None for w in weights):
        if epoch_rows is not None:
            given = "rows_per_epoch= gives each source's rows" if any(n is not None for n in rows_per_epoch) else "no source has a weight"
            raise ValueError(f"epoch_rows= is shared out by the sources' weight=, and {given}: give the sources weights, or leave epoch_rows out")
        return [size if n is None else n for size, n in zip(sizes, rows_per_epoch)]
    total = sum(sizes) if epoch_rows is None else epoch_rows
    fixed = sum(size for size, w in zip(sizes, weights) if w is None)
    shared = total - fixed
    if shared < 0:
        raise ValueError(f"epoch_rows={total} is smaller than the {fixed} rows of the sources without a weight, which contribute all their rows")
    weighted = [w for w in weights if w is not None]
    shares = iter(largest_remainder(weighted, shared))
    return [size if w is None else next(shares) for size, w in zip(sizes, weights)]


@dataclass(frozen=True)
class EpochMix:
    """One epoch of a mixture: its splits, and its blocks and windows as row ranges of every
    source's epoch sequence."""

    splits: list[MixSplit]
    split_rows: list[SplitRows]
    first_split: list[int]  # per source: its first split's index
    starts: list[np.ndarray]  # per source: where each of its splits starts in its sequence, plus the end
    bounds: np.ndarray  # [source, window]: the window's first row of the source's sequence (plus the end)
    block_windows: np.ndarray  # the first window of each block, plus the end
    order: np.ndarray  # the blocks in dealing order

    def block_rows(self, block: int) -> int:
        first, last = int(self.block_windows[block]), int(self.block_windows[block + 1])
        return int((self.bounds[:, last] - self.bounds[:, first]).sum())


@dataclass(frozen=True, eq=False)
class MixedStream(Stream):
    """A stream of mixture windows: ``window_sources[w]`` holds window ``w``'s rows of each
    source (its pieces come source after source); rows come out interleaved (``shuffle`` is
    True: every window has an order of its own) by the merge of ``phase`` (``merge_positions``)."""

    window_sources: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    random: bool = False  # rows of each source permuted before the merge
    phase: Phase | None = None

    def window_permutation(self, window: int) -> np.ndarray:
        counts = tuple(int(c) for c in self.window_sources[window])
        out = np.empty(sum(counts), dtype=np.int64)
        base = 0
        for source, (count, positions) in enumerate(zip(counts, merge_layout(counts, self.phase))):
            if count:
                local = stable_permutation([*self.key, _WINDOW_ROWS, window, source], count) if self.random else np.arange(count)
                out[positions] = base + local
            base += count
        return out


@functools.lru_cache(maxsize=8)
def merge_layout(counts: tuple[int, ...], phase: Phase | None = None) -> tuple[np.ndarray, ...]:
    """``merge_positions`` of every source (windows of an epoch have only a few distinct counts)."""
    return tuple(merge_positions(counts, source, phase) for source in range(len(counts)))


def merge_positions(counts: Sequence[int], source: int, phase: Phase | None = None) -> np.ndarray:
    """Where the rows of ``source`` go when sources of ``counts`` rows are merged by the key
    (j + a_k / m) / count_k of row j of source k, ``phase`` = ((a_0, a_1, ...), m) with
    0 < a_k < m (None: 1/2 for every source, which centres each row in its share of the window;
    ties: the earlier source first). Integer arithmetic, no sort: row j is preceded by the rows of
    every other source whose key is smaller. Canonical lanes give each lane phases of its own, so
    that the lanes' rounding errors cancel in a global step instead of adding up."""
    starts, m = phase or ((1,) * len(counts), 2)
    own = counts[source]
    key = m * np.arange(own, dtype=np.int64) + starts[source]  # m j + a_source
    position = np.arange(own, dtype=np.int64)
    for other, count in enumerate(counts):
        if other == source or not count:
            continue
        # other's row i is smaller when (m i + a_other) own < (m j + a_source) count (or equal, for an
        # earlier source): i < ((m j + a_source) count - a_other own) / (m own)
        numerator, denominator = key * count - starts[other] * own, m * own
        before = numerator // denominator + 1 if other < source else -(-numerator // denominator)
        position += np.clip(before, 0, count)
    return position


def lane_of_block(block: int, blocks: int, lanes: int) -> int:
    """The canonical lane holding ``block``: lane l holds blocks [l B / C, (l + 1) B / C)."""
    return ((block + 1) * lanes - 1) // blocks


def lane_phase(lane: int, lanes: int, sources: int) -> Phase:
    """The phases of canonical lane ``l``'s sources (``merge_positions``): source k's is
    (p_k(l) + 1/2) / C for a fixed permutation p_k of the lanes, so that the lanes' phases of one
    source are spread evenly and each lane pairs the sources' phases differently."""
    return tuple(2 * int(p[lane]) + 1 for p in _lane_permutations(lanes, sources)), 2 * lanes


@functools.lru_cache(maxsize=4)
def _lane_permutations(lanes: int, sources: int) -> tuple[np.ndarray, ...]:
    """p_k of ``lane_phase`` for every source (asked once per block of an epoch)."""
    return tuple(stable_permutation([lanes, k, _LANE_PHASE], lanes) for k in range(sources))


class MixturePlan:
    """The mixture's epochs, computed on demand (the last few kept)."""

    def __init__(
        self, sources: Sequence[SourceLayout], file_offsets: Sequence[np.ndarray], shuffle: bool, seed: int, buffer_rows: int, lanes: int | None = None
    ):
        self.sources = list(sources)
        self.file_offsets = file_offsets
        self.shuffle = shuffle
        self.seed = seed
        self.buffer_rows = buffer_rows
        self.lanes = lanes  # canonical lanes (plan/mixing_canonical.py): C lanes of whole blocks, windows of buffer_rows / C
        self._epochs: Lru[int, EpochMix] = Lru(_CACHED_EPOCHS)

    @property
    def epoch_rows(self) -> int:
        return sum(s.rows_per_epoch for s in self.sources)

    @property
    def block_count(self) -> int:
        """Blocks per epoch: as many as the source with the most splits' worth of rows per epoch has,
        so a block holds about a split of every source. (Smaller blocks would spread a small
        mixture over more workers, but every worker that reads part of a row group decodes it whole.)
        With canonical lanes, the next multiple of C: each lane is B / C whole blocks."""
        worth = max((Fraction(len(s.splits) * s.rows_per_epoch, s.num_rows) for s in self.sources if s.num_rows), default=Fraction(1))
        blocks = max(1, math.ceil(worth))
        return blocks if self.lanes is None else -(-blocks // self.lanes) * self.lanes

    @property
    def window_rows(self) -> int:
        """Rows of a window: ``buffer_rows``, or ``buffer_rows / C`` with C canonical lanes (a
        worker keeps a window of each lane it reads, as in a plain dataset's canonical lanes)."""
        return self.buffer_rows if self.lanes is None else max(1, self.buffer_rows // self.lanes)

    def epoch(self, epoch: int) -> EpochMix:
        return self._epochs.get(epoch, lambda: self._plan_epoch(epoch))

    def source_ranges(self, index: int, epoch: int) -> list[tuple[int, int, int, int]]:
        """Source ``index``'s epoch sequence as (base split, first row, end row, copy) ranges."""
        source = self.sources[index]
        count, size = len(source.splits), source.num_rows
        if size == 0:
            return []
        passes, rest = divmod(source.rows_per_epoch, size)
        out = []
        for copy in range(passes):
            order = stable_permutation([self.seed, epoch, index, copy, _PASS_ORDER], count) if self.shuffle else range(count)
            out += [(int(s), source.splits[s].start, source.splits[s].stop, copy) for s in order]
        if rest:
            walk = stable_permutation([self.seed, index, _WALK_ORDER], count) if self.shuffle else np.arange(count)
            ends = np.cumsum([source.splits[s].num_rows for s in walk])
            position, left = epoch * rest % size, rest
            while left:
                i = int(np.searchsorted(ends, position, side="right"))
                split = source.splits[int(walk[i])]
                offset = position - (int(ends[i]) - split.num_rows)
                take = min(left, split.num_rows - offset)
                out.append((int(walk[i]), split.start + offset, split.start + offset + take, passes))
                position, left = (position + take) % size, left - take
        return out

    def _plan_epoch(self, epoch: int) -> EpochMix:
        rows = np.array([s.rows_per_epoch for s in self.sources], dtype=np.int64)
        blocks = max(1, min(self.block_count, int(rows.sum())))
        block_bounds = np.array([[b * n // blocks for b in range(blocks + 1)] for n in rows.tolist()], dtype=np.int64).reshape(len(rows), blocks + 1)
        splits: list[MixSplit] = []
        split_rows: list[SplitRows] = []
        first_split, starts = [], []
        for index, source in enumerate(self.sources):
            first_split.append(len(splits))
            ranges = _cut_at(self.source_ranges(index, epoch), block_bounds[index])
            for split, start, stop, copy in ranges:
                file = source.splits[split].file
                splits.append(MixSplit(source.paths[split], start, stop - start, index, copy))
                split_rows.append(SplitRows(file, start, stop))
            starts.append(np.concatenate([[0], np.cumsum([stop - start for _, start, stop, _ in ranges], dtype=np.int64)]))
        columns, block_windows = [], [0]
        for block in range(blocks):
            lo, hi = block_bounds[:, block], block_bounds[:, block + 1]
            windows = max(1, -(-int((hi - lo).sum()) // self.window_rows))
            if self.lanes is None:
                columns += [lo + (hi - lo) * w // windows for w in range(windows)]
            else:  # cut with its lane's phases, as its windows are merged (plan/mixing_canonical.py)
                phases, m = lane_phase(lane_of_block(block, blocks, self.lanes), self.lanes, len(rows))
                a = np.array(phases, dtype=np.int64)
                columns += [lo + ((hi - lo) * w * m + a * windows) // (m * windows) for w in range(windows)]
            block_windows.append(block_windows[-1] + windows)
        bounds = np.stack(columns + [block_bounds[:, -1]], axis=1) if len(rows) else np.zeros((0, 1), dtype=np.int64)
        order = stable_permutation([self.seed, epoch, _BLOCK_ORDER], blocks) if self.shuffle else np.arange(blocks, dtype=np.int64)
        return EpochMix(splits, split_rows, first_split, starts, bounds, np.array(block_windows, dtype=np.int64), order)

    def build_stream(self, key: tuple[int, ...], epoch: int, blocks: Sequence[int], phase: Phase | None = None) -> MixedStream:
        """The stream of a worker that reads ``blocks`` of ``epoch`` (in this order), its windows
        merged with ``phase`` (``merge_positions``)."""
        mix = self.epoch(epoch)
        pieces: list[Piece] = []
        window_pieces, window_rows, window_sources = [0], [0], []
        for block in blocks:
            for window in range(int(mix.block_windows[block]), int(mix.block_windows[block + 1])):
                counts = []
                for source in range(len(self.sources)):
                    first, stop = int(mix.bounds[source, window]), int(mix.bounds[source, window + 1])
                    counts.append(stop - first)
                    pieces += self._pieces(mix, source, first, stop)
                window_pieces.append(len(pieces))
                window_rows.append(window_rows[-1] + sum(counts))
                window_sources.append(counts)
        sources = np.array(window_sources, dtype=np.int64).reshape(len(window_sources), len(self.sources))
        return MixedStream(
            key, tuple(blocks), tuple(pieces), np.array(window_pieces, dtype=np.int64), np.array(window_rows, dtype=np.int64), True,
            window_sources=sources, random=self.shuffle, phase=phase,
        )  # fmt: skip

    def _pieces(self, mix: EpochMix, source: int, first: int, stop: int) -> list[Piece]:
        """The pieces holding rows [first, stop) of a source's epoch sequence."""
        starts = mix.starts[source]
        out: list[Piece] = []
        i = int(np.searchsorted(starts, first, side="right")) - 1
        while first < stop:
            split = mix.first_split[source] + i
            rows = mix.split_rows[split]
            lo, hi = first - int(starts[i]), min(stop, int(starts[i + 1])) - int(starts[i])
            out += split_pieces(split, SplitRows(rows.file, rows.start + lo, rows.start + hi), self.file_offsets[rows.file])
            first = int(starts[i]) + hi
            i += 1
        return out


def _cut_at(ranges: list[tuple[int, int, int, int]], bounds: np.ndarray) -> list[tuple[int, int, int, int]]:
    """``source_ranges`` cut where a block of the source's sequence ends, so that every split of
    a mixture lies in one block: one worker reads it, in one run of its windows, which keeps a
    state's splits in progress to those of the block being read."""
    out = []
    position = 0
    cuts = iter(int(b) for b in bounds[1:-1])
    cut = next(cuts, None)
    for split, start, stop, copy in ranges:
        end = position + stop - start
        while cut is not None and cut <= position:
            cut = next(cuts, None)
        while cut is not None and cut < end:
            middle = start + cut - position
            out.append((split, start, middle, copy))
            start, position = middle, cut
            cut = next(cuts, None)
        out.append((split, start, stop, copy))
        position = end
    return out


class MixtureBook(StreamBook):
    """The stream book of a mixture: blocks (not splits) are dealt, streams are mixed windows."""

    deals_splits = False

    def __init__(self, plan: MixturePlan):
        super().__init__([], plan.file_offsets, plan.shuffle, plan.seed, plan.buffer_rows)
        self.mix = plan
        self._mixed: Lru[StreamKey, Stream] = Lru(_CACHED_STREAMS)

    def epoch_order(self, epoch: int) -> np.ndarray:
        return self.mix.epoch(epoch).order

    def stream_rows(self, key: StreamKey) -> int:
        mix = self.mix.epoch(key.epoch)
        return sum(mix.block_rows(b) for b in self.assignment(key.epoch, key.rank, key.world_size, key.num_workers)[key.worker])

    def stream(self, key: StreamKey) -> Stream:
        return self._mixed.get(key, lambda: self._build_mixed(key))

    def _build_mixed(self, key: StreamKey) -> Stream:
        blocks = self.assignment(key.epoch, key.rank, key.world_size, key.num_workers)[key.worker]
        return self.mix.build_stream((self.mix.seed, key.epoch, key.rank, key.worker), key.epoch, blocks)

"""Lanes and the stream book (lanes.py), checked against streams expanded row by row."""

import collections

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from stream_helpers import rows_in_order

from torch_dataloader_utils.plan.lanes import Lane, Segment, StreamBook, StreamKey
from torch_dataloader_utils.plan.streams import SplitRows


@st.composite
def books(draw):
    """A stream book over a few files cut into splits, and the topology its lanes come from."""
    files = draw(st.lists(st.lists(st.integers(1, 25), min_size=1, max_size=4), min_size=1, max_size=4))
    offsets = [np.concatenate([[0], np.cumsum(units)]).astype(np.int64) for units in files]
    split_rows = []
    for index, units in enumerate(files):
        total = sum(units)
        cuts = sorted(set(draw(st.lists(st.integers(1, total), max_size=2))) | {0, total})
        split_rows += [SplitRows(index, a, b) for a, b in zip(cuts, cuts[1:])]
    shuffle = draw(st.booleans())
    book = StreamBook(split_rows, offsets, shuffle, draw(st.integers(0, 2**32 - 1)), draw(st.integers(1, 40)))
    world, workers = draw(st.integers(1, 3)), draw(st.integers(0, 3))
    return book, draw(st.integers(0, 4)), draw(st.integers(0, world - 1)), world, workers, (split_rows, offsets)


def _expanded(book, lane):
    """(split, file, unit, row) of every lane row, in lane order."""
    return [row for segment in lane.segments for row in rows_in_order(book.stream(segment.key))[segment.start : segment.stop]]


def _mixed_lane(book, epoch, world, workers, data):
    """A lane of pieces of several streams (as an elastic resume deals them)."""
    segments = []
    for rank in range(world):
        for worker in range(max(1, workers)):
            key = StreamKey(epoch, rank, world, workers, worker)
            rows = book.stream_rows(key)
            a = data.draw(st.integers(0, rows))
            segments.append(Segment(key, a, data.draw(st.integers(a, rows))))
    return Lane(tuple(data.draw(st.permutations(segments))))


@settings(max_examples=200, deadline=None)
@given(books())
def test_canonical_lanes_hold_each_row_of_the_rank_once(case):
    book, epoch, rank, world, workers, (split_rows, offsets) = case
    lanes = book.canonical_lanes(epoch, rank, world, workers)
    assert len(lanes) == max(1, workers)
    splits = [split_rows[i] for worker in book.assignment(epoch, rank, world, workers) for i in worker]
    mine = sorted((s.file, r) for s in splits for r in range(s.start, s.stop))
    rows = sorted((file, int(offsets[file][unit]) + r) for lane in lanes for _, file, unit, r in _expanded(book, lane))
    assert rows == mine


@settings(max_examples=200, deadline=None)
@given(books(), st.data())
def test_slice_and_rows_done_match_the_expanded_lane(case, data):
    book, epoch, _, world, workers, _ = case
    lane = _mixed_lane(book, epoch, world, workers, data)
    rows = _expanded(book, lane)
    start = data.draw(st.integers(0, len(rows)))
    stop = data.draw(st.integers(start, len(rows)))
    assert _expanded(book, Lane(tuple(lane.slice(start, stop)))) == rows[start:stop]
    done = collections.Counter(split for split, _, _, _ in rows[:start])
    total = collections.Counter(split for split, _, _, _ in rows)
    assert book.rows_done(lane, start) == {split: (done[split], total[split]) for split in total}
    splits, done_rows, total_rows = book.split_progress(lane, start)
    assert splits.tolist() == sorted(total) and done_rows.tolist() == [done[s] for s in splits.tolist()]
    assert total_rows.tolist() == [total[s] for s in splits.tolist()]


@settings(max_examples=200, deadline=None)
@given(books(), st.data())
def test_deal_units_cut_a_segment_at_split_or_window_bounds_only(case, data):
    book, epoch, rank, world, workers, _ = case
    key = StreamKey(epoch, rank, world, workers, 0)
    stream, rows = book.stream(key), book.stream_rows(key)
    a = data.draw(st.integers(0, rows))
    segment = Segment(key, a, data.draw(st.integers(a, rows)))
    units = book.deal_units(segment)
    assert [r for u in units for r in range(u.start, u.stop)] == list(range(segment.start, segment.stop))
    expanded = rows_in_order(stream)
    for unit in units:
        if stream.shuffle:  # one window each
            assert stream.window_of(unit.start) == stream.window_of(unit.stop - 1)
        else:  # one split each
            assert len({split for split, _, _, _ in expanded[unit.start : unit.stop]}) == 1


def test_assignments_follow_each_epochs_order_whatever_order_epochs_are_asked_in():
    from torch_dataloader_utils.plan.splits import assign_splits, epoch_order

    split_rows = [SplitRows(0, 0, 10) for _ in range(40)]
    book = StreamBook(split_rows, [np.zeros(1, dtype=np.int64)], True, 7, 100)
    for epoch in (0, 1, 0, 2, 3, 1, 1, 5, 0):
        for rank in range(3):
            assert book.assignment(epoch, rank, 3, 2) == assign_splits(epoch_order(40, True, 7, epoch), rank, 3, 2), (epoch, rank)

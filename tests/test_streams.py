"""A worker's stream (streams.py): pure functions, checked against a row-by-row expansion."""

import collections

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from stream_helpers import rows_in_order

from torch_dataloader_utils.plan.streams import SplitRows, build_stream, split_rows_between

# files of row groups; each split is a row range of one file
layouts = st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=4), min_size=1, max_size=4)


@st.composite
def streams(draw):
    files = draw(layouts)
    offsets = [np.concatenate([[0], np.cumsum(units)]).astype(np.int64) for units in files]
    split_rows = []
    for index, units in enumerate(files):
        total = sum(units)
        cuts = sorted(set(draw(st.lists(st.integers(0, total), max_size=3))) | {0, total})
        split_rows += [SplitRows(index, a, b) for a, b in zip(cuts, cuts[1:]) if b > a]
    if not split_rows:
        split_rows = [SplitRows(0, 0, 0)]
    splits = draw(st.permutations(range(len(split_rows))))
    shuffle = draw(st.booleans())
    key = (draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 5)), 0, draw(st.integers(0, 3)))
    return build_stream(key, splits, split_rows, offsets, shuffle, draw(st.integers(1, 60))), split_rows, offsets


@settings(max_examples=300, deadline=None)
@given(streams())
def test_a_stream_holds_each_row_of_its_splits_once(case):
    stream, split_rows, offsets = case
    rows = rows_in_order(stream)
    assert len(rows) == stream.num_rows
    absolute = sorted((file, int(offsets[file][unit]) + r) for _, file, unit, r in rows)
    expected = sorted((split_rows[s].file, r) for s in stream.splits for r in range(split_rows[s].start, split_rows[s].stop))
    assert absolute == expected
    if not stream.shuffle:
        order = [(stream.splits.index(split), file, int(offsets[file][unit]) + r) for split, file, unit, r in rows]
        assert order == sorted(order), "unshuffled: splits in the given order, rows in file order"


@settings(max_examples=300, deadline=None)
@given(streams(), st.data())
def test_split_rows_between_counts_the_rows_of_each_split_in_a_range(case, data):
    stream, _, _ = case
    rows = rows_in_order(stream)
    # several ranges in any order on one stream: the window owners it keeps must follow
    for _ in range(data.draw(st.integers(1, 6))):
        start = data.draw(st.integers(0, stream.num_rows))
        stop = data.draw(st.integers(start, stream.num_rows))
        counted = collections.Counter(split for split, _, _, _ in rows[start:stop])
        assert split_rows_between(stream, start, stop) == dict(counted)

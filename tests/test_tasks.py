"""The delivery order of a rank's lanes (tasks.py): pure functions, checked against their definitions."""

from hypothesis import given, settings
from hypothesis import strategies as st

from torch_dataloader_utils.plan.schedule import PADDING_LANE, cap_batches, lane_schedule, padding_schedule, quick_start

lane_states = st.integers(1, 5).flatmap(
    lambda lanes: st.tuples(
        st.lists(st.integers(0, 120), min_size=lanes, max_size=lanes),  # lengths
        st.lists(st.integers(0, 120), min_size=lanes, max_size=lanes),  # positions (clipped to the lengths)
        st.integers(0, lanes - 1),  # next lane
        st.integers(1, 40),  # chunk rows
    )
).map(lambda case: (case[0], [min(p, n) for p, n in zip(case[1], case[0])], *case[2:]))


def _ranges_by_lane(schedule, lanes):
    out = {lane: [] for lane in range(lanes)}
    for lane, start, stop in schedule:
        out[lane].append((start, stop))
    return out


@settings(max_examples=300, deadline=None)
@given(lane_states)
def test_lane_schedule_delivers_each_lanes_rest_in_aligned_chunks_round_robin(case):
    lengths, positions, next_lane, chunk = case
    lanes = len(lengths)
    schedule = lane_schedule(positions, lengths, next_lane, chunk, keep_slots=False)
    by_lane = _ranges_by_lane(schedule, lanes)
    for lane in range(lanes):
        rows = [r for start, stop in by_lane[lane] for r in range(start, stop)]
        assert rows == list(range(positions[lane], lengths[lane])), "each lane's rest, once, in order"
        for start, stop in by_lane[lane]:
            assert start < stop == min(lengths[lane], (start // chunk + 1) * chunk), "chunks end on multiples of chunk_rows"
    # cycle c holds chunk c of every lane that has more than c chunks, from next_lane on
    counts = {lane: len(by_lane[lane]) for lane in range(lanes)}
    expected = [
        lane
        for cycle in range(max(counts.values(), default=0))
        for lane in [(next_lane + i) % lanes for i in range(lanes)]
        if counts[lane] > cycle
    ]
    assert [lane for lane, _, _ in schedule] == expected


@settings(max_examples=300, deadline=None)
@given(lane_states)
def test_lane_schedule_with_slots_keeps_each_entry_on_its_process(case):
    lengths, positions, next_lane, chunk = case
    lanes = len(lengths)
    slotted = lane_schedule(positions, lengths, next_lane, chunk, keep_slots=True)
    assert [lane for lane, _, _ in slotted] == [(next_lane + i) % lanes for i in range(len(slotted))]
    assert [e for e in slotted if e[1] < e[2]] == lane_schedule(positions, lengths, next_lane, chunk, keep_slots=False)
    assert all(start == stop == lengths[lane] for lane, start, stop in slotted if start == stop), "empty slots only for finished lanes"


@settings(max_examples=300, deadline=None)
@given(lane_states, st.integers(1, 13), st.integers(0, 40))
def test_cap_batches_keeps_the_first_budget_batches(case, batch_size, budget):
    lengths, positions, next_lane, chunk = case
    schedule = lane_schedule(positions, lengths, next_lane, chunk, keep_slots=False)

    def batches(entries):
        return [(lane, b, min(b + batch_size, stop)) for lane, start, stop in entries for b in range(start, stop, batch_size)]

    assert batches(cap_batches(schedule, batch_size, budget)) == batches(schedule)[:budget]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 200), st.integers(0, 200), st.integers(1, 40))
def test_padding_schedule_covers_the_rest_in_aligned_chunks(position, rows, chunk):
    schedule = padding_schedule(position, rows, chunk)
    assert all(lane == PADDING_LANE for lane, _, _ in schedule)
    assert [r for _, start, stop in schedule for r in range(start, stop)] == list(range(position, rows))
    assert all(stop == min(rows, (start // chunk + 1) * chunk) for _, start, stop in schedule)


@settings(max_examples=300, deadline=None)
@given(lane_states, st.integers(1, 4), st.integers(1, 30))
def test_quick_start_cuts_the_first_chunk_and_keeps_every_entry_on_its_process(case, processes, first_rows):
    lengths, positions, next_lane, chunk = case
    schedule = lane_schedule(positions, lengths, next_lane, chunk, keep_slots=True)
    quick = quick_start(schedule, first_rows, processes)
    rows = lambda entries: [(lane, r) for lane, start, stop in entries for r in range(start, stop)]  # noqa: E731
    assert rows(quick) == rows(schedule), "the same rows in the same order"
    if not schedule or schedule[0][2] - schedule[0][1] <= first_rows:
        assert quick == schedule
        return
    lane, start, stop = schedule[0]
    assert quick[0] == (lane, start, start + first_rows)
    assert quick[processes] == (lane, start + first_rows, stop), "the rest of the chunk on the first piece's process"
    assert all(a == b for _, a, b in quick[1:processes]), "empty slots in between"
    assert quick[processes + 1 :] == schedule[1:]
    for index, entry in enumerate(schedule[1:], start=1):
        assert quick[index + processes] == entry and (index + processes) % processes == index % processes


def test_quick_start_leaves_padding_and_short_chunks_alone():
    assert quick_start([(PADDING_LANE, 0, 100), (0, 0, 10)], 8, 2) == [(PADDING_LANE, 0, 100), (0, 0, 10)]
    assert quick_start([(0, 0, 8), (1, 0, 100)], 8, 2) == [(0, 0, 8), (1, 0, 100)]
    assert quick_start([(0, 0, 20)], 8, 3) == [(0, 0, 8), (0, 8, 8), (0, 8, 8), (0, 8, 20)]

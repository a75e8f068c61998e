import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_dataloader_utils import FileLayout, Split, assign_splits, epoch_order, plan_splits

unit_lists = st.lists(st.tuples(st.integers(0, 500), st.integers(1, 5000)), min_size=0, max_size=12)
files = st.lists(unit_lists, min_size=1, max_size=6)


def _layouts(spec):
    return [
        FileLayout(f"/data/part-{i}.parquet", sum(b for _, b in units) + 100, tuple(r for r, _ in units), tuple(b for _, b in units))
        for i, units in enumerate(spec)
    ]


@settings(max_examples=300, deadline=None)
@given(files, st.integers(1, 20000))
def test_splits_cover_every_row_once_and_respect_split_bytes(spec, split_bytes):
    layouts = _layouts(spec)
    splits = plan_splits(layouts, split_bytes)
    for layout in layouts:
        mine = [s for s in splits if s.path == layout.path]
        if layout.num_rows == 0:
            assert mine == []
            continue
        if layout.size <= split_bytes:
            assert mine == [Split(layout.path, None, None)]
            continue
        # contiguous, non-overlapping, covering [0, rows)
        assert mine[0].row_offset == 0
        for a, b in zip(mine, mine[1:]):
            assert a.row_offset + a.row_length == b.row_offset
        assert mine[-1].row_offset + mine[-1].row_length == layout.num_rows
        # every split lies on unit boundaries and holds <= split_bytes unless it is one unit
        starts = [0]
        for rows in layout.unit_rows:
            starts.append(starts[-1] + rows)
        for split in mine:
            assert split.row_length > 0
            assert split.row_offset in starts and split.row_offset + split.row_length in starts
            lo, hi = starts.index(split.row_offset), len(starts) - 1 - starts[::-1].index(split.row_offset + split.row_length)
            # units without rows may attach to either neighbour; count the ones holding rows
            nonempty = [b for r, b in zip(layout.unit_rows[lo:hi], layout.unit_bytes[lo:hi]) if r > 0]
            assert sum(nonempty) <= split_bytes or len(nonempty) == 1


def test_small_file_is_one_whole_file_split():
    layout = FileLayout("/d/a.parquet", 10, (5, 5), (4, 4))
    assert plan_splits([layout], 100) == [Split("/d/a.parquet")]


def test_oversized_unit_is_its_own_split():
    layout = FileLayout("/d/a.parquet", 1000, (10, 10, 10), (50, 500, 50))
    assert plan_splits([layout], 100) == [
        Split("/d/a.parquet", 0, 10),
        Split("/d/a.parquet", 10, 10),
        Split("/d/a.parquet", 20, 10),
    ]


@given(st.integers(0, 60), st.integers(1, 4), st.integers(0, 4), st.booleans(), st.integers(0, 2**32 - 1), st.integers(0, 50))
def test_assignment_deals_every_split_to_exactly_one_worker(n, world, workers, shuffle, seed, epoch):
    order = epoch_order(n, shuffle, seed, epoch)
    dealt = [s for rank in range(world) for worker in assign_splits(order, rank, world, workers) for s in worker]
    assert sorted(dealt) == list(range(n))
    # round-robin: split at epoch position i goes to rank i % world
    for rank in range(world):
        mine = [s for w in assign_splits(order, rank, world, workers) for s in w]
        assert sorted(mine) == sorted(int(s) for s in order[rank::world])


def test_epoch_order_is_deterministic_and_changes_with_epoch_and_seed():
    a = epoch_order(100, True, 7, 0)
    assert (a == epoch_order(100, True, 7, 0)).all()
    assert not (a == epoch_order(100, True, 7, 1)).all()
    assert not (a == epoch_order(100, True, 8, 0)).all()
    assert list(epoch_order(5, False, 7, 3)) == [0, 1, 2, 3, 4]


PINNED = [5, 6, 9, 3, 2, 1, 0, 8, 4, 7]


def test_stable_permutation_is_pinned():
    # fixed by the SeedSequence and PCG64 specifications: a checkpoint must outlive NumPy upgrades
    from torch_dataloader_utils.plan.splits import stable_permutation

    assert stable_permutation([1, 2], 10).tolist() == PINNED
    assert sorted(stable_permutation([7], 1000).tolist()) == list(range(1000))
    assert stable_permutation([7], 1).tolist() == [0] and stable_permutation([7], 0).tolist() == []
    with pytest.raises(ValueError, match="seed words"):
        stable_permutation([-1], 1)


def test_seed_words_must_fit_32_bits():
    """SeedSequence cuts larger ints into 32-bit words: (2**32 + 5, 0) would seed like (5, 1)."""
    from torch_dataloader_utils.plan.splits import stable_permutation

    with pytest.raises(ValueError, match="seed words must be in"):
        epoch_order(20, True, 2**32 + 5, 0)
    with pytest.raises(ValueError, match="seed words must be in"):
        stable_permutation([1, -1], 5)
    assert not (epoch_order(20, True, 2**32 - 1, 0) == epoch_order(20, True, 2**32 - 1, 1)).all()

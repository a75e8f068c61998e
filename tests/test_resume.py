"""Exactly-once and resume equivalence with real DataLoader worker processes."""

import json

import pytest
from datagen import write_dataset, write_formats
from resume_helpers import assert_exactly_once, batch_key, make, resume, run_epoch

from torch_dataloader_utils.formats import _parquet_seek as parquet_seek
from torch_dataloader_utils.formats import parquet
from torch_dataloader_utils.testing import assert_resumes_exactly

# three files; row groups of odd sizes so batches and chunks straddle them
LAYOUT = [[23, 31, 17], [40, 9], [11, 29, 33, 14]]
ROWS = sum(map(sum, LAYOUT))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    paths = write_formats(tmp_path_factory, LAYOUT)
    root = tmp_path_factory.mktemp("paged")
    write_dataset(root, LAYOUT, "parquet", paged=True)
    paths["parquet_paged"] = str(root)
    return paths


def _config(workers, shuffle, fmt):
    # split_bytes small enough to cut files into several splits; chunk of 2 batches
    return dict(
        format=fmt,
        batch_size=13,
        num_workers=workers,
        shuffle=shuffle,
        shuffle_seed=5,
        split_bytes=2500 if fmt == "parquet" else 2000,
        chunk_rows=26,
        shuffle_buffer_rows=50,
    )


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [0, 1, 3])
def test_resume_at_every_interruption_point(data, fmt, shuffle, workers):
    config = _config(workers, shuffle, fmt)
    loader, dataset = make(data[fmt], **config)
    assert len(dataset.splits) > 3
    full = assert_resumes_exactly(lambda: make(data[fmt], **config), epochs=1, batch_key=batch_key).batches[0]
    assert_exactly_once(full, ROWS)
    assert len(full) == len(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_inside_row_groups_seeks_through_the_page_index(data, workers, monkeypatch, seek_tiny_files):
    """Files with a page index and pages of ~5 rows: resumes start decoding at the page that
    holds the saved row (parquet_seek)."""
    seeks = []

    def counted(*args):
        batches = parquet_seek.iter_from_row(*args)
        seeks.append(batches is not None)
        return batches

    monkeypatch.setattr(parquet, "iter_from_row", counted)  # counts in this process (workers=0)
    config = _config(workers, False, "parquet")
    full = assert_resumes_exactly(lambda: make(data["parquet_paged"], **config), epochs=1, batch_key=batch_key).batches[0]
    assert_exactly_once(full, ROWS)
    if workers == 0:
        assert sum(seeks) > len(full) // 2, seeks


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_persistent_workers_resume_at_every_point_in_one_live_loader(data, fmt, shuffle):
    """The same loader and its persistent workers (their open files and buffers) serve every
    resume: each load_state_dict must win over what the workers read before."""
    config = {**_config(2, shuffle, fmt), "persistent_workers": True}
    live = make(data[fmt], **config)
    full = assert_resumes_exactly(lambda: live, epochs=1, batch_key=batch_key).batches[0]
    assert_exactly_once(full, ROWS)


def test_shuffle_mixes_rows_and_depends_on_seed_and_epoch(data):
    config = _config(2, True, "parquet")
    loader, dataset = make(data["parquet"], **config)
    first = run_epoch(loader, dataset)
    again = run_epoch(*make(data["parquet"], **config))
    assert first == again
    dataset.set_epoch(1)
    second = run_epoch(loader, dataset)
    assert_exactly_once(second, ROWS)
    assert first != second
    other_seed = run_epoch(*make(data["parquet"], **{**config, "shuffle_seed": 6}))
    assert other_seed != first
    ids = [i for b in first for i in b]
    assert ids != sorted(ids)
    # rows inside a batch come from several places, not one sorted run
    assert any(list(b) != sorted(b) for b in first)


@pytest.mark.parametrize("shuffle", [False, True])
def test_several_interruptions_in_one_epoch(data, shuffle):
    config = _config(3, shuffle, "parquet")
    loader, dataset = make(data["parquet"], **config)
    full = run_epoch(loader, dataset)
    delivered = []
    state = None
    for stop in (2, 5, 6, 11):
        loader, dataset = make(data["parquet"], **config)
        if state is not None:
            dataset.load_state_dict(state)
        for batch in loader:
            delivered.append(batch_key(batch))
            if len(delivered) == stop:
                break
        state = dataset.state_dict()
    delivered += resume(data["parquet"], state, **config)
    assert delivered == full


@pytest.mark.parametrize("persistent", [False, True])
def test_across_epoch_boundary(data, persistent):
    config = {**_config(2, True, "parquet"), "persistent_workers": persistent}
    # resume after every batch of every epoch with the reference's loop (set_epoch for the resumed
    # epoch, then each later one): deep_stride=1 runs the later epochs at every point. (Saved
    # after an epoch's last batch, that epoch delivers nothing more, then the next ones run.)
    reference = assert_resumes_exactly(lambda: make(data["parquet"], **config), epochs=3, deep_stride=1, batch_key=batch_key)
    epochs, states = reference.batches, reference.states
    for epoch in epochs:
        assert_exactly_once(epoch, ROWS)
    assert len({tuple(map(tuple, e)) for e in epochs}) == 3
    # a state saved at the end of an epoch, then set_epoch(next) at once, starts the next epoch fresh
    assert resume(data["parquet"], states[0][-1], epoch=1, **config) == epochs[1]


def test_iterating_again_after_an_epoch_repeats_it(data):
    loader, dataset = make(data["parquet"], **_config(1, False, "parquet"))
    first = run_epoch(loader, dataset)
    assert_exactly_once(first, ROWS)
    assert run_epoch(loader, dataset) == first


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loop_that_stops_after_the_last_batch_still_repeats_the_epoch(data, workers):
    """zip(range(len(loader)), loader) takes every batch but never reaches the loader's end."""
    loader, dataset = make(data["parquet"], **_config(workers, False, "parquet"))
    full = run_epoch(loader, dataset)
    for _ in range(2):
        taken = [batch_key(batch) for _, batch in zip(range(len(loader)), loader)]
        assert taken == full
    # a state restored as complete still delivers nothing until the next pass
    state = dataset.state_dict()
    loader, dataset = make(data["parquet"], **_config(workers, False, "parquet"))
    dataset.load_state_dict(state)
    assert run_epoch(loader, dataset) == []
    assert run_epoch(loader, dataset) == full


def test_breaking_out_and_iterating_again_continues(data):
    config = _config(2, False, "parquet")
    loader, dataset = make(data["parquet"], **config)
    full = run_epoch(loader, dataset)
    loader, dataset = make(data["parquet"], **config)
    first = []
    for batch in loader:
        first.append(tuple(batch["id"].tolist()))
        if len(first) == 3:
            break
    assert first + run_epoch(loader, dataset) == full


@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_full_except_one_per_worker(data, drop_last):
    config = {**_config(3, False, "parquet"), "drop_last": drop_last}
    loader, dataset = make(data["parquet"], **config)
    batches = run_epoch(loader, dataset)
    short = [b for b in batches if len(b) != 13]
    assert len(short) <= (0 if drop_last else 3)
    assert sum(map(len, batches)) == len(dataset)
    if not drop_last:
        assert_exactly_once(batches, ROWS)


@pytest.mark.parametrize("shuffle", [False, True])
def test_drop_last_leaves_out_exactly_each_lanes_partial_batch_and_resumes(data, shuffle):
    """drop_last delivers the run without drop_last minus its short batches (one per lane, the
    lane's tail), in the same order, and resumes that exactly at every interruption point."""
    config = _config(3, shuffle, "parquet")
    whole = run_epoch(*make(data["parquet"], **config))
    assert 0 < sum(len(b) != 13 for b in whole) <= 3
    config["drop_last"] = True
    loader, dataset = make(data["parquet"], **config)
    cut = assert_resumes_exactly(lambda: make(data["parquet"], **config), epochs=1, batch_key=batch_key).batches[0]
    assert cut == [b for b in whole if len(b) == 13]
    assert len(cut) == len(loader) and sum(map(len, cut)) == len(dataset)


@pytest.mark.parametrize("taken", [2, 3])  # the old iterator stopped at a chunk's end, or inside one
@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("change", ["a newer iter\\(loader\\)", "load_state_dict", "set_epoch"])
def test_a_superseded_iterator_stops_instead_of_delivering_rows_twice(data, workers, persistent, change, taken):
    """One progress, one live pass: an iterator older than the last iter(loader), load_state_dict
    or set_epoch raises at its next batch without taking anything of the newer pass (persistent
    workers serve every iterator from one stream), and the newer pass delivers exactly."""
    config = {**_config(workers, True, "parquet"), "persistent_workers": persistent}
    loader, dataset = make(data["parquet"], **config)
    full = run_epoch(loader, dataset)
    dataset.set_epoch(1)
    next_epoch = run_epoch(loader, dataset)
    loader, dataset = make(data["parquet"], **config)
    old = iter(loader)
    got = [batch_key(next(old)) for _ in range(taken - 1)]
    saved = json.loads(json.dumps(dataset.state_dict()))
    got.append(batch_key(next(old)))
    if change == "set_epoch":
        dataset.set_epoch(1)
        expected = next_epoch
    elif change == "load_state_dict":
        dataset.load_state_dict(saved)
        expected = full[taken - 1 :]
    else:
        newer = iter(loader)
        got.append(batch_key(next(newer)))
    with pytest.raises(RuntimeError, match=f"superseded by {change} on the same dataset"):
        next(old)
    if change == "a newer iter\\(loader\\)":
        assert got + [batch_key(b) for b in newer] == full
    else:
        assert got == full[:taken] and run_epoch(loader, dataset) == expected


def test_prefetched_batches_are_not_counted(data):
    # with workers reading ahead, the state still counts only what the loop received
    config = {**_config(2, False, "parquet"), "prefetch_factor": 4}
    loader, dataset = make(data["parquet"], **config)
    it = iter(loader)
    next(it)
    state = dataset.state_dict()
    assert sum(state["rows_delivered"]) == 13

"""torchdata's StatefulDataLoader over a StructuredDataset: checkpoint with dl.state_dict(),
resume in a fresh process-like setup (new dataset, new loader, state through JSON or torch.save)."""

from __future__ import annotations

import io
import json
import shutil

import pyarrow.compute  # noqa: F401  imported before workers fork (its first use otherwise imports pandas per worker)
import pytest
import torch
from datagen import corrupt_data_pages, write_dataset
from resume_helpers import stop_failed_workers
from torchdata.stateful_dataloader import Stateful, StatefulDataLoader  # installed by .[dev]: a missing one fails, never skips

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset
from torch_dataloader_utils.testing import Reference, assert_resumes_exactly

# three files; row groups of odd sizes so batches, chunks and splits do not line up
LAYOUT = [[23, 31, 17], [40, 9], [11, 29, 33, 14]]
ROWS = sum(map(sum, LAYOUT))
CONFIG = dict(batch_size=13, shuffle_seed=5, split_bytes=2500, chunk_rows=26, shuffle_buffer_rows=50)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("stateful")
    write_dataset(root, LAYOUT, "parquet")
    return str(root)


def make(path: str, workers: int, shuffle: bool, persistent: bool = False, via: str = "ctor", snapshot: int = 1, **changes):
    """A fresh dataset (by the constructor or create_dataloader) and a StatefulDataLoader over it."""
    kwargs = {**CONFIG, "num_workers": workers, "shuffle": shuffle, **changes}
    loader_workers = kwargs.pop("loader_workers", kwargs["num_workers"])
    if via == "create":
        dataset = StructuredDataset.create_dataloader(path, **kwargs)[1]
    else:
        dataset = StructuredDataset(path, **kwargs)
    loader = StatefulDataLoader(
        dataset,
        batch_size=None,
        num_workers=loader_workers,
        persistent_workers=persistent and loader_workers > 0,
        snapshot_every_n_steps=snapshot,
    )
    return dataset, loader


def key(batch: dict) -> tuple:
    """The batch's ids, after checking the other columns belong to the same rows."""
    ids = batch["id"].tolist()
    assert batch["text"] == [f"row-{i}" for i in ids]
    assert torch.equal(batch["x"], batch["id"].double() * 0.5)
    return tuple(ids)


def roundtrip(state: dict, how: str) -> dict:
    """The state as a new process reads it back from a checkpoint file."""
    if how == "json":
        return json.loads(json.dumps(state))
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer)


def run(loader, states: list | None = None, stop: int | None = None) -> list[tuple]:
    """Batches of one pass (the first ``stop``), with the loader's state after each in ``states``."""
    batches = []
    for batch in loader:
        batches.append(key(batch))
        if states is not None:
            states.append(roundtrip(loader.state_dict(), "json"))
        if stop is not None and len(batches) == stop:
            break
    return batches


def resume(path: str, state: dict, *args, epoch: int | None = None, **kwargs) -> list[tuple]:
    dataset, loader = make(path, *args, **kwargs)
    loader.load_state_dict(state)
    if epoch is not None:
        dataset.set_epoch(epoch)
    return run(loader)


def resumes(path: str, workers: int, shuffle: bool, *, how: str = "json", epochs: int = 1, points: list | None = None,
            stride: int = 1, deep_stride: int = 4, **kwargs) -> Reference:
    """assert_resumes_exactly over fresh StatefulDataLoaders (``make``'s arguments): the loader's own
    state_dict, stored through JSON or torch.save (``how``), loaded by the loader's load_state_dict."""

    def fresh():
        dataset, loader = make(path, workers, shuffle, **kwargs)
        return loader, dataset

    return assert_resumes_exactly(
        fresh, epochs=epochs, points=points, stride=stride, deep_stride=deep_stride, batch_key=key,
        save=lambda loader, _: roundtrip(loader.state_dict(), how), load=lambda loader, _, state: loader.load_state_dict(state),
    )


def refused(loader, error: type, match: str) -> str:
    """Iterate and expect ``error``; returns its message as the user sees it."""
    with pytest.raises(error, match=match) as info:
        run(loader)
    stop_failed_workers(info.value)
    return str(info.value)


def assert_exactly_once(batches: list[tuple]) -> None:
    ids = [i for b in batches for i in b]
    assert len(ids) == len(set(ids)), "a row was delivered twice"
    assert sorted(ids) == list(range(ROWS)), "rows were lost"


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [0, 1, 3])
def test_resume_at_every_interruption_point(data, workers, shuffle):
    via = "create" if workers == 1 else "ctor"  # both ways of obtaining the dataset
    how = "torch" if shuffle else "json"  # both ways of storing the state
    dataset, _ = make(data, workers, shuffle, via=via)
    full = resumes(data, workers, shuffle, via=via, how=how).batches[0]
    assert_exactly_once(full)
    assert len(full) == dataset.num_batches()


@pytest.mark.parametrize("workers", [0, 3])
def test_drop_last_leaves_out_each_workers_short_batch_and_resumes(data, workers):
    """Workers read their own path here (runtime/worker_stream.py): drop_last must cut each
    worker's stream to whole batches there too, in the order the run without it has."""
    whole = run(make(data, workers, True)[1])
    assert 0 < sum(len(b) != 13 for b in whole) <= max(1, workers)
    dataset, _ = make(data, workers, True, drop_last=True)
    full = resumes(data, workers, True, drop_last=True).batches[0]
    assert full == [b for b in whole if len(b) == 13]
    assert len(full) == dataset.num_batches()


@pytest.mark.parametrize("workers", [0, 2])
def test_on_error_skip_delivers_the_readable_rows_once_and_resumes(tmp_path, workers):
    write_dataset(tmp_path, LAYOUT, "parquet")
    corrupt_data_pages(tmp_path / "part-00001.parquet")  # rows 71-119
    full = resumes(str(tmp_path), workers, True, stride=2, on_error="skip").batches[0]
    assert sorted(i for b in full for i in b) == [i for i in range(ROWS) if not 71 <= i < 120]


def test_orc_resumes_at_every_interruption_point(tmp_path):
    write_dataset(tmp_path, LAYOUT, "orc")
    full = resumes(str(tmp_path), 2, True, stride=2, format="orc", split_bytes=2000).batches[0]
    assert_exactly_once(full)


def test_several_interruptions_in_one_epoch_with_persistent_workers(data):
    full = run(make(data, 3, True, persistent=True)[1])
    delivered, state = [], None
    for stop in (2, 5, 1, 6):  # four runs, each killed after `stop` batches
        _, loader = make(data, 3, True, persistent=True)
        if state is not None:
            loader.load_state_dict(state)
        delivered += run(loader, stop=stop)
        state = roundtrip(loader.state_dict(), "torch")
    delivered += resume(data, state, 3, True, persistent=True)
    assert delivered == full


@pytest.mark.parametrize("workers,persistent", [(0, False), (3, False), (3, True)])
def test_across_epochs_with_set_epoch(data, workers, persistent, caplog):
    # every interruption point of epoch 1, resumed by the training loop of a restarted job (load,
    # then set_epoch for each remaining epoch): the first batches too, where persistent workers
    # have not yet delivered anything of the new epoch, and the last (epoch 1 delivers nothing more)
    dataset, _ = make(data, workers, True)
    dataset.set_epoch(1)
    points = [(1, k) for k in range(dataset.num_batches())]
    reference = resumes(data, workers, True, persistent=persistent, epochs=3, points=points, deep_stride=1)
    epochs, states = reference.batches, reference.states
    for epoch in epochs:
        assert_exactly_once(epoch)
    assert epochs[0] != epochs[1] != epochs[2]
    dataset, loader = make(data, workers, True, persistent=persistent)
    assert run(loader) == epochs[0]
    end = roundtrip(loader.state_dict(), "json")  # taken after epoch 0 ended

    def loop(state: dict, start: int) -> list[list[tuple]]:
        """The training loop of a restarted job: load, then set_epoch for each remaining epoch."""
        dataset, loader = make(data, workers, True, persistent=persistent)
        loader.load_state_dict(state)
        seen = []
        for epoch in range(start, 3):
            dataset.set_epoch(epoch)
            seen.append(run(loader))
        return seen

    assert loop(end, 1) == [epochs[1], epochs[2]]  # saved after epoch 0 ended
    # without set_epoch the restored epoch is finished first
    k = 4
    assert resume(data, states[2][k], workers, True, persistent=persistent) == epochs[2][k + 1 :]
    # create_dataloader's "this pass delivers nothing" warning is not this loader's case: torchdata
    # iterates the dataset again at once (docs/stateful-dataloader.md)
    with caplog.at_level("WARNING", logger="torch_dataloader_utils"):
        resume(data, end, workers, True, persistent=persistent)
    assert not [r for r in caplog.records if "delivers nothing" in r.getMessage()]


@pytest.mark.parametrize("persistent", [False, True])
def test_iterating_again_after_a_break(data, persistent):
    dataset, loader = make(data, 3, False, persistent=persistent)
    full = run(loader)
    # a new pass without a loaded state starts the epoch again: nothing read ahead is lost
    assert run(loader, stop=3) == full[:3]
    assert run(loader) == full
    # a state taken early in such a pass (before every worker delivered) resumes exactly
    states: list = []
    again = run(loader, states, stop=1)
    assert again + resume(data, states[0], 3, False, persistent=persistent) == full
    # loading the state taken at the break continues exactly
    first = run(loader, stop=4)
    loader.load_state_dict(roundtrip(loader.state_dict(), "json"))
    assert first + run(loader) == full


def test_state_taken_before_iterating(data):
    dataset, loader = make(data, 3, True)
    dataset.set_epoch(1)
    epoch1 = run(loader)
    # dl.state_dict() before the first batch starts the workers (and their read-ahead),
    # so set_epoch comes first, exactly as before iter(dl)
    dataset, loader = make(data, 3, True)
    dataset.set_epoch(1)
    initial = roundtrip(loader.state_dict(), "json")
    assert run(loader) == epoch1
    dataset, loader = make(data, 3, True)
    loader.load_state_dict(initial)
    dataset.set_epoch(1)
    assert run(loader) == epoch1


def test_large_snapshot_interval_still_resumes_exactly(data):
    resumes(data, 3, True, points=[(0, k) for k in (0, 3, 4, 8, -2)], snapshot=5)


@pytest.mark.parametrize("equalize", ["pad", "drop"])
def test_data_parallel_ranks_deliver_equal_batches(data, equalize):
    """torchtitan style: one StatefulDataLoader, and one saved state, per data-parallel rank."""
    runs = []
    for rank in range(2):
        options = dict(rank=rank, world_size=2, equalize=equalize)
        dataset, _ = make(data, 2, True, **options)
        points = None if equalize == "pad" else [(0, -3), (0, -2), (0, -1)]
        runs.append(resumes(data, 2, True, points=points, **options).batches[0])
        assert len(runs[-1]) == dataset.num_batches()
    assert len(runs[0]) == len(runs[1])  # no rank waits for the other at the end of the epoch
    own = [{i for b in batches for i in b} for batches in runs]
    assert not own[0] & own[1]
    if equalize == "pad":  # every row once, plus repeats of the rank's own rows
        assert sorted(own[0] | own[1]) == list(range(ROWS))
    else:  # the cut rows are simply not delivered; none twice
        assert sum(len(b) for batches in runs for b in batches) == len(own[0]) + len(own[1])


def _elastic(path: str, shuffle: bool, global_state: dict | None) -> tuple:
    """1 rank x 2 workers; with ``global_state``, loaded elastically first (as the resumed job did)."""
    dataset = StructuredDataset(path, **CONFIG, num_workers=2, shuffle=shuffle)
    if global_state is not None:
        dataset.load_state_dict(global_state, elastic=True)
    return dataset, StatefulDataLoader(dataset, batch_size=None, num_workers=2)


@pytest.mark.parametrize("shuffle", [False, True])
def test_worker_states_after_an_elastic_load_resume_only_on_the_same_lanes(data, shuffle):
    """A job of 2 ranks x 2 workers stops; its global state is loaded elastically on 1 rank x 2 workers
    read by a StatefulDataLoader, whose worker states count along the re-dealt lanes. Given the same
    elastic load first, every resume point is exact; on a newly built dataset (the planned lanes)
    the state is refused (it delivered rows twice, silently)."""
    from torch_dataloader_utils.distributed import merge_states

    delivered, rank_states = [], []
    for rank in range(2):
        loader, dataset = StructuredDataset.create_dataloader(data, **CONFIG, num_workers=2, shuffle=shuffle, rank=rank, world_size=2)
        delivered += run(loader, stop=3)
        rank_states.append(roundtrip(dataset.state_dict(), "json"))
    global_state = roundtrip(merge_states(rank_states), "json")
    reference = assert_resumes_exactly(
        lambda: _elastic(data, shuffle, global_state)[::-1], epochs=1, batch_key=key,
        save=lambda loader, _: roundtrip(loader.state_dict(), "json"), load=lambda loader, _, state: loader.load_state_dict(state),
    )
    rest, states = reference.batches[0], reference.states[0]
    assert_exactly_once(delivered + rest)
    _, planned = _elastic(data, shuffle, None)
    planned.load_state_dict(states[2])
    refused(planned, CheckpointMismatchError, r"re-dealt; this dataset reads the planned lanes \(key 'deal'\)")
    # the next epoch is planned normally: its states resume with or without the elastic load repeated
    dataset, loader = _elastic(data, shuffle, global_state)
    run(loader)
    dataset.set_epoch(1)
    passes = iter(loader)
    next(passes)
    next_epoch = roundtrip(loader.state_dict(), "json")
    rest = [key(batch) for batch in passes]
    for again in (global_state, None):
        dataset, loader = _elastic(data, shuffle, again)
        loader.load_state_dict(next_epoch)
        assert run(loader) == rest, "repeated elastic load" if again else "newly built dataset"


def test_worker_state_is_small_and_plain(data):
    dataset, loader = make(data, 3, True)
    run(loader, stop=4)
    state = loader.state_dict()
    worker = state["_snapshot"]["_worker_snapshots"]["worker_1"]["dataset_state"]
    assert worker["scope"] == "worker" and worker["worker"] == 1
    assert len(json.dumps(worker)) < 1024
    assert isinstance(dataset, Stateful)  # so torchdata saves our state instead of fast-forwarding


@pytest.fixture(scope="module")
def saved(data) -> dict:
    _, loader = make(data, 3, True)
    run(loader, stop=5)
    return roundtrip(loader.state_dict(), "json")


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"shuffle_seed": 6}, "shuffle_seed changed: checkpoint=5, current=6"),
        ({"num_workers": 2}, "num_workers changed: checkpoint=3, current=2"),
        ({"num_workers": 4}, "num_workers changed: checkpoint=3, current=4"),
        ({"split_bytes": 100_000}, "split_bytes changed"),
        ({"shuffle_buffer_rows": 20}, "shuffle_buffer_rows changed: checkpoint=50, current=20"),
    ],
)
def test_changed_configuration_is_refused(data, saved, changes, message):
    dataset, loader = make(data, 3, True, **changes)
    loader.load_state_dict(saved)
    shown = refused(loader, CheckpointMismatchError, message)
    assert "in DataLoader worker process" in shown and "Reconstruct the dataset" in shown


def test_changed_file_list_is_refused(data, saved, tmp_path):
    shutil.copytree(data, tmp_path / "more")
    write_dataset(tmp_path / "extra", [[7]], "parquet", first_id=ROWS)
    shutil.copy(tmp_path / "extra" / "part-00000.parquet", tmp_path / "more" / "part-00099.parquet")
    _, loader = make(str(tmp_path / "more"), 3, True)
    loader.load_state_dict(saved)
    refused(loader, CheckpointMismatchError, "file list changed")


@pytest.mark.parametrize("loader_workers", [2, 4])
def test_loader_workers_must_match_the_dataset(data, saved, loader_workers):
    _, loader = make(data, 3, True, loader_workers=loader_workers)
    loader.load_state_dict(saved)  # dataset planned for 3 workers: its state fits, the loader does not
    refused(loader, ValueError, f"planned for num_workers=3 but runs in a DataLoader with {loader_workers} workers")
    _, fresh = make(data, 3, True, loader_workers=loader_workers)  # no state: a worker's first state_dict() checks too
    refused(fresh, ValueError, f"planned for num_workers=3 but runs in a DataLoader with {loader_workers} workers")


def test_main_process_state_is_validated_too(data):
    _, loader = make(data, 0, True)
    run(loader, stop=3)
    state = roundtrip(loader.state_dict(), "torch")
    _, loader = make(data, 0, True, shuffle_seed=9)
    with pytest.raises(CheckpointMismatchError, match="shuffle_seed changed: checkpoint=5, current=9"):
        loader.load_state_dict(state)
        run(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_state_given_to_the_dataset_is_refused_naming_the_loader(data, workers):
    dataset, loader = make(data, workers, False)
    run(loader, stop=2)
    with pytest.raises(CheckpointMismatchError, match=r"a StatefulDataLoader's state, not this dataset's(.|\n)*StatefulDataLoader's own load_state_dict"):
        dataset.load_state_dict(loader.state_dict())

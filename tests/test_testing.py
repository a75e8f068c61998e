"""torch_dataloader_utils.testing.assert_resumes_exactly: it passes on real loaders, and it fails,
naming the check, on wrappers that break the promise in one way each."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from datagen import write_dataset, write_formats

from torch_dataloader_utils import Ragged, StructuredDataset
from torch_dataloader_utils.distributed import merge_states
from torch_dataloader_utils.testing import assert_resumes_exactly, fingerprint

LAYOUT = [[23, 31, 17], [40, 9], [11, 29, 33, 14]]
ROWS = sum(map(sum, LAYOUT))
CONFIG = dict(batch_size=26, split_bytes=2500, chunk_rows=52, shuffle_seed=5, shuffle_buffer_rows=60)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    return write_formats(tmp_path_factory, LAYOUT)


def ids(batch: dict) -> tuple[int, ...]:
    return tuple(batch["id"].tolist())


def exactly_once(batches: list[tuple[int, ...]]) -> None:
    assert sorted(i for b in batches for i in b) == list(range(ROWS))


# ------------------------------------------------------------------ real loaders pass
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_real_loaders_pass_at_every_point_of_two_epochs(data, workers, shuffle):
    def make():
        return StructuredDataset.create_dataloader(data["parquet"], num_workers=workers, shuffle=shuffle, **CONFIG)

    reference = assert_resumes_exactly(make, epochs=2)
    sizes = [len(epoch) for epoch in reference.batches]
    assert sizes[0] == sizes[1] == len(make()[0]) and len(reference.states[1]) == sizes[1]
    assert reference.batches[0] != reference.batches[1] if shuffle else reference.batches[0] == reference.batches[1]
    again = assert_resumes_exactly(make, epochs=2, batch_key=ids, points=[(0, 0), (1, sizes[1] - 2)])
    for epoch in again.batches:
        exactly_once(epoch)


def test_rank_of_a_ddp_job_with_padding_and_orc(data):
    """Rank 1 of 2 (a process group is not needed: rank= and world_size= say it), padded to the
    other rank's batch count, read from ORC."""

    def make():
        return StructuredDataset.create_dataloader(
            data["orc"], format="orc", rank=1, world_size=2, num_workers=2, shuffle=True, **{**CONFIG, "split_bytes": 2000}
        )

    reference = assert_resumes_exactly(make, epochs=2, batch_key=ids, deep_stride=2)
    assert reference.states[0][-1]["_rank"] == 1 and reference.states[0][-1]["_world_size"] == 2
    padding = [state["padding_delivered"] for state in reference.states[0]]
    assert padding[-1] > 0, "this layout must make rank 1 pad, or padded states were not checked"


def _elastically_resumed(path: str):
    """Rank 1 of 3 with 1 worker, resumed elastically from a job of 2 ranks x 2 workers stopped after 3 batches."""
    config = dict(CONFIG, shuffle=True, batch_size=10)
    states = []
    for rank in range(2):
        loader, dataset = StructuredDataset.create_dataloader(path, rank=rank, world_size=2, num_workers=2, **config)
        for _, _ in zip(range(3), loader):
            pass
        states.append(json.loads(json.dumps(dataset.state_dict())))
    merged = merge_states(states)

    def make():
        loader, dataset = StructuredDataset.create_dataloader(path, rank=1, world_size=3, num_workers=1, **config)
        dataset.load_state_dict(merged, elastic=True)
        return loader, dataset

    return make


def test_states_saved_after_an_elastic_resume_resume_exactly(data):
    reference = assert_resumes_exactly(_elastically_resumed(data["parquet"]), epochs=1, deep_stride=1)
    assert all(state["lanes"] is not None for state in reference.states[0])


def test_the_state_keeps_its_shape_into_the_epoch_after_an_elastic_resume(data):
    """The dealt epoch's states carry a batch target, the next epoch's a null one: the same keys."""
    reference = assert_resumes_exactly(_elastically_resumed(data["parquet"]), epochs=2, points=[(0, -1)])
    assert reference.states[0][-1]["batch_target"] is not None
    assert reference.states[1][-1]["batch_target"] is None


def test_the_same_live_loader_may_serve_every_resume(data):
    live = StructuredDataset.create_dataloader(data["parquet"], num_workers=2, persistent_workers=True, shuffle=True, **CONFIG)
    assert_resumes_exactly(lambda: live, epochs=2, deep_stride=3)


def test_points_and_stride_choose_where_to_resume(data):
    calls = []

    def make():
        calls.append(1)
        return StructuredDataset.create_dataloader(data["parquet"], num_workers=0, **CONFIG)

    reference = assert_resumes_exactly(make, epochs=1, stride=3, deep_stride=100)
    size = len(reference.batches[0])
    points = len({*range(0, size, 3), size - 1})
    assert size > 4 and (size - 1) % 3  # (so the last batch is a point of its own)
    assert len(calls) == 1 + points + 1  # the reference, one per point, a second resume at the first point
    calls.clear()
    assert_resumes_exactly(make, epochs=1, points=[(0, 1)])
    assert len(calls) == 3
    with pytest.raises(ValueError, match=rf"point \(0, {size}\) is outside the run: its epochs have \[{size}\] batches"):
        assert_resumes_exactly(make, epochs=1, points=[(0, size)])


# ------------------------------------------------------------------ broken wrappers fail
class Wrapper:
    """A user's wrapper: a transform on every batch, the state passed through. It plays both
    the loader and the dataset that make() returns."""

    def __init__(self, path: str, **config):
        self.loader, self.dataset = StructuredDataset.create_dataloader(path, **{**CONFIG, "num_workers": 0, **config})

    def __iter__(self):
        for batch in self.loader:
            yield {"id": batch["id"], "double": batch["x"] * 2}

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)


def _make(cls, path: str, **config):
    def make():
        wrapper = cls(path, **config)
        return wrapper, wrapper

    return make


def test_a_correct_wrapper_passes(data):
    reference = assert_resumes_exactly(_make(Wrapper, data["parquet"], shuffle=True), epochs=2, deep_stride=1)
    assert reference.batches[0][0][0][0] == "'double'"  # the default key fingerprints every column


class DropsABatchAfterResume(Wrapper):
    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.skip = True

    def __iter__(self):
        batches = super().__iter__()
        if getattr(self, "skip", False):
            self.skip = False
            next(batches, None)
        yield from batches


class RedeliversABatch(Wrapper):
    """Saves the state from before the batch it hands out: the batch comes again after a resume."""

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.saved = state

    def __iter__(self):
        self.saved = self.dataset.state_dict()
        for batch in super().__iter__():
            yield batch
            self.saved = self.dataset.state_dict()

    def state_dict(self) -> dict:
        return self.saved


class TupleInState(Wrapper):
    def state_dict(self) -> dict:
        return {**super().state_dict(), "seen": (1, 2)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict({k: v for k, v in state.items() if k != "seen"})


class NumpyInState(TupleInState):
    def state_dict(self) -> dict:
        return {**Wrapper.state_dict(self), "seen": np.int64(3)}


class KeyOnlyMidEpoch(TupleInState):
    def state_dict(self) -> dict:
        state = Wrapper.state_dict(self)
        return {**state, "seen": 1} if state["batches_delivered"] > 2 else state


class ForgetsItsCounterOnLoad(Wrapper):
    """Counts batches in its state but does not restore the count."""

    count = 0

    def __iter__(self):
        for batch in super().__iter__():
            self.count += 1
            yield batch

    def state_dict(self) -> dict:
        return {"inner": super().state_dict(), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state["inner"])


class ReplaysButCountsFromTheResume(Wrapper):
    """Resumes by replaying the epoch up to its saved count, right; but after a resume it counts
    from 0, so the state it saves then is wrong (only resuming twice shows it)."""

    count = skip = 0

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.dataset.epoch:
            self.count = 0
        super().set_epoch(epoch)

    def __iter__(self):
        skip, self.skip = self.skip, 0
        if skip:
            self.count = 0  # the bug
        for batch in super().__iter__():
            if skip:
                skip -= 1
                continue
            self.count += 1
            yield batch

    def state_dict(self) -> dict:
        return {"epoch": self.dataset.epoch, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.dataset.set_epoch(state["epoch"])
        self.skip = self.count = state["count"]


class IgnoresSetEpochAfterALoad(Wrapper):
    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.loaded = True

    def set_epoch(self, epoch: int) -> None:
        if not getattr(self, "loaded", False):
            super().set_epoch(epoch)


class StaleEpoch(Wrapper):
    """Reports the epoch set_epoch chose, not the one load_state_dict restored."""

    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        super().set_epoch(epoch)


@pytest.mark.parametrize(
    "cls, epochs, match",
    [
        (DropsABatchAfterResume, 1, r"resume from the state after batch 0 of epoch 0: batch 1 differs \(number 1 after the resume\)"),
        (RedeliversABatch, 1, r"after batch 0 of epoch 0: batch 1 differs"),
        (TupleInState, 1, r"the state after batch 0 of epoch 0: the state is not plain JSON: state\['seen'\] is a builtins.tuple"),
        (NumpyInState, 1, r"state\['seen'\] is a numpy.int64"),
        (KeyOnlyMidEpoch, 1, r"after batch 2 of epoch 0: the state's shape changed at state: it gained the keys \['seen'\]"),
        (ForgetsItsCounterOnLoad, 1, r"state_dict\(\) right after loading differs from the loaded state in \['count'\]"),
        (ReplaysButCountsFromTheResume, 1, r"after batch 0 of epoch 0, one batch, then a second resume: batch 2 differs"),
        (IgnoresSetEpochAfterALoad, 2, r"after batch 0 of epoch 0, then epoch 1: batch 0 differs"),
        (StaleEpoch, 2, r"after batch 0 of epoch 1: dataset.epoch is 0 after load_state_dict, but the state was saved in epoch 1"),
    ],
)
def test_a_broken_wrapper_fails_naming_the_check(data, cls, epochs, match):
    with pytest.raises(AssertionError, match=match):
        assert_resumes_exactly(_make(cls, data["parquet"], shuffle=True), epochs=epochs)


def test_a_wrapper_that_fails_only_the_second_resume_passes_checks_1_to_5(data):
    """So the failure above is check 6's own: without it (no deep point) the wrapper passes."""
    make = _make(ReplaysButCountsFromTheResume, data["parquet"], shuffle=True)
    last = make()[1].dataset.num_batches() - 1
    assert_resumes_exactly(make, epochs=2, points=[(0, last), (1, last)])


def test_a_loader_that_delivers_nothing_fails(tmp_path):
    write_dataset(tmp_path, [[0]])
    with pytest.raises(AssertionError, match="delivered no batch"):
        assert_resumes_exactly(lambda: StructuredDataset.create_dataloader(str(tmp_path), num_workers=0), epochs=1)


# ------------------------------------------------------------------ the default batch key
def test_fingerprint_compares_every_column_by_value_and_type():
    batch = {
        "id": torch.arange(3),
        "x": torch.tensor([0.5, math.nan, 1.0]),
        "text": ["a", "b", "c"],
        "ragged": Ragged(torch.arange(4), torch.tensor([0, 1, 4])),
        "nested": {"b": [np.int64(1)], "a": (2,)},
    }
    same = {"nested": {"a": [2], "b": [1]}, **{k: v for k, v in batch.items() if k != "nested"}}
    same["x"] = torch.tensor([0.5, math.nan, 1.0])
    assert fingerprint(batch) == fingerprint(same)  # NaN equals NaN, dict order and list/tuple do not matter
    assert hash(fingerprint(batch))
    for key, other in [
        ("id", torch.arange(3, dtype=torch.int32)),
        ("id", torch.tensor([0, 2, 1])),
        ("text", ["a", "b", "d"]),
        ("ragged", Ragged(torch.arange(4), torch.tensor([0, 2, 4]))),
        ("x", torch.tensor([[0.5, math.nan, 1.0]])),
    ]:
        assert fingerprint({**batch, key: other}) != fingerprint(batch), key


def test_fingerprint_of_a_mapping_that_is_not_a_dict():
    """A transform may return a mapping such as a tokenizer's BatchEncoding (a UserDict)."""
    from collections import UserDict

    assert fingerprint(UserDict({"ids": torch.arange(3)})) == fingerprint({"ids": torch.arange(3)})
    assert fingerprint(UserDict({"ids": torch.arange(3)})) != fingerprint(UserDict({"ids": torch.arange(4)}))

"""Hostile and damaged state dicts (extends test_mismatch.py, which covers each named cause).

Property: a valid state, mutated at random (keys dropped or added, values replaced by other JSON
values, numbers nudged, list entries dropped or duplicated), either raises CheckpointMismatchError
or ValueError with a message and leaves the dataset's progress untouched, or it is a state the
loader reads back verbatim and resumes from exactly: the rest of the epoch, each row once.
"""

from __future__ import annotations

import collections
import copy
import io
import json
import os
import re
import shutil
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from datagen import write_dataset
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from resume_helpers import make, run_epoch

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset

LAYOUT = [[30, 30], [25], [40, 20], [17]]
ROWS = sum(map(sum, LAYOUT))
# batch_size 1: every row position is a batch boundary, so the reference gives the exact suffix
# for any position a mutated state may claim (one stream: num_workers=0)
ONE = dict(batch_size=1, num_workers=0, shuffle=True, shuffle_seed=3, split_bytes=2000, shuffle_buffer_rows=25, chunk_rows=16)
TWO = dict(batch_size=5, num_workers=2, shuffle=True, shuffle_seed=3, split_bytes=2000, shuffle_buffer_rows=25, chunk_rows=10)
JSON_TYPES = (dict, list, str, int, float, bool, type(None))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("hostile")
    write_dataset(root, LAYOUT)
    return str(root)


class Reference:
    """Uninterrupted runs of a configuration: rows per epoch and the genuine states after each batch."""

    def __init__(self, path: str, config: dict):
        self.path, self.config = path, config
        self._rows: dict[int, list[int]] = {}
        self.batches: dict[int, list[tuple]] = {}
        self.states: dict[int, list[dict]] = {}

    def epoch(self, epoch: int) -> list[int]:
        if epoch not in self._rows:
            loader, dataset = make(self.path, **self.config)
            dataset.set_epoch(epoch)
            states: list = []
            self.batches[epoch] = run_epoch(loader, dataset, states)
            self.states[epoch] = states
            self._rows[epoch] = [i for b in self.batches[epoch] for i in b]
        return self._rows[epoch]


@pytest.fixture(scope="module")
def one(data) -> Reference:
    reference = Reference(data, ONE)
    reference.epoch(0)
    reference.epoch(1)
    return reference


# ------------------------------------------------------------------ plain JSON
def _only_json(value: Any, where: str = "state") -> None:
    assert isinstance(value, JSON_TYPES), f"{where} is a {type(value).__name__}"
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str), f"{where} has a non-string key {key!r}"
            _only_json(item, f"{where}[{key!r}]")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _only_json(item, f"{where}[{i}]")


def test_state_is_plain_json_and_loads_without_running_code(one):
    state = one.states[1][40]
    _only_json(state)
    assert json.loads(json.dumps(state, allow_nan=False)) == state
    buffer = io.BytesIO()
    torch.save({"dataset": state}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["dataset"]  # the unpickler that runs no code
    loader, dataset = make(one.path, **ONE)
    kept = copy.deepcopy(loaded)
    dataset.load_state_dict(loaded)
    assert loaded == kept, "load_state_dict changed the dict it was given"
    assert [i for b in run_epoch(loader, dataset) for i in b] == one.epoch(1)[41:]


# ------------------------------------------------------------------ other datasets
def test_state_of_another_dataset_with_the_same_layout(one, tmp_path):
    """Same file names, layout and configuration, other directory: the files differ by URL."""
    other = str(tmp_path / "other")
    shutil.copytree(one.path, other)
    with pytest.raises(CheckpointMismatchError, match="files removed since the checkpoint"):
        StructuredDataset(other, **ONE).load_state_dict(one.states[0][10])


def _fixed_width_file(path: str, first: int, rows: int) -> None:
    """A file whose size does not depend on its values: uncompressed, plain-encoded int64/float64."""
    ids = np.arange(first, first + rows, dtype=np.int64)
    table = pa.table({"id": ids, "x": ids.astype(np.float64)})
    pq.write_table(table, path, compression="none", use_dictionary=False, row_group_size=20)


def test_state_after_a_same_size_rewrite_of_a_local_file(tmp_path):
    root = str(tmp_path / "fixed")
    os.makedirs(root)
    for i in range(2):
        _fixed_width_file(os.path.join(root, f"part-{i}.parquet"), 100 * i, 60)
    config = dict(batch_size=10, num_workers=0)
    loader, dataset = make(root, **config)
    it = iter(loader)
    [next(it) for _ in range(2)]
    state = json.loads(json.dumps(dataset.state_dict()))
    before = os.stat(os.path.join(root, "part-0.parquet"))
    _fixed_width_file(os.path.join(root, "part-0.parquet"), 5000, 60)  # other rows, same size
    assert os.path.getsize(os.path.join(root, "part-0.parquet")) == before.st_size
    os.utime(os.path.join(root, "part-0.parquet"), ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))  # coarse clocks tick every 4 ms
    with pytest.raises(CheckpointMismatchError, match="part-0.parquet"):
        StructuredDataset(root, **config).load_state_dict(state)


# ------------------------------------------------------------------ named damage not in test_mismatch
SHARD_MISMATCH = "Checkpoint shard does not match any current split"
DAMAGE = {  # name: (damage, what the refusal must say)
    "unknown scope": (lambda s: s.update(scope="elsewhere"), "unknown scope 'elsewhere'"),
    "format_version 0": (lambda s: s.update(format_version=0), "invalid format_version 0"),
    "format_version str": (lambda s: s.update(format_version="1"), "'format_version' has the wrong type.*found str"),
    "format_version float": (lambda s: s.update(format_version=1.0), "'format_version' has the wrong type.*found float"),
    "format_version bool": (lambda s: s.update(format_version=True), "'format_version' has the wrong type.*found bool"),
    "epoch bool": (lambda s: s.update(epoch=True), "'epoch' has the wrong type.*found bool"),
    "next_worker negative": (lambda s: s.update(next_worker=-1), r"'next_worker' is out of range \(-1\)"),
    "rows_delivered float": (lambda s: s.update(rows_delivered=[41.0]), r"'rows_delivered\[0\]' has the wrong type.*found float"),
    "rows_delivered bool": (lambda s: s.update(rows_delivered=[True]), r"'rows_delivered\[0\]' has the wrong type.*found bool"),
    "rows_delivered str": (lambda s: s.update(rows_delivered="41"), "'rows_delivered' has the wrong type.*found str"),
    "completed_shards dict": (lambda s: s.update(completed_shards={"worker": 0}), "'completed_shards' has the wrong type.*found dict"),
    "completed_shards empty": (lambda s: s.update(completed_shards=[]), "does not have one entry per worker.*'completed_shards' 0"),
    "num_workers str": (lambda s: s.update(_num_workers="0"), r"num_workers changed: checkpoint='0', current=0 \(state key '_num_workers' holds str, expected int: the state is damaged\)"),
    "extra file": (lambda s: s["files"].append(["/x.parquet", 1, None]), "files removed since the checkpoint .*/x.parquet"),
    "file missing": (lambda s: s["files"].pop(0), "files added since the checkpoint .*part-00000.parquet"),
    "file size negative": (lambda s: s["files"][0].__setitem__(1, -1), "file rewritten since the checkpoint: .*size checkpoint=-1"),
    "completed split dropped": (lambda s: s["completed_shards"][0]["splits"].pop(), f"{SHARD_MISMATCH}.*splits do not match the plan at 41 rows"),
    "completed split doubled": (
        lambda s: s["completed_shards"][0]["splits"].append(dict(s["completed_shards"][0]["splits"][0])),
        f"{SHARD_MISMATCH}.*splits do not match the plan at 41 rows",
    ),
    "split row_offset negative": (
        lambda s: s["completed_shards"][0]["splits"][0].update(row_offset=-5),
        rf"{SHARD_MISMATCH}.*rows \[-5, 25\).*splits do not match the plan",
    ),
}


@pytest.mark.parametrize("damage, message", list(DAMAGE.values()), ids=list(DAMAGE))
def test_damaged_state_is_refused_and_progress_kept(one, damage, message):
    genuine = one.states[0][40]
    assert genuine["completed_shards"][0]["splits"], "the chosen state should have a completed split"
    state = copy.deepcopy(genuine)
    damage(state)
    loader, dataset = make(one.path, **ONE)
    dataset.load_state_dict(one.states[1][5])
    before = dataset.state_dict()
    with pytest.raises(CheckpointMismatchError, match=re.compile(message, re.DOTALL)):
        dataset.load_state_dict(state)
    assert dataset.state_dict() == before, "a refused state changed the progress"


# ------------------------------------------------------------------ property: random mutations
def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every location inside a JSON value (dict keys and list indices)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _paths(item, prefix + (i,))
    return found


def _parent(state: dict, path: tuple) -> tuple[Any, Any]:
    node = state
    for step in path[:-1]:
        node = node[step]
    return node, path[-1]


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.sampled_from([-1, 0, 1, 2, 5, 24, 25, 26, 60, 161, 162, 163, 10**9]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.just([]),
    st.just({}),
    st.lists(st.integers(-3, 200), max_size=3),
)


@st.composite
def mutations(draw, state: dict) -> tuple[dict, list[str]]:
    state = copy.deepcopy(state)
    done = []
    for _ in range(draw(st.integers(1, 2))):
        paths = _paths(state)
        path = draw(st.sampled_from(paths))
        parent, key = _parent(state, path)
        kind = draw(st.sampled_from(["delete", "replace", "nudge", "duplicate", "junk"]))
        current = parent[key]
        if kind == "delete":
            del parent[key]
        elif kind == "nudge" and isinstance(current, int) and not isinstance(current, bool):
            parent[key] = current + draw(st.sampled_from([-26, -5, -1, 1, 5, 26, 1000]))
        elif kind == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(current))
        elif kind == "junk" and isinstance(current, dict):
            current[draw(st.sampled_from(["junk", "__class__", "__reduce__", "extra"]))] = draw(JSON_VALUES)
        else:
            kind = "replace"
            parent[key] = draw(JSON_VALUES)
        done.append(f"{kind} {path!r}")
    return state, done


DEFAULTS = {"scope": "rank", "padding_delivered": 0, "lanes": None, "_split_rows": None}  # keys a state may leave out
# what the loader resumes from; the rest (completed_shards, files) is checked against the plan
POSITION_KEYS = ("format_version", "scope", "epoch", "rows_delivered", "next_worker", "padding_delivered", "lanes")


def _as_loaded(state: dict, loaded: dict) -> dict:
    """The configuration and position keys of ``state`` as a loader that took it verbatim reports them."""
    keys = [k for k in loaded if k.startswith("_") or k in POSITION_KEYS]
    return {k: state.get(k, DEFAULTS.get(k, "<missing>")) for k in keys}


def _check_mutation(one: Reference, mutated: dict, done: list[str]) -> str:
    loader, dataset = make(one.path, **ONE)
    dataset.load_state_dict(one.states[0][7])  # progress a refused state must leave alone (epoch 0: see below)
    before = dataset.state_dict()
    try:
        dataset.load_state_dict(json.loads(json.dumps(mutated)))
    except ValueError as error:  # CheckpointMismatchError included
        assert str(error).strip(), f"{done}: an error without a message"
        assert dataset.state_dict() == before, f"{done}: a refused state changed the progress"
        return "refused"
    loaded = dataset.state_dict()  # (a finished epoch loaded into a dataset set to a later one moves on to it)
    assert _as_loaded(mutated, loaded) == _as_loaded(loaded, loaded), f"{done}: accepted, but not resumed from what it says"
    epoch, (position,) = loaded["epoch"], loaded["rows_delivered"]
    resumed = [i for b in run_epoch(loader, dataset) for i in b]
    assert resumed == one.epoch(epoch)[position:], f"{done}: accepted, but the resume is not exact"
    return "accepted"


@settings(max_examples=250, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_states_refuse_or_resume_exactly(one, data):
    index = data.draw(st.sampled_from([0, 1, 24, 25, 26, 60, 100, 161]), label="state after batch")
    genuine = one.states[0][index]
    mutated, done = data.draw(mutations(genuine), label="mutations")
    outcome = _check_mutation(one, mutated, done)
    event(outcome)


def test_multi_worker_states_mixed_or_nudged_refuse_or_resume_exactly(data):
    """Two workers. A worker's progress taken from another genuine state (a mix no run saved) is
    accepted and delivers exactly the rows neither worker had delivered; rows_delivered nudged off
    what the state's splits say is refused."""
    reference = Reference(data, TWO)
    reference.epoch(0)
    genuine, batches = reference.states[0], reference.batches[0]
    # which worker delivered each batch of the reference run, so each worker's rows at a position are known
    owners = [int(np.flatnonzero(np.subtract(after["rows_delivered"], before["rows_delivered"]))[0])
              for before, after in zip([{"rows_delivered": [0, 0]}] + genuine, genuine)]

    def delivered_by(worker: int, position: int) -> list[int]:
        rows = [i for b, owner in zip(batches, owners) if owner == worker for i in b]
        return rows[:position]

    rng = np.random.default_rng(7)
    outcomes = collections.Counter()
    for trial in range(30):
        first, second = (int(k) for k in rng.integers(0, len(genuine) - 1, 2))
        mutated = copy.deepcopy(genuine[first])
        worker = trial % 2
        loader, dataset = make(data, **TWO)
        if trial % 3 == 0:
            step = int(rng.choice([-10, -5, -1, 1, 5, 10]))
            mutated["rows_delivered"][worker] += step
            with pytest.raises(ValueError, match="Checkpoint"):
                dataset.load_state_dict(mutated)
            outcomes["refused"] += 1
            continue
        for key in ("rows_delivered", "completed_shards", "in_progress"):
            mutated[key][worker] = copy.deepcopy(genuine[second][key][worker])
        dataset.load_state_dict(mutated)
        outcomes["accepted"] += 1
        loaded = dataset.state_dict()
        assert _as_loaded(mutated, loaded) == _as_loaded(loaded, loaded), "not resumed as written"
        resumed = [i for b in run_epoch(loader, dataset) for i in b]
        before = delivered_by(0, mutated["rows_delivered"][0]) + delivered_by(1, mutated["rows_delivered"][1])
        assert len(resumed) == len(set(resumed)), "a row was delivered twice after the resume"
        assert sorted(resumed) == sorted(set(range(ROWS)) - set(before)), f"states {first} and {second} mixed: wrong rows"
        if loaded in genuine:
            assert resumed == [i for b in batches[genuine.index(loaded) + 1 :] for i in b]
    assert outcomes["refused"] and outcomes["accepted"] >= 15, outcomes


# ------------------------------------------------------------------ gaps found by this campaign, now fixed
def test_malformed_file_entry_is_refused(one):
    state = copy.deepcopy(one.states[0][10])
    state["files"][1][0] = ["not", "a", "url"]
    with pytest.raises(ValueError, match="files"):
        StructuredDataset(one.path, **ONE).load_state_dict(state)


def test_file_entry_without_url_is_refused(one):
    state = copy.deepcopy(one.states[0][10])
    state["files"][1][0] = None
    state["files"][2][0] = None
    with pytest.raises(ValueError, match="files"):
        StructuredDataset(one.path, **ONE).load_state_dict(state)


def test_refused_padding_keeps_progress(one):
    loader, dataset = make(one.path, **ONE)
    dataset.load_state_dict(one.states[1][7])
    before = dataset.state_dict()
    with pytest.raises(ValueError, match="padding_delivered"):
        dataset.load_state_dict({**one.states[0][40], "padding_delivered": 10**6})
    assert dataset.state_dict() == before, "the refused state reset the progress"


@pytest.mark.parametrize("damage", ["position", "rows_done"])
def test_in_progress_contradicting_the_position_is_refused(one, damage):
    state = copy.deepcopy(one.states[0][40])
    (entry,) = [e for e in state["in_progress"] if e["splits"]]
    if damage == "position":
        state["rows_delivered"][0] += 1  # same completed splits, one row further
    else:
        entry["splits"][0]["rows_done"] = 10**6
    at = 42 if damage == "position" else 41
    with pytest.raises(CheckpointMismatchError, match=re.compile(f"{SHARD_MISMATCH}.*splits do not match the plan at {at} rows delivered", re.DOTALL)) as info:
        StructuredDataset(one.path, **ONE).load_state_dict(state)
    if damage == "rows_done":  # the key is named, with both values
        worker = state["in_progress"].index(entry)
        assert f"first at key 'in_progress[{worker}].splits[0].rows_done': checkpoint=1000000, plan=" in str(info.value)


def test_state_from_another_shuffle_buffer_is_refused_naming_both_sizes(one):
    """The buffer size decides the order of rows, so a state from another size cannot resume."""
    other = {**ONE, "shuffle_buffer_rows": 60}
    for point in range(0, len(one.states[0]), 7):
        _, dataset = make(one.path, **other)
        with pytest.raises(CheckpointMismatchError, match="shuffle_buffer_rows changed: checkpoint=25, current=60"):
            dataset.load_state_dict(one.states[0][point])

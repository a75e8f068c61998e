"""States saved by an earlier version (tests/fixtures/saved_states, written by
make_saved_states.py before the package was restructured) load and resume exactly: the batches
after each saved state equal the ones that version delivered after it."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.distributed import merge_states

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "saved_states")
CASES = sorted(name[:-5] for name in os.listdir(FIXTURES) if name.endswith(".json") and name != "mtimes.json")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> str:
    """The fixture's files under a new root, with the modification times the states recorded."""
    root = str(tmp_path_factory.mktemp("saved") / "data")
    shutil.copytree(os.path.join(FIXTURES, "data"), root)
    with open(os.path.join(FIXTURES, "mtimes.json")) as f:
        for name, mtime_ns in json.load(f).items():
            os.utime(os.path.join(root, name), ns=(mtime_ns, mtime_ns))
    return root


def load_case(case: str, root: str) -> dict:
    with open(os.path.join(FIXTURES, f"{case}.json")) as f:
        return json.loads(f.read().replace("@DATA_ROOT@", json.dumps(root)[1:-1]))


def run_rest(loader, dataset) -> list[list[int]]:
    return [[int(i) for i in batch["id"].tolist()] for batch in loader]


def test_fixture_has_every_case():
    assert CASES == ["ddp_pad_r2", "rank_plain_w0", "rank_shuffled_w2"]


@pytest.mark.parametrize("case", CASES)
def test_saved_rank_states_resume_exactly(case, data_root):
    recorded = load_case(case, data_root)
    for rank, epochs in enumerate(recorded["ranks"]):
        for epoch, run in enumerate(epochs):
            batches, states = run["batches"], run["states"]
            assert batches, "the fixture recorded no batches"
            for k in range(0, len(states), 2 if recorded["kwargs"]["num_workers"] else 1):
                loader, dataset = StructuredDataset.create_dataloader(
                    data_root, rank=rank, world_size=recorded["world_size"], **recorded["kwargs"]
                )
                dataset.load_state_dict(states[k])
                assert dataset.epoch == epoch
                dataset.set_epoch(epoch)
                assert run_rest(loader, dataset) == batches[k + 1 :], f"rank {rank}, epoch {epoch}, after batch {k}"
                if epoch == 0 and k == len(states) // 2:
                    dataset.set_epoch(1)
                    assert run_rest(loader, dataset) == epochs[1]["batches"]


def test_saved_global_state_resumes_every_rank(data_root):
    recorded = load_case("ddp_pad_r2", data_root)
    ranks = recorded["ranks"]
    step = len(ranks[0][0]["states"]) // 2
    merged = merge_states([ranks[r][0]["states"][step] for r in range(recorded["world_size"])])
    for rank in range(recorded["world_size"]):
        loader, dataset = StructuredDataset.create_dataloader(data_root, rank=rank, world_size=2, **recorded["kwargs"])
        dataset.load_state_dict(json.loads(json.dumps(merged)))
        assert run_rest(loader, dataset) == ranks[rank][0]["batches"][step + 1 :]

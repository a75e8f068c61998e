"""Loader statistics: counted as the loop receives batches, kept apart from the checkpoint state."""

import json
import time

import pytest
import torch
from datagen import write_dataset

from torch_dataloader_utils import Ragged, StructuredDataset
from torch_dataloader_utils.runtime.stats import BOTTLENECK_WAIT_SHARE, LoaderStats, StatsSnapshot, batch_rows

LAYOUT = [[40, 25], [30], [17, 18]]
ROWS = sum(map(sum, LAYOUT))
CONFIG = dict(batch_size=16, num_workers=2, shuffle=True, shuffle_seed=3, split_bytes=3000, chunk_rows=32)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("stats")
    write_dataset(root, LAYOUT)
    return str(root)


def test_counts_what_the_loop_received_over_a_full_epoch(data):
    loader, dataset = StructuredDataset.create_dataloader(data, **CONFIG)
    pause = 0.002
    for _ in loader:
        time.sleep(pause)
    stats = loader.stats
    assert (stats.batches, stats.rows, stats.passes) == (len(loader), ROWS, 1)
    # the loop slept after every batch but the last before asking for the next one
    assert stats.loop_s >= pause * (stats.batches - 1)
    assert stats.startup_s > 0 and stats.elapsed_s == pytest.approx(stats.startup_s + stats.wait_s + stats.loop_s)
    assert stats.rows_per_s == pytest.approx(ROWS / stats.elapsed_s)


def test_interrupted_pass_counts_only_received_batches_and_matches_the_state(data):
    loader, dataset = StructuredDataset.create_dataloader(data, **CONFIG)
    received = 0
    for index, batch in enumerate(loader):
        received += len(batch["id"])
        if index == 2:
            break
    assert loader.stats.batches == 3 and loader.stats.rows == received
    # prefetched chunks are neither in the statistics nor in the state
    assert sum(dataset.state_dict()["rows_delivered"]) == loader.stats.rows


def test_stats_stay_out_of_the_checkpoint_state(data):
    counted, plain = (StructuredDataset.create_dataloader(data, **CONFIG) for _ in range(2))
    plain[0].stats.enabled = False
    for (a, b) in zip(counted[0], plain[0]):
        assert torch.equal(a["id"], b["id"])
    assert counted[0].stats.batches == len(counted[0]) and plain[0].stats.batches == 0
    assert json.dumps(counted[1].state_dict()) == json.dumps(plain[1].state_dict())


def test_last_pass_and_reset(data):
    loader, _ = StructuredDataset.create_dataloader(data, **CONFIG)
    for _ in loader:
        pass
    first_pass = loader.stats.batches
    for index, _ in enumerate(loader):
        if index == 1:
            break
    assert loader.stats.passes == 2
    assert loader.stats.batches == first_pass + 2 and loader.stats.last_pass.batches == 2
    loader.stats.reset()
    assert loader.stats.as_dict()["batches"] == 0 and loader.stats.passes == 0


def test_batch_rows_of_every_column_kind():
    assert batch_rows({"a": torch.zeros(5, 3)}) == 5
    assert batch_rows({"t": ["a", "b"]}) == 2
    assert batch_rows({"r": Ragged(torch.zeros(7), torch.tensor([0, 3, 7]))}) == 2
    assert batch_rows({}) == 0


def test_verdict_follows_the_waiting_share():
    waiting = StatsSnapshot(batches=10, rows=100, startup_s=1.0, wait_s=3.0, loop_s=1.0)
    keeping_up = StatsSnapshot(batches=10, rows=100, startup_s=1.0, wait_s=0.01, loop_s=1.0)
    assert waiting.wait_share == pytest.approx(0.75) and waiting.loader_bound
    assert "bottleneck" in waiting.summary()
    assert keeping_up.wait_share < BOTTLENECK_WAIT_SHARE and not keeping_up.loader_bound
    assert "keeps up" in keeping_up.summary()
    assert LoaderStats().summary() == "no batches delivered yet"

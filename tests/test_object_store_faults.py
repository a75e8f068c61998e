"""Faults of the S3 server (503s, resets, stalls) retried without losing or repeating rows, and
the disk cache serving later epochs within its limit."""

from __future__ import annotations

import gc
import json
import re

import pytest
from object_store_helpers import LAYOUT, ROWS, no_client_retries, store_config, uploaded  # noqa: F401 - fixtures
from resume_helpers import assert_exactly_once, make, resume, run_epoch
from servers import BUCKET, get_store, object_store, s3, s3_options, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.errors import DataReadError


@pytest.mark.parametrize("mode", ["503", "reset", "stall"])
def test_transient_faults_are_retried_nothing_lost_or_duplicated(s3, uploaded, no_client_retries, mode):
    url = uploaded(s3)
    faults = s3.server.faults
    config = store_config(s3, True, download_retry=3, download_timeout=1.5)
    config["storage_options"] = no_client_retries
    # a stall outlasts the test unless download_timeout cuts it (the client's read timeout is 300 s)
    faults.inject(mode, 1, stall_seconds=120.0)  # the first read of every object while planning (its footer) ...
    loader, dataset = make(url, **config)
    assert faults.injected_count() == len(LAYOUT)
    faults.inject(mode, 1, stall_seconds=120.0)  # ... and while reading
    assert_exactly_once(run_epoch(loader, dataset), ROWS)
    assert faults.injected_count() >= len(LAYOUT)


def run_until_error(loader, dataset) -> tuple[str, list, dict | None]:
    """Iterate until a DataReadError; return its message, the batches and the last state.

    The failed torch DataLoader iterator sits in a reference cycle (exception <-> frames);
    collecting it here shuts its workers down in this thread, not in whichever thread
    (e.g. fsspec's event loop, which it would stall) runs the garbage collector next.
    """
    batches, state, message = [], None, None
    try:
        for batch in loader:
            batches.append(tuple(batch["id"].tolist()))
            state = json.loads(json.dumps(dataset.state_dict()))
    except DataReadError as error:
        message = str(error)
    gc.collect()
    assert message is not None, "no DataReadError was raised"
    return message, batches, state


def test_without_retries_the_fault_surfaces(s3, uploaded, no_client_retries):
    url = uploaded(s3)
    config = store_config(s3, False, download_retry=0, num_workers=0)
    config["storage_options"] = no_client_retries
    dataset = StructuredDataset(url, **config)
    s3.server.faults.inject("503", 1)
    with pytest.raises(DataReadError, match="failed after 1 attempt"):
        list(dataset)


def test_file_that_stays_unreadable_is_named_with_its_split(s3, uploaded, no_client_retries):
    url = uploaded(s3)
    config = store_config(s3, False, download_retry=2)
    config["storage_options"] = no_client_retries
    loader, dataset = make(url, **config)
    s3.server.faults.inject("503", -1, match="part-00002")
    message, _, _ = run_until_error(loader, dataset)
    assert re.search(r"part-00002\.parquet \(split .*part-00002\.parquet.*failed after 3 attempt", message), message
    assert "resume from the last state_dict(); download_retry sets" in message
    with pytest.raises(OSError, match=r"s3://bucket-a/data-parquet/part-00002\.parquet .*failed after 3 attempt.* kept failing"):
        make(url, **config)


def test_interrupted_by_fault_resumes_exactly(s3, uploaded, no_client_retries):
    """A run stopped by a permanent fault in a worker resumes from its last state, nothing lost."""
    url = uploaded(s3)
    config = store_config(s3, True, download_retry=0)
    config["storage_options"] = no_client_retries
    loader, dataset = make(url, **config)
    full = run_epoch(loader, dataset)
    loader, dataset = make(url, **config)
    s3.server.faults.inject("503", -1, match="part-00003")
    _, seen, state = run_until_error(loader, dataset)
    s3.server.faults.clear()
    assert state is not None and seen == full[: len(seen)]
    assert seen + resume(url, state, **config) == full


# ----------------------------------------------------------------------------- cache (S3)
def test_cache_serves_later_epochs_and_keeps_its_limit(s3, uploaded, tmp_path):
    url = uploaded(s3)
    faults = s3.server.faults
    cache = tmp_path / "cache"
    config = store_config(s3, True, cache_dir=str(cache))
    loader, dataset = make(url, **config)
    before, _ = faults.counters()
    first = run_epoch(loader, dataset)
    fetched = faults.counters()[0] - before
    heads = faults.head_count()
    dataset.set_epoch(1)
    second = run_epoch(loader, dataset)
    again = faults.counters()[0] - before - fetched
    assert_exactly_once(first, ROWS)
    assert_exactly_once(second, ROWS)
    assert fetched > 0 and again == 0, f"epoch 2 fetched {again} bytes despite the cache"
    # new workers read every range from the cache: no version check (HEAD) is needed either
    assert faults.head_count() == heads, "a cached epoch asked the store for object metadata"

    limit = fetched // 3
    small = tmp_path / "small"
    loader, dataset = make(url, **store_config(s3, True, cache_dir=str(small), cache_limit_bytes=limit))
    for epoch in range(2):
        dataset.set_epoch(epoch)
        assert_exactly_once(run_epoch(loader, dataset), ROWS)
    held = sum(p.stat().st_size for p in small.iterdir())
    assert 0 < held <= limit

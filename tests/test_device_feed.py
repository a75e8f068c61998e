"""device=: batches copied to an accelerator ahead of the loop. Without a GPU here, the feed runs
its threads and staging buffers with a CPU target (the same code path but for the CUDA stream
and event calls, which the GPU check in benchmarks/gpu_feed.py covers)."""

from __future__ import annotations

import pytest
import torch
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.runtime.device_feed import DeviceFeed, check_device
from torch_dataloader_utils.testing import assert_resumes_exactly


def fed(path, **kwargs):
    """A loader whose chunks go through a DeviceFeed with a CPU target."""
    loader, dataset = StructuredDataset.create_dataloader(path, **kwargs)
    loader._feed = DeviceFeed(torch.device("cpu"))
    return loader, dataset


def rows(batch) -> tuple:
    return (tuple(batch["id"].tolist()), tuple(map(tuple, batch["vec"].tolist())), tuple(batch["text"]))


@pytest.mark.parametrize("workers", [0, 2])
def test_fed_batches_equal_the_plain_ones(tmp_path, workers):
    write_dataset(tmp_path, [[30, 25], [40], [9]])
    config = dict(batch_size=7, num_workers=workers, chunk_rows=14, shuffle=True, shuffle_seed=2)
    plain = [rows(b) for b in StructuredDataset.create_dataloader(str(tmp_path), **config)[0]]
    assert [rows(b) for b in fed(str(tmp_path), **config)[0]] == plain


def test_fed_batches_are_new_memory_not_views_of_the_workers_buffers(tmp_path):
    write_dataset(tmp_path, [[64]])
    loader, _ = fed(str(tmp_path), batch_size=8, num_workers=2, chunk_rows=32)
    kept = [batch["id"] for batch in loader]
    assert torch.cat(kept).tolist() == list(range(64))


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_equivalence_through_the_feed(tmp_path, workers):
    write_dataset(tmp_path, [[20, 13], [17]])
    assert_resumes_exactly(
        lambda: fed(str(tmp_path), batch_size=6, num_workers=workers, chunk_rows=12, shuffle=True, shuffle_seed=1),
        epochs=2,
        stride=2,
    )


def test_a_pass_abandoned_mid_way_stops_its_thread_and_the_next_continues(tmp_path):
    write_dataset(tmp_path, [[40], [40]])
    loader, dataset = fed(str(tmp_path), batch_size=5, num_workers=2, chunk_rows=10)
    seen = []
    for i, batch in enumerate(loader):
        seen += batch["id"].tolist()
        if i == 3:
            break
    seen += [i for batch in loader for i in batch["id"].tolist()]
    assert sorted(seen) == list(range(80))
    loader._feed.close()
    assert loader._feed._thread is None


def test_an_error_in_a_worker_reaches_the_loop(tmp_path):
    write_dataset(tmp_path, [[20], [20]])
    loader, _ = fed(str(tmp_path), batch_size=5, num_workers=2, chunk_rows=10)
    (tmp_path / "part-00001.parquet").write_bytes(b"PAR1" + b"\0" * 100 + b"PAR1")
    with pytest.raises(Exception, match="part-00001"):
        list(loader)


def test_device_choices(tmp_path):
    assert check_device(None) is None and check_device("cpu") is None
    with pytest.raises(ValueError, match="CUDA devices only"):
        check_device("meta")
    with pytest.raises(ValueError, match="device must be"):
        check_device("no-such-device")
    if not torch.cuda.is_available():
        write_dataset(tmp_path, [[5]])
        with pytest.raises(ValueError, match=r"torch.cuda.is_available\(\) is False"):
            StructuredDataset.create_dataloader(str(tmp_path), device="cuda")


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run tests/gpu_checks.py on one)")


@cuda
def test_cuda_batches_equal_host_batches(tmp_path):
    import gpu_checks

    write_dataset(tmp_path / "pq", [[30, 25], [40], [9]])
    write_dataset(tmp_path / "orc", [[30, 25], [40]], fmt="orc")
    gpu_checks.device_batches_equal_host_batches(str(tmp_path / "pq"))
    gpu_checks.device_batches_equal_host_batches(str(tmp_path / "orc"), fmt="orc")


@cuda
def test_cuda_resume_equivalence_and_side_stream(tmp_path):
    import gpu_checks

    write_dataset(tmp_path, [[30, 25], [40], [9]])
    gpu_checks.device_resumes_exactly(str(tmp_path))
    gpu_checks.a_side_stream_consumer_sees_finished_copies(str(tmp_path))


def test_persistent_workers_across_epochs_and_an_abandoned_pass(tmp_path):
    write_dataset(tmp_path, [[40], [35]])
    loader, dataset = fed(str(tmp_path), batch_size=5, num_workers=2, chunk_rows=10, persistent_workers=True, shuffle=True)
    for epoch in range(3):
        dataset.set_epoch(epoch)
        seen = []
        if epoch == 1:
            for i, batch in enumerate(loader):
                seen += batch["id"].tolist()
                if i == 2:
                    break
            dataset.set_epoch(epoch)  # the rest of the epoch continues where the loop stopped
        seen += [i for batch in loader for i in batch["id"].tolist()]
        assert sorted(seen) == list(range(75)), epoch

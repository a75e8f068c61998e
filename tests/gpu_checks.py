"""Checks of device="cuda" that need a CUDA GPU: run by tests/test_device_feed.py where torch sees
one (skipped elsewhere), and as a script on a GPU machine without pytest:

    PYTHONPATH=src python tests/gpu_checks.py
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from datagen import write_dataset  # noqa: E402

from torch_dataloader_utils import StructuredDataset  # noqa: E402
from torch_dataloader_utils.testing import assert_resumes_exactly  # noqa: E402


def _host(batch: dict) -> dict:
    out = {}
    for name, value in batch.items():
        if isinstance(value, torch.Tensor):
            out[name] = (str(value.device.type), value.cpu().tolist())
        elif isinstance(value, tuple) and hasattr(value, "_fields"):  # Ragged
            out[name] = tuple((str(v.device.type), v.cpu().tolist()) for v in value)
        else:
            out[name] = value
    return out


def device_batches_equal_host_batches(root: str, fmt: str = "parquet") -> None:
    """Every column's values equal the host loader's; tensors (and ragged parts) are on the GPU, strings stay lists."""
    for workers in (0, 2):
        config = dict(format=fmt, batch_size=7, num_workers=workers, chunk_rows=14, shuffle=True, shuffle_seed=3)
        host = [_host(b) for b in StructuredDataset.create_dataloader(root, **config)[0]]
        device = [_host(b) for b in StructuredDataset.create_dataloader(root, device="cuda", **config)[0]]
        assert len(host) == len(device) and host, (len(host), len(device))
        for h, d in zip(host, device):
            assert h.keys() == d.keys()
            for name in h:
                if isinstance(h[name], tuple) and h[name] and isinstance(h[name][0], str):  # a tensor
                    assert h[name][0] == "cpu" and d[name][0] == "cuda", (name, h[name][0], d[name][0])
                    assert h[name][1] == d[name][1], name
                elif isinstance(h[name], tuple):  # ragged
                    assert [part[1] for part in h[name]] == [part[1] for part in d[name]], name
                    assert all(part[0] == "cuda" for part in d[name]), name
                else:
                    assert h[name] == d[name], name


def device_resumes_exactly(root: str) -> None:
    assert_resumes_exactly(
        lambda: StructuredDataset.create_dataloader(root, batch_size=6, num_workers=2, chunk_rows=12, shuffle=True, device="cuda"),
        epochs=2,
        stride=3,
    )


def a_side_stream_consumer_sees_finished_copies(root: str) -> None:
    """A loop computing on its own stream gets complete data (the wait is on the loop's stream)."""
    stream = torch.cuda.Stream()
    expected = [b["id"].tolist() for b in StructuredDataset.create_dataloader(root, batch_size=8, num_workers=2, chunk_rows=32)[0]]
    with torch.cuda.stream(stream):
        loader, _ = StructuredDataset.create_dataloader(root, batch_size=8, num_workers=2, chunk_rows=32, device="cuda")
        got = [(b["id"] * 1).tolist() for b in loader]
    assert got == expected


def main() -> None:
    assert torch.cuda.is_available(), "these checks need a CUDA GPU"
    with tempfile.TemporaryDirectory() as root:
        write_dataset(os.path.join(root, "pq"), [[30, 25], [40], [9]])
        write_dataset(os.path.join(root, "orc"), [[30, 25], [40]], fmt="orc")
        device_batches_equal_host_batches(os.path.join(root, "pq"))
        device_batches_equal_host_batches(os.path.join(root, "orc"), fmt="orc")
        device_resumes_exactly(os.path.join(root, "pq"))
        a_side_stream_consumer_sees_finished_copies(os.path.join(root, "pq"))
    print("gpu checks passed")


if __name__ == "__main__":
    main()

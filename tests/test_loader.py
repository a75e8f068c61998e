"""StructuredDataLoader's worker set-up."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.loader import _start_worker

from datagen import write_dataset


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_workers_start_without_transparent_huge_pages(tmp_path):
    write_dataset(tmp_path, [[10]])
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), batch_size=5, num_workers=1)
    assert loader._loader.worker_init_fn is _start_worker
    status = subprocess.run(
        [sys.executable, "-c", "from torch_dataloader_utils.loader import _start_worker; _start_worker(0); print(open('/proc/self/status').read())"],
        capture_output=True, text=True, check=True,
    ).stdout
    if "THP_enabled:" not in status:
        pytest.skip("this kernel does not report THP_enabled")
    assert "THP_enabled:\t0" in status

"""StructuredDataLoader's worker set-up and error paths."""

from __future__ import annotations

import subprocess
import sys
import traceback

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


def test_an_error_read_in_the_main_process_keeps_its_traceback(tmp_path):
    """With num_workers=0 nothing needs shutting down, so the user sees where the error arose."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, None, 3]}), tmp_path / "a.parquet")
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), num_workers=0)
    with pytest.raises(ValueError, match="null value") as error:
        list(loader)
    files = [frame.filename for frame in traceback.extract_tb(error.value.__traceback__)]
    assert any(name.endswith("convert.py") for name in files), files

"""catalog/shared_footers.py: remote Parquet footers in shared memory; what a worker receives
does not grow with the number of files."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from datagen import write_dataset
from servers import s3, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.catalog.shared_footers import SharedFooters
from torch_dataloader_utils.formats._parquet_tail import KeptFooter


def footers(count: int) -> list:
    return [None if i % 5 == 4 else KeptFooter(bytes([i % 251]) * 400) for i in range(count)]


def test_shared_footers_read_back_as_kept_and_keep_other_footers():
    kept = footers(20) + [{"a parsed footer": 1}]
    shared = SharedFooters(kept)
    assert [f.data if isinstance(f, KeptFooter) else f for f in shared] == [f.data if isinstance(f, KeptFooter) else f for f in kept]
    copy = pickle.loads(pickle.dumps(shared))  # a plain pickle carries the bytes
    assert copy[3].data == kept[3].data and copy[4] is None and copy[20] == {"a parsed footer": 1}


def test_what_a_worker_receives_does_not_grow_with_the_files():
    """DataLoader workers receive the dataset through multiprocessing's pickler, which shares
    the block: a handle, not 400 bytes per file."""
    small, large = (len(ForkingPickler.dumps(SharedFooters(footers(n)))) for n in (100, 5000))
    assert large < 1024 and large - small < 64, (small, large)
    received = ForkingPickler.loads(ForkingPickler.dumps(SharedFooters(footers(5000))))
    assert received[4321].data == footers(5000)[4321].data


@pytest.mark.parametrize("context", ["spawn"])  # (forked workers: the other remote tests)
def test_remote_files_read_in_workers_from_the_shared_footers(s3, tmp_path, context):
    local = tmp_path / "src"
    write_dataset(local, [[20], [15, 5], [30]])
    s3.upload(str(local), f"shared-footers-{context}")
    loader, dataset = StructuredDataset.create_dataloader(
        s3.url(f"shared-footers-{context}"), batch_size=8, num_workers=1 if context == "spawn" else 2,
        storage_options=s3.options, multiprocessing_context=context,
    )  # fmt: skip
    assert isinstance(dataset._catalog.footers, SharedFooters)
    assert sorted(torch.cat([batch["id"] for batch in loader]).tolist()) == list(range(70))

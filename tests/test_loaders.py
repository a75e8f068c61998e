"""loaders.py: building the loaders a StructuredDataset is read with (create_dataloader's
signature; dataset.stateful_dataloader, torchdata's StatefulDataLoader set up as the docs say)."""

from __future__ import annotations

import inspect
import json
import sys

import pytest
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataLoader, StructuredDataset
from torch_dataloader_utils.testing import assert_resumes_exactly

LAYOUT = [[23, 31, 17], [40, 9]]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("create")
    write_dataset(root, LAYOUT, "parquet")
    return str(root)


def test_create_dataloader_shows_every_argument_it_takes():
    shown = inspect.signature(StructuredDataset.create_dataloader).parameters
    dataset = [name for name in inspect.signature(StructuredDataset.__init__).parameters if name != "self"]
    loader = [name for name, p in inspect.signature(StructuredDataLoader.__init__).parameters.items() if p.kind is p.KEYWORD_ONLY]
    assert list(shown) == dataset + loader and "batch_size" in shown and "persistent_workers" in shown
    assert shown["batch_size"].default == 1024 and shown["path"].default is inspect.Parameter.empty


def test_table_datasets_show_their_own_arguments_and_the_ones_they_pass_on():
    from torch_dataloader_utils import DeltaDataset, IcebergDataset

    iceberg = inspect.signature(IcebergDataset.create_dataloader).parameters
    assert list(iceberg)[:6] == ["table", "catalog_config", "snapshot_id", "scan_filter", "filters", "pin_snapshot"]
    assert {"batch_size", "shuffle", "persistent_workers", "device"} <= set(iceberg) and "path" not in iceberg and "format" not in iceberg
    delta = inspect.signature(DeltaDataset.create_dataloader).parameters
    assert list(delta)[:5] == ["path", "version", "storage_options", "filters", "pin_version"] and "num_workers" in delta
    assert all(p.kind is not p.VAR_KEYWORD for p in [*iceberg.values(), *delta.values()])


def test_stateful_dataloader_resumes_exactly(data):
    def make():
        dataset = StructuredDataset(data, batch_size=13, num_workers=2, shuffle=True, split_bytes=2500, chunk_rows=26)
        return dataset.stateful_dataloader(persistent_workers=True), dataset

    loader, dataset = make()
    assert loader.batch_size is None and loader.num_workers == 2
    ids = sorted(int(i) for batch in loader for i in batch["id"])
    assert ids == list(range(sum(map(sum, LAYOUT))))
    assert_resumes_exactly(
        make, epochs=2, stride=3, batch_key=lambda batch: tuple(batch["id"].tolist()),
        save=lambda loader, _: json.loads(json.dumps(loader.state_dict())), load=lambda loader, _, state: loader.load_state_dict(state),
    )  # fmt: skip


def test_stateful_dataloader_refuses_a_batch_size_or_worker_count_of_its_own(data):
    dataset = StructuredDataset(data, batch_size=13, num_workers=2)
    with pytest.raises(ValueError, match="takes batch_size=None .* got batch_size=13: set it on the dataset"):
        dataset.stateful_dataloader(batch_size=13)
    with pytest.raises(ValueError, match="takes num_workers=2 .* got num_workers=4"):
        dataset.stateful_dataloader(num_workers=4)
    assert dataset.stateful_dataloader(num_workers=2, batch_size=None).num_workers == 2


def test_without_torchdata_the_error_says_what_to_install(data, monkeypatch):
    dataset = StructuredDataset(data, batch_size=13, num_workers=0)
    for name in [m for m in sys.modules if m == "torchdata" or m.startswith("torchdata.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torchdata", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install torchdata .*pip install -e \"\.\[torchdata\]\""):
        dataset.stateful_dataloader()
    assert next(iter(StructuredDataset.create_dataloader(data, batch_size=13, num_workers=0)[0]))["id"].shape == (13,)


def test_loader_options_are_checked_before_planning(tmp_path):
    with pytest.raises(ValueError, match=r"worker_mode must be one of \('process', 'thread'\), got 'threads'"):
        StructuredDataset.create_dataloader(str(tmp_path / "no such dir"), worker_mode="threads")


def test_reader_threads_take_a_transform_that_does_not_pickle(data):
    import threading

    lock = threading.Lock()  # a closure over a lock pickles neither
    transform = lambda batch: {**batch, "rows": len(batch["id"]) if lock else 0}  # noqa: E731
    with pytest.raises(TypeError, match=r"cannot be pickled .*worker_mode='thread'"):
        StructuredDataset.create_dataloader(data, batch_size=13, num_workers=2, transform=transform)
    loader, _ = StructuredDataset.create_dataloader(data, batch_size=13, num_workers=2, worker_mode="thread", transform=transform)
    assert sum(batch["rows"] for batch in loader) == sum(map(sum, LAYOUT))

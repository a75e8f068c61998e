"""Arrow IPC files (formats/arrow_ipc.py): record batches are units; exactly once and resume."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyarrow import feather
from servers import s3, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.testing import assert_resumes_exactly

ROWS = 500


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("arrow")
    table = pa.table({"id": np.arange(300), "x": np.arange(300) * 0.5, "s": [f"s{i}" for i in range(300)]})
    with pa.ipc.new_file(str(root / "a.arrow"), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=45):
            writer.write_batch(batch)
    feather.write_feather(pa.table({"id": np.arange(300, 420), "x": np.arange(120) * 1.0}), str(root / "b.feather"), chunksize=50, compression="lz4")
    with pa.ipc.new_file(str(root / "c.ipc"), pa.schema([("id", pa.int32())])) as writer:
        writer.write_batch(pa.record_batch({"id": pa.array(np.arange(420, 500), pa.int32())}))
    return str(root)


def ids(batch: dict) -> tuple[int, ...]:
    return tuple(batch["id"].tolist())


def test_batches_are_units_and_formats_inferred(root):
    dataset = StructuredDataset(root, format=None, num_workers=0, columns=["id"])
    assert [layout.unit_rows for layout in dataset._catalog.layouts] == [(45,) * 6 + (30,), (50, 50, 20), (80,)]
    assert dataset._catalog.schema.field("id").type == pa.int64()  # int64 and int32: the schema rule


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_exactly_once_and_resume_at_every_point(root, workers, shuffle):
    def make():
        return StructuredDataset.create_dataloader(
            root, format="arrow", num_workers=workers, shuffle=shuffle, batch_size=32, chunk_rows=64, split_bytes=1500, shuffle_buffer_rows=100, columns=["id"]
        )

    assert len(make()[1].splits) >= 6
    reference = assert_resumes_exactly(make, epochs=1, batch_key=ids)
    assert sorted(i for batch in reference.batches[0] for i in batch) == list(range(ROWS))


@pytest.mark.filterwarnings("ignore")
def test_a_feather_v1_file_is_named(tmp_path):
    feather.write_feather(pa.table({"id": [1, 2]}), str(tmp_path / "old.feather"), version=1)
    with pytest.raises(ValueError, match="old.feather"):
        StructuredDataset(str(tmp_path), format="arrow", num_workers=0)


def test_remote_arrow_files_on_s3_read_exactly_once(s3, root):
    s3.upload(root, "arrow-ipc")
    loader, dataset = StructuredDataset.create_dataloader(
        s3.url("arrow-ipc"), format=None, num_workers=2, batch_size=64, split_bytes=1500, storage_options=s3.options, columns=["id"]
    )
    assert sorted(i for batch in loader for i in ids(batch)) == list(range(ROWS))


@pytest.mark.parametrize("workers", [0, 2])
def test_polars_categorical_and_enum_columns_are_strings(tmp_path, workers):
    polars = pytest.importorskip("polars")
    frame = polars.DataFrame(
        {
            "id": list(range(6)),
            "cat": polars.Series(["a", "b", "a", None, "c", "b"], dtype=polars.Categorical),
            "e": polars.Series(["x", "y", "x", "y", "x", "x"], dtype=polars.Enum(["x", "y"])),
        }
    )
    frame.write_ipc(tmp_path / "a.arrow")
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), format="arrow", batch_size=4, num_workers=workers)
    batches = list(loader)
    assert [value for batch in batches for value in batch["cat"]] == ["a", "b", "a", None, "c", "b"]
    assert [value for batch in batches for value in batch["e"]] == ["x", "y", "x", "y", "x", "x"]

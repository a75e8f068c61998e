"""numpy and Arrow batches cross from the workers in shared buffers (read/packed_batches.py): the
bytes packed in the worker rebuild the same batches in the main process, and resume exactly."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.read.convert import Joined
from torch_dataloader_utils.read.packed_batches import Packed, pack_batches, unpack
from torch_dataloader_utils.testing import assert_resumes_exactly


def received(columns: dict[str, Joined]) -> dict[str, torch.Tensor]:
    """What the main process gets for packed columns: each written into (shared) memory of its own."""
    out = {}
    for key, joined in columns.items():
        out[key] = torch.empty(joined.shape, dtype=torch.uint8)
        joined.write(out[key])
    return out


def test_numpy_batches_round_trip():
    batch = {
        "i": np.arange(10, dtype=np.int16),
        "f": np.linspace(0, 1, 30, dtype=np.float32).reshape(10, 3),
        "b": np.arange(10) % 2 == 0,
        "t": np.arange(10).astype("datetime64[ms]"),
        "strided": np.arange(20)[::2],
        "empty": np.zeros((0, 4)),
        "s": np.array(["a", None, "c"] * 3 + ["d"], dtype=object),
    }
    columns, packed = pack_batches([batch, {"i": batch["i"][:0]}], "numpy")
    assert all(isinstance(p, Packed) for p in packed) and len(columns) == 7  # every array but the object one, and the empty batch's
    again = received(columns)
    for original, rebuilt in zip([batch, {"i": batch["i"][:0]}], [unpack(p, again) for p in packed]):
        assert original.keys() == rebuilt.keys()
        for name, array in original.items():
            assert rebuilt[name].dtype == array.dtype and rebuilt[name].shape == array.shape
            assert rebuilt[name].tolist() == array.tolist()


def test_arrow_batches_round_trip_with_only_their_rows():
    table = pa.table(
        {
            "id": pa.array(range(100)),
            "text": pa.array([None if i % 7 == 0 else f"t{i}" for i in range(100)]),
            "list": pa.array([[i] * (i % 3) for i in range(100)]),
            "struct": pa.array([{"a": i, "b": str(i)} for i in range(100)]),
        }
    )
    batches = table.slice(40, 20).to_batches() + table.slice(95).to_batches()
    columns, packed = pack_batches(batches, "arrow")
    assert sum(joined.nbytes for joined in columns.values()) < table.nbytes  # slices carry their own rows
    rebuilt = [unpack(p, received(columns)) for p in packed]
    assert all(a.equals(b) for a, b in zip(batches, rebuilt, strict=True))


def test_arrow_batches_keep_their_field_names_across_processes():
    """Pickled, a pa.Schema renames a fixed-size list's child (element -> item); packed batches
    cross with the schema's IPC form, so a worker's batch has the main process's schema."""
    feat = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(40, dtype=np.float32)), type=pa.list_(pa.field("element", pa.float32()), 4))
    batch = pa.record_batch({"feat": feat})
    columns, packed = pack_batches([batch], "arrow")
    rebuilt = unpack(pickle.loads(pickle.dumps(packed[0])), received(columns))
    assert rebuilt.schema.equals(batch.schema) and rebuilt.schema.field("feat").type.value_field.name == "element"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("packed")
    write_dataset(root, [[23, 31, 17], [40, 9]])
    return str(root)


@pytest.mark.parametrize("fmt", ["numpy", "arrow"])
def test_worker_batches_equal_the_main_process_batches_and_resume_exactly(data, fmt):
    """With 2 workers the batches cross in the workers' shared buffers: they hold the torch
    batches' rows and values, and resume exactly."""
    config = dict(batch_size=8, split_bytes=2500, chunk_rows=24, output_format=fmt)

    def key(batch):
        if fmt == "arrow":
            return tuple(batch.column("id").to_pylist()), tuple(batch.column("text").to_pylist()), tuple(map(tuple, batch.column("vec").to_pylist()))
        return tuple(batch["id"].tolist()), tuple(batch["text"].tolist()), batch["vec"].tobytes(), batch["x"].tobytes()

    reference = assert_resumes_exactly(
        lambda: StructuredDataset.create_dataloader(data, num_workers=2, shuffle=True, **config), epochs=1, points=[(0, 0), (0, 6), (0, -1)], batch_key=key
    )
    torch_loader, _ = StructuredDataset.create_dataloader(data, num_workers=2, shuffle=True, batch_size=8, split_bytes=2500, chunk_rows=24)
    for want, got in zip(torch_loader, reference.batches[0], strict=True):
        assert list(got[0]) == want["id"].tolist() and list(got[1]) == want["text"]

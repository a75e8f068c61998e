"""transform=: applied in the worker to each finished batch, resumed exactly (the state counts
source rows), refused up front when it cannot reach the workers, and its errors name the batch."""

from __future__ import annotations

import os

import pytest
import torch
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset, TransformError
from torch_dataloader_utils.testing import assert_resumes_exactly

LAYOUT = [[23, 31, 17], [40, 9]]
ROWS = sum(map(sum, LAYOUT))
CONFIG = dict(batch_size=8, split_bytes=2500, chunk_rows=24)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("transforms")
    write_dataset(root, LAYOUT)
    return str(root)


class CharTokens:
    """A toy tokenizer: each string's bytes as token ids, padded to ``length`` (what a real
    tokenizer's ``__call__`` would do, see docs/filters-and-output.md)."""

    def __init__(self, length: int):
        self.length = length

    def __call__(self, batch: dict) -> dict:
        tokens = torch.zeros(len(batch["text"]), self.length, dtype=torch.int64)
        for row, text in enumerate(batch["text"]):
            encoded = list(text.encode())[: self.length]
            tokens[row, : len(encoded)] = torch.tensor(encoded)
        return {"id": batch["id"], "tokens": tokens}


def with_pid(batch: dict) -> dict:
    return {**CharTokens(8)(batch), "pid": os.getpid()}


def fail_on_row_50(batch: dict) -> dict:
    if 50 in batch["id"].tolist():
        raise KeyError("no token for row 50")
    return batch


def test_the_transform_runs_in_the_workers(data):
    loader, _ = StructuredDataset.create_dataloader(data, num_workers=2, transform=with_pid, **CONFIG)
    batches = list(loader)
    assert {batch["pid"] for batch in batches} - {os.getpid()} and os.getpid() not in {batch["pid"] for batch in batches}
    assert sorted(i for batch in batches for i in batch["id"].tolist()) == list(range(ROWS))
    first = next(batch for batch in batches if 0 in batch["id"].tolist())
    assert bytes(first["tokens"][0][:5].tolist()) == b"row-0"
    assert loader.stats.rows == ROWS  # source rows, whatever the transform returns


@pytest.mark.parametrize(("fmt", "workers"), [("torch", 2), ("numpy", 0)])
def test_a_transform_resumes_exactly(data, fmt, workers):
    transform = CharTokens(6) if fmt == "torch" else len

    def make():
        return StructuredDataset.create_dataloader(data, num_workers=workers, shuffle=True, output_format=fmt, transform=transform, **CONFIG)

    points = None if workers == 0 else [(0, 1), (0, 7), (1, -3)]
    reference = assert_resumes_exactly(make, epochs=2, points=points, deep_stride=4)
    assert reference.states[0][-1]["rows_delivered"] == [ROWS] if workers == 0 else sum(reference.states[0][-1]["rows_delivered"]) == ROWS


def test_a_transform_that_cannot_be_pickled_is_refused_up_front(data):
    with pytest.raises(TypeError, match="cannot be pickled.*module-level function"):
        StructuredDataset(data, num_workers=2, transform=lambda batch: batch)
    StructuredDataset(data, num_workers=0, transform=lambda batch: batch)  # never leaves this process
    with pytest.raises(TypeError, match="callable"):
        StructuredDataset(data, num_workers=0, transform="tokenize")


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_in_the_transform_names_the_batch(data, workers):
    loader, _ = StructuredDataset.create_dataloader(data, num_workers=workers, transform=fail_on_row_50, **{**CONFIG, "split_bytes": 10**9})
    with pytest.raises(TransformError) as error:
        list(loader)
    message = str(error.value)
    assert "fail_on_row_50 raised KeyError" in message and "no token for row 50" in message
    assert "batch 6 of lane 0 (its rows [48, 56), epoch 0)" in message and "part-00000.parquet  full file" in message
    assert "part-00001" not in message  # the chunk of rows [48, 72) reaches into it with one worker, the batch does not


def with_a_lock(batch: dict) -> dict:
    import threading

    return {**batch, "lock": threading.Lock()}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("loader_kind", ["loader", "stateful"])
def test_a_result_that_cannot_leave_the_worker_is_an_error_not_a_hang(data, loader_kind):
    """torch's queue thread only prints a pickling error and drops the batch; the loop would wait forever."""
    if loader_kind == "loader":
        loader, _ = StructuredDataset.create_dataloader(data, num_workers=2, transform=with_a_lock, **CONFIG)
    else:
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = StatefulDataLoader(StructuredDataset(data, num_workers=2, transform=with_a_lock, **CONFIG), batch_size=None, num_workers=2)
    with pytest.raises(TypeError, match=r"the transform's result for rows read from .* cannot leave the worker process .*cannot pickle '_thread.lock'"):
        list(loader)


def unchanged(batch: dict) -> dict:
    return batch


@pytest.mark.parametrize("workers", [0, 2])
def test_the_transform_gets_batches_under_the_null_and_decimal_options(tmp_path, workers):
    from decimal import Decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    amounts = pa.array([Decimal("1.25"), None, Decimal("-3.75")] * 4, pa.decimal128(5, 2))
    pq.write_table(pa.table({"n": pa.array([1, None, 3] * 4, pa.int64()), "d": amounts}), tmp_path / "part.parquet")
    options = dict(batch_size=5, num_workers=workers, nulls="mask", fill_values={"n": -1, "d": 0}, decimals="int64")
    expected = list(StructuredDataset.create_dataloader(str(tmp_path), **options)[0])
    seen = list(StructuredDataset.create_dataloader(str(tmp_path), transform=unchanged, **options)[0])
    assert expected[0]["d"].tolist() == [125, 0, -375, 125, 0] and expected[0]["n.valid"].tolist() == [True, False, True, True, False]
    assert len(seen) == len(expected) == 3
    for got, want in zip(seen, expected):
        assert sorted(got) == sorted(want) == ["d", "d.valid", "n", "n.valid"]
        assert all(torch.equal(got[key], want[key]) for key in want)

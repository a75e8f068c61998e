"""read/picks.py: rows picked in another order convert to the same tensors as the gathered table,
each plain numeric value moved once (a scatter), every other column gathered as before."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from torch_dataloader_utils.read.convert import Joined, build_columns, table_to_columns
from torch_dataloader_utils.read.nulls import ColumnPolicy
from torch_dataloader_utils.read.picks import join_picked, pick, picked_to_joined


def _table(first: int, rows: int, nulls: bool = False) -> pa.Table:
    ids = np.arange(first, first + rows, dtype=np.int64)
    x = pa.array(ids.astype(np.float32), mask=(ids % 5 == 0) if nulls else None)
    return pa.table(
        {
            "id": ids,
            "x": x,
            "small": (ids % 100).astype(np.uint8),
            "wide": ids.astype(np.uint32),
            "flag": ids % 2 == 0,
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 3).astype(np.float64)), 3),
            "text": pa.array([f"r{i}" for i in ids]),
            "seq": pa.array([list(range(i % 4)) for i in ids], pa.list_(pa.int32())),
        }
    )


def _many_chunks(nulls: bool = False) -> pa.Table:
    return pa.concat_tables([_table(0, 30, nulls), _table(30, 25, nulls), _table(55, 45, nulls)])


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        left, right = a[name], b[name]
        if isinstance(left, torch.Tensor):
            torch.testing.assert_close(left, right, rtol=0, atol=0, equal_nan=True)
        elif isinstance(left, tuple):
            assert all(torch.equal(p, q) if isinstance(p, torch.Tensor) else p == q for p, q in zip(left, right)), name
        else:
            assert left == right, name


@pytest.mark.parametrize("order", ["shuffled", "interleaved", "run"])
@pytest.mark.parametrize("nulls", [False, True])
def test_picked_rows_convert_to_the_gathered_tables_tensors(order, nulls):
    table = _many_chunks(nulls)
    rows = {
        "shuffled": np.random.default_rng(0).permutation(100)[:60],
        "interleaved": np.concatenate([np.arange(0, 40), np.arange(60, 100)]).reshape(2, 40).T.reshape(-1),
        "run": np.arange(20, 70),
    }[order]
    picked = pick(table, rows)
    assert picked.table().equals(table.take(pa.array(rows)))
    policy = ColumnPolicy(nulls="fill") if nulls else ColumnPolicy()
    joined = picked_to_joined(picked, lambda: "test", policy)
    assert isinstance(joined["id"], Joined) and joined["id"].scatter  # plain numbers are scattered
    assert not joined["text"].data.scatter and not joined["flag"].scatter and not joined["wide"].scatter  # gathered first
    assert bool(joined["x"].scatter) == (not nulls)  # a column with nulls is gathered, then filled
    _same(build_columns(joined), table_to_columns(table.take(pa.array(rows)), lambda: "test", policy=policy))


def test_masks_keep_their_place_after_their_column():
    table = _many_chunks(nulls=True)
    picked = pick(table, np.random.default_rng(1).permutation(100))
    policy = ColumnPolicy(nulls="mask")
    converted = build_columns(picked_to_joined(picked, lambda: "test", policy))
    _same(converted, table_to_columns(picked.table(), lambda: "test", policy=policy))


def test_joined_parts_keep_their_order():
    first, second = _many_chunks(), _table(100, 40)
    rows = np.random.default_rng(2).permutation(100)
    joined = join_picked([(pick(first, rows), 100), (second, 40), (pick(second, np.arange(39, -1, -1)), 40)])
    expected = pa.concat_tables([first.take(pa.array(rows)), second, second.take(pa.array(np.arange(39, -1, -1)))])
    assert joined.num_rows == 180 and joined.table().equals(expected)
    _same(build_columns(picked_to_joined(joined, lambda: "test")), table_to_columns(expected, lambda: "test"))

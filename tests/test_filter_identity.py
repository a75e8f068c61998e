"""What makes two filters or two sets of reader options the same to a checkpoint and to the
counts kept in cache_dir (catalog/filter_prune.py filter_identity, catalog/sources.py
options_identity): different ones never look alike, equal ones look alike in every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset


@pytest.mark.parametrize(
    "first, second",
    [
        (pc.field("d") > pa.scalar(1, pa.duration("s")), pc.field("d") > pa.scalar(1, pa.duration("ms"))),  # both print (d > 1)
        (pc.field("x") > pa.scalar(0.1, pa.float32()), pc.field("x") > pa.scalar(0.1, pa.float64())),
    ],
    ids=["duration-units", "float32-float64"],
)
def test_filters_pyarrow_prints_alike_count_their_own_rows_and_refuse_each_others_states(tmp_path, first, second):
    table = pa.table({"d": pa.array(np.arange(3000), pa.duration("ms")), "x": pa.array(np.repeat(np.float32([0, 0.1]), 1500), pa.float32())})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=500)
    assert str(first) == str(second)
    path, expected = str(tmp_path / "t.parquet"), [table.filter(f).num_rows for f in (first, second)]
    assert expected[0] != expected[1]
    for cache in (None, str(tmp_path / "cache")):
        for expression, rows in zip((first, second), expected):
            loader, dataset = StructuredDataset.create_dataloader(path, filters=expression, batch_size=100, num_workers=0, cache_dir=cache)
            assert len(dataset) == rows and sum(len(b["d"]) for b in loader) == rows
    _, one = StructuredDataset.create_dataloader(path, filters=first, batch_size=100, num_workers=0)
    _, other = StructuredDataset.create_dataloader(path, filters=second, batch_size=100, num_workers=0)
    with pytest.raises(CheckpointMismatchError, match="filters changed"):
        other.load_state_dict(json.loads(json.dumps(one.state_dict())))


_STATE_IN_A_NEW_PROCESS = """
import json, sys
import pyarrow.csv as pacsv
from torch_dataloader_utils import StructuredDataset
path, = sys.argv[1:]
dataset = StructuredDataset(path, format="csv", num_workers=0, batch_size=10,
    filters=[("c", "in", {"apple", "banana", "cherry", "date", "elder", "fig"})],
    csv_options={"null_values": {"NA", "n/a", "-", "none"}, "timestamp_parsers": [pacsv.ISO8601]})
print(json.dumps({"filters": dataset.state_dict()["_filters"], "options": dataset.state_dict()["_reader_options"]}))
"""


def test_a_set_in_filters_or_reader_options_is_recorded_alike_in_every_process(tmp_path):
    """A set's order follows the process's string hashing (PYTHONHASHSEED: torchrun's ranks and a
    resumed job differ), and pyarrow.csv.ISO8601's repr is its address."""
    path = tmp_path / "t.csv"
    path.write_text("c,n\n" + "".join(f"{c},{i}\n" for i, c in enumerate(["apple", "kiwi", "fig", "NA", "date"] * 4)))
    recorded = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", _STATE_IN_A_NEW_PROCESS, str(path)], env=env, capture_output=True, text=True, check=True)
        recorded.add(out.stdout.strip().splitlines()[-1])
    assert len(recorded) == 1, recorded
    dataset = StructuredDataset(str(path), format="csv", num_workers=0, filters=[("c", "in", ["apple", "fig", "date"])])
    assert len(dataset) == 12


def test_counts_kept_in_cache_dir_are_those_of_the_reader_options(tmp_path):
    """csv_options decide which values are null, so the same filter matches other rows."""
    path = tmp_path / "t.csv"
    path.write_text("s\n" + "NA\nx\n" * 50)
    cache, expression = str(tmp_path / "cache"), pc.field("s").is_null()
    nulls = StructuredDataset(str(path), format="csv", num_workers=0, filters=expression, cache_dir=cache, csv_options={"strings_can_be_null": True})
    assert len(nulls) == 50
    plain = StructuredDataset(str(path), format="csv", num_workers=0, filters=expression, cache_dir=cache)
    assert len(plain) == 0
    assert pacsv.read_csv(path).column("s").null_count == 0

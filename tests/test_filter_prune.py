"""filters= that do not fit the columns (catalog/filter_prune.py): refused at planning, naming the
filter and the types of the columns it reads."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils import StructuredDataset


def test_a_naive_datetime_against_a_zoned_column_names_the_filter(tmp_path):
    import datetime

    stamps = pa.array([datetime.datetime(2024, 3, 1, hour) for hour in range(10)], pa.timestamp("us", tz="UTC"))
    pq.write_table(pa.table({"at": stamps}, metadata={"pandas": "{}"}), tmp_path / "t.parquet")
    with pytest.raises(ValueError, match=r"filters=\(at >= 2024-03-01 05:00:00.000000\) does not fit the columns' types \(at: timestamp\[us, tz=UTC\]\): .*time ?zone") as error:
        StructuredDataset(str(tmp_path), filters=[("at", ">=", datetime.datetime(2024, 3, 1, 5))], num_workers=0)
    assert "pandas" not in str(error.value)


def test_a_value_of_another_type_names_only_the_filtered_columns_type(tmp_path):
    """The message printed the whole schema (and its metadata) before the cause."""
    pq.write_table(pa.table({"id": [1, 2], "a": [1, 2], "label": [0, 1], **{f"c{i}": [0.0, 1.0] for i in range(30)}}), tmp_path / "t.parquet")
    with pytest.raises(ValueError, match=r"filters=\(label == \"pos\"\) does not fit the columns' types \(label: int64\): ") as error:
        StructuredDataset(str(tmp_path), filters=[("label", "==", "pos")], num_workers=0)
    assert "c29" not in str(error.value) and "a: int64" not in str(error.value)  # ('a' is in 'label', not a column of the filter)

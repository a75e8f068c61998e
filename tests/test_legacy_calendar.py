"""formats/_legacy_calendar.py: dates and timestamps Spark and ORC's Java writer store in the
hybrid Julian/Gregorian calendar are delivered as written, as Spark reads them back (files
Spark wrote: tests/fixtures/spark)."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.errors import WideningError
from torch_dataloader_utils.formats._legacy_calendar import GREGORIAN_START, proleptic_days
from torch_dataloader_utils.testing import assert_resumes_exactly

SPARK = Path(__file__).parent / "fixtures" / "spark"
EPOCH = dt.date(1970, 1, 1)
WRITTEN = {1: dt.date(1000, 1, 1), 2: dt.date(1582, 10, 4), 3: dt.date(1582, 10, 15), 4: dt.date(1, 1, 1), 5: dt.date(1900, 1, 1), 6: dt.date(2024, 5, 1)}
TIMES = {1: dt.time(12), 2: dt.time(0), 3: dt.time(0), 4: dt.time(0), 5: dt.time(0, 0, 1), 6: dt.time(10)}


def _julian_days(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a Julian calendar date (through its Julian day number)."""
    a = (14 - month) // 12
    y, m = year + 4800 - a, month + 12 * a - 3
    return day + (153 * m + 2) // 5 + 365 * y + y // 4 - 32083 - 2440588


def test_hybrid_days_become_the_same_date_in_the_proleptic_calendar():
    rng = random.Random(0)
    dates = [(rng.randint(1, 1582), rng.randint(1, 12), rng.randint(1, 28)) for _ in range(3000)]
    dates = [d for d in dates if d < (1582, 10, 5)]
    got = proleptic_days(np.array([_julian_days(*d) for d in dates], dtype=np.int64))
    assert got.tolist() == [(dt.date(*d) - EPOCH).days for d in dates]
    assert proleptic_days(np.array([_julian_days(1500, 2, 29)]))[0] == (dt.date(1500, 3, 1) - EPOCH).days  # as Spark moves it
    later = np.arange(GREGORIAN_START, GREGORIAN_START + 200_000, dtype=np.int64)
    assert (proleptic_days(later) == later).all()


def _read(name: str, **kwargs) -> dict:
    loader, dataset = StructuredDataset.create_dataloader(str(SPARK / name), format=None, batch_size=10, num_workers=0, output_format="dict", **kwargs)
    (batch,) = list(loader)
    return dict(zip(batch["id"], zip(*(batch[c] for c in batch if c != "id"))))


@pytest.mark.parametrize("name", ["rebase_LEGACY_TIMESTAMP_MICROS.parquet", "rebase_CORRECTED_TIMESTAMP_MICROS.parquet", "rebase_orc.orc"])
def test_spark_dates_read_as_spark_wrote_them(name):
    rows = _read(name, columns=["id", "date"])
    assert {i: date for i, (date,) in rows.items()} == WRITTEN


@pytest.mark.parametrize("name", ["rebase_LEGACY_TIMESTAMP_MICROS.parquet", "rebase_CORRECTED_TIMESTAMP_MICROS.parquet"])
def test_spark_timestamps_in_microseconds_read_as_written(name):
    rows = _read(name, columns=["id", "ts"])
    expected = {i: dt.datetime.combine(date, TIMES[i], dt.timezone.utc) for i, date in WRITTEN.items()}
    assert {i: ts for i, (ts,) in rows.items()} == expected


def test_int96_timestamps_before_1677_are_refused_as_nanoseconds_cannot_hold_them():
    with pytest.raises(WideningError, match="nanoseconds cannot hold"):
        _read("rebase_LEGACY_INT96.parquet", columns=["id", "ts"])
    assert {i: date for i, (date,) in _read("rebase_LEGACY_INT96.parquet", columns=["id", "date"]).items()} == WRITTEN


@pytest.mark.parametrize("name", ["rebase_LEGACY_TIMESTAMP_MICROS.parquet", "rebase_orc.orc"])
def test_random_access_and_a_resume_deliver_the_written_dates(tmp_path, name):
    for copy in range(3):
        (tmp_path / f"{copy}-{name}").write_bytes((SPARK / name).read_bytes())

    def make():
        return StructuredDataset.create_dataloader(str(tmp_path), format=None, batch_size=4, num_workers=2, shuffle=True, columns=["id", "date"])

    loader, dataset = make()
    assert {int(dataset[i]["id"]): int(dataset[i]["date"]) for i in range(len(WRITTEN))} == {i: (d - EPOCH).days for i, d in WRITTEN.items()}
    delivered = sorted((int(i), int(d)) for batch in loader for i, d in zip(batch["id"], batch["date"]))
    assert delivered == sorted((i, (d - EPOCH).days) for i, d in WRITTEN.items() for _ in range(3))
    assert_resumes_exactly(make, epochs=1, batch_key=lambda batch: tuple(batch["date"].tolist()))


def test_files_of_other_writers_are_not_converted(tmp_path):
    import pyarrow.orc as orc
    import pyarrow.parquet as pq

    table = pa.table({"id": [1], "date": pa.array([(dt.date(1000, 1, 1) - EPOCH).days], pa.date32())})
    pq.write_table(table, tmp_path / "a.parquet")
    orc.write_table(table, tmp_path / "b.orc")
    for name in ("a.parquet", "b.orc"):
        loader, _ = StructuredDataset.create_dataloader(str(tmp_path / name), format=None, batch_size=4, num_workers=0, output_format="dict")
        assert next(iter(loader))["date"] == [dt.date(1000, 1, 1)]

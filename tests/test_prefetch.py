"""Small object-store units decoded ahead, concurrently (read/prefetch.py): many tiny files on the
S3 server are read with requests in flight at once, the rows stay exact and in the uninterrupted
order across a resume, and a unit that fails ahead is read again and reported as any read error."""

from __future__ import annotations

import io
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from servers import BUCKET, s3, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.errors import DataReadError
from torch_dataloader_utils.plan.streams import Piece
from torch_dataloader_utils.read import prefetch
from torch_dataloader_utils.testing import assert_resumes_exactly

FILES, ROWS = 40, 10


@pytest.fixture
def tiny_files(s3):
    """FILES Parquet files of ROWS rows each under a new prefix; the store's faults cleared after."""
    prefix = f"tiny-{uuid.uuid4().hex[:8]}"
    blobs = {}
    for i in range(FILES):
        sink = io.BytesIO()
        pq.write_table(pa.table({"id": pa.array(range(i * ROWS, (i + 1) * ROWS), pa.int64())}), sink)
        blobs[f"{BUCKET}/{prefix}/f{i:03d}.parquet"] = sink.getvalue()
    s3.fs.pipe(blobs)
    yield s3.url(prefix), prefix
    s3.server.faults.clear()


def _ids(loader) -> list[int]:
    return [i for batch in loader for i in batch["id"].tolist()]


@pytest.mark.parametrize("shuffle", [True, False])
def test_tiny_files_are_read_with_requests_in_flight_at_once(s3, tiny_files, shuffle):
    url, _ = tiny_files
    loader, dataset = StructuredDataset.create_dataloader(url, storage_options=s3.options, batch_size=64, num_workers=0, shuffle=shuffle)
    faults = s3.server.faults
    faults.inject("stall", -1, stall_seconds=0.05)  # each object read waits: reads made one by one never overlap
    faults.reset_peak()
    ids = _ids(loader)
    assert sorted(ids) == list(range(FILES * ROWS)) and (ids != sorted(ids)) == shuffle
    assert faults.peak_in_flight() > 1


def test_resume_over_files_decoded_ahead_is_exact(s3, tiny_files):
    url, _ = tiny_files
    config = dict(storage_options=s3.options, batch_size=16, num_workers=2, shuffle=True, shuffle_seed=4, split_bytes=1, chunk_rows=48)
    make = lambda: StructuredDataset.create_dataloader(url, **config)  # noqa: E731
    reference = assert_resumes_exactly(make, points=[(0, 3), (0, 11)], batch_key=lambda batch: tuple(batch["id"].tolist()))
    assert sorted(i for batch in reference.batches[0] for i in batch) == list(range(FILES * ROWS))


def test_a_unit_that_fails_ahead_is_reported_without_a_second_fetch(s3, tiny_files):
    url, prefix = tiny_files
    options = dict(storage_options=s3.options, batch_size=64, num_workers=0, shuffle=True, download_retry=0)
    loader, _ = StructuredDataset.create_dataloader(url, **options)
    alone, _ = StructuredDataset.create_dataloader(f"{url.rstrip('/')}/f007.parquet", **options)  # one file: nothing decoded ahead
    skipping, dataset = StructuredDataset.create_dataloader(url, on_error="skip", **options)
    faults = s3.server.faults
    faults.inject("503", -1, match=f"{prefix}/f007.parquet")  # after planning, every read of one file fails
    with pytest.raises(DataReadError, match="f007.parquet"):
        _ids(alone)
    one_read = faults.injected_count()  # (the client's own retries included)
    faults.inject("503", -1, match=f"{prefix}/f007.parquet")
    with pytest.raises(DataReadError, match="f007.parquet"):
        _ids(loader)
    assert faults.injected_count() == one_read
    assert sorted(_ids(skipping)) == [i for i in range(FILES * ROWS) if not 70 <= i < 80]
    assert [split.describe() for split, _ in dataset.skipped_splits] == [dataset.splits[7].describe()]


def test_a_streamed_row_group_larger_than_a_decode_batch_is_not_decoded_ahead(s3, tmp_path, monkeypatch):
    """Unshuffled, a row group is decoded a batch at a time; decoding it ahead would hold it whole."""
    from torch_dataloader_utils.read import reader

    prefix = f"rows-{uuid.uuid4().hex[:8]}"
    bounds = [0, 10, 2510, 2520, 5020]  # small files before large ones: a chunk takes one of each
    for i in range(4):
        pq.write_table(pa.table({"id": pa.array(range(bounds[i], bounds[i + 1]), pa.int64())}), tmp_path / f"f{i}.parquet")
    s3.upload(str(tmp_path), prefix)
    decoded: list = []
    monkeypatch.setattr(reader, "decode_ahead", lambda catalog, columns, wanted, open_file: decoded.append(wanted) or {})
    for shuffle in (False, True):
        loader, _ = StructuredDataset.create_dataloader(s3.url(prefix), storage_options=s3.options, batch_size=500, num_workers=0, chunk_rows=1000, shuffle=shuffle)
        assert sorted(_ids(loader)) == list(range(5020))
        assert bool(decoded) == shuffle  # shuffled, the window is decoded whole anyway
        decoded.clear()


def test_which_units_are_decoded_ahead(s3, tiny_files, tmp_path):
    url, _ = tiny_files
    catalog = StructuredDataset(url, storage_options=s3.options, num_workers=0)._catalog
    pieces = [Piece(file, 0, 0, ROWS, file) for file in range(4)]
    assert prefetch.units_to_decode(catalog, pieces, lambda key: False) == {0: [0], 1: [0], 2: [0], 3: [0]}
    assert prefetch.units_to_decode(catalog, pieces, lambda key: key[0] != 2) == {}  # one file left: nothing to overlap
    assert prefetch.units_to_decode(catalog, pieces + pieces[:1], lambda key: key[0] == 3) == {0: [0], 1: [0], 2: [0]}
    assert prefetch.units_to_decode(catalog, [Piece(0, 0, 0, 0, 0), *pieces[1:3]], lambda key: False) == {1: [0], 2: [0]}
    sizes = [catalog.layouts[file].unit_bytes[0] for file in range(4)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prefetch, "BUDGET_BYTES", sizes[0] + sizes[1] + min(sizes[2:]) - 1)  # two fit
        assert prefetch.units_to_decode(catalog, pieces, lambda key: False) == {0: [0], 1: [0]}
        patch.setattr(prefetch, "UNIT_BYTES", min(sizes) - 1)
        assert prefetch.units_to_decode(catalog, pieces, lambda key: False) == {}
    pq.write_table(pa.table({"id": [1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [2]}), tmp_path / "b.parquet")
    local = StructuredDataset(str(tmp_path), num_workers=0)._catalog
    assert prefetch.units_to_decode(local, [Piece(0, 0, 0, 1, 0), Piece(1, 0, 0, 1, 1)], lambda key: False) == {}

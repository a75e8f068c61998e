"""Bytes and requests against the S3 server: projected columns fetch only their chunks or streams,
footers are fetched once and concurrently, long ranges in parts."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from datagen import write_dataset
from object_store_helpers import LAYOUT, ROWS, ids_parquet, no_client_retries, store_config, uploaded  # noqa: F401 - fixtures
from servers import BUCKET, get_store, object_store, s3, s3_options, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.formats import parquet

WIDE_COLUMNS = 24


@pytest.fixture(scope="module")
def wide(s3, tmp_path_factory):
    """Two files of 24 float64 columns, 4 row groups each; returns (url, bytes needed for c7)."""
    root = tmp_path_factory.mktemp("wide")
    rng = np.random.default_rng(0)
    needed = 0
    footers = {}
    for index in range(2):
        table = pa.table({f"c{i}": rng.random(40_000) for i in range(WIDE_COLUMNS)})
        path = root / f"part-{index}.parquet"
        pq.write_table(table, path, row_group_size=10_000, compression="none")
        meta = pq.read_metadata(path)
        needed += sum(meta.row_group(r).column(7).total_compressed_size for r in range(meta.num_row_groups))
        size = path.stat().st_size
        footers[f"{BUCKET}/wide/{path.name}"] = (size - meta.serialized_size - 8, size)
        needed += meta.serialized_size + 8
    s3.upload(str(root), "wide")
    return s3.url("wide"), needed, footers


def test_one_column_read_fetches_its_chunks_and_the_footers_only(s3, wide):
    url, needed, _ = wide
    faults = s3.server.faults
    before, _ = faults.counters()
    loader, dataset = StructuredDataset.create_dataloader(url, batch_size=5000, num_workers=2, columns=["c7"], storage_options=s3.options)
    rows = sum(len(batch["c7"]) for batch in loader)
    sent = faults.counters()[0] - before
    assert rows == 80_000
    assert needed <= sent <= 1.2 * needed, f"server sent {sent} bytes for {needed} needed"


@pytest.fixture(scope="module")
def wide_orc(s3, tmp_path_factory):
    """Two uncompressed ORC files of 24 float64 columns, several stripes each: (url, table)."""
    import pyarrow.orc as orc

    root = tmp_path_factory.mktemp("wide-orc")
    rng = np.random.default_rng(1)
    tables = []
    for index in range(2):
        tables.append(pa.table({f"c{i}": rng.random(40_000) for i in range(WIDE_COLUMNS)}))
        orc.write_table(tables[-1], root / f"part-{index}.orc", stripe_size=2 << 20, compression="uncompressed")
        assert orc.ORCFile(root / f"part-{index}.orc").nstripes > 1
    s3.upload(str(root), "wide-orc")
    return s3.url("wide-orc"), pa.concat_tables(tables)


def test_one_orc_column_read_fetches_its_streams_not_whole_stripes(s3, wide_orc):
    url, table = wide_orc
    faults = s3.server.faults
    before, _ = faults.counters()
    loader, _ = StructuredDataset.create_dataloader(url, format="orc", batch_size=5000, num_workers=2, columns=["c7"], storage_options=s3.options)
    values = torch.cat([batch["c7"] for batch in loader])
    sent = faults.counters()[0] - before
    expected = torch.from_numpy(table.column("c7").to_numpy())
    assert torch.equal(values.sort().values, expected.sort().values)  # workers interleave their batches
    # the column's values (8 bytes a row), plus per stripe its index and footer, per file its tail
    needed = 8 * table.num_rows
    assert needed <= sent <= 1.2 * needed + 2 * 64 * 1024, f"server sent {sent} bytes for a column of {needed}"


def test_a_dotted_orc_column_name_reads_that_column_remotely(s3, tmp_path):
    """pyarrow takes "meta.lang" as a path into the struct column "meta"; the remote reader, which
    fetches only the asked-for columns' streams, must read the top-level column all the same."""
    import pyarrow.orc as orc

    table = pa.table({"id": np.arange(6), "meta.lang": list("abcdef"), "meta": pa.array([{"lang": "wrong"}] * 6)})
    orc.write_table(table, tmp_path / "f.orc")
    s3.upload(str(tmp_path), "dotted-orc")
    loader, _ = StructuredDataset.create_dataloader(
        s3.url("dotted-orc"), format="orc", batch_size=6, num_workers=0, columns=["id", "meta.lang"], storage_options=s3.options
    )
    (batch,) = list(loader)
    assert batch["meta.lang"] == list("abcdef") and batch["id"].tolist() == list(range(6))


def test_folder_markers_are_not_taken_for_data_files(object_store):
    """Zero-byte folder markers (a console's "data/", Hadoop's "x_$folder$") next to the data: a
    directory with a trailing slash, "/*" and "/**" all find the two data files (the Azure
    directory was read as its marker blob, and the globs took the markers for Parquet files)."""
    part = ids_parquet(0)
    for key in ("markers/data/a.parquet", "markers/data/sub/b.parquet"):
        object_store.fs.pipe_file(f"{BUCKET}/{key}", part)
    for marker in ("markers/data/", "markers/data/sub/", "markers/data/c.parquet_$folder$"):
        object_store.fs.pipe_file(f"{BUCKET}/{marker}", b"")
    object_store.fs.invalidate_cache()
    root = object_store.url("markers/data").rstrip("/")
    for url in (root + "/", root + "/*", root + "/**"):
        dataset = StructuredDataset(url, num_workers=0, batch_size=400, storage_options=object_store.options)
        assert [f.rsplit("/data/", 1)[1] for f in dataset.files] == ["a.parquet", "sub/b.parquet"], url
        assert sum(len(batch["id"]) for batch in dataset) == 400


def test_footers_read_once_not_on_epochs_or_worker_start(s3, wide):
    url, _, footers = wide
    faults = s3.server.faults
    faults.record(True)
    try:
        loader, dataset = StructuredDataset.create_dataloader(url, batch_size=5000, num_workers=2, columns=["c0", "c9"], storage_options=s3.options)
        planning = faults.take_log()
        for epoch in range(2):
            dataset.set_epoch(epoch)
            assert sum(len(b["c0"]) for b in loader) == 80_000
        reading = faults.take_log()
    finally:
        faults.record(False)
    assert sorted(key for key, _ in planning) == sorted(footers), "one tail request per file while planning"
    for key, (start, end) in reading:
        footer_start, _ = footers[key]
        assert end <= footer_start, f"{key} bytes [{start}, {end}) re-read footer bytes after planning"
    # 2 epochs x 8 row groups x 2 columns (not adjacent: one request each)
    assert len(reading) == 2 * 8 * 2


def test_a_range_longer_than_a_part_is_fetched_in_parts(s3, tmp_path):
    """download_timeout bounds each request: a 20 MiB column chunk asked for whole failed on any link
    slower than 20 MiB / download_timeout. It is fetched in parts of at most PART_BYTES, and put
    together in order."""
    from torch_dataloader_utils.storage.remote import PART_BYTES

    blobs = [np.random.default_rng(i).bytes(5 * 1024 * 1024) for i in range(4)]
    pq.write_table(pa.table({"id": pa.array(range(4), pa.int64()), "blob": pa.array(blobs, pa.binary())}), tmp_path / "big.parquet", compression="none")
    s3.upload(str(tmp_path), "parts")
    faults = s3.server.faults
    faults.record(True)
    try:
        (batch,) = list(StructuredDataset(s3.url("parts"), batch_size=4, num_workers=0, columns=["blob"], storage_options=s3.options))
        reading = faults.take_log()
    finally:
        faults.record(False)
    assert batch["blob"] == blobs
    sizes = [end - start for key, (start, end) in reading]
    assert max(sizes) <= PART_BYTES and sum(sizes) > 20 * 1024 * 1024, sizes


def test_footers_are_fetched_concurrently(s3, tmp_path):
    root = tmp_path / "many"
    write_dataset(root, [[20]] * 40)
    url = s3.url("many")
    s3.upload(str(root), "many")
    faults = s3.server.faults
    # each read is held 0.3 s, so reads that run at once overlap on the server however busy the
    # machine is (on a loaded CI machine unheld reads were too quick to overlap: peak 5 once)
    faults.inject("stall", -1, match="many/", stall_seconds=0.3)
    faults.reset_peak()
    try:
        dataset = StructuredDataset(url, num_workers=0, storage_options=s3.options)
    finally:
        faults.clear()
    assert len(dataset.files) == 40
    assert faults.peak_in_flight() >= 8, "footer reads ran (nearly) one at a time"




def test_a_failed_request_for_a_large_footer_is_a_storage_error_not_a_corrupt_file(s3, tmp_path, no_client_retries):
    """A footer larger than the tail fetched with all the others needs a request of its own;
    when that request fails, planning raises the storage error naming the object (not "is it a
    complete parquet file?")."""
    table = pa.table({f"column_{i:04d}": np.arange(3, dtype=np.int64) for i in range(1500)})
    pq.write_table(table, tmp_path / "wide.parquet")
    assert pq.read_metadata(tmp_path / "wide.parquet").serialized_size > 64 * 1024
    s3.upload(str(tmp_path), "big-footer")
    url = s3.url("big-footer")
    s3.server.faults.inject("503", -1, match="big-footer", after=1)  # the tail passes, the rest fails
    with pytest.raises(OSError, match=r"s3://bucket-a/big-footer/wide\.parquet .*failed after 1 attempt"):
        StructuredDataset(url, storage_options=no_client_retries, download_retry=0, num_workers=0)
    s3.server.faults.clear()
    assert len(StructuredDataset(url, storage_options=no_client_retries, num_workers=0).files) == 1


def test_remote_parquet_footers_are_kept_as_their_bytes(s3, uploaded, tmp_path):
    """The catalog (and the copy each worker receives) holds a remote file's footer bytes, not
    pyarrow's parsed form; statistics, pruning and reads parse them again."""
    dataset = StructuredDataset(uploaded(s3), batch_size=25, num_workers=0, storage_options=s3.options)
    catalog = dataset._catalog
    assert all(isinstance(footer, parquet.KeptFooter) for footer in catalog.footers)
    parsed = catalog.footer(0)
    assert isinstance(parsed, pq.FileMetaData)
    assert parsed.num_rows == sum(LAYOUT[0])
    kept = pickle.loads(pickle.dumps(catalog.footers[0]))
    assert kept.data == catalog.footers[0].data and len(kept.data) < 4096
    assert parquet.PARQUET.null_counts(kept, ["id"]) == {"id": 0}
    assert sorted(int(i) for batch in dataset for i in batch["id"]) == list(range(ROWS))

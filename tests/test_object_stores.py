"""S3, GCS and Azure Blob through fsspec against real local servers (see servers.py)."""

from __future__ import annotations

import gc
import json
import pickle
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from datagen import rewrite_page_index, set_location, write_dataset
from resume_helpers import assert_exactly_once, batch_key, make, resume, run_epoch
from servers import BUCKET, get_store, object_store, s3, s3_options, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset
from torch_dataloader_utils.errors import DataReadError
from torch_dataloader_utils.formats import _parquet_seek as parquet_seek
from torch_dataloader_utils.formats import parquet
from torch_dataloader_utils.formats.io import RangeFile
from torch_dataloader_utils.storage.remote import RemoteStore
from torch_dataloader_utils.testing import assert_resumes_exactly

LAYOUT = [[120, 80], [150], [60, 90, 70], [110, 40]]
ROWS = sum(map(sum, LAYOUT))


@pytest.fixture(scope="module")
def uploaded(tmp_path_factory):
    """The LAYOUT dataset (Parquet and ORC) on every server that gets started, uploaded once."""
    roots = {}
    for fmt in ("parquet", "orc", "parquet_paged"):
        roots[fmt] = tmp_path_factory.mktemp(f"src-{fmt}")
        write_dataset(roots[fmt], LAYOUT, fmt.split("_")[0], paged=fmt.endswith("paged"))
    done: set = set()

    def ensure(store, fmt="parquet"):
        if (store.name, fmt) not in done:
            store.upload(str(roots[fmt]), f"data-{fmt}")
            done.add((store.name, fmt))
        return store.url(f"data-{fmt}")

    return ensure


def _config(store, shuffle, **extra):
    config = dict(
        batch_size=25,
        num_workers=2,
        shuffle=shuffle,
        shuffle_seed=3,
        split_bytes=3000,
        chunk_rows=50,
        shuffle_buffer_rows=120,
        storage_options=store.options,
    )
    return {**config, **extra}


@pytest.mark.parametrize("rounds, workers", [(1, 0), (2, 0), (2, 2)])
def test_resume_inside_row_groups_seeks_through_the_page_index(object_store, uploaded, monkeypatch, seek_tiny_files, rounds, workers):
    """A remote row group is decoded from the page that holds the saved row too (parquet_seek).
    Its page index comes with the column chunks (one round of requests), or first, followed by
    only the pages from the saved row's (two rounds): nothing is fetched on demand (counted
    without workers, in this process)."""
    monkeypatch.setattr(parquet, "REMOTE_CUT_MIN_BYTES", 0 if rounds == 2 else 1 << 40)  # forked workers inherit it
    url = uploaded(object_store, "parquet_paged")
    seeks, readers = [], []

    def counted(source, *args):
        batches = parquet_seek.iter_from_row(source, *args)
        seeks.append(batches is not None)
        readers.append(source)
        return batches

    monkeypatch.setattr(parquet, "iter_from_row", counted)
    config = _config(object_store, False, num_workers=workers)
    full = assert_resumes_exactly(lambda: make(url, **config), epochs=1, batch_key=batch_key).batches[0]
    assert_exactly_once(full, ROWS)
    if workers == 0:
        assert sum(seeks) > len(full) // 2, seeks
        assert all(isinstance(source, RangeFile) for source in readers)
        assert sum(source.on_demand for source in readers) == 0


def test_a_resume_deep_in_a_row_group_downloads_the_pages_from_its_row_only(s3, tmp_path, monkeypatch, seek_tiny_files):
    """One row group of 40,000 rows with a page index: resuming at row 36,000 fetches the page
    indexes and the last tenth of the column chunks, not the chunks whole."""
    monkeypatch.setattr(parquet, "REMOTE_CUT_MIN_BYTES", 0)
    rows = 40_000
    table = pa.table({"id": pa.array(range(rows), pa.int64()), "x": pa.array(np.random.default_rng(2).random(rows))})
    path = tmp_path / "one.parquet"
    pq.write_table(table, path, row_group_size=rows, write_page_index=True, data_page_size=8192, compression="none", use_dictionary=False)
    s3.upload(str(tmp_path), "deep")
    chunks = sum(pq.read_metadata(path).row_group(0).column(c).total_compressed_size for c in range(2))
    options = dict(batch_size=4000, num_workers=0, chunk_rows=4000, storage_options=s3.options)
    loader, dataset = make(s3.url("deep"), **options)
    full, states = [], []
    for batch in loader:
        full.append(batch["id"].tolist())
        states.append(dataset.state_dict())
    faults = s3.server.faults
    loader, dataset = make(s3.url("deep"), **options)
    dataset.load_state_dict(states[8])  # after 36,000 rows
    planned, _ = faults.counters()
    rest = [batch["id"].tolist() for batch in loader]
    sent = faults.counters()[0] - planned
    assert rest == full[9:]
    assert sent < 0.15 * chunks, f"sent {sent} bytes after planning; the chunks hold {chunks}"


def test_a_cut_failing_its_check_after_the_second_round_reads_whole_chunks_and_keeps_nothing(s3, tmp_path, monkeypatch, seek_tiny_files):
    """Column b's page index says the page holding row 36,000 starts a row early: its cut fails
    the header check once its pages are fetched, and the read starts over with the whole chunks,
    with no request on demand and no bytes kept afterwards."""
    monkeypatch.setattr(parquet, "REMOTE_CUT_MIN_BYTES", 0)
    rows, row = 40_000, 36_000
    table = pa.table({"a": pa.array(np.arange(rows)), "b": pa.array(np.arange(rows) * 3)})
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, write_page_index=True, data_page_size=8192, data_page_version="2.0", use_dictionary=False, compression="none")

    def early(locations):
        page = max(i for i, location in enumerate(locations) if location.get(3) <= row)
        set_location(locations[page], 3, locations[page].get(3) - 1)

    rewrite_page_index(path, 1, early)
    s3.upload(str(tmp_path), "early")
    dataset = StructuredDataset(s3.url("early"), num_workers=0, storage_options=s3.options)
    catalog = dataset._catalog
    reader = parquet.PARQUET.open(catalog.fs, catalog.files[0].fs_path, catalog.footers[0], False)
    fetches = []  # the fetch callback of each seek: given when the read takes two rounds
    monkeypatch.setattr(parquet, "iter_from_row", lambda *args: fetches.append(args[-1]) or parquet_seek.iter_from_row(*args))
    got = pa.concat_tables(list(reader.iter_unit(0, None, 4096, row)))
    assert got.to_pylist() == table.slice(row).to_pylist()
    assert len(fetches) == 1 and fetches[0] is not None
    assert reader._source.on_demand == 0
    assert not reader._source._parts


@pytest.mark.parametrize("shuffle", [False, True])
def test_exactly_once_and_resume(object_store, uploaded, shuffle):
    url = uploaded(object_store)
    config = _config(object_store, shuffle)
    loader, dataset = make(url, **config)
    assert isinstance(dataset._catalog.fs, RemoteStore)
    assert len(dataset.splits) > 4
    full = assert_resumes_exactly(lambda: make(url, **config), epochs=1, batch_key=batch_key).batches[0]
    assert_exactly_once(full, ROWS)


def test_orc_and_abfs_alias(object_store, uploaded):
    url = uploaded(object_store, "orc")
    if object_store.name == "azure":
        url = url.replace("abfs://", "az://")
    config = {**_config(object_store, True, columns=["id", "x", "text"]), "format": "orc"}
    loader, dataset = make(url, **config)
    points = [(0, 0), (0, len(loader) // 2), (0, -2)]
    full = assert_resumes_exactly(lambda: make(url, **config), epochs=1, points=points, batch_key=batch_key).batches[0]
    assert_exactly_once(full, ROWS)
    assert len(full) == len(loader)


def test_storage_options_survive_pickling(object_store, uploaded):
    """A dataset pickled to a fresh process (spawn) recreates its client from storage_options."""
    url = uploaded(object_store)
    dataset = StructuredDataset(url, batch_size=100, num_workers=0, storage_options=object_store.options)
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy._catalog.fs._fs is None
    assert_exactly_once([tuple(b["id"].tolist()) for b in copy], ROWS)


@pytest.mark.parametrize("rewrite", ["same-size", "other-size"])
def test_rewritten_file_fails_resume_naming_it(object_store, tmp_path, rewrite):
    root = tmp_path / "src"
    write_dataset(root, [[100, 100], [100]])
    prefix = f"drift-{rewrite}"
    urls = object_store.upload(str(root), prefix)
    url = object_store.url(prefix)
    dataset = StructuredDataset(url, batch_size=50, num_workers=0, storage_options=object_store.options)
    batches = iter(dataset)
    next(batches)
    state = json.loads(json.dumps(dataset.state_dict()))
    if rewrite == "same-size":
        data = bytearray((root / "part-00001.parquet").read_bytes())
        data[10] ^= 0xFF  # inside the first data page: footer and size stay the same
    else:
        write_dataset(tmp_path / "other", [[70]])
        data = bytearray((tmp_path / "other" / "part-00000.parquet").read_bytes())
    object_store.fs.pipe_file(urls[1].split("://", 1)[1], bytes(data))
    fresh = StructuredDataset(url, batch_size=50, num_workers=0, storage_options=object_store.options)
    with pytest.raises(CheckpointMismatchError, match="part-00001.parquet") as caught:
        fresh.load_state_dict(state)
    assert ("tag checkpoint=" if rewrite == "same-size" else "size checkpoint=") in str(caught.value)


def test_a_cache_that_cannot_be_written_warns_once_and_loses_nothing(s3, uploaded, tmp_path, monkeypatch, caplog):
    """A full disk under cache_dir: every write fails, every row is still read, and the log gets one warning."""
    import errno

    from torch_dataloader_utils.storage.cache import RangeCache

    def disk_full(self, key, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RangeCache, "put", disk_full)
    loader, dataset = make(uploaded(s3), **_config(s3, True, num_workers=0, cache_dir=str(tmp_path / "cache")))
    with caplog.at_level("DEBUG", logger="torch_dataloader_utils.storage.cache"):
        assert_exactly_once(run_epoch(loader, dataset), ROWS)
    failures = [r for r in caplog.records if "cannot write cache entry" in r.getMessage()]
    assert len(failures) > 3 and [r.levelname for r in failures].count("WARNING") == 1
    assert "No space left on device" in failures[0].getMessage() and "reads go on" in failures[0].getMessage()


def test_file_rewritten_after_planning_is_refused_and_never_cached(object_store, tmp_path):
    """The planned footer must not be applied to a new version, nor its bytes cached under the old one."""
    write_dataset(tmp_path / "a", [[60]])
    write_dataset(tmp_path / "b", [[60]], first_id=1000)  # same layout and size, other rows
    (url_a,) = object_store.upload(str(tmp_path / "a"), "rewritten")
    key = url_a.split("://", 1)[1]
    url = object_store.url("rewritten")
    options = dict(batch_size=20, num_workers=0, storage_options=object_store.options, cache_dir=str(tmp_path / "cache"))
    dataset = StructuredDataset(url, **options)
    object_store.fs.pipe_file(key, (tmp_path / "b" / "part-00000.parquet").read_bytes())
    with pytest.raises(DataReadError, match=r"part-00000.parquet .*the file changed after planning"):
        list(dataset)
    object_store.fs.pipe_file(key, (tmp_path / "a" / "part-00000.parquet").read_bytes())  # rolled back
    object_store.fs.invalidate_cache()
    ids = [i for batch in StructuredDataset(url, **options) for i in batch["id"].tolist()]
    assert ids == list(range(60))


def test_a_gcs_checkpoint_of_the_etag_era_is_refused_saying_why(store_registry, uploaded):
    """GCS files were identified by their ETag (MD5) until 2026-11-22, now by their generation: such a
    checkpoint's files all look rewritten, and the refusal says that it may be the cause."""
    gcs = get_store("gcs", store_registry)
    url = uploaded(gcs)
    loader, dataset = StructuredDataset.create_dataloader(url, batch_size=25, num_workers=0, storage_options=gcs.options)
    next(iter(loader))
    state = json.loads(json.dumps(dataset.state_dict()))
    for entry in state["files"]:
        entry[2] = gcs.fs.info(entry[0].split("://", 1)[1])["etag"].strip('"')  # what older versions saved
    with pytest.raises(CheckpointMismatchError, match="file rewritten since the checkpoint") as error:
        StructuredDataset(url, batch_size=25, num_workers=0, storage_options=gcs.options).load_state_dict(state)
    assert "identified GCS files by their ETag; they are now identified by their generation" in str(error.value)


def _ids_parquet(first: int) -> bytes:
    """200 ids in 4 row groups, uncompressed: every ``first`` gives a file of the same size."""
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": pa.array(range(first, first + 200), pa.int64())}), sink, row_group_size=50, compression="none")
    return sink.getvalue().to_pybytes()


def test_file_rewritten_mid_pass_is_never_read_nor_cached(object_store, tmp_path):
    """A rewrite after the pass's first batch, same size: the rest of the pass, the next passes and
    a new dataset on the same cache must never deliver the new version's rows under the old plan
    (each range request is pinned to the planned version on S3 and Azure, checked after the
    fetch on GCS), and the cache must not keep them under the planned version's key."""
    old, new = _ids_parquet(0), _ids_parquet(1000)
    assert len(old) == len(new)
    key = f"{BUCKET}/mid-pass/part.parquet"
    object_store.fs.pipe_file(key, old)
    object_store.fs.invalidate_cache()
    url = object_store.url("mid-pass")
    options = dict(batch_size=10, chunk_rows=10, split_bytes=1, num_workers=0, storage_options=object_store.options, cache_dir=str(tmp_path / "cache"))
    dataset = StructuredDataset(url, **options)
    delivered = []
    passes = iter(dataset)
    delivered += next(passes)["id"].tolist()
    object_store.fs.pipe_file(key, new)
    for epoch in range(3):
        with pytest.raises(DataReadError, match=r"part.parquet .*the file changed after planning"):
            for batch in passes:
                delivered += batch["id"].tolist()
        dataset.set_epoch(epoch + 1)
        passes = iter(dataset)
    assert delivered and max(delivered) < 1000, "rows of the new version were delivered under the old plan"
    object_store.fs.pipe_file(key, old)  # rolled back: S3's and GCS's MD5 ETag is the old one again
    object_store.fs.invalidate_cache()
    assert [i for batch in StructuredDataset(url, **options) for i in batch["id"].tolist()] == list(range(200))


@pytest.mark.parametrize("workers, persistent", [(0, False), (2, True)])
def test_file_rewritten_between_passes_is_refused_not_read(object_store, tmp_path, workers, persistent):
    """Every read is of the planned version or fails (persistent workers too): the next epoch must
    not read a new version of the same size under the old plan."""
    write_dataset(tmp_path / "a", [[60]])
    write_dataset(tmp_path / "b", [[60]], first_id=1000)  # same layout and size, other rows
    (url_a,) = object_store.upload(str(tmp_path / "a"), f"between-passes-{workers}")
    key = url_a.split("://", 1)[1]
    loader, dataset = StructuredDataset.create_dataloader(
        object_store.url(f"between-passes-{workers}"), batch_size=20, num_workers=workers,
        persistent_workers=persistent, storage_options=object_store.options,
    )
    assert sorted(i for batch in loader for i in batch["id"].tolist()) == list(range(60))
    object_store.fs.pipe_file(key, (tmp_path / "b" / "part-00000.parquet").read_bytes())
    dataset.set_epoch(1)
    with pytest.raises(DataReadError, match=r"part-00000.parquet .*the file changed after planning"):
        list(loader)


def test_planning_against_a_store_that_does_not_answer_times_out(s3, uploaded, no_client_retries):
    """Listing and metadata at planning are bounded by download_timeout too (they waited for the
    client's own timeouts and retries, minutes, times our attempts)."""
    import time

    url = uploaded(s3)
    s3.server.faults.stall_metadata(20.0)
    started = time.monotonic()
    with pytest.raises(OSError, match=r"listing 's3://.*' failed \(TimeoutError: no answer within download_timeout=1.0s\)"):
        StructuredDataset(url, storage_options=no_client_retries, download_retry=1, download_timeout=1.0, num_workers=0)
    assert time.monotonic() - started < 15


def test_a_refused_read_names_the_file_and_the_credentials(s3, uploaded):
    """Anonymous reads of a bucket that needs credentials: the store says only 'Forbidden'."""
    url = uploaded(s3)
    options = {k: v for k, v in s3.options.items() if k not in ("key", "secret")}
    with pytest.raises(OSError, match=r"part-00000.parquet .*Forbidden. The store refused access: check the credentials in storage_options \(anon=True sends none\)"):
        StructuredDataset(url, storage_options={**options, "anon": True}, download_retry=0, num_workers=0)


def test_an_unreachable_endpoint_is_named_at_planning(monkeypatch):
    import socket

    import s3fs

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = s3_options(f"http://127.0.0.1:{port}", client_retries=False)
    with pytest.raises(OSError, match=r"listing 's3://bucket-a/x' failed \(.*\); check the endpoint, region and credentials"):
        StructuredDataset("s3://bucket-a/x", storage_options=options, download_retry=0, num_workers=0)


# ----------------------------------------------------------------------------- bytes and requests (S3)
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
    part = _ids_parquet(0)
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


# ----------------------------------------------------------------------------- faults (S3)
@pytest.fixture
def no_client_retries(s3, monkeypatch):
    """S3 options with botocore's and s3fs's own retries off, so only ours can recover."""
    import s3fs

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    yield s3_options(s3.server.endpoint, client_retries=False)
    s3.server.faults.clear()


@pytest.mark.parametrize("mode", ["503", "reset", "stall"])
def test_transient_faults_are_retried_nothing_lost_or_duplicated(s3, uploaded, no_client_retries, mode):
    url = uploaded(s3)
    faults = s3.server.faults
    config = _config(s3, True, download_retry=3, download_timeout=1.5)
    config["storage_options"] = no_client_retries
    # a stall outlasts the test unless download_timeout cuts it (the client's read timeout is 300 s)
    faults.inject(mode, 1, stall_seconds=120.0)  # the first read of every object while planning (its footer) ...
    loader, dataset = make(url, **config)
    assert faults.injected_count() == len(LAYOUT)
    faults.inject(mode, 1, stall_seconds=120.0)  # ... and while reading
    assert_exactly_once(run_epoch(loader, dataset), ROWS)
    assert faults.injected_count() >= len(LAYOUT)


def run_until_error(loader, dataset) -> tuple[str, list, dict | None]:
    """Iterate until a DataReadError; return its message, the batches and the last state.

    The failed torch DataLoader iterator sits in a reference cycle (exception <-> frames);
    collecting it here shuts its workers down in this thread, not in whichever thread
    (e.g. fsspec's event loop, which it would stall) runs the garbage collector next.
    """
    batches, state, message = [], None, None
    try:
        for batch in loader:
            batches.append(tuple(batch["id"].tolist()))
            state = json.loads(json.dumps(dataset.state_dict()))
    except DataReadError as error:
        message = str(error)
    gc.collect()
    assert message is not None, "no DataReadError was raised"
    return message, batches, state


def test_without_retries_the_fault_surfaces(s3, uploaded, no_client_retries):
    url = uploaded(s3)
    config = _config(s3, False, download_retry=0, num_workers=0)
    config["storage_options"] = no_client_retries
    dataset = StructuredDataset(url, **config)
    s3.server.faults.inject("503", 1)
    with pytest.raises(DataReadError, match="failed after 1 attempt"):
        list(dataset)


def test_file_that_stays_unreadable_is_named_with_its_split(s3, uploaded, no_client_retries):
    url = uploaded(s3)
    config = _config(s3, False, download_retry=2)
    config["storage_options"] = no_client_retries
    loader, dataset = make(url, **config)
    s3.server.faults.inject("503", -1, match="part-00002")
    message, _, _ = run_until_error(loader, dataset)
    assert re.search(r"part-00002\.parquet \(split .*part-00002\.parquet.*failed after 3 attempt", message), message
    with pytest.raises(OSError, match=r"s3://bucket-a/data-parquet/part-00002\.parquet .*failed after 3 attempt"):
        make(url, **config)


def test_interrupted_by_fault_resumes_exactly(s3, uploaded, no_client_retries):
    """A run stopped by a permanent fault in a worker resumes from its last state, nothing lost."""
    url = uploaded(s3)
    config = _config(s3, True, download_retry=0)
    config["storage_options"] = no_client_retries
    loader, dataset = make(url, **config)
    full = run_epoch(loader, dataset)
    loader, dataset = make(url, **config)
    s3.server.faults.inject("503", -1, match="part-00003")
    _, seen, state = run_until_error(loader, dataset)
    s3.server.faults.clear()
    assert state is not None and seen == full[: len(seen)]
    assert seen + resume(url, state, **config) == full


# ----------------------------------------------------------------------------- cache (S3)
def test_cache_serves_later_epochs_and_keeps_its_limit(s3, uploaded, tmp_path):
    url = uploaded(s3)
    faults = s3.server.faults
    cache = tmp_path / "cache"
    config = _config(s3, True, cache_dir=str(cache))
    loader, dataset = make(url, **config)
    before, _ = faults.counters()
    first = run_epoch(loader, dataset)
    fetched = faults.counters()[0] - before
    heads = faults.head_count()
    dataset.set_epoch(1)
    second = run_epoch(loader, dataset)
    again = faults.counters()[0] - before - fetched
    assert_exactly_once(first, ROWS)
    assert_exactly_once(second, ROWS)
    assert fetched > 0 and again == 0, f"epoch 2 fetched {again} bytes despite the cache"
    # new workers read every range from the cache: no version check (HEAD) is needed either
    assert faults.head_count() == heads, "a cached epoch asked the store for object metadata"

    limit = fetched // 3
    small = tmp_path / "small"
    loader, dataset = make(url, **_config(s3, True, cache_dir=str(small), cache_limit_bytes=limit))
    for epoch in range(2):
        dataset.set_epoch(epoch)
        assert_exactly_once(run_epoch(loader, dataset), ROWS)
    held = sum(p.stat().st_size for p in small.iterdir())
    assert 0 < held <= limit


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

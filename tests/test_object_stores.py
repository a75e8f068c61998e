"""S3, GCS and Azure Blob through fsspec against real local servers (see servers.py): exactly once,
resume, files that change, the disk cache's failures, errors at planning."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datagen import rewrite_page_index, set_location, write_dataset
from object_store_helpers import LAYOUT, ROWS, ids_parquet, no_client_retries, store_config, uploaded  # noqa: F401 - fixtures
from resume_helpers import assert_exactly_once, batch_key, make, run_epoch
from servers import BUCKET, get_store, object_store, s3, s3_options, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset
from torch_dataloader_utils.errors import DataReadError
from torch_dataloader_utils.formats import _parquet_seek as parquet_seek
from torch_dataloader_utils.formats import parquet
from torch_dataloader_utils.formats.io import RangeFile
from torch_dataloader_utils.storage.remote import RemoteStore
from torch_dataloader_utils.testing import assert_resumes_exactly


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
    config = store_config(object_store, False, num_workers=workers)
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
    config = store_config(object_store, shuffle)
    loader, dataset = make(url, **config)
    assert isinstance(dataset._catalog.fs, RemoteStore)
    assert len(dataset.splits) > 4
    full = assert_resumes_exactly(lambda: make(url, **config), epochs=1, batch_key=batch_key).batches[0]
    assert_exactly_once(full, ROWS)


def test_orc_and_abfs_alias(object_store, uploaded):
    url = uploaded(object_store, "orc")
    if object_store.name == "azure":
        url = url.replace("abfs://", "az://")
    config = {**store_config(object_store, True, columns=["id", "x", "text"]), "format": "orc"}
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
    loader, dataset = make(uploaded(s3), **store_config(s3, True, num_workers=0, cache_dir=str(tmp_path / "cache")))
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


def test_file_rewritten_mid_pass_is_never_read_nor_cached(object_store, tmp_path):
    """A rewrite after the pass's first batch, same size: the rest of the pass, the next passes and
    a new dataset on the same cache must never deliver the new version's rows under the old plan
    (each range request is pinned to the planned version on S3 and Azure, checked after the
    fetch on GCS), and the cache must not keep them under the planned version's key."""
    old, new = ids_parquet(0), ids_parquet(1000)
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

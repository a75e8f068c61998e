"""Footer reads through pyarrow's C++ S3 client (catalog/arrow_tails.py, retried by storage/tail_fetch.py): s3fs's settings mapped,
the same plan as through s3fs, retries, and the fsspec path where pyarrow cannot go."""

from __future__ import annotations

import pytest
from datagen import write_dataset
from servers import BUCKET, s3, s3_options, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.catalog import arrow_tails as arrow_tails_module
from torch_dataloader_utils.catalog.arrow_tails import ArrowStatusError, s3_arguments
from torch_dataloader_utils.errors import FileChangedError, RemoteReadError
from torch_dataloader_utils.storage.remote import IOOptions, RemoteStore
from torch_dataloader_utils.storage.retry import is_transient
from torch_dataloader_utils.storage.versions import FileEntry

LAYOUT = [[30, 20], [40], [10, 15, 5]]


# ----------------------------------------------------------------------------- settings
def test_s3fs_settings_map_to_pyarrow():
    options = {
        "key": "AK",
        "secret": "SK",
        "token": "T",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"},
        "config_kwargs": {"max_pool_connections": 64, "retries": {"max_attempts": 1}, "s3": {"addressing_style": "virtual"}},
        "use_listings_cache": False,
    }
    assert s3_arguments(options, 30.0) == {
        "access_key": "AK",
        "secret_key": "SK",
        "session_token": "T",
        "endpoint_override": "127.0.0.1:9000",
        "scheme": "http",
        "region": "eu-west-1",
        "force_virtual_addressing": True,
        "request_timeout": 30.0,
        "connect_timeout": 30.0,
    }
    assert s3_arguments({"anon": True, "endpoint_url": "https://s3.example.org"}, None) == {
        "anonymous": True,
        "endpoint_override": "s3.example.org",
        "scheme": "https",
        "force_virtual_addressing": False,
    }
    # no credentials given: pyarrow's default chain (environment, profile files, instance role)
    assert s3_arguments({"region_name": "us-east-2"}, None) == {"region": "us-east-2", "force_virtual_addressing": False}
    assert s3_arguments({"client_kwargs": {"verify": "/etc/ca.pem"}}, None)["tls_ca_file_path"] == "/etc/ca.pem"


@pytest.mark.parametrize(
    "options",
    [
        {"profile": "dev"},
        {"requester_pays": True},
        {"version_aware": True},
        {"s3_additional_kwargs": {"ServerSideEncryption": "aws:kms"}},
        {"client_kwargs": {"verify": False}},
        {"config_kwargs": {"signature_version": "s3"}},
        {"key": "AK"},  # a key without its secret
        {"endpoint_url": "http://host:9000/prefix"},
    ],
)
def test_settings_pyarrow_cannot_take_keep_fsspec(options):
    assert s3_arguments(options, None) is None


def test_only_s3_and_only_when_switched_on(monkeypatch):
    import fsspec

    assert arrow_tails_module.arrow_tails(RemoteStore(fsspec.filesystem("memory"))) is None  # not S3
    s3_store = RemoteStore(fsspec.filesystem("s3", anon=True, region_name="us-east-1", skip_instance_cache=True), IOOptions(max_concurrency=8))
    assert arrow_tails_module.arrow_tails(s3_store)._concurrency == 16  # two requests per file
    monkeypatch.setenv(arrow_tails_module.ENV_SWITCH, "0")
    assert arrow_tails_module.arrow_tails(s3_store) is None


def test_an_aws_bucket_is_read_in_its_region_asked_once(monkeypatch):
    asked = []
    monkeypatch.setattr(arrow_tails_module, "_bucket_region", lambda bucket: asked.append(bucket) or "eu-west-1")
    tails = arrow_tails_module.ArrowTails({"anonymous": True}, concurrency=60)
    clients = tails._clients_for("data")
    assert tails._clients_for("data") is clients and asked == ["data"]
    assert len(clients) == 3 and clients[0].region == "eu-west-1"  # 25 requests in flight per client


def test_pyarrow_refusals_are_not_retried():
    refused = arrow_tails_module._classified(OSError("AWS Error ACCESS_DENIED during HeadObject operation: denied"))
    assert isinstance(refused, ArrowStatusError) and not is_transient(refused)
    assert is_transient(arrow_tails_module._classified(OSError("AWS Error SLOW_DOWN (HTTP status 503) during GetObject operation")))
    assert is_transient(arrow_tails_module._classified(OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28")))


# ----------------------------------------------------------------------------- on the emulator
@pytest.fixture(scope="module")
def small(s3, tmp_path_factory):
    root = tmp_path_factory.mktemp("arrow-reads")
    write_dataset(root / "parquet", LAYOUT)
    write_dataset(root / "orc", LAYOUT, "orc")
    s3.upload(str(root / "parquet"), "arrow-reads/parquet")
    s3.upload(str(root / "orc"), "arrow-reads/orc")
    return {fmt: s3.url(f"arrow-reads/{fmt}") for fmt in ("parquet", "orc")}


def _plan(url: str, options: dict, monkeypatch, arrow: bool, **extra):
    monkeypatch.setenv(arrow_tails_module.ENV_SWITCH, "1" if arrow else "0")
    return StructuredDataset(url, num_workers=0, split_bytes=2000, storage_options=options, **extra)


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_the_plan_is_the_one_fsspec_gives(s3, small, monkeypatch, fmt):
    through = {arrow: _plan(small[fmt], s3.options, monkeypatch, arrow, format=fmt) for arrow in (False, True)}
    old, new = through[False]._catalog, through[True]._catalog
    assert old.fs.stats["fetcher_reads"] == 0 and new.fs.stats["fetcher_reads"] == len(LAYOUT)
    assert new.fingerprint == old.fingerprint and list(new.layouts) == list(old.layouts) and list(new.splits) == list(old.splits)
    assert [getattr(f, "data", None) for f in new.footers] == [getattr(f, "data", None) for f in old.footers]
    assert new.schema == old.schema
    ids = sorted(int(i) for batch in through[True] for i in batch["id"])
    assert ids == list(range(sum(map(sum, LAYOUT))))


def test_settings_that_do_not_map_read_through_fsspec(s3, small, monkeypatch):
    options = {**s3.options, "config_kwargs": {"signature_version": "s3v4"}}
    dataset = _plan(small["parquet"], options, monkeypatch, arrow=True)
    assert dataset._catalog.fs.stats["fetcher_reads"] == 0 and len(dataset.files) == len(LAYOUT)


def test_a_corrupt_footer_is_named(s3, tmp_path, monkeypatch):
    write_dataset(tmp_path, [[10]])
    (tmp_path / "part-00001.parquet").write_bytes(b"not a parquet file at all" * 10)
    s3.upload(str(tmp_path), "arrow-reads-corrupt")
    with pytest.raises(ValueError, match=r"cannot read the parquet footer of s3://bucket-a/arrow-reads-corrupt/part-00001\.parquet"):
        _plan(s3.url("arrow-reads-corrupt"), s3.options, monkeypatch, arrow=True)


@pytest.fixture
def faults(s3):
    yield s3.server.faults
    s3.server.faults.clear()


@pytest.mark.parametrize("mode", ["503", "reset"])
def test_transient_faults_are_retried(s3, small, faults, monkeypatch, mode):
    faults.inject(mode, 1, match="arrow-reads/parquet")  # the first read of every file fails
    dataset = _plan(small["parquet"], s3_options(s3.server.endpoint, client_retries=False), monkeypatch, arrow=True, download_retry=2)
    stats = dataset._catalog.fs.stats
    assert faults.injected_count() == len(LAYOUT) and stats["fetcher_reads"] == len(LAYOUT) and stats["retries"] == 1
    assert sum(len(batch["id"]) for batch in dataset) == sum(map(sum, LAYOUT))


def test_a_fault_that_stays_names_the_file(s3, small, faults, monkeypatch):
    faults.inject("503", -1, match="part-00002")
    with pytest.raises(OSError, match=r"s3://bucket-a/arrow-reads/parquet/part-00002\.parquet .*failed after 2 attempt"):
        _plan(small["parquet"], s3_options(s3.server.endpoint, client_retries=False), monkeypatch, arrow=True, download_retry=1)


class _Prefetching(RemoteStore):
    def prefetch_tails(self, entries, fetcher=None):
        return super().prefetch_tails(entries, arrow_tails_module.arrow_tails(self))


def _store(s3, monkeypatch) -> RemoteStore:
    monkeypatch.setenv(arrow_tails_module.ENV_SWITCH, "1")
    return _Prefetching(s3.fs, IOOptions(download_retry=0))


def test_a_missing_object_goes_through_fsspec_and_is_named(s3, small, monkeypatch):
    store = _store(s3, monkeypatch)
    missing = FileEntry(f"{BUCKET}/arrow-reads/none.parquet", f"s3://{BUCKET}/arrow-reads/none.parquet", 100, None)
    with pytest.raises(RemoteReadError, match=r"s3://bucket-a/arrow-reads/none\.parquet .*FileNotFoundError"):
        store.prefetch_tails([missing])


def test_a_size_other_than_listed_is_a_changed_file(s3, small, monkeypatch):
    store = _store(s3, monkeypatch)
    path = f"{BUCKET}/arrow-reads/parquet/part-00000.parquet"
    size = s3.fs.size(path)
    store.prefetch_tails([FileEntry(path, f"s3://{path}", size, None)])
    assert store.take_tail(path)[1] == s3.fs.cat_file(path, start=max(0, size - 65536))
    with pytest.raises(FileChangedError, match=r"s3://bucket-a/arrow-reads/parquet/part-00000\.parquet holds"):
        store.prefetch_tails([FileEntry(path, f"s3://{path}", size + 1, None)])

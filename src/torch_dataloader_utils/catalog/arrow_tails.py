"""Footer (tail) reads through pyarrow's C++ S3 client, for planning many remote files.

Planning reads one tail per file. Through s3fs and aiobotocore a request costs about 1.5 ms of
client CPU on fsspec's one event-loop thread; pyarrow's S3 filesystem makes one for about 0.45 ms,
in C++ with the GIL released, on as many threads as requests in flight. ``s3_arguments`` maps s3fs's ``storage_options`` (credentials,
endpoint, region) to a ``pyarrow.fs.S3FileSystem``, or returns None where a setting has no
equivalent there (a profile, requester pays, server-side encryption keys, ...): the caller then
reads through fsspec. ``ArrowTails`` fetches byte ranges of many files on a thread
pool, for ``RemoteStore.prefetch_tails`` (which retries them: storage/tail_fetch.py).

Python's binding opens a file by its path only, so each file costs a HEAD (its size) and a ranged
GET, where s3fs needs the GET alone; the HEAD's size is checked against the listed size (a file
rewritten since listing is ``FileChangedError``). Without the ETag condition s3fs's reads carry,
a file rewritten at the same size in between is caught by the data reads, which carry it.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from ..errors import FileChangedError
from ..storage.remote import RemoteStore

#: The AWS SDK keeps at most 25 connections per client: requests beyond that wait for one, so
#: there is a client per this many requests in flight.
CONNECTIONS_PER_CLIENT = 25
#: Set to 0 to read footers through fsspec only.
ENV_SWITCH = "TDU_ARROW_FOOTERS"

# s3fs settings that change nothing about reading a range (caches, listings, uploads, the loop)
_NO_EFFECT = {
    "default_block_size", "default_fill_cache", "default_cache_type", "cache_regions", "skip_instance_cache",
    "use_listings_cache", "listings_expiry_time", "max_paths", "asynchronous", "loop", "max_concurrency",
    "fixed_upload_size", "version_aware", "requester_pays", "s3_additional_kwargs", "session_kwargs",
}  # fmt: skip
# (the last four: only their false / empty values, checked below)
_CONFIG_NO_EFFECT = {"retries", "read_timeout", "connect_timeout", "max_pool_connections"}


def enabled() -> bool:
    """Whether footers may be read through pyarrow (``TDU_ARROW_FOOTERS=0`` turns it off)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def s3_arguments(options: dict, timeout: float | None) -> dict | None:
    """``pyarrow.fs.S3FileSystem`` keyword arguments equivalent to s3fs's ``options``, or None
    when one of them has no equivalent (then reads stay on s3fs)."""
    options = dict(options)
    client = dict(options.pop("client_kwargs", None) or {})
    config = dict(options.pop("config_kwargs", None) or {})
    for name in ("version_aware", "requester_pays", "s3_additional_kwargs", "session_kwargs"):
        if options.get(name):
            return None
    if set(options) - _NO_EFFECT - {"key", "secret", "token", "username", "password", "anon", "endpoint_url", "region_name", "use_ssl"}:
        return None
    if set(client) - {"endpoint_url", "region_name", "aws_access_key_id", "aws_secret_access_key", "aws_session_token", "verify", "use_ssl"}:
        return None
    addressing = (config.pop("s3", None) or {}).copy()
    style = addressing.pop("addressing_style", "auto")
    if set(config) - _CONFIG_NO_EFFECT or addressing or style not in ("auto", "path", "virtual"):
        return None
    args: dict[str, Any] = {"force_virtual_addressing": style == "virtual"}
    key = options.get("key", options.get("username", client.get("aws_access_key_id")))
    secret = options.get("secret", options.get("password", client.get("aws_secret_access_key")))
    token = options.get("token", client.get("aws_session_token"))
    if options.get("anon"):
        args["anonymous"] = True
    elif key or secret:
        if not (key and secret):
            return None
        args.update(access_key=key, secret_key=secret, session_token=token)
    elif token:
        return None
    verify = client.get("verify", True)
    if verify is False:
        return None
    if isinstance(verify, str):
        args["tls_ca_file_path"] = verify
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    use_ssl = options.get("use_ssl", client.get("use_ssl", True))
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"{'https' if use_ssl else 'http'}://{endpoint}")
        if parts.scheme not in ("http", "https") or parts.path.strip("/") or parts.query or not parts.netloc:
            return None
        args.update(endpoint_override=parts.netloc, scheme=parts.scheme)
    elif os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3"):
        return None  # botocore and the C++ SDK read these differently
    elif not use_ssl:
        args["scheme"] = "http"
    region = options.get("region_name") or client.get("region_name")
    if region:
        args["region"] = region
    if timeout:
        args.update(request_timeout=timeout, connect_timeout=timeout)
    return args


def _bucket_region(bucket: str) -> str | None:
    """The region of an AWS bucket (None when it cannot be found out)."""
    from pyarrow.fs import resolve_s3_region

    try:
        return resolve_s3_region(bucket)
    except (OSError, ValueError):
        return None


class ArrowTails:
    """Byte ranges of many S3 objects, fetched by pyarrow's C++ client on a thread pool."""

    requests_per_read = 2  # a HEAD (pyarrow opens an object by its path), then the GET

    def __init__(self, arguments: dict, concurrency: int):
        self._arguments = arguments
        self._concurrency = max(1, concurrency)
        self._clients: dict[str | None, list[Any]] = {}
        self._regions: dict[str, str | None] = {}  # AWS buckets' regions, asked once
        self._lock = threading.Lock()

    def _clients_for(self, bucket: str) -> list[Any]:
        """The clients for ``bucket``: one per CONNECTIONS_PER_CLIENT requests in flight (against
        AWS without a region given: in the bucket's region, which s3fs finds out by itself)."""
        region = None
        if "region" not in self._arguments and "endpoint_override" not in self._arguments:
            if bucket not in self._regions:
                self._regions[bucket] = _bucket_region(bucket)
            region = self._regions[bucket]
        with self._lock:
            if region not in self._clients:
                from pyarrow import fs as pafs

                arguments = {**self._arguments, **({"region": region} if region else {})}
                # our retry loop is the one that retries (RemoteStore counts and logs each retry)
                arguments["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=1)
                count = -(-self._concurrency // CONNECTIONS_PER_CLIENT)
                self._clients[region] = [pafs.S3FileSystem(**arguments) for _ in range(count)]
            return self._clients[region]

    def fetch(self, requests: Sequence[tuple[str, int, int, int]]) -> list:
        """Bytes of each (path, start, end, listed size), or the exception its read raised;
        ``FileChangedError`` when the object's size is no longer the listed one."""
        if not requests:
            return []
        buckets = {path.split("/", 1)[0] for path, *_ in requests}
        clients = {bucket: self._clients_for(bucket) for bucket in buckets}

        def one(index: int) -> Any:
            path, start, end, size = requests[index]
            pool = clients[path.split("/", 1)[0]]
            try:
                with pool[index % len(pool)].open_input_file(path) as file:
                    if file.size() != size:
                        raise FileChangedError(
                            f"the file changed after it was listed (s3://{path} holds {file.size():,} bytes, listed with {size:,}); "
                            "create the loader again"
                        )
                    return file.read_at(end - start, start)
            except Exception as error:  # noqa: BLE001 - returned, like fsspec's gather returns them
                return _classified(error)

        with ThreadPoolExecutor(max_workers=min(self._concurrency, len(requests)), thread_name_prefix="tdu-tails") as pool:
            return list(pool.map(one, range(len(requests))))


class ArrowStatusError(OSError):
    """A request pyarrow's S3 client reports as refused, with the HTTP status when it gives one
    (which ``is_transient`` reads: 5xx, 408 and 429 are retried, the rest is not)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


# AWS errors that retrying cannot mend (pyarrow names them, not always with a status)
_REFUSALS = ("ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "MISSING_AUTHENTICATION_TOKEN", "UNRECOGNIZED_CLIENT", "NO_SUCH_BUCKET")


def _classified(error: Exception) -> Exception:
    """pyarrow's OSError for a refused request as an ``ArrowStatusError`` (its HTTP status, or
    403 for a named refusal); other errors as they are (an OSError without errno is transient)."""
    if not isinstance(error, OSError) or error.errno is not None or isinstance(error, FileChangedError):
        return error
    text = str(error)
    found = re.search(r"HTTP status (\d{3})", text)
    if found:
        status = int(found.group(1))
    elif any(f"AWS Error {name}" in text for name in _REFUSALS):
        status = 403
    else:
        return error
    wrapped = ArrowStatusError(text, status)
    wrapped.__cause__ = error
    return wrapped


def arrow_tails(store: RemoteStore) -> ArrowTails | None:
    """An ``ArrowTails`` for the store's tails, or None: not S3, settings pyarrow cannot take,
    pyarrow built without S3, or ``TDU_ARROW_FOOTERS=0``."""
    if store.protocol_name not in ("s3", "s3a") or not enabled():
        return None
    arguments = s3_arguments(store.storage_options, store.options.download_timeout)
    if arguments is None:
        return None
    try:
        from pyarrow import fs as pafs

        pafs.S3FileSystem  # noqa: B018 - absent from pyarrow builds without S3
    except (ImportError, AttributeError):
        return None
    # twice the files in flight: each costs two requests in a row (HEAD, GET), and a waiting
    # thread holds no GIL
    return ArrowTails(arguments, 2 * store.options.max_concurrency)

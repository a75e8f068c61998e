"""Range reads that only succeed on the planned version of an object.

S3 and Azure Blob take the planned ETag as a condition of each GET (``If-Match``): a file
rewritten after planning answers HTTP 412, which ``RemoteStore`` turns into ``FileChangedError``,
instead of the new version's bytes. Other stores have no such condition here (the GCS emulator
ignores ``ifGenerationMatch``); ``RemoteStore`` checks their version after fetching instead.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable, Callable
from typing import Any

PinnedRead = Callable[[Any, str, int, int, str], Awaitable[bytes]]

_S3 = ("s3", "s3a")
_AZURE = ("abfs", "az", "abfss")


def pinned_read_for(fs: Any) -> PinnedRead | None:
    """``read(fs, path, start, end, tag)`` for ``fs``'s store, or None when it has no conditional read."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if not getattr(fs, "async_impl", False):
        return None
    if any(p in _S3 for p in protocols) and hasattr(fs, "_call_s3"):
        return _s3_range
    if any(p in _AZURE for p in protocols) and hasattr(fs, "service_client"):
        return _azure_range
    return None


async def _s3_range(fs: Any, path: str, start: int, end: int, tag: str) -> bytes:
    bucket, key, version = fs.split_path(path)
    extra = {"VersionId": version} if version else {}
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", IfMatch=f'"{tag}"', **extra)
    body = response["Body"]
    try:
        return await body.read()
    finally:
        body.close()


async def _azure_range(fs: Any, path: str, start: int, end: int, tag: str) -> bytes:
    from azure.core import MatchConditions
    from azure.core.exceptions import ResourceNotFoundError

    container, blob, version = fs.split_path(fs._strip_protocol(path))
    async with fs.service_client.get_blob_client(container=container, blob=blob) as client:
        try:
            stream = await client.download_blob(
                offset=start,
                length=end - start,
                version_id=version,
                etag=f'"{tag}"',
                match_condition=MatchConditions.IfNotModified,
                **getattr(fs, "_timeout_kwargs", {}),
            )
        except ResourceNotFoundError as error:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path) from error
        return await stream.readall()

"""Private: a Parquet file's footer read from the end of the file and parsed (encrypted files
refused before pyarrow touches their columns), and a remote file's footer kept as its bytes."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import UnsupportedFileError
from ._parquet_footer import ENCRYPTED_MAGIC, MAGIC, has_encryption_algorithm
from ._thrift_compact import ThriftError

FOOTER_READ = 64 * 1024  # the tail read first (pyarrow's own first read is as large)


def footer_tail(file: Any, size: int) -> bytes:
    """The file's footer with its length and magic (the last ``8 + length`` bytes), read through
    ``file`` (seek / read); UnsupportedFileError for an encrypted footer, ValueError when the file
    does not end like a Parquet file (cut short, or not Parquet)."""

    def read_at(offset: int, nbytes: int) -> bytes:
        file.seek(offset)
        return file.read(nbytes)

    return _tail_of(read_at, size)


def local_footer_tail(path: str) -> bytes:
    """``footer_tail`` of a local file, read with one ``pread`` (or two, for a footer larger
    than ``FOOTER_READ``): a buffered Python file costs twice as much per file, which counts
    when planning 100,000 small files."""
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        return _tail_of(lambda offset, nbytes: os.pread(descriptor, nbytes, offset), os.fstat(descriptor).st_size)
    finally:
        os.close(descriptor)


def _tail_of(read_at: Callable[[int, int], bytes], size: int) -> bytes:
    tail = read_at(max(0, size - FOOTER_READ), FOOTER_READ)
    if tail[-4:] == ENCRYPTED_MAGIC:
        raise UnsupportedFileError(_ENCRYPTED.format("its footer is encrypted"))
    if len(tail) < 2 * len(MAGIC) + 4 or tail[-4:] != MAGIC:
        raise ValueError(f"the file does not end in Parquet's magic bytes {MAGIC!r}")
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 2 * len(MAGIC) + 4 > size:
        raise ValueError(f"its footer's length ({length:,} bytes) is more than the file holds ({size:,} bytes)")
    if length + 8 > len(tail):
        tail = read_at(size - length - 8, length + 8)
    return bytes(tail[-length - 8 :])


_ENCRYPTED = "it is an encrypted Parquet file ({}), and reading encrypted files is not supported. Decrypt it first, or pass a path without it"


def parsed_footer(tail: bytes) -> pq.FileMetaData:
    """The footer parsed by pyarrow from its bytes (``footer_tail``), refused before any column's
    metadata is touched when its columns are encrypted: pyarrow aborts the process then.

    Parsed from bytes in Python memory, planning allocates nothing from pyarrow's memory pool. The
    pool's first allocation in a process faults in memory that mimalloc marks for transparent huge
    pages, and with the kernel's usual ``defrag=madvise`` that fault may compact memory first, which
    makes the first footer many times slower to read than parsing it from Python memory.
    """
    try:
        # (pq.ParquetFile would also index the columns' paths, which costs a third more here)
        reader = pq.ParquetReader()
        reader.open(pa.BufferReader(tail))
        footer = reader.metadata
    except (OSError, pa.ArrowException) as error:  # a complete file whose footer pyarrow refuses
        raise UnsupportedFileError(f"pyarrow cannot read its footer: {str(error).rstrip('.')}") from error
    try:
        encrypted = has_encryption_algorithm(tail[:-8], footer.created_by)
    except ThriftError as error:
        raise UnsupportedFileError(f"its footer is not valid Thrift ({error}), although pyarrow parsed it") from error
    if encrypted:
        raise UnsupportedFileError(_ENCRYPTED.format("its columns are encrypted, its footer is not"))
    return footer


class KeptFooter:
    """A remote file's footer as the catalog keeps it: its Thrift bytes, parsed again where it is
    used (a file opened, statistics checked). pyarrow's parsed ``FileMetaData`` takes about ten
    times the memory (6 KB for a two-column file's 0.5 KB footer), in the main process and in
    the copy of the catalog each DataLoader worker receives."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def parsed(self) -> pq.FileMetaData:
        last = _last_parsed
        if last[0] is self:
            return last[1]
        return remember_parsed(self, parsed_footer(self.data))

    def __getstate__(self) -> bytes:
        return self.data

    def __setstate__(self, data: bytes) -> None:
        self.data = data


#: The footer parsed last and its KeptFooter: planning asks for a footer's schema right after
#: reading it, and the catalog keeps only the bytes (one parsed footer held, not one per file).
_last_parsed: tuple[KeptFooter | None, Any] = (None, None)


def remember_parsed(footer: KeptFooter, parsed: pq.FileMetaData) -> pq.FileMetaData:
    """``parsed`` (``footer`` parsed), kept as the footer parsed last."""
    global _last_parsed
    _last_parsed = (footer, parsed)
    return parsed


def metadata(footer: Any) -> pq.FileMetaData:
    """The parsed footer of ``footer`` (a ``FileMetaData`` as it is, a ``KeptFooter`` parsed)."""
    return footer.parsed() if isinstance(footer, KeptFooter) else footer

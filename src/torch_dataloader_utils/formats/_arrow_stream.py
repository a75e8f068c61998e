"""Arrow IPC streams (what ``pyarrow.ipc.new_stream``, Hugging Face ``datasets``' ``save_to_disk``
and polars' ``write_ipc_stream`` write): a stream has no footer, so planning walks its messages
once for the byte offset of each record batch, and a batch is read by seeking to its message.

A batch of a stream with dictionary-encoded columns needs the dictionary messages written before
it: it is read from a small stream of the schema message, those dictionary messages and its own."""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import pyarrow as pa

from ..errors import UnsupportedFileError

log = logging.getLogger(__name__)
_END_MARK = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # a stream's last 8 bytes: a message of length 0


class StreamIndex(NamedTuple):
    """Where a stream's messages are: [start, end) byte ranges."""

    schema_end: int
    batches: tuple[tuple[int, int], ...]
    dictionaries: tuple[tuple[int, int], ...]
    #: per record batch, how many dictionary messages come before it
    dictionaries_before: tuple[int, ...]


def scan_stream(source: Any, url: str) -> tuple[pa.Schema, list[pa.RecordBatch], StreamIndex]:
    """A stream's schema, its record batches (a memory-mapped stream's buffers are not read; a
    remote one is read once) and the index its reader needs."""
    messages = pa.ipc.MessageReader.open_stream(source)
    schema: pa.Schema | None = None
    schema_end = 0
    batches: list[pa.RecordBatch] = []
    batch_ranges: list[tuple[int, int]] = []
    dictionaries: list[tuple[int, int]] = []
    dictionaries_before: list[int] = []
    while True:
        start = source.tell()
        try:
            message = messages.read_next_message()
        except StopIteration:
            break
        if schema is None:
            if message.type != "schema":
                raise UnsupportedFileError(f"it is an Arrow IPC stream whose first message is a {message.type}, not its schema")
            schema, schema_end = pa.ipc.read_schema(message), source.tell()
        elif message.type == "dictionary":
            dictionaries.append((start, source.tell()))
        elif message.type == "record batch":
            if not dictionaries:  # (with dictionaries, the batches are read below with them)
                batches.append(pa.ipc.read_record_batch(message, schema))
            batch_ranges.append((start, source.tell()))
            dictionaries_before.append(len(dictionaries))
        else:
            raise UnsupportedFileError(f"it is an Arrow IPC stream with a second {message.type} message")
    if schema is None:
        raise UnsupportedFileError("it is an Arrow IPC stream without a schema message (an empty or cut file)")
    end = source.tell()
    source.seek(max(0, end - len(_END_MARK)))
    if source.read(len(_END_MARK)) != _END_MARK:
        log.warning("%s: the Arrow IPC stream has no end mark, so its writer may not have finished it: its %d record batches are read", url, len(batch_ranges))
    if dictionaries:
        source.seek(0)
        batches = list(pa.ipc.open_stream(source))
    return schema, batches, StreamIndex(schema_end, tuple(batch_ranges), tuple(dictionaries), tuple(dictionaries_before))


class StreamReader:
    """Reads a stream's record batches by the index its planning scan made."""

    def __init__(self, source: Any, schema: pa.Schema, index: StreamIndex):
        self._source = source
        self._schema = schema
        self._index = index

    def get_batch(self, number: int) -> pa.RecordBatch:
        """The ``number``-th record batch of the stream (as the file format's reader names it)."""
        index = self._index
        if not index.dictionaries:
            self._source.seek(index.batches[number][0])
            return pa.ipc.read_record_batch(pa.ipc.read_message(self._source), self._schema)
        ranges = [(0, index.schema_end), *index.dictionaries[: index.dictionaries_before[number]], index.batches[number]]
        return pa.ipc.open_stream(pa.py_buffer(b"".join(self._read(start, end) for start, end in ranges))).read_next_batch()

    def _read(self, start: int, end: int) -> bytes:
        self._source.seek(start)
        return bytes(self._source.read(end - start))

"""Arrow IPC streams (what ``pyarrow.ipc.new_stream``, Hugging Face ``datasets``' ``save_to_disk``
and polars' ``write_ipc_stream`` write): a stream has no footer, so planning walks its messages
once for where each record batch is. A batch is read as a small stream of its own: the schema
message, the dictionary messages it needs (the last replacement of each dictionary before it and
the deltas after that) and the batch's message, so that pyarrow's stream reader sees byte order
and dictionaries as in a whole read.

pyarrow does not say which dictionary a dictionary message holds, nor whether it is a delta:
``_dictionary_key`` reads the two fields from the message's flatbuffer (Arrow's Message.fbs)."""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa

from ..errors import FileChangedError, RemoteReadError, UnsupportedFileError

log = logging.getLogger(__name__)


class DictionaryMessage(NamedTuple):
    """A dictionary message of a stream: its [start, end) bytes, the dictionary's id, and whether
    it adds to that dictionary (a delta) or replaces it."""

    start: int
    end: int
    id: int
    delta: bool


class StreamIndex(NamedTuple):
    """Where a stream's messages are: [start, end) byte ranges."""

    schema_end: int
    batches: tuple[tuple[int, int], ...]
    dictionaries: tuple[DictionaryMessage, ...]
    #: per record batch, how many dictionary messages come before it
    dictionaries_before: tuple[int, ...]


def scan_stream(source: Any, url: str, reopen: Callable[[], Any]) -> tuple[pa.Schema, list[pa.RecordBatch], StreamIndex]:
    """A stream's schema, its record batches (a memory-mapped stream's buffers are not read; a
    remote one is read once, in large blocks) and the index its reader needs. ``reopen`` gives
    the stream from its start again (read twice when it holds dictionaries)."""
    messages = pa.ipc.MessageReader.open_stream(source)
    schema: pa.Schema | None = None
    schema_end = last_end = 0
    batches: list[pa.RecordBatch] = []
    batch_ranges: list[tuple[int, int]] = []
    dictionaries: list[DictionaryMessage] = []
    dictionaries_before: list[int] = []
    while True:
        start = source.tell()
        try:
            message = messages.read_next_message()
            last_end = source.tell()
            if schema is not None and message.type == "dictionary":
                dictionaries.append(DictionaryMessage(start, last_end, *_dictionary_key(message.metadata)))
        except StopIteration:
            break
        except (pa.ArrowInvalid, OSError, ValueError, IndexError, struct.error) as error:  # (the last two: a dictionary message's flatbuffer cut short)
            if isinstance(error, (RemoteReadError, FileChangedError)) or getattr(error, "errno", None) is not None:
                raise  # the storage failed, not the file
            if schema is None:
                raise UnsupportedFileError(f"it is neither an Arrow IPC file nor a stream: {error}") from None
            raise ValueError(f"the Arrow IPC stream is cut short or damaged at byte {start}, after {len(batch_ranges)} record batches: {error}") from None
        if schema is None:
            if message.type != "schema":
                raise UnsupportedFileError(f"it is neither an Arrow IPC file nor a stream (its first message is a {message.type}, not a schema)")
            schema, schema_end = pa.ipc.read_schema(message), last_end
        elif message.type == "record batch":
            if not dictionaries:  # (with dictionaries, the batches are read below with them)
                batches.append(pa.ipc.read_record_batch(message, schema))
            batch_ranges.append((start, last_end))
            dictionaries_before.append(len(dictionaries))
        elif message.type != "dictionary":
            raise UnsupportedFileError(f"it is an Arrow IPC stream with a second {message.type} message")
    if schema is None:
        raise UnsupportedFileError("it is neither an Arrow IPC file nor a stream (it has no schema message)")
    if source.tell() == last_end:  # (reading the end mark moves past it: 8 bytes, 4 in the format before Arrow 0.15)
        log.warning("%s: the Arrow IPC stream has no end mark, so its writer may not have finished it: its %d record batches are read", url, len(batch_ranges))
    if dictionaries:
        with reopen() as again:
            batches = list(pa.ipc.open_stream(again))
    return schema, batches, StreamIndex(schema_end, tuple(batch_ranges), tuple(dictionaries), tuple(dictionaries_before))


def _dictionary_key(metadata: pa.Buffer) -> tuple[int, bool]:
    """The id and isDelta of a DictionaryBatch message (its flatbuffer: the Message table's
    field 2 is the header, the DictionaryBatch table's fields 0 and 2 are id and isDelta)."""
    data = metadata.to_pybytes()
    header = _field(data, struct.unpack_from("<I", data, 0)[0], 2)
    if header is None:
        raise ValueError("a dictionary message without its header")
    table = header + struct.unpack_from("<I", data, header)[0]
    id_at, delta_at = _field(data, table, 0), _field(data, table, 2)
    return (struct.unpack_from("<q", data, id_at)[0] if id_at is not None else 0), (bool(data[delta_at]) if delta_at is not None else False)


def _field(data: bytes, table: int, field: int) -> int | None:
    """Where field ``field`` of the flatbuffer table at ``table`` is (None: absent, its default)."""
    vtable = table - struct.unpack_from("<i", data, table)[0]
    at = 4 + 2 * field
    if at >= struct.unpack_from("<H", data, vtable)[0]:
        return None
    offset = struct.unpack_from("<H", data, vtable + at)[0]
    return table + offset if offset else None


def read_options(fields: tuple[int, ...] | None) -> pa.ipc.IpcReadOptions | None:
    """pyarrow's options to read only the top-level ``fields`` of a batch (None: all)."""
    return None if fields is None else pa.ipc.IpcReadOptions(included_fields=list(fields))


def release_fetched(source: Any) -> None:
    """Let a remote file drop the bytes fetched for a batch read (a local file holds none)."""
    forget = getattr(source, "forget", None)
    if forget is not None:
        forget([])


def needed_dictionaries(dictionaries: tuple[DictionaryMessage, ...], before: int) -> list[DictionaryMessage]:
    """Of the first ``before`` dictionary messages, those a batch after them needs, in order: for
    each dictionary its last replacement and the deltas after it."""
    needed, complete = [], set()
    for message in reversed(dictionaries[:before]):
        if message.id not in complete:
            needed.append(message)
            if not message.delta:
                complete.add(message.id)
    return needed[::-1]


class StreamReader:
    """Reads a stream's record batches by the index its planning scan made."""

    def __init__(self, source: Any, index: StreamIndex):
        self._source = source
        self._index = index

    def get_batch(self, number: int, fields: tuple[int, ...] | None) -> pa.RecordBatch:
        """The ``number``-th record batch of the stream, of the top-level ``fields`` (None: all)."""
        index = self._index
        dictionaries = needed_dictionaries(index.dictionaries, index.dictionaries_before[number])
        ranges = [(0, index.schema_end), *((m.start, m.end) for m in dictionaries), index.batches[number]]
        data = bytearray(sum(end - start for start, end in ranges))
        view, at = memoryview(data), 0
        for start, end in ranges:
            self._read_into(view[at : at + end - start], start)
            at += end - start
        release_fetched(self._source)
        return pa.ipc.open_stream(pa.py_buffer(data), options=read_options(fields)).read_next_batch()

    def _read_into(self, view: memoryview, start: int) -> None:
        self._source.seek(start)
        if self._source.readinto(view) != len(view):
            raise OSError(f"the file ends before byte {start + len(view)}, where planning found a message")

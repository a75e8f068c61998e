"""What CSV and JSON Lines share: units are byte ranges of whole records, found with the sparse
row index (_text_index.py), which is built by one scan at planning and kept in the disk cache
(``cache_dir``) keyed by the file's version, so planning the same files again reads no data.

An uncompressed file's units hold about ``min(split_bytes, TEXT_UNIT_BYTES)`` bytes (and at
most ``split_rows`` rows), cut at indexed records; a read from any row starts at the indexed
record before it. A compressed file (.gz, .bz2, .zst, .deflate) cannot be entered in the middle: it is
one unit, and a read from a row inside it decompresses and parses from the start and drops the
rows before.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv

from ..plan.splits import FileLayout
from ..storage.cache import RangeCache
from ..storage.paths import is_local, is_remote
from ..storage.versions import FileEntry
from . import TEXT_COMPRESSIONS, _text_index
from ._text_index import RecordIndex, RecordScanner, scan_records
from .io import RangeFile, open_input

log = logging.getLogger(__name__)

#: the largest unit of an uncompressed text file: large enough that parsing a unit costs far
#: more than starting one, small enough that a worker holds little of it decoded
TEXT_UNIT_BYTES = 16 * 1024 * 1024
#: the advice for pyarrow's "straddling object" error: a record longer than the block it parses in
LONG_RECORD = (
    "A record is longer than the block pyarrow parses records in (block_size, 1 MiB by default); the file is not "
    "damaged: pass {options}={{'block_size': N}} with N larger than the file's longest record, in bytes"
)
SCAN_BLOCK = 8 * 1024 * 1024
DEFAULT_BLOCK_SIZE = pa_csv.ReadOptions().block_size  # (pyarrow.json's default is the same)


class ScanCounter:
    """Bytes read by row index scans in this process (tests check that a cached index is reused)."""

    bytes_scanned = 0
    files_scanned = 0
    lock = threading.Lock()  # footers are read by a thread pool

    @classmethod
    def add(cls, files: int, nbytes: int) -> None:
        with cls.lock:
            cls.files_scanned += files
            cls.bytes_scanned += nbytes


def compression_of(path: str) -> str | None:
    """The compression a file name's last suffix names (pyarrow's codec name), or None."""
    lower = path.lower()
    return next((codec for suffix, codec in TEXT_COMPRESSIONS.items() if lower.endswith(suffix)), None)


@dataclass(frozen=True)
class TextFooter:
    """A text file as planned: its row index, units (index entries where each starts, then the
    number of entries), schema and how to parse it (format-specific, picklable)."""

    index: RecordIndex
    units: tuple[int, ...]
    schema: pa.Schema
    compression: str | None
    parse: Any
    whole: bool = False  # one unit, parsed from the start for any row (records the scan may miscount)

    def unit_bytes(self, unit: int, first_entry: int | None = None) -> tuple[int, int]:
        """Bytes [start, end) of a unit, from index entry ``first_entry`` (default: its first)."""
        offsets = self.index.offsets
        entry = self.units[unit] if first_entry is None else first_entry
        stop = self.units[unit + 1]
        return int(offsets[entry]), int(offsets[stop]) if stop < len(offsets) else self.index.data_end

    def unit_first_row(self, unit: int) -> int:
        return self.units[unit] * self.index.every


def plan_units(index: RecordIndex, unit_bytes: int, unit_rows: int | None) -> tuple[int, ...]:
    """Index entries where units start (plus the entry count): about ``unit_bytes`` bytes and at
    most ``unit_rows`` rows each, at least one entry each."""
    offsets = np.append(index.offsets, index.data_end)
    entries = len(index.offsets)
    most = entries if unit_rows is None else max(1, unit_rows // index.every)
    starts, entry = [], 0
    while entry < entries:
        starts.append(entry)
        by_bytes = int(np.searchsorted(offsets, offsets[entry] + unit_bytes, side="right")) - 1
        entry = max(entry + 1, min(by_bytes, entry + most, entries))
    return (*starts, entries)


def _raw_blocks(fs: Any, path: str, size: int) -> Iterator[bytes]:
    """The file's bytes in blocks of SCAN_BLOCK."""
    if is_remote(fs):
        handle = RangeFile(fs, path)
        for start in range(0, size, SCAN_BLOCK):
            block = bytes(handle.read_range(start, min(size, start + SCAN_BLOCK)))
            handle.forget([])  # (the block was fetched on demand)
            yield block
        return
    with open_input(fs, path) as handle:
        while True:
            block = handle.read(SCAN_BLOCK)
            if not block:
                return
            yield bytes(block)


def open_decompressed(fs: Any, path: str, size: int, compression: str) -> Any:
    """A stream of the file's decompressed bytes (a remote file is fetched whole first)."""
    if is_local(fs):
        return pa.input_stream(path, compression=compression)
    return pa.input_stream(pa.py_buffer(b"".join(_raw_blocks(fs, path, size))), compression=compression)


def _blocks(fs: Any, path: str, size: int, compression: str | None) -> Iterator[bytes]:
    """The file's (decompressed) bytes in blocks, counted in ScanCounter."""
    ScanCounter.add(1, 0)
    if compression is None:
        source: Iterator[bytes] = _raw_blocks(fs, path, size)
    else:
        stream = open_decompressed(fs, path, size, compression)
        source = iter(lambda: stream.read(SCAN_BLOCK), b"")
    for block in source:
        ScanCounter.add(0, len(block))
        yield block


class TextFormat:
    """The ``FileFormat`` of a text format; subclasses parse (csv.py, jsonl.py).

    The object in ``FORMATS`` has default options; ``configured`` gives one with the user's
    options, the split sizes and the row index cache (catalog/sources.py)."""

    name = ""
    suffixes: tuple[str, ...] = ()
    streams_units = True
    schema_advice = ""
    miscount_hint = ""  # what else than a changed file makes a unit parse to another row count
    #: pyarrow's error messages number rows from the block that failed (JSON), not from the parse's start (CSV)
    numbers_rows_by_block = False

    def skips_empty_lines(self, parse: Any) -> bool:
        """Whether pyarrow parses an empty line into no row (and a byte order mark would be dropped: CSV)."""
        return False

    def __init__(self, options: dict | None = None, unit_bytes: int = TEXT_UNIT_BYTES, unit_rows: int | None = None):
        self.options = self.check_options(dict(options or {}))
        self._unit_bytes = unit_bytes
        self._unit_rows = unit_rows
        self._cache: RangeCache | None = None
        self._tags: dict[str, str | None] = {}

    # ------------------------------------------------------------ per format
    def check_options(self, options: dict) -> dict:
        """The options, checked (a ValueError names a bad key and the accepted ones)."""
        raise NotImplementedError

    def file_parse(self, path: str) -> Any:
        """How one file is parsed (picklable), from the options and its name."""
        raise NotImplementedError

    def scanner(self, parse: Any) -> RecordScanner:
        """A scanner of this file's records."""
        raise NotImplementedError

    def infer_schema(self, stream: Any, parse: Any, count_rows: bool) -> tuple[pa.Schema, int | None]:
        """The schema pyarrow infers from the start of a file (``stream``: the file from its first
        byte), and with ``count_rows`` the rows pyarrow parses from the whole stream."""
        raise NotImplementedError

    def parse(self, data: pa.Buffer | Any, footer: TextFooter, columns: list[str] | None, use_threads: bool) -> pa.Table:
        """Records without a header (``data``: a buffer or a stream) as a table of ``footer.schema``'s types."""
        raise NotImplementedError

    def parse_blocks(self, data: pa.Buffer | Any, footer: TextFooter, columns: list[str] | None) -> Iterator[pa.Table]:
        """``parse``'s rows, one block (``block_size`` bytes) at a time, each parsed when asked for."""
        raise NotImplementedError

    # ------------------------------------------------------------ FileFormat
    def configured(self, options: dict, *, split_bytes: int, split_rows: int | None, cache_dir: str | None, files: list[FileEntry]) -> TextFormat:
        """This format with ``options``, units of at most ``split_bytes`` bytes (and
        TEXT_UNIT_BYTES) and ``split_rows`` rows, and a row index cache in ``cache_dir``."""
        configured = type(self)(options, min(split_bytes, TEXT_UNIT_BYTES), split_rows)
        configured._cache = RangeCache(cache_dir) if cache_dir is not None else None
        configured._tags = {entry.url: entry.tag for entry in files}
        return configured

    def read_footer(self, fs: Any, path: str, size: int, url: str) -> tuple[FileLayout, TextFooter]:
        """The row index and schema (from the cache, else by a scan and pyarrow's inference), and the units."""
        parse = self.file_parse(path)
        compression = compression_of(path)
        key = self._cache_key(url, size, parse, compression)
        found = self._cached(key, url)
        if found is None:
            index = scan_records(_blocks(fs, path, size, compression), self.scanner(parse))
            # a header without rows still names the columns (of the null type: other files' types win)
            schema = self._infer(fs, path, size, compression, self.with_index(parse, index), index.rows) if index.rows or index.data_start else pa.schema([])
            if key is not None and self._cache is not None:
                self._cache.put(key, _entry_bytes(index, schema))
        else:
            index, schema = found
        parse = self.with_index(parse, index)
        whole = self.whole_file(parse)
        units = (0, len(index.offsets)) if compression is not None or whole else plan_units(index, self._unit_bytes, self._unit_rows)
        if index.rows == 0:
            units = (0,)
        footer = TextFooter(index, units, schema, compression, parse, whole)
        count = len(units) - 1
        rows = tuple(min(index.rows, units[u + 1] * index.every) - units[u] * index.every for u in range(count))
        sizes = (size,) * count if compression is not None else tuple(end - start for start, end in map(footer.unit_bytes, range(count)))
        return FileLayout(url, size, rows, sizes), footer

    def _infer(self, fs: Any, path: str, size: int, compression: str | None, parse: Any, rows: int) -> pa.Schema:
        """The file's schema. A file within pyarrow's first block is parsed whole for it anyway: its
        rows are checked against the scan's count here, so that a file the scan miscounts (a
        pretty-printed JSON document) is refused at planning, not at its first read."""
        stream = open_decompressed(fs, path, size, compression) if compression else open_input(fs, path)
        whole = compression is None and size <= parse.read.get("block_size", DEFAULT_BLOCK_SIZE)
        with stream:
            schema, parsed = self.infer_schema(stream, parse, whole)
        if parsed is not None and parsed != rows:
            raise ValueError(
                f"pyarrow parses it to {parsed} rows where the planning scan counted {rows}: the scan does not read it as pyarrow does{self.miscount_hint}"
            )
        return schema

    def whole_file(self, parse: Any) -> bool:
        """Whether the scan may miscount this file's records (CSV: an escape_char), so that it is one
        unit, parsed from its start: then the read's row count check covers every record."""
        return False

    def with_index(self, parse: Any, index: RecordIndex) -> Any:
        """The file's parse settings once its records are known (CSV: quoted newlines)."""
        return parse

    def schema(self, fs: Any, path: str, footer: TextFooter) -> pa.Schema:
        return footer.schema

    def open(self, fs: Any, path: str, footer: TextFooter, use_threads: bool) -> TextReader:
        return TextReader(self, fs, path, footer, use_threads)

    # ------------------------------------------------------------ the row index cache
    def _cache_key(self, url: str, size: int, parse: Any, compression: str | None) -> str | None:
        """The cache entry of one version of a file read with these settings (None: not cached)."""
        tag = self._tags.get(url)
        if self._cache is None or tag is None:
            return None
        text = f"rowindex\0{_text_index.SCAN_RULES}\0{self.name}\0{url}\0{tag}\0{size}\0{_text_index.INDEX_EVERY}\0{compression}\0{self.scan_key(parse)}"
        return "rowindex-" + hashlib.sha256(text.encode()).hexdigest()[:40]

    def _cached(self, key: str | None, url: str) -> tuple[RecordIndex, pa.Schema] | None:
        data = self._cache.get(key) if key is not None and self._cache is not None else None
        if data is None:
            return None
        try:
            length = int.from_bytes(data[:8], "big")
            return RecordIndex.from_bytes(data[8 : 8 + length]), pa.ipc.read_schema(pa.py_buffer(data[8 + length :]))
        except (ValueError, TypeError, pa.ArrowException) as error:  # a damaged entry: scan again
            log.debug("row index cache entry %s unreadable (%s); scanning %s", key, error, url)
            return None

    def scan_key(self, parse: Any) -> str:
        """The parse settings the records and inferred types depend on (part of the cache key)."""
        return repr(parse)


def _entry_bytes(index: RecordIndex, schema: pa.Schema) -> bytes:
    packed = index.to_bytes()
    return len(packed).to_bytes(8, "big") + packed + schema.serialize().to_pybytes()


def _from_row(error: pa.ArrowInvalid, first: int, by_block: bool) -> pa.ArrowInvalid:
    """``error`` saying which row of the file pyarrow's row numbers count from: the parse's first
    row (``first``, a data row counted from 0 after any header), or with ``by_block`` the first
    row of the block that failed."""
    if by_block:
        where = f"pyarrow's row numbers count from the block that failed: its row 0 is data row {first:,} of the file, counted from 0"
    elif "Row #" in str(error):
        where = f"pyarrow's row numbers count from where this parse started: its Row #1 is data row {first:,} of the file, counted from 0 after the header"
    else:
        where = f"the rows parsed start at data row {first:,} of the file, counted from 0 after the header"
    return pa.ArrowInvalid(f"{error} ({where})")


def _until_error(tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``tables`` up to the first that fails to parse."""
    try:
        yield from tables
    except pa.ArrowInvalid:
        return


class TextReader:
    """Reads units (byte ranges of records) of one text file."""

    def __init__(self, fmt: TextFormat, fs: Any, path: str, footer: TextFooter, use_threads: bool):
        self._fmt, self._fs, self._path, self._footer, self._use_threads = fmt, fs, path, footer, use_threads
        self._mapped: pa.Buffer | None = None

    @property
    def miscount_hint(self) -> str:
        """Said when a unit parses to another row count than the planning scan counted."""
        return self._fmt.miscount_hint

    def read_unit(self, unit: int, columns: list[str] | None) -> pa.Table:
        whole = self._footer.compression is not None
        data = self._decompressed() if whole else self._records(*self._footer.unit_bytes(unit))
        try:
            return self._fmt.parse(data, self._footer, columns, self._use_threads)
        except pa.ArrowInvalid as error:
            first = 0 if whole else self._footer.unit_first_row(unit)
            if self._fmt.numbers_rows_by_block:  # parsed again a block at a time, to find the block that fails
                first += sum(table.num_rows for table in _until_error(self.iter_unit(unit, columns, 1 << 30)))
            raise _from_row(error, first, self._fmt.numbers_rows_by_block) from error

    def iter_unit(self, unit: int, columns: list[str] | None, batch_rows: int, first_row: int = 0) -> Iterator[pa.Table]:
        """The unit's rows from ``first_row``, parsed a block at a time from the indexed record at
        or before it (a compressed file: from its start); the rows before are dropped."""
        footer = self._footer
        if footer.compression is not None:
            data, drop = self._decompressed(), first_row
        elif footer.whole:
            data, drop = self._records(*footer.unit_bytes(0)), first_row
        else:
            _, indexed_row = footer.index.record_offset(footer.unit_first_row(unit) + first_row)
            data = self._records(*footer.unit_bytes(unit, indexed_row // footer.index.every))
            drop = footer.unit_first_row(unit) + first_row - indexed_row
        first = footer.unit_first_row(unit) + first_row - drop  # the data row the parse starts at
        parsed = 0  # rows of the blocks parsed before
        try:
            for table in self._fmt.parse_blocks(data, footer, columns):
                parsed += table.num_rows
                if drop >= table.num_rows:
                    drop -= table.num_rows
                    continue
                table, drop = table.slice(drop), 0
                for start in range(0, table.num_rows, batch_rows):
                    yield table.slice(start, batch_rows)
        except pa.ArrowInvalid as error:
            by_block = self._fmt.numbers_rows_by_block
            raise _from_row(error, first + parsed if by_block else first, by_block) from error

    def _decompressed(self) -> Any:
        """The decompressed records: the stream after the header."""
        stream = open_decompressed(self._fs, self._path, self._size(), self._footer.compression or "")
        stream.read(self._footer.index.data_start)
        return stream

    def _size(self) -> int:
        return self._fs.ident(self._path)[2] if is_remote(self._fs) else int(self._fs.size(self._path))

    def _records(self, start: int, end: int) -> pa.Buffer:
        """Bytes [start, end) of whole records. pyarrow's CSV parser drops a UTF-8 byte order mark at
        the start of what it is given, which only the file's own first bytes may be: a record that
        starts with one is given from the line end before it (an empty line, which it skips)."""
        data = self._bytes(start, end)
        if start > 0 and self._fmt.skips_empty_lines(self._footer.parse) and data[:3].to_pybytes() == b"\xef\xbb\xbf":
            return self._bytes(start - 1, end)
        return data

    def _bytes(self, start: int, end: int) -> pa.Buffer:
        if is_local(self._fs):
            if self._mapped is None:
                self._mapped = pa.memory_map(self._path, "r").read_buffer()
            return self._mapped.slice(start, end - start)
        if is_remote(self._fs):
            handle = RangeFile(self._fs, self._path)
            ((_, data),) = handle.fetch([(start, end)])
            return pa.py_buffer(data)
        with self._fs.open(self._path, "rb") as handle:
            handle.seek(start)
            return pa.py_buffer(handle.read(end - start))


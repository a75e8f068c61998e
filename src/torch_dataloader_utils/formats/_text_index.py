"""The sparse row index of a text file (CSV, JSON Lines): where its records start.

One pass over the file finds every record boundary (a newline outside quotes; for CSV also a
carriage return that no newline follows, the line end of old Mac files) and keeps the
byte offset of every ``every``-th record. Byte ranges between kept offsets hold exactly
``every`` records, so a file can be cut into units at record boundaries with exact row
counts, and a read can start at any row by seeking to the kept record before it and dropping
fewer than ``every`` rows.

Quotes, as pyarrow's CSV parser reads them: a quote character opens a quoted field only at the
start of a field (after a delimiter or a line end); inside one, a quote closes it, or with
``double_quote`` a doubled quote stands for itself. A quote in the middle of an unquoted field
(``12" ruler``) is an ordinary character. A newline is a boundary only outside quoted fields.
Most files need no more than counting quote characters (the quote that opens or closes a field
toggles, a doubled one toggles twice); a block with a quote inside an unquoted field is walked
quoted field by quoted field.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

#: records per index entry: a resume parses and drops fewer than this many rows
INDEX_EVERY = 256
#: the version of the scan's rules, in the row index cache's key (2: a lone CR ends a CSV record;
#: 4: a quote opens a quoted field only at the start of a field)
SCAN_RULES = 4
_NEWLINE, _RETURN = 10, 13


@dataclass(frozen=True)
class RecordIndex:
    """Records of one text file: ``offsets[i]`` is the byte offset of record ``i * every``."""

    data_start: int  # after the header and skipped lines
    data_end: int  # the file's (decompressed) size
    rows: int
    every: int
    offsets: np.ndarray  # int64
    quoted_newlines: bool  # a quoted field holds a newline (the parser must be told)

    def to_bytes(self) -> bytes:
        head = json.dumps([self.data_start, self.data_end, self.rows, self.every, self.quoted_newlines]).encode()
        return len(head).to_bytes(4, "big") + head + self.offsets.astype("<i8").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> RecordIndex:
        length = int.from_bytes(data[:4], "big")
        start, end, rows, every, quoted = json.loads(data[4 : 4 + length])
        offsets = np.frombuffer(data, dtype="<i8", offset=4 + length).astype(np.int64)
        return cls(int(start), int(end), int(rows), int(every), offsets, bool(quoted))

    def record_offset(self, row: int) -> tuple[int, int]:
        """(byte offset, row) of the indexed record at or before ``row``."""
        entry = min(row // self.every, len(self.offsets) - 1)
        return int(self.offsets[entry]), entry * self.every


class RecordScanner:
    """Feeds blocks of a file and counts its records (see the module's docstring).

    ``quote``: the quote byte (None: none); ``skip``: leading records that are not data (a
    header); ``marker``: a byte every data record holds (``{`` for JSON objects), so that lines
    of blanks are not counted (None: only empty lines are not records); ``count_empty``: empty
    lines are records too; ``returns``: a carriage return without a newline after it ends a
    record too (as pyarrow's CSV parser reads it); ``raw_skip``: leading lines skipped before
    ``skip`` records, whose quote characters do not count (pyarrow's ``skip_rows``); ``escape``: a
    byte that makes the next one literal (a quote or a line end it precedes counts for nothing);
    ``delimiter`` and ``double_quote``: the CSV's, which decide where a quoted field may open and
    whether a doubled quote stands for itself. A file that ends inside a quoted field is refused
    (ValueError): every record after its opening quote would be one field.
    """

    def __init__(
        self,
        quote: int | None,
        skip: int,
        every: int | None = None,
        marker: int | None = None,
        count_empty: bool = False,
        returns: bool = False,
        raw_skip: int = 0,
        escape: int | None = None,
        delimiter: int = ord(","),
        double_quote: bool = True,
    ):
        self._escape = escape
        # by the byte before a quote, plus 2: whether a field starts there (a delimiter, a line end, the file's start: -1)
        self._field_start = np.zeros(258, dtype=bool)
        self._field_start[[delimiter + 2, _NEWLINE + 2, _RETURN + 2, 1]] = True
        self._double_quote = double_quote
        self._closed_at_end = False  # the last byte fed is a quote that closed a quoted field
        self._bom = False  # the file starts with a UTF-8 byte order mark
        self._head = b""  # the file's first bytes, up to 3
        self._escaped_at_end = False  # the last byte fed was taken by an escape
        self._pending_escape = False  # the last block ended with an escape that takes the next byte
        self._quote, self._skip, self._marker, self._count_empty, self._returns = quote, skip + raw_skip, marker, count_empty, returns
        self._raw_skip = raw_skip  # leading lines skipped as lines, quotes in them not counted (pyarrow's skip_rows)
        self._pending_return = False  # the last block ended with a carriage return (a record end unless a newline follows)
        self._every = INDEX_EVERY if every is None else every
        self._pos = 0  # bytes fed so far
        self._record_start = 0
        self._in_quote = False
        self._marked = False  # the open record has held the marker byte
        self._prev = -1  # the last byte fed
        self._data_start = 0 if skip + raw_skip == 0 else -1
        self._rows = 0
        self._marks: list[np.ndarray] = []
        self._quoted_newlines = False
        self._content = False  # (with a marker) a byte other than blanks was fed

    def feed(self, block: bytes | memoryview) -> None:
        data = np.frombuffer(block, dtype=np.uint8)
        if not len(data):
            return
        if self._pos < 3:  # (the mark may come in blocks of fewer than 3 bytes)
            self._head += bytes(data[: 3 - self._pos])
            self._bom = self._head == b"\xef\xbb\xbf"
        if self._raw_skip:
            data = self._skip_lines(data)
            if not len(data):
                return
        newlines, line_feeds = self._line_ends(data)
        escaped = self._escaped(data) if self._escape is not None else None
        if escaped is not None and (len(escaped) or self._escaped_at_end):
            free = ~np.isin(newlines, escaped) & ~((newlines == -1) & self._escaped_at_end)  # (-1: the block before's last byte)
            newlines, line_feeds = newlines[free], line_feeds[free]
        if self._quote is not None:
            outside = self._outside_quotes(data, newlines, escaped)
            newlines, line_feeds = newlines[outside], line_feeds[outside]
        ends = newlines + (self._pos + 1)  # exclusive ends of the records closed in this block
        starts = np.concatenate([[self._record_start], ends[:-1]]).astype(np.int64) if len(ends) else ends
        keep = self._non_empty(data, newlines, line_feeds, starts, ends)
        if self._skip:  # the header: the first records that are not empty lines, as pyarrow skips those before it
            records = np.flatnonzero(keep)
            taken = min(self._skip, len(records))
            if taken:
                self._skip -= taken
                keep[: records[taken - 1] + 1] = False
                if not self._skip:
                    self._data_start = int(ends[records[taken - 1]])
        self._count(starts[keep])
        if len(ends):
            self._record_start = int(ends[-1])
            self._marked = False
        if self._marker is not None:
            self._content = self._content or bool(np.any((data != 32) & (data != 9) & (data != _NEWLINE) & (data != _RETURN)))
            tail = data[int(newlines[-1]) + 1 :] if len(newlines) else data
            self._marked = self._marked or bool(np.any(tail == self._marker))
        self._escaped_at_end = escaped is not None and bool(len(escaped)) and int(escaped[-1]) == len(data) - 1
        self._pos += len(data)
        self._prev = int(data[-1])

    def _skip_lines(self, data: np.ndarray) -> np.ndarray:
        """Take up to ``raw_skip`` lines off the front of ``data`` as lines; the rest of it."""
        ends, _, pending = self._ends_in(data, self._pending_return)
        taken = min(self._raw_skip, len(ends))
        self._raw_skip -= taken
        self._skip -= taken
        if self._raw_skip:  # the block ends inside a skipped line
            cut, self._pending_return = len(data), pending
        else:  # (taken >= 1) the rest is scanned as records, from the end of the last skipped line
            cut, self._pending_return = int(ends[taken - 1]) + 1, False
            self._record_start = self._pos + cut
            if not self._skip:
                self._data_start = self._record_start
        if cut:
            self._pos += cut
            self._prev = int(data[cut - 1])
        return data[cut:]

    def _line_ends(self, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where lines end in ``data`` (-1: the carriage return that ended the block before), and
        which of them are newlines (the others carriage returns)."""
        ends, line_feeds, self._pending_return = self._ends_in(data, self._pending_return)
        return ends, line_feeds

    def _ends_in(self, data: np.ndarray, pending: bool) -> tuple[np.ndarray, np.ndarray, bool]:
        """``_line_ends``, given whether the block before ended with a carriage return; and whether this one does."""
        newlines = np.flatnonzero(data == _NEWLINE)
        if not self._returns:
            return newlines, np.ones(len(newlines), dtype=bool), False
        returns = np.flatnonzero(data == _RETURN)
        inside = returns[returns < len(data) - 1]
        lone = inside[data[inside + 1] != _NEWLINE]  # (one at the block's end waits for the next block's first byte)
        before = [-1] if pending and data[0] != _NEWLINE else []
        ends_with_return = bool(len(returns)) and int(returns[-1]) == len(data) - 1
        if not len(lone) and not before:
            return newlines, np.ones(len(newlines), dtype=bool), ends_with_return
        ends = np.concatenate([np.array(before, dtype=np.int64), lone, newlines])
        order = np.argsort(ends, kind="stable")
        return ends[order], (np.arange(len(ends)) >= len(before) + len(lone))[order], ends_with_return

    def _escaped(self, data: np.ndarray) -> np.ndarray:
        """Positions in ``data`` of the bytes an escape takes literally. In a run of escape bytes every
        other one escapes the next: the first, unless an escape the block before ended with takes it."""
        found = np.flatnonzero(data == self._escape)
        pending, self._pending_escape = self._pending_escape, False
        lead = [0] if pending and (not len(found) or found[0] != 0) else []  # the byte the pending escape takes
        if not len(found):
            return np.array(lead, dtype=np.int64)
        run_start = np.concatenate([[True], np.diff(found) != 1])
        starts_at = np.maximum.accumulate(np.where(run_start, np.arange(len(found)), 0))
        within = np.arange(len(found)) - starts_at
        parity = np.where((starts_at == 0) & (pending and found[0] == 0), 1, 0)  # the first escape is itself taken
        taken = found[(within & 1) == parity] + 1
        self._pending_escape = bool(len(taken)) and int(taken[-1]) == len(data)
        return np.concatenate([np.array(lead, dtype=np.int64), taken[taken < len(data)]])

    def _outside_quotes(self, data: np.ndarray, newlines: np.ndarray, escaped: np.ndarray | None = None) -> np.ndarray:
        """Which of ``newlines`` are outside quoted fields."""
        quotes = np.flatnonzero(data == self._quote)
        if escaped is not None and len(escaped) and len(quotes):
            quotes = quotes[~np.isin(quotes, escaped)]
        if not len(quotes) and not self._in_quote:
            self._closed_at_end = False
            return np.ones(len(newlines), dtype=bool)
        quotes = self._toggling(data, quotes, escaped)
        inside = ((np.searchsorted(quotes, newlines) + self._in_quote) & 1).astype(bool)
        if inside.any():
            self._quoted_newlines = True
        closes = (np.arange(len(quotes)) + self._in_quote) & 1  # the quotes that close a field
        self._closed_at_end = bool(len(quotes)) and int(quotes[-1]) == len(data) - 1 and bool(closes[-1])
        self._in_quote = bool((len(quotes) + self._in_quote) & 1)
        return ~inside

    def _toggling(self, data: np.ndarray, quotes: np.ndarray, escaped: np.ndarray | None) -> np.ndarray:
        """The ``quotes`` that open or close a quoted field, a doubled quote's two counted as a close
        and an open; the others are characters of unquoted fields. Counting every quote is right
        when each quote that would open a field by the count is at a field's start or doubles the
        quote before it; else the block is walked field by field."""
        first = int(self._in_quote)  # quotes[first::2] open fields by the count
        openers = quotes[first::2]
        wrong = np.flatnonzero(~self._starts_field(data, openers, escaped))
        if len(wrong) and self._double_quote:
            at = first + 2 * wrong  # their index among the quotes: a doubled quote follows the closing one
            previous = np.where(at > 0, quotes[np.maximum(at - 1, 0)], -1 - int(not (self._closed_at_end and quotes[0] == 0)))
            wrong = wrong[previous != quotes[at] - 1]
        return quotes if not len(wrong) else self._walk_fields(data, quotes, escaped)

    def _starts_field(self, data: np.ndarray, positions: np.ndarray, escaped: np.ndarray | None) -> np.ndarray:
        """Whether each quote at ``positions`` is the first byte of a field (pyarrow skips a UTF-8
        BOM at the file's start; a delimiter or line end an escape took ends no field)."""
        before = data[np.maximum(positions - 1, 0)].astype(np.int16)
        if len(positions) and positions[0] == 0:
            before[0] = self._prev
        starts = self._field_start[before + 2]
        if escaped is not None and len(positions):
            if len(escaped):
                starts &= ~np.isin(positions - 1, escaped)
            if positions[0] == 0 and self._escaped_at_end:
                starts[0] = False
        if self._bom:
            starts |= positions + self._pos == 3
        return starts

    def _walk_fields(self, data: np.ndarray, quotes: np.ndarray, escaped: np.ndarray | None) -> np.ndarray:
        """``_toggling`` field by field, for a block with a quote inside an unquoted field: outside
        quotes, the next quote at a field's start opens one; inside, the next quote closes it (with
        the quote right after it, a doubled quote: both counted)."""
        opening = np.flatnonzero(self._starts_field(data, quotes, escaped)).tolist()
        doubled = set(np.flatnonzero(quotes[1:] == quotes[:-1] + 1).tolist()) if self._double_quote else set()  # quote i, then i + 1
        toggling: list[int] = []
        inside, index = self._in_quote, 0
        if not inside and self._double_quote and self._closed_at_end and quotes[0] == 0:
            toggling.append(0)
            inside, index = True, 1
        while True:
            if inside:
                if index >= len(quotes):
                    break
                if index in doubled:
                    toggling += [index, index + 1]
                    index += 2
                    continue
                toggling.append(index)
                inside, index = False, index + 1
            else:
                found = bisect.bisect_left(opening, index)
                if found == len(opening):
                    break
                index = opening[found]
                toggling.append(index)
                inside, index = True, index + 1
        return quotes[np.array(toggling, dtype=np.int64)] if toggling else quotes[:0]

    def _non_empty(self, data: np.ndarray, newlines: np.ndarray, line_feeds: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        if self._marker is not None:  # a record holds the marker between its start and its end
            at = starts - self._pos  # (the first record may have started in an earlier block: < 0)
            held = (at >= 0) & (data[np.clip(at, 0, len(data) - 1)] == self._marker)  # the usual case: it starts with it
            unsure = np.flatnonzero(~held)
            if len(unsure):
                markers = np.flatnonzero(data == self._marker) + self._pos
                held[unsure] = np.searchsorted(markers, starts[unsure]) < np.searchsorted(markers, ends[unsure])
            if len(held):
                held[0] |= self._marked
            return held
        if self._count_empty:
            return np.ones(len(ends), dtype=bool)
        length = ends - starts
        if self._bom:  # the mark alone on the first line: an empty line (pyarrow drops the mark first)
            length = np.where(starts == 0, length - 3, length)
        before = np.where(newlines > 0, data[np.maximum(newlines - 1, 0)], self._prev)
        return ~((length == 1) | ((length == 2) & (before == _RETURN) & line_feeds))

    def _count(self, starts: np.ndarray) -> None:
        rows = np.arange(self._rows, self._rows + len(starts))
        self._marks.append(starts[rows % self._every == 0])
        self._rows += len(starts)

    def finish(self) -> RecordIndex:
        """The index, once every block has been fed (a last record may lack its newline)."""
        if self._content and not self._rows and not self._marked:
            raise ValueError(f"no line holds {chr(self._marker or 0)!r}, so it holds no record (a JSON Lines file holds one object per line)")
        if self._in_quote:
            raise ValueError(
                "the file ends inside quotes: a field that starts with a quote character is never closed by another, "
                "so every record after it would be part of that field. Close the quoted field (a quote inside it is "
                "written twice: \"a\"\"b\"), or pass quote_char=False in csv_options if the file quotes no field"
            )
        tail = self._pos - self._record_start
        if self._marker is not None:
            last = self._marked
        else:
            # a carriage return at the end ends the last line: a record only when empty lines are
            last = tail > 0 and not (tail == 1 and self._prev == _RETURN and not self._count_empty)
        if last and not self._skip:
            self._count(np.array([self._record_start], dtype=np.int64))
        if self._data_start < 0:  # the header is all there is
            self._data_start = self._pos
        offsets = np.concatenate(self._marks).astype(np.int64) if self._marks else np.zeros(0, dtype=np.int64)
        return RecordIndex(self._data_start, self._pos, self._rows, self._every, offsets, self._quoted_newlines)


def scan_records(blocks: Iterable[bytes], scanner: RecordScanner) -> RecordIndex:
    """Feed every block to ``scanner``; its index."""
    for block in blocks:
        scanner.feed(block)
    return scanner.finish()

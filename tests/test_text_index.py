"""formats/_text_index.py: the sparse row index finds every record start, whatever the blocks."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from pyarrow import csv, json

from torch_dataloader_utils.formats._text_index import RecordIndex, RecordScanner, scan_records


def _csv_bytes(rows: int, seed: int) -> bytes:
    rng = random.Random(seed)
    lines = ["a,b"]
    for i in range(rows):
        field = rng.choice(["x", '"q,\nz"', '"""y"""', "", '"a\r\nb"', '"two\n\nblank"'])
        lines.append(f"{i},{field}")
        if rng.random() < 0.05:
            lines.append(rng.choice(["", "\r"]))
    return ("\n".join(lines) + rng.choice(["", "\n"])).encode()


def _blocks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("block", [1, 2, 7, 64, 1 << 20])
@pytest.mark.parametrize("seed", [0, 1])
def test_csv_records_with_quoted_newlines_blank_lines_and_any_blocks(block, seed):
    data = _csv_bytes(300, seed)
    options = csv.ParseOptions(newlines_in_values=True)
    rows = csv.read_csv(pa.BufferReader(data), parse_options=options).num_rows
    index = scan_records(_blocks(data, block), RecordScanner(ord('"'), skip=1, every=10))
    assert index.rows == rows and index.quoted_newlines and index.data_start == 4
    for entry in range(len(index.offsets)):  # every indexed offset starts record entry * every
        rest = csv.read_csv(pa.BufferReader(data[index.offsets[entry] :]), read_options=csv.ReadOptions(column_names=["a", "b"]), parse_options=options)
        assert rest.column("a")[0].as_py() == csv.read_csv(pa.BufferReader(data), parse_options=options).column("a")[entry * 10].as_py()


def _mixed_line_ends(rows: int, seed: int) -> bytes:
    """CSV whose lines end in CR, LF or CRLF at random, with quoted CRs and empty CR lines."""
    rng = random.Random(seed)
    out = "a,b" + rng.choice(["\r", "\n", "\r\n"])
    for i in range(rows):
        out += f"{i}," + rng.choice(["x", '"q\rz"', '"r\r\nn"', ""]) + rng.choice(["\r", "\n", "\r\n"])
        if rng.random() < 0.05:
            out += "\r"
    return out.encode()


@pytest.mark.parametrize("block", [1, 2, 7, 64, 1 << 20])
@pytest.mark.parametrize("data", [b"a,b\r1,x\r2,y\r3,z", b"a,b\r1,x\r2,y\r", _mixed_line_ends(200, 0), _mixed_line_ends(200, 1)], ids=["cr", "cr-end", "mixed0", "mixed1"])
def test_csv_lines_ending_in_a_lone_carriage_return_are_records(block, data):
    options = csv.ParseOptions(newlines_in_values=True)
    table = csv.read_csv(pa.BufferReader(data), parse_options=options)
    index = scan_records(_blocks(data, block), RecordScanner(ord('"'), skip=1, every=3, returns=True))
    assert index.rows == table.num_rows >= 2 and index.data_start == 4
    for entry in range(len(index.offsets)):
        rest = csv.read_csv(pa.BufferReader(data[index.offsets[entry] :]), read_options=csv.ReadOptions(column_names=["a", "b"]), parse_options=options)
        assert rest.column("a")[0].as_py() == table.column("a")[entry * 3].as_py()


def test_json_lines_of_blanks_are_not_records():
    data = b'{"a": "1"}\n\n   \n{"a": "}\\n{"}\r\n\t\n{"a": "3"}'
    for block in (1, 3, 100):
        index = scan_records(_blocks(data, block), RecordScanner(None, 0, every=1, marker=ord("{")))
        assert index.rows == json.read_json(pa.BufferReader(data)).num_rows == 3
        assert index.offsets.tolist() == [0, 16, 33]


def test_header_only_and_empty_files_have_no_rows():
    assert scan_records([b"a,b\n"], RecordScanner(ord('"'), skip=1)).rows == 0
    assert scan_records([b"a,b"], RecordScanner(ord('"'), skip=1)).data_start == 3
    assert scan_records([], RecordScanner(None, 0)).rows == 0


def test_empty_lines_count_when_asked():
    assert scan_records([b"1\n\n2\n"], RecordScanner(None, 0, count_empty=True)).rows == 3


def test_index_round_trips_through_bytes_and_finds_the_record_before_a_row():
    index = RecordIndex(4, 100, 25, 10, np.array([4, 40, 80]), True)
    again = RecordIndex.from_bytes(index.to_bytes())
    assert again.offsets.tolist() == [4, 40, 80] and (again.rows, again.every, again.quoted_newlines) == (25, 10, True)
    assert again.record_offset(0) == (4, 0) and again.record_offset(19) == (40, 10) and again.record_offset(24) == (80, 20)


@pytest.mark.parametrize("block", [1, 2, 5, 1 << 20])
@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
def test_skipped_lines_are_lines_whatever_quotes_they_hold(block, ending):
    """pyarrow's skip_rows skips lines; a quote in one does not open a quoted field."""
    lines = ['# exported from "Sales report', '"a', "id,s", *[f'{i},"v{i}"' for i in range(20)]]
    data = ending.join(lines).encode() + ending.encode()
    rows = csv.read_csv(pa.BufferReader(data), read_options=csv.ReadOptions(skip_rows=2)).num_rows
    index = scan_records(_blocks(data, block), RecordScanner(ord('"'), skip=1, every=4, returns=True, raw_skip=2))
    assert index.rows == rows == 20
    assert data[index.data_start :].startswith(b"0,")
    assert all(data[offset:].startswith(f'{i},"'.encode()) for offset, i in zip(index.offsets, range(0, 20, 4), strict=True))


@pytest.mark.parametrize("data", [b'id,s\n1,"abc\n2,c\n', b'id,s\n1,"a""\n2,c\n', b'"id,s\n1,2\n'])
def test_a_file_ending_inside_a_quoted_field_is_refused(data):
    with pytest.raises(ValueError, match="ends inside quotes.*quote_char=False"):
        scan_records([data], RecordScanner(ord('"'), skip=1, returns=True))


def _fields_with_stray_quotes(rows: int, seed: int, delimiter: str) -> bytes:
    """Unquoted fields holding quote characters (12" ruler) among quoted ones with newlines and doubled quotes."""
    rng = random.Random(seed)
    kinds = ['12" ruler', 'a"b"c', 'x"', '"q\nz"', '"say ""hi"""', '"ab"cd"e', '""', "plain", '"a\r\nb"', f'"x{delimiter}y"']
    lines = [f"id{delimiter}s{delimiter}t"]
    for i in range(rows):
        lines.append(delimiter.join([str(i), rng.choice(kinds), rng.choice(kinds)]))
    return ("\ufeff" if seed % 2 else "").encode() + "\n".join(lines).encode() + b"\n"


@pytest.mark.parametrize("block", [1, 3, 64, 1 << 20])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("delimiter", [",", ";"])
def test_a_quote_inside_an_unquoted_field_is_a_character_as_pyarrow_reads_it(block, seed, delimiter):
    data = _fields_with_stray_quotes(200, seed, delimiter)
    options = csv.ParseOptions(delimiter=delimiter, newlines_in_values=True)
    ids = csv.read_csv(pa.BufferReader(data), parse_options=options).column("id").to_pylist()
    index = scan_records(_blocks(data, block), RecordScanner(ord('"'), skip=1, every=8, returns=True, delimiter=ord(delimiter)))
    assert index.rows == len(ids) == 200
    for entry, offset in enumerate(index.offsets):  # every indexed offset starts record entry * every
        rest = csv.read_csv(pa.BufferReader(data[offset:]), read_options=csv.ReadOptions(column_names=["id", "s", "t"]), parse_options=options)
        assert rest.column("id")[0].as_py() == ids[entry * 8]


def test_without_double_quote_a_quote_after_a_closing_one_is_a_character():
    data = b'id,s\n1,"a""b\n2,c\n'  # double_quote=False: "a" closes, then "b is unquoted text
    options = csv.ParseOptions(double_quote=False)
    rows = csv.read_csv(pa.BufferReader(data), parse_options=options).num_rows
    index = scan_records([data], RecordScanner(ord('"'), skip=1, returns=True, double_quote=False))
    assert index.rows == rows == 2


def test_json_lines_with_content_but_no_object_are_refused_and_blank_files_are_empty():
    with pytest.raises(ValueError, match="no line holds '{'"):
        scan_records([b"[1, 2, 3]\n", b"4\n"], RecordScanner(None, 0, marker=ord("{")))
    assert scan_records([b"  \n", b"\r\n\t\n"], RecordScanner(None, 0, marker=ord("{"))).rows == 0
    assert scan_records([b'{"a": 1}'], RecordScanner(None, 0, marker=ord("{"))).rows == 1


CASES = [  # (csv bytes, RecordScanner options, pyarrow ReadOptions / ParseOptions)
    (b"\nname,city\nann,oslo\nbob,rome\n", {}, {}, {}),  # a blank line before the header
    (b"\xef\xbb\xbf\r\n\nname,city\nann,oslo\n", {}, {}, {}),  # the byte order mark alone on a line, then one blank
    (b"# note\n\nname,city\nann,oslo\n", {"raw_skip": 1}, {"skip_rows": 1}, {}),  # a blank line after skip_rows
    (b"\xef\xbb\xbf\n1,x\n", {"skip": 0}, {"column_names": ["n", "s"]}, {}),  # no header: the marked line is blank
    (b'item,size\nruler\\,"12,30\nbox,5\n', {"escape": ord("\\")}, {}, {"escape_char": "\\"}),  # an escaped delimiter, then a quote
    (b'item,size\nlid,"2\\\n3"\ncap,"4"\n', {"escape": ord("\\")}, {}, {"escape_char": "\\"}),
    (b"a,b\n1,x\n\r", {"count_empty": True}, {}, {"ignore_empty_lines": False}),  # an empty last line ended by a lone CR
    (b"a,b\n1,x\r\r", {"count_empty": True}, {}, {"ignore_empty_lines": False}),
    (b'\xef\xbb\xbf"x\ny",z\n1,2\n', {}, {}, {}),  # a quoted header field right after the byte order mark
]


@pytest.mark.parametrize("block", [1, 2, 3, 5, 1 << 20])
@pytest.mark.parametrize("data, scanner, read, parse", CASES)
def test_header_blank_lines_escapes_and_the_byte_order_mark_as_pyarrow_reads_them(data, scanner, read, parse, block):
    options = {"skip": 1, "returns": True, **scanner}
    skip = options.pop("skip")
    index = scan_records(_blocks(data, block), RecordScanner(ord('"'), skip, every=1, **options))
    table = csv.read_csv(pa.BufferReader(data), read_options=csv.ReadOptions(**read), parse_options=csv.ParseOptions(newlines_in_values=True, **parse))
    assert index.rows == table.num_rows
    first = table.column(0)[0].as_py() if table.num_rows else None
    rest = csv.read_csv(pa.BufferReader(data[index.offsets[0] :]), read_options=csv.ReadOptions(column_names=table.column_names), parse_options=csv.ParseOptions(newlines_in_values=True, **parse))
    assert rest.column(0)[0].as_py() == first

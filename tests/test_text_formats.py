"""CSV and JSON Lines (formats/csv.py, jsonl.py, _text.py): byte-range units with exact row
counts, exactly once and resume equivalence, options, the schema rule, and the row index cache."""

from __future__ import annotations

import os
import shutil

import pyarrow as pa
import pyarrow.csv as pa_csv
import pytest
from servers import s3, store_registry  # noqa: F401 - fixtures
from textgen import write_csv, write_csv_dataset, write_jsonl, write_jsonl_dataset

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.errors import DataReadError
from torch_dataloader_utils.formats import _text_index
from torch_dataloader_utils.formats._text import ScanCounter
from torch_dataloader_utils.testing import assert_resumes_exactly

CONFIG = dict(batch_size=30, chunk_rows=60, split_bytes="2KiB", shuffle_seed=4, shuffle_buffer_rows=90)


@pytest.fixture(autouse=True)
def small_index(monkeypatch):
    """An index entry every 16 records: small files get many units and resumes seek."""
    monkeypatch.setattr(_text_index, "INDEX_EVERY", 16)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, tuple[str, int]]:
    csv_root, json_root = tmp_path_factory.mktemp("csv"), tmp_path_factory.mktemp("jsonl")
    return {"csv": (str(csv_root), write_csv_dataset(csv_root)), "jsonl": (str(json_root), write_jsonl_dataset(json_root))}


def ids(batch: dict) -> tuple[int, ...]:
    return tuple(batch["id"].tolist())


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_exactly_once_and_resume_at_every_point(data, fmt, workers, shuffle):
    root, rows = data[fmt]

    def make():
        return StructuredDataset.create_dataloader(root, format=fmt, num_workers=workers, shuffle=shuffle, **CONFIG)

    dataset = make()[1]
    layouts = dataset._catalog.layouts
    assert len(dataset.splits) >= 6 and max(len(layout.unit_rows) for layout in layouts) >= 3  # several byte ranges a file
    reference = assert_resumes_exactly(make, epochs=1, batch_key=ids)
    assert sorted(i for batch in reference.batches[0] for i in batch) == list(range(rows))


def test_batches_hold_the_fields_as_written(data):
    root, rows = data["csv"]
    dataset = StructuredDataset(root, format=None, batch_size=rows, num_workers=0)
    (batch,) = list(dataset)
    names = dict(zip(batch["id"].tolist(), batch["name"]))
    assert names[3] == "two\nlines 3" and names[2] == 'say "2"' and names[1] == "a,1" and names[4] == "crlf\r\n4"
    assert names[rows - 1] == f"t{rows - 1}"  # the .tsv file, tab-separated
    assert batch["val"].dtype.is_floating_point  # double in three files, int64 in the gzip one: widened


def test_a_resume_inside_a_unit_parses_from_the_indexed_record_before_it(data, monkeypatch):
    root, _ = data["csv"]
    dataset = StructuredDataset(os.path.join(root, "a.csv"), format="csv", num_workers=0, split_bytes="1MiB")
    catalog = dataset._catalog
    footer = catalog.footers[0]
    assert catalog.layouts[0].unit_rows == (230,)
    parsed = []
    original = type(catalog.format).parse_blocks
    monkeypatch.setattr(type(catalog.format), "parse_blocks", lambda self, data, *a: parsed.append(data.size) or original(self, data, *a))
    reader = catalog.format.open(catalog.fs, catalog.files[0].fs_path, footer, False)
    tables = list(reader.iter_unit(0, ["id"], 7, first_row=200))
    assert pa.concat_tables(tables).column("id").to_pylist() == list(range(200, 230))
    start, end = footer.unit_bytes(0)
    assert parsed == [end - int(footer.index.offsets[200 // 16])] and parsed[0] < (end - start) / 4


def test_the_row_index_comes_from_the_cache_when_planned_again(tmp_path):
    root = tmp_path / "data"
    write_csv_dataset(root)
    cache = str(tmp_path / "cache")
    before = ScanCounter.files_scanned
    first = StructuredDataset(str(root), format="csv", num_workers=0, split_bytes="2KiB", cache_dir=cache)
    assert ScanCounter.files_scanned - before == 4
    scanned = ScanCounter.bytes_scanned
    again = StructuredDataset(str(root), format="csv", num_workers=0, split_bytes="4KiB", cache_dir=cache)
    assert ScanCounter.files_scanned - before == 4 and ScanCounter.bytes_scanned == scanned  # no byte read again
    assert [layout.num_rows for layout in again._catalog.layouts] == [layout.num_rows for layout in first._catalog.layouts]
    assert len(again.splits) < len(first.splits)  # units follow split_bytes, the index does not
    write_csv(root / "a.csv", 0, 231)  # another version of one file: its index is built again
    StructuredDataset(str(root), format="csv", num_workers=0, cache_dir=cache)
    assert ScanCounter.files_scanned - before == 5
    StructuredDataset(str(root), format="csv", num_workers=0, cache_dir=cache, csv_options={"column_names": ["i", "n", "v"]})
    assert ScanCounter.files_scanned - before == 9  # the header is a record now: other boundaries


def test_csv_options_reach_pyarrow(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("# comment line\nid;flag;note\n1;yes;NA\n2;no;b\n")
    options = {"skip_rows": 1, "delimiter": ";", "true_values": ["yes"], "false_values": ["no"], "null_values": ["NA"], "strings_can_be_null": True}
    (batch,) = list(StructuredDataset(str(path), format="csv", num_workers=0, csv_options=options))
    assert batch["flag"].tolist() == [True, False] and batch["note"] == [None, "b"]
    typed = {"column_names": ["a", "b", "c"], "column_types": {"a": pa.float32()}, "skip_rows": 2, "delimiter": ";"}
    (batch,) = list(StructuredDataset(str(path), format="csv", num_workers=0, csv_options=typed))
    assert batch["a"].dtype.is_floating_point and batch["a"].tolist() == [1.0, 2.0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"delimeter": ","}, "unknown csv option 'delimeter'"),
        ({"use_threads": True}, "not accepted"),
        ({"encoding": "latin-1"}, "UTF-8"),
        ({"delimiter": ";;"}, r"csv_options \{'delimiter': ';;'\} are refused by pyarrow's ParseOptions"),
        ({"column_types": {"id": "nope"}}, "refused by pyarrow's ConvertOptions"),
    ],
)
def test_bad_csv_options_are_named(data, options, message):
    with pytest.raises(ValueError, match=message):
        StructuredDataset(data["csv"][0], format="csv", num_workers=0, csv_options=options)


def test_a_value_past_the_inferred_block_names_its_file_and_column(tmp_path):
    """Types are inferred from a file's first block: a later value that does not fit is refused naming
    the file and the column (pyarrow gives only its number), with the option that fixes it."""
    from torch_dataloader_utils import DataReadError

    path = tmp_path / "late.csv"
    path.write_text("a,id,score\n" + "".join(f"x,{i},{i}\n" for i in range(100_000)) + "x,5,2.5\n")
    with pytest.raises(DataReadError, match=rf"(?s){path}.*\(column 'score'\).*csv_options=\{{'column_types': \{{'score': 'string'\}}\}}"):
        list(StructuredDataset(str(path), format="csv", num_workers=0, columns=["id", "score"], csv_options={"block_size": 1 << 16}))


def test_options_of_another_format_are_refused(data):
    with pytest.raises(ValueError, match="json_options applies to format='jsonl'"):
        StructuredDataset(data["csv"][0], format="csv", num_workers=0, json_options={})


def test_an_un_unifiable_inferred_type_names_the_column_files_and_the_fix(tmp_path):
    (tmp_path / "a.csv").write_text("id,code\n1,7\n")
    (tmp_path / "b.csv").write_text("id,code\n2,x7\n")
    with pytest.raises(ValueError, match=r"(?s)'code' is int64 in .*a\.csv but string in .*b\.csv.*column_types"):
        StructuredDataset(str(tmp_path), format="csv", num_workers=0)
    dataset = StructuredDataset(str(tmp_path), format="csv", num_workers=0, csv_options={"column_types": {"code": pa.string()}})
    assert sorted(code for batch in dataset for code in batch["code"]) == ["7", "x7"]


def test_a_type_the_first_block_did_not_show_is_named_with_the_fix(tmp_path):
    lines = ["v"] + ["1"] * 3000 + ["2.5"]
    (tmp_path / "a.csv").write_text("\n".join(lines) + "\n")
    dataset = StructuredDataset(str(tmp_path), format="csv", num_workers=0, csv_options={"block_size": 1024})
    with pytest.raises(DataReadError, match=r"a\.csv.*invalid value '2\.5'.*column_types"):
        list(dataset)


def test_jsonl_fields_beyond_the_first_block_are_an_error_unless_ignored(tmp_path):
    lines = ['{"a": 1}'] * 400 + ['{"a": 2, "b": 3}']
    (tmp_path / "x.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataReadError, match="explicit_schema"):
        list(StructuredDataset(str(tmp_path), format="json", num_workers=0, json_options={"block_size": 1024}))
    ignored = StructuredDataset(str(tmp_path), format="json", num_workers=0, json_options={"block_size": 1024, "unexpected_field_behavior": "ignore"})
    assert sum(len(batch["a"]) for batch in ignored) == 401
    with pytest.raises(ValueError, match="unexpected_field_behavior='infer' is not accepted.*explicit_schema"):
        StructuredDataset(str(tmp_path), format="json", num_workers=0, json_options={"unexpected_field_behavior": "infer"})


def test_a_gzip_file_is_one_split_and_resumes_by_dropping_rows(tmp_path):
    write_jsonl(tmp_path / "x.jsonl.gz", 0, 300)
    dataset = StructuredDataset(str(tmp_path), format="jsonl", num_workers=0, batch_size=40, split_bytes=100)
    assert len(dataset.splits) == 1 and dataset._catalog.layouts[0].unit_rows == (300,)
    assert_resumes_exactly(lambda: StructuredDataset.create_dataloader(str(tmp_path), format="jsonl", num_workers=0, batch_size=40), epochs=1)


def test_a_file_changed_after_planning_is_refused(tmp_path):
    write_csv(tmp_path / "a.csv", 0, 50)
    dataset = StructuredDataset(str(tmp_path), format="csv", num_workers=0)
    shutil.copy(tmp_path / "a.csv", tmp_path / "b")
    write_csv(tmp_path / "a.csv", 0, 60)
    with pytest.raises(Exception, match="a.csv"):
        list(dataset)


def test_remote_csv_on_s3_resumes_exactly_and_reuses_the_cached_index(s3, data, tmp_path):
    root, rows = data["csv"]
    s3.upload(root, "text-csv")
    url = s3.url("text-csv")
    config = dict(CONFIG, num_workers=2, shuffle=True, storage_options=s3.options, cache_dir=str(tmp_path / "cache"))
    before = ScanCounter.files_scanned

    def make():
        return StructuredDataset.create_dataloader(url, format="csv", **config)

    reference = assert_resumes_exactly(make, epochs=1, stride=2, batch_key=ids)
    assert sorted(i for batch in reference.batches[0] for i in batch) == list(range(rows))
    assert ScanCounter.files_scanned - before == 4  # planned many times, scanned once


def test_split_rows_caps_text_units_and_splits(data):
    root, rows = data["csv"]
    dataset = StructuredDataset(root, format="csv", num_workers=0, batch_size=64, split_rows=40)
    assert max(split.row_length or 0 for split in dataset.splits) <= 40
    assert max(rows for layout in dataset._catalog.layouts[:2] for rows in layout.unit_rows) <= 32  # whole index entries of 16
    assert sorted(i for batch in dataset for i in ids(batch)) == list(range(rows))


def test_a_malformed_record_fails_its_unit_and_skip_reports_it(tmp_path):
    lines = ["id,name"] + [f"{i},n{i}" for i in range(100)]
    lines[60] = "59,n59,extra"  # a record with a field too many, in the second unit of 32 records
    (tmp_path / "a.csv").write_text("\n".join(lines) + "\n")
    config = dict(format="csv", num_workers=0, batch_size=10, split_bytes=300, csv_options={"block_size": 256})  # (inferred from 256 bytes)
    with pytest.raises(DataReadError, match=r"a\.csv.*Expected 2 columns, got 3"):
        list(StructuredDataset(str(tmp_path), **config))
    dataset = StructuredDataset(str(tmp_path), on_error="skip", **config)
    delivered = sorted(i for batch in dataset for i in ids(batch))
    (split, message), = dataset.skipped_splits
    assert 58 not in delivered and len(delivered) == 100 - split.row_length and "Expected 2 columns" in message


@pytest.mark.parametrize(("suffix", "codec"), [(".csv.bz2", "bz2"), (".csv.zst", "zstd"), (".tsv.gz", "gzip")])
def test_every_compression_is_one_unit_read_whole(tmp_path, suffix, codec):
    plain = tmp_path / "plain.csv"
    write_csv(plain, 0, 120, sep="\t" if suffix.startswith(".tsv") else ",")
    with pa.CompressedOutputStream(str(tmp_path / f"x{suffix}"), codec) as out:
        out.write(plain.read_bytes())
    plain.unlink()
    dataset = StructuredDataset(str(tmp_path), format=None, num_workers=0, batch_size=50, split_bytes=100)
    assert dataset._catalog.layouts[0].unit_rows == (120,)
    assert sorted(i for batch in dataset for i in ids(batch)) == list(range(120))


SPARK_DEFLATE = os.path.join(os.path.dirname(__file__), "fixtures", "spark", "deflate")


@pytest.mark.parametrize("kind", ["csv", "json"])
@pytest.mark.parametrize("workers", [0, 2])
def test_spark_deflate_files_are_read_exactly_once_and_resume(kind, workers):
    """Spark's compression="deflate" (Hive's compressed text too) writes zlib streams, *.csv.deflate
    and *.json.deflate: found with format=None and read as the rows Spark wrote."""

    def make():
        return StructuredDataset.create_dataloader(
            os.path.join(SPARK_DEFLATE, kind), format=None, num_workers=workers, batch_size=32, chunk_rows=64, shuffle=True, shuffle_buffer_rows=100
        )

    dataset = make()[1]
    assert dataset._catalog.layouts[0].unit_rows == (300,) and len(dataset) == 300
    reference = assert_resumes_exactly(make, epochs=1, stride=2, batch_key=lambda batch: tuple(zip(batch["id"].tolist(), batch["name"], batch["x"].tolist())))
    assert sorted(row for batch in reference.batches[0] for row in batch) == [(i, f"name {i}", i * 0.5) for i in range(300)]
    row = dataset[299]
    assert (row["id"].item(), row["name"], row["x"].item()) == (299, "name 299", 149.5)


def test_zlib_streams_one_after_another_and_a_damaged_one(tmp_path):
    import zlib

    (tmp_path / "two.csv.deflate").write_bytes(zlib.compress(b"id,s\n0,a\n1,b\n") + zlib.compress(b"2,c\n"))
    assert sorted(i for batch in StructuredDataset(str(tmp_path), format=None, num_workers=0) for i in ids(batch)) == [0, 1, 2]
    whole = zlib.compress(b"id\n" + b"".join(b"%d\n" % i for i in range(5000)))
    (tmp_path / "two.csv.deflate").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cannot read .*two\.csv\.deflate as csv .*Truncated compressed stream"):
        StructuredDataset(str(tmp_path), format=None, num_workers=0)


@pytest.mark.parametrize("workers", [0, 2])
def test_csv_with_carriage_return_line_ends_reads_every_row(tmp_path, workers):
    """Old Mac files (and pandas' lineterminator="\\r") end lines with a lone CR, which pyarrow reads."""
    (tmp_path / "a.csv").write_bytes(("id,s\r" + "".join(f'{i},"v{i}"\r' for i in range(600))).encode())
    (tmp_path / "b.csv").write_bytes(("id,s\n" + "".join(f"{i},w\n" for i in range(600, 610))).encode())

    def make():
        return StructuredDataset.create_dataloader(str(tmp_path), format="csv", batch_size=64, num_workers=workers, split_rows=250)

    loader, dataset = make()
    assert len(dataset) == 610
    assert sorted(i for batch in loader for i in batch["id"].tolist()) == list(range(610))
    assert_resumes_exactly(make, epochs=1, batch_key=lambda b: tuple(b["id"].tolist()), stride=4)


def test_jsonl_with_carriage_return_line_ends_reads_every_row(tmp_path):
    """pyarrow reads objects separated by lone CRs; planning counts them so (it counted 1 row)."""
    (tmp_path / "a.jsonl").write_bytes("".join(f'{{"id": {i}}}\r' for i in range(600)).encode())

    def make():
        return StructuredDataset.create_dataloader(str(tmp_path), format="jsonl", batch_size=64, num_workers=0, split_rows=250)

    loader, dataset = make()
    assert len(dataset) == 600 and len(dataset.splits) == 3
    assert sorted(i for batch in loader for i in batch["id"].tolist()) == list(range(600))
    assert_resumes_exactly(make, epochs=1, batch_key=lambda b: tuple(b["id"].tolist()), stride=3)


def test_a_jsonl_file_without_objects_is_refused_naming_it(tmp_path):
    (tmp_path / "ok.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "array.jsonl").write_text("[1, 2, 3]\n")
    with pytest.raises(ValueError, match=r"array\.jsonl .*no line holds '\{'"):
        StructuredDataset(str(tmp_path), format="jsonl", num_workers=0)


def test_a_checkpoint_refuses_other_reader_options(tmp_path):
    """skip_rows (like quoting or delimiters) decides which records a file holds: a resume with
    other csv_options would skip or repeat rows, so the state records them."""
    from torch_dataloader_utils import CheckpointMismatchError

    write_csv(tmp_path / "a.csv", 0, 300)

    def make(**options):
        return StructuredDataset.create_dataloader(str(tmp_path), format="csv", batch_size=10, num_workers=0, **options)

    names = {"column_names": ["id", "name", "val"]}
    loader, dataset = make(csv_options={**names, "skip_rows": 1})
    iterator = iter(loader)
    next(iterator)
    state = dataset.state_dict()
    with pytest.raises(CheckpointMismatchError, match=r"csv_options/json_options changed"):
        make(csv_options={**names, "skip_rows": 101})[1].load_state_dict(state)
    make(csv_options={"skip_rows": 1, **names})[1].load_state_dict(state)  # the same options in another order
    plain_loader, plain = make()
    next(iter(plain_loader))
    assert "_reader_options" not in plain.state_dict()


@pytest.mark.parametrize("workers", [0, 2])
def test_with_escape_char_a_csv_file_is_one_unit_and_resumes_exactly(tmp_path, workers):
    """The scan does not follow escapes: a file split where an escaped quote hid a newline from it
    delivered a row cut short and an invented one. As one unit, the row count check covers it."""
    rows = [f'{i},"v\\"{i}"' for i in range(300)]
    (tmp_path / "a.csv").write_text("id,s\n" + "\n".join(rows) + "\n")
    options = {"escape_char": "\\", "double_quote": False}

    def make():
        return StructuredDataset.create_dataloader(
            str(tmp_path), format="csv", csv_options=options, batch_size=16, num_workers=workers, split_bytes=512, shuffle=True, shuffle_seed=3
        )

    assert len(make()[1].splits) == 1
    reference = assert_resumes_exactly(make, epochs=1, points=[(0, 5)], batch_key=ids)
    assert sorted(i for batch in reference.batches[0] for i in batch) == list(range(300))
    hidden = rows[:100] + ['100,"x\\"y\n9999,z\\"w"', "101,\\\\", '102,"\\\\"'] + rows[103:]  # a newline after an escaped quote; escaped escapes
    (tmp_path / "a.csv").write_text("id,s\n" + "\n".join(hidden) + "\n")
    expected = pa_csv.read_csv(tmp_path / "a.csv", parse_options=pa_csv.ParseOptions(**options)).to_pylist()
    loader, dataset = make()
    assert len(dataset) == len(expected) == 300
    got = sorted((row for batch in loader for row in zip(batch["id"].tolist(), batch["s"])), key=lambda r: r[0])
    assert got == [(r["id"], r["s"]) for r in expected]


@pytest.mark.parametrize("block", [1, 2, 3, 7, 1 << 20])
def test_the_scan_follows_escapes_across_blocks(block):
    """Escaped quotes, escaped escapes and escaped line ends, cut into blocks of any size: the
    records pyarrow parses."""
    data = 'a,b\n1,"q\\"\nx"\n2,\\\\\n3,"\\\\"\n4,p\\\ny\n5,"\\""\n'.encode()
    parse = pa_csv.ParseOptions(escape_char="\\", double_quote=False)
    expected = pa_csv.read_csv(pa.py_buffer(data), parse_options=parse).num_rows
    scanner = _text_index.RecordScanner(ord('"'), 1, returns=True, escape=ord("\\"))
    index = _text_index.scan_records((data[i : i + block] for i in range(0, len(data), block)), scanner)
    assert index.rows == expected == 5


def test_a_csv_header_without_rows_names_its_columns(tmp_path):
    (tmp_path / "a.csv").write_text("id,s\n")
    dataset = StructuredDataset(str(tmp_path), format="csv", num_workers=0, columns=["id"])
    assert len(dataset) == 0 and StructuredDataset(str(tmp_path), format="csv", num_workers=0).schema.names == ["id", "s"]
    (tmp_path / "b.csv").write_text("id,s\n1,x\n")
    loader, both = StructuredDataset.create_dataloader(str(tmp_path), format="csv", num_workers=0, batch_size=4)
    assert both.schema.field("id").type == pa.int64() and [b["s"] for b in loader] == [["x"]]


def test_an_explicit_schema_is_not_extended_by_inference(tmp_path):
    """A field explicit_schema lacks is refused wherever it first appears, with advice that fits
    (the first block's fields became extra columns; a later one was told to pass explicit_schema)."""
    schema = pa.schema([("id", pa.int64())])
    (tmp_path / "a.jsonl").write_text("".join(f'{{"id": {i}, "extra": 1}}\n' for i in range(3)))
    with pytest.raises(ValueError, match=r"unexpected field\. The file does not fit json_options' explicit_schema: add the field"):
        StructuredDataset(str(tmp_path), format="jsonl", num_workers=0, json_options={"explicit_schema": schema})
    (tmp_path / "a.jsonl").write_text("".join(f'{{"id": {i}}}\n' for i in range(3000)) + '{"id": 3000, "extra": 1}\n')
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), format="jsonl", num_workers=0, json_options={"explicit_schema": schema, "block_size": 4096})
    with pytest.raises(DataReadError, match=r"does not fit json_options' explicit_schema"):
        list(loader)
    loader, dataset = StructuredDataset.create_dataloader(
        str(tmp_path), format="jsonl", num_workers=0, json_options={"explicit_schema": schema, "unexpected_field_behavior": "ignore"}
    )
    assert dataset.schema.names == ["id"] and sum(len(b["id"]) for b in loader) == 3001

"""formats/_text.py's reader on records as other writers lay them out: quote characters inside
unquoted fields, blank lines before the header, byte order marks inside a file, and parse errors
placed in the file."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.csv as pa_csv
import pytest

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.errors import DataReadError
from torch_dataloader_utils.testing import assert_resumes_exactly


@pytest.mark.parametrize("workers", [0, 2])
def test_quotes_inside_unquoted_fields_read_resume_and_index_as_pyarrow_reads_them(tmp_path, workers):
    """An inch mark (12" ruler) or a quote mid-field is a character to pyarrow; counted as a quote it
    made planning miscount the records, and dataset[i] give another row."""
    names = ['TV 55" screen', '"a\nb\nc"', 'ruler 12" long', 'say "hi"', '"quoted, ""twice"""']
    text = "id,name\n" + "".join(f"{i},{names[i % 5] if i % 7 == 0 else f'item {i}'}\n" for i in range(700))
    (tmp_path / "products.csv").write_text(text)
    expected = pa_csv.read_csv(tmp_path / "products.csv", parse_options=pa_csv.ParseOptions(newlines_in_values=True))

    def make():
        return StructuredDataset.create_dataloader(str(tmp_path), format="csv", batch_size=50, num_workers=workers, split_bytes=1024,
                                                   output_format="dict")  # fmt: skip

    loader, dataset = make()
    assert dataset.num_rows == len(dataset) == expected.num_rows == 700
    assert sorted(row for batch in loader for row in zip(batch["id"], batch["name"])) == list(zip(*expected.to_pydict().values()))
    assert [dataset[i]["name"] for i in range(0, 700, 7)] == expected.column("name").to_pylist()[::7]
    assert_resumes_exactly(make, epochs=1, batch_key=lambda b: tuple(b["id"]), stride=3)


def test_blank_lines_before_the_header_are_skipped_not_read_as_a_row(tmp_path):
    """pyarrow skips them; the planning scan took the blank line for the header, and the header
    arrived as a row (no error: the unit's row count matched)."""
    (tmp_path / "a.csv").write_bytes(b"\n\r\nname,city\n" + b"".join(b"n%d,c%d\n" % (i, i) for i in range(300)))
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), format="csv", batch_size=64, num_workers=0, output_format="dict", split_bytes=512)
    names = [name for batch in loader for name in batch["name"]]
    assert len(dataset) == 300 and names == [f"n{i}" for i in range(300)] and dataset[0]["name"] == "n0"


def test_a_parse_error_says_where_the_parse_started_and_fits_its_cause(tmp_path):
    """pyarrow numbers rows from the block it was given: the error says which data row that is; a
    value of another type than an explicit schema's gets advice about the type, not a missing field."""
    lines = [f"{i},{i}" for i in range(3000)]
    lines[2500] = "2500,1,extra"
    (tmp_path / "a.csv").write_text("id,v\n" + "\n".join(lines) + "\n")
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path / "a.csv"), format="csv", batch_size=500, num_workers=0, split_bytes=4096,
                                                    csv_options={"block_size": 4096})  # fmt: skip
    with pytest.raises(DataReadError, match=r"Expected 2 columns, got 3.*its Row #1 is data row 2,\d{3} of the file") as error:
        list(loader)
    started = int(str(error.value).split("Row #1 is data row ")[1].split(" ")[0].replace(",", ""))
    row = int(str(error.value).split("Row #")[1].split(":")[0])
    assert started + row - 1 == 2500
    (tmp_path / "b.jsonl").write_text('{"x": 1.5}\n{"x": "NaN"}\n')
    schema = pa.schema([("x", pa.float64())])
    with pytest.raises(ValueError, match=r"another JSON type than the column's type in json_options' explicit_schema"):
        list(StructuredDataset.create_dataloader(str(tmp_path / "b.jsonl"), format="jsonl", num_workers=0, json_options={"explicit_schema": schema})[0])
    (tmp_path / "c.jsonl").write_text('{"x": 1}\n' * 3000 + '{"x": 1,,}\n' + '{"x": 2}\n' * 100)
    for split_bytes in (1 << 20, 4096):  # the unit read whole, and streamed from an indexed record
        loader = StructuredDataset.create_dataloader(str(tmp_path / "c.jsonl"), format="jsonl", num_workers=0, split_bytes=split_bytes,
                                                     json_options={"block_size": 4096})[0]  # fmt: skip
        with pytest.raises(DataReadError, match=r"not valid JSON \(a truncated or damaged line\)") as error:
            list(loader)
        row = int(str(error.value).split(" in row ")[1].split(".")[0])
        block = int(str(error.value).split("its row 0 is data row ")[1].split(" ")[0].replace(",", ""))
        assert block + row == 3000


@pytest.mark.parametrize("split_bytes", [2048, 1 << 20])
def test_a_byte_order_mark_inside_a_file_is_kept_wherever_a_parse_starts(tmp_path, split_bytes):
    """pyarrow drops a mark at the start of what it parses: a record that starts with one lost it
    (a value silently, a line of the mark alone made the read fail) when a unit or an indexed
    record started there."""
    names = [f"r{i}" for i in range(600)]
    names[256], names[512] = "\ufeffBOMVALUE", "\ufeff"
    (tmp_path / "a.csv").write_text("name,id\n" + "".join(f"{n},{i}\n" for i, n in enumerate(names)), encoding="utf-8")
    expected = pa_csv.read_csv(tmp_path / "a.csv").column("name").to_pylist()
    assert expected[256] == "\ufeffBOMVALUE" and expected[512] == "\ufeff"
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), format="csv", batch_size=100, num_workers=0, output_format="dict",
                                                          split_bytes=split_bytes)  # fmt: skip
    assert [n for batch in loader for n in batch["name"]] == expected
    assert [dataset[i]["name"] for i in (256, 512, 255)] == [expected[256], expected[512], expected[255]]


@pytest.mark.parametrize("fmt, line", [("csv", "{i},{big}\n"), ("jsonl", '{{"i": {i}, "s": "{big}"}}\n')])
def test_a_record_longer_than_the_parse_block_is_named_with_the_option_that_reads_it(tmp_path, fmt, line):
    big = "x" * (2 << 20)
    (tmp_path / f"a.{fmt}").write_text(("i,s\n" if fmt == "csv" else "") + "".join(line.format(i=i, big=big if i == 1 else "y") for i in range(3)))
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), format=fmt, batch_size=8, num_workers=0)
    with pytest.raises((DataReadError, ValueError), match=r"the file is not damaged: pass \w+_options=\{'block_size': N\}"):
        list(loader)
    options = {f"{'csv' if fmt == 'csv' else 'json'}_options": {"block_size": 4 << 20}}
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), format=fmt, batch_size=8, num_workers=0, output_format="dict", **options)
    assert [len(s) for batch in loader for s in batch["s"]] == [1, 2 << 20, 1]

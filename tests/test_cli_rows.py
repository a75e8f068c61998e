"""``tdu rows``: rows by global row number, with their file and row in it."""

from __future__ import annotations

import argparse
import json

import pytest
from cli_helpers import run
from datagen import write_dataset

from torch_dataloader_utils.cli import main
from torch_dataloader_utils.cli.rows import parse_rows

LAYOUT = [[120, 80], [150]]
ROWS = 350


@pytest.fixture()
def data(tmp_path):
    write_dataset(tmp_path / "data", LAYOUT)
    return str(tmp_path / "data")


def test_parse_rows():
    assert parse_rows("5") == 5 and parse_rows("-1") == -1
    assert parse_rows("1000:1010") == slice(1000, 1010) and parse_rows("::100") == slice(None, None, 100)
    assert parse_rows("-3:") == slice(-3, None) and parse_rows("3,17,-2") == [3, 17, -2]
    for bad in ["a", "1:2:3:4", "1.5", "", "1:2:0"]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse_rows(bad)


def test_rows_prints_a_range_with_files_and_rows_in_them(capsys, data):
    code, out, _ = run(capsys, "rows", data, "198:202", "--columns", "id,text")
    assert code == 0
    assert "row 199  (" in out and "part-00000.parquet, row 199)" in out and "part-00001.parquet, row 0)" in out
    assert out.count("  id: ") == 4 and "  text: row-201" in out and "label" not in out


def test_rows_json_of_a_list_with_negative_indices(capsys, data):
    code, out, _ = run(capsys, "rows", data, "3,-1", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["num_rows"] == ROWS
    assert [r["row"] for r in result["rows"]] == [3, ROWS - 1]
    assert result["rows"][1]["row_in_file"] == 149 and result["rows"][1]["file"].endswith("part-00001.parquet")
    assert result["rows"][0]["values"] == {"id": 3, "label": 3, "x": 1.5, "vec": [3.0, 3.0, 3.0], "text": "row-3"}


@pytest.mark.parametrize("rows, expected", [("-5:-3", [ROWS - 5, ROWS - 4]), ("-2:", [ROWS - 2, ROWS - 1]), ("-1,-3", [ROWS - 1, ROWS - 3])])
def test_rows_starting_with_a_negative_row_are_not_taken_for_options(capsys, data, rows, expected):
    for argv in (["rows", data, rows, "--json"], ["rows", "--json", data, rows], ["-v", "rows", "--json", data, "--", rows]):
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        assert [r["row"] for r in json.loads(out)["rows"]] == expected


def test_rows_out_of_range_and_too_many_are_usage_errors(capsys, data):
    code, _, err = run(capsys, "rows", data, str(ROWS))
    assert code == 2 and f"row index {ROWS} is out of range for a dataset of {ROWS} rows" in err
    code, _, err = run(capsys, "rows", data, "0:300", "--limit", "100")
    assert code == 2 and "--limit" in err
    code, _, err = run(capsys, "rows", data, "::-1", "--limit", "100")
    assert code == 2 and "::-1 selects more than --limit 100 rows" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["rows", data, "x:y"])
    assert exit_info.value.code == 2 and "not rows: 'x:y'" in capsys.readouterr().err


def test_long_text_is_cut_to_the_width(capsys, data):
    code, out, _ = run(capsys, "rows", data, "7", "--width", "4")
    assert code == 0 and "  text: r..." in out

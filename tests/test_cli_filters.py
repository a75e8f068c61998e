"""tdu's --filters: the simple and the JSON syntax, and plan (of one dataset and of a mixture), bench and inspect with a filter."""

import argparse
import json

import pytest
from cli_helpers import run
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.cli.options import parse_filters

LAYOUT = [[40, 25], [30], [17, 18]]  # ids 0..129, label = id % 7
MATCHING = sum(1 for i in range(130) if i % 7 < 3)


@pytest.fixture()
def data(tmp_path):
    write_dataset(tmp_path / "data", LAYOUT)
    return str(tmp_path / "data")


@pytest.mark.parametrize(
    ("text", "dnf"),
    [
        ("label < 3", [("label", "<", 3)]),
        ("band = 1 and name = android", [("band", "=", 1), ("name", "=", "android")]),
        ("label in [1, 2] and text != row-5", [("label", "in", [1, 2]), ("text", "!=", "row-5")]),
        ('name not in ["a"] and x >= 0.5', [("name", "not in", ["a"]), ("x", ">=", 0.5)]),
        ('[["label", "=", 1]]', [("label", "=", 1)]),
        ('[[["id", "<", 5]], [["label", "in", [6]], ["id", ">", 150]]]', [[("id", "<", 5)], [("label", "in", [6]), ("id", ">", 150)]]),
    ],
)
def test_filters_syntax(text, dnf):
    assert parse_filters(text) == dnf


@pytest.mark.parametrize("text", ["label", "label <3", "[1, 2]", '[["a", "="]]', "[oops", "label < 3 and", "and label < 3", "a = 1 and  and b = 2"])
def test_bad_filters_say_what_is_expected(text):
    with pytest.raises(argparse.ArgumentTypeError, match="--filters"):
        parse_filters(text)


def test_plan_and_bench_count_the_matching_rows(capsys, data):
    code, out, _ = run(capsys, "plan", data, "--num-workers", 2, "--batch-size", 8, "--filters", "label < 3", "--json")
    assert code == 0 and json.loads(out)["rows"] == MATCHING
    code, out, _ = run(capsys, "bench", data, "--num-workers", 0, "--batch-size", 8, "--filters", '[["label", "<", 3]]', "--no-resume", "--json")
    assert code == 0 and json.loads(out)["rows"] == MATCHING
    code, _, err = run(capsys, "plan", data, "--filters", "nope < 3")
    assert code == 2 and "nope" in err


def test_inspect_checks_a_state_saved_with_a_filter(capsys, data, tmp_path):
    loader, dataset = StructuredDataset.create_dataloader(data, batch_size=8, num_workers=0, filters=[("label", "<", 3)])
    next(iter(loader))
    (tmp_path / "state.json").write_text(json.dumps(dataset.state_dict()))
    code, out, _ = run(capsys, "inspect", tmp_path / "state.json", data, "--filters", "label < 3", "--json")
    assert code == 0 and json.loads(out)[0]["matches_data"]["rows_remaining"] == MATCHING - 8
    code, out, _ = run(capsys, "inspect", tmp_path / "state.json", data, "--json")
    assert code == 1 and "filters changed" in out


def test_plan_of_a_mixture_shares_the_matching_rows(capsys, data, tmp_path):
    write_dataset(tmp_path / "other", [[20, 20]])  # ids 0..39
    other = str(tmp_path / "other")
    code, out, _ = run(capsys, "plan", data, other, "--weight", 1, 1, "--epoch-rows", 40, "--filters", "label < 3", "--json")
    assert code == 0
    sources = json.loads(out)["sources"]
    assert [s["rows"] for s in sources] == [MATCHING, sum(1 for i in range(40) if i % 7 < 3)]
    assert [s["rows_per_epoch"] for s in sources] == [20, 20]


def test_plan_of_a_mixture_names_each_sources_format(capsys, data, tmp_path):
    write_dataset(tmp_path / "stripes", [[20, 20]], fmt="orc")
    code, out, _ = run(capsys, "plan", data, tmp_path / "stripes", "--weight", 1, 1)
    assert code == 0 and "(orc+parquet)" in out and "row groups / stripes" in out

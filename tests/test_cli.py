"""The tdu command line: plan, bench, usage errors, exit codes, entry points and the planning progress bar."""

import json
import runpy
import subprocess
import sys
import time

import pytest
from cli_helpers import LAYOUT, ROWS, SPLIT_BYTES, data, run  # noqa: F401 - fixtures
from datagen import corrupt_data_pages, write_dataset

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.catalog import progress_bar as progress_module
from torch_dataloader_utils.catalog.build import build_catalog
from torch_dataloader_utils.cli import main
from torch_dataloader_utils.cli.options import parse_size


# ---------------------------------------------------------------- plan
def test_plan_numbers_match_what_each_rank_delivers(capsys, data):
    code, out, _ = run(capsys, "plan", data, "--world-size", 2, "--num-workers", 2, "--split-bytes", SPLIT_BYTES,
                       "--batch-size", 8, "--shuffle", "--shuffle-seed", 4, "--epoch", 1, "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["files"] == len(LAYOUT) and plan["rows"] == ROWS and plan["splits"] > len(LAYOUT)
    for rank in range(2):
        kwargs = dict(world_size=2, rank=rank, num_workers=2, split_bytes=SPLIT_BYTES, batch_size=8, shuffle=True, shuffle_seed=4)
        unequal = StructuredDataset(data, equalize="none", **kwargs)
        padded = StructuredDataset(data, **kwargs)
        for dataset in (unequal, padded):
            dataset.set_epoch(1)
        assert plan["ranks"][rank]["rows"] == len(unequal)
        assert plan["ranks"][rank]["batches"] == unequal.num_batches()
        assert plan["ranks"][rank]["batches_delivered"] == padded.num_batches()
        lanes = [w["rows"] for w in plan["workers"] if w["rank"] == rank]
        assert lanes == padded.state_dict()["rows_total"]


def test_plan_counts_the_files_cut_into_several_splits(capsys, data):
    # one split per row group: every file but the one with a single row group is cut
    code, out, _ = run(capsys, "plan", data, "--split-bytes", 1, "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["splits"] == sum(map(len, LAYOUT)) and plan["files_cut"] == sum(len(groups) > 1 for groups in LAYOUT)


def test_plan_text_and_idle_worker_advice(capsys, data):
    code, out, _ = run(capsys, "plan", data, "--num-workers", 8, "-v")  # default split_bytes: one split per file
    assert code == 0
    assert f"{ROWS:,} rows" in out and "rank worker" in out
    assert "4 of 8 workers get no split" in out and "--split-bytes" in out


def test_plan_of_a_missing_path_is_a_usage_error(capsys, tmp_path):
    code, out, err = run(capsys, "plan", tmp_path / "nothing-here")
    assert code == 2 and "tdu plan: error:" in err and "nothing-here" in err


def test_usage_errors_exit_2(capsys):
    huge = "99999999999999999999"
    for argv, message in (
        (["plan"], "required: PATH"),
        (["plan", "x", "--split-bytes", "12X"], "12X"),
        (["plan", "x", "--world-size", "0"], "must be >= 1: '0'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["plan", "x", "--shuffle", "--epoch", huge], f"argument --epoch: must be <= 4,294,967,295: '{huge}'"),
        (["bench", "x", "--batch-size", huge], f"argument --batch-size: must be <= 2,147,483,647: '{huge}'"),
        (["bench", "x", "--chunk-rows", huge], "argument --chunk-rows: must be <= 2,147,483,647"),
        (["bench", "x", "--seconds", "nan"], "tdu bench: error: --seconds must be a positive number of seconds, got nan"),
        (["bench", "x", "--seconds", "0"], "usage: tdu bench"),
        (["demo", "--checkpoint-at", "1"], "tdu demo: error: --checkpoint-at must be a fraction"),
        (["bench", "x", "--seconds", "inf"], "got inf"),
        (["plan", "x", "--split-bytes", "99999999999999999999999"], "argument --split-bytes: size must be <= 4,611,686,018,427,387,904 bytes"),
        (["plan", "--rows-per-epoch", "5", "9", "a/", "b/"], "not an integer: 'a/'; if it is a PATH, write the PATHs before --rows-per-epoch, or end its values with --"),
        (["plan", "--weight", "0.5", "b/"], "not a number: 'b/'; if it is a PATH, write the PATHs before --weight"),
        (["plan", "a/", "--rows-per-epoch", "0"], "argument --rows-per-epoch: must be >= 1: '0'\n"),  # (a number: no PATH hint)
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err, argv
    assert main([]) == 2  # no command: help, exit 2
    assert "plan" in capsys.readouterr().out


def test_parse_size():
    assert parse_size("64MiB") == 64 << 20 and parse_size("1.5KB") == 1500 and parse_size("4096") == 4096



# --------------------------------------------------------------- bench
def test_bench_reports_throughput_with_its_config_and_a_resume(capsys, data):
    code, out, _ = run(capsys, "bench", data, "--batch-size", 8, "--num-workers", 1, "--split-bytes", SPLIT_BYTES,
                       "--max-batches", 6, "--columns", "id,x", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["batches"] == 6 and result["rows"] == 48
    assert result["config"]["columns"] == ["id", "x"] and result["config"]["num_workers"] == 1
    assert result["rows_per_s"] > 0 and result["resume"]["got_batch"] and result["resume"]["at_batch"] == 3


def test_bench_never_prints_storage_option_values(capsys, data):
    for extra in ([], ["--json"]):
        code, out, _ = run(capsys, "bench", data, "--num-workers", 0, "--max-batches", 2, "--storage-option", "secret=hunter2", *extra)
        assert code == 0 and "secret" in out and "hunter2" not in out


def test_bench_resumes_from_the_middle_of_what_it_read_when_time_runs_out(capsys, data):
    # the worker process takes far longer than 1 ms to start, so the time budget ends the loop after its first batch
    code, out, _ = run(capsys, "bench", data, "--batch-size", 8, "--num-workers", 1, "--split-bytes", SPLIT_BYTES,
                       "--seconds", 0.001, "--json")
    assert code == 0
    result = json.loads(out)
    assert result["batches"] < result["batches_in_epoch"] // 2  # stopped before the planned midpoint
    resume = result["resume"]
    assert resume["got_batch"] and 1 <= resume["at_batch"] <= max(1, result["batches"] // 2 + 1)
    code, out, _ = run(capsys, "bench", data, "--batch-size", 8, "--num-workers", 1, "--split-bytes", SPLIT_BYTES,
                       "--seconds", 0.001)
    assert code == 0 and "resume       at batch" in out


def test_bench_of_a_one_batch_epoch_says_there_is_no_resume_to_time(capsys, caplog, tmp_path):
    write_dataset(tmp_path / "tiny", [[5]])
    code, out, _ = run(capsys, "bench", tmp_path / "tiny", "--batch-size", 8, "--num-workers", 0)
    assert code == 0 and "no batch comes after it (the epoch ends there), nothing to time" in out
    assert "load_state_dict -> first batch" not in out
    assert "set_epoch" not in caplog.text  # the library's warning about a state at the epoch's end is not the user's concern


def test_errors_give_advice_in_tdu_options(capsys, tmp_path):
    (tmp_path / "t.txt").write_text("id\n1\n")
    code, _, err = run(capsys, "plan", tmp_path / "t.txt")
    assert code == 2 and "pass --format, one of parquet, orc, arrow, csv, jsonl" in err and "format='" not in err
    write_dataset(tmp_path / "orc", [[5]], "orc")
    code, _, err = run(capsys, "plan", tmp_path / "orc", "--format", "parquet")
    assert code == 2 and "orc files are there: to read those, pass --format orc (or no --format to infer it)" in err
    assert "format='" not in err
    code, _, err = run(capsys, "plan", tmp_path / "missing")
    assert code == 2 and "check the path and --storage-option" in err


    mixed = tmp_path / "mixed"
    write_dataset(mixed / "a", [[5]], "orc")
    write_dataset(mixed / "b", [[5]])
    code, _, err = run(capsys, "plan", mixed)
    assert code == 2 and "pass --format with the one to read, or a path holding one format" in err and "format=" not in err
    code, _, err = run(capsys, "bench", tmp_path / "orc", "--columns", ",")
    assert code == 2 and "leave out --columns for all columns" in err and "None" not in err


@pytest.mark.parametrize("workers", [0, 2])
def test_bench_of_a_damaged_file_is_one_error_without_a_traceback(capsys, tmp_path, workers):
    """A worker's error reaches the main process with the worker's traceback in its message."""
    write_dataset(tmp_path / "d", [[40], [40]])
    damaged = sorted((tmp_path / "d").iterdir())[1]
    corrupt_data_pages(str(damaged))
    code, _, err = run(capsys, "bench", tmp_path / "d", "--num-workers", workers, "--batch-size", 8)
    assert code == 2, err
    assert err.startswith(f"tdu bench: error: cannot read {damaged} (split ")
    assert err.rstrip().endswith("If the file is damaged, replace or remove it"), err  # no on_error option in tdu
    assert "Traceback" not in err and "File \"" not in err and len(err.strip().splitlines()) == 1, err


def test_plan_advice_for_idle_workers_fits_what_can_be_cut(capsys, tmp_path):
    write_dataset(tmp_path / "one", [[50]])  # one row group: no smaller split exists
    code, out, _ = run(capsys, "plan", tmp_path / "one", "--num-workers", 4, "--split-bytes", 100)
    assert code == 0 and "3 of 4 workers get no split" in out
    assert "already a split of its own: use fewer workers" in out and "Lower --split-bytes" not in out


def test_plan_advice_for_uneven_workers_fits_what_can_be_cut(capsys, tmp_path):
    write_dataset(tmp_path / "whole", [[60], [10], [10], [10]])  # every row group is a split already
    code, out, _ = run(capsys, "plan", tmp_path / "whole", "--num-workers", 2, "--split-bytes", 1)
    assert code == 0 and "more than 25% above the mean" in out
    assert "already a split of its own" in out and "--split-bytes) balance better" not in out
    write_dataset(tmp_path / "cuttable", [[45, 45], [10], [10], [10]])  # the first file can be cut in two
    code, out, _ = run(capsys, "plan", tmp_path / "cuttable", "--num-workers", 2, "--split-bytes", "1GiB")
    assert code == 0 and "smaller splits (--split-bytes) balance better" in out


def test_bench_keeps_the_state_nearest_the_middle_of_any_stop(data):
    from torch_dataloader_utils.cli.bench import _MidpointStates

    loader, dataset = StructuredDataset.create_dataloader(data, batch_size=8, num_workers=1, split_bytes=SPLIT_BYTES)
    states = _MidpointStates(dataset.state_dict, planned_midpoint=10_000)  # never reached
    middles = {}
    for index, _ in enumerate(loader, start=1):
        states.after_batch(index)
        middles[index] = states.middle()
    assert index >= 24
    for read, (at, state) in middles.items():
        assert abs(at - read / 2) <= max(1, 0.15 * read), (read, at)
        assert sum(state["rows_delivered"]) == 8 * at  # the state was taken after batch `at`
    assert middles[20][0] == 10 and middles[13][0] == 6


# ------------------------------------------------------ entry points
def test_module_and_console_script_show_help(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["tdu", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("torch_dataloader_utils", run_name="__main__")
    assert exit_info.value.code == 0 and "usage: tdu" in capsys.readouterr().out
    result = subprocess.run(["tdu", "inspect", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage: tdu inspect" in result.stdout


# ------------------------------------------------------------ progress
def test_planning_progress_bar_when_slow_and_silent_otherwise(capsys, data, monkeypatch):
    monkeypatch.setattr(progress_module, "PROGRESS_DELAY_S", 0.0)  # as if planning took longer than the delay
    build_catalog(data, "parquet", None, SPLIT_BYTES)
    err = capsys.readouterr().err
    assert "reading footers" in err and "100%" in err  # pytest's stderr is not a terminal: the bar is left as a log line
    monkeypatch.setenv("TDU_PROGRESS", "0")
    build_catalog(data, "parquet", None, SPLIT_BYTES)
    assert capsys.readouterr().err == ""
    monkeypatch.delenv("TDU_PROGRESS")
    monkeypatch.setattr(progress_module, "PROGRESS_DELAY_S", 60.0)  # fast planning never shows the bar
    build_catalog(data, "parquet", None, SPLIT_BYTES)
    assert capsys.readouterr().err == ""


def test_the_filter_count_bar_counts_its_delay_from_the_start_of_planning(capsys, data, monkeypatch):
    """Counting the rows filters= keep is planning too: its bar shows once planning (listing and
    footers included) has lasted the delay, however fast the count itself is."""
    from torch_dataloader_utils.catalog import build

    listed = build.discover_files

    def slow_listing(*args, **kwargs):
        time.sleep(0.4)
        return listed(*args, **kwargs)

    monkeypatch.setattr(build, "discover_files", slow_listing)
    monkeypatch.setattr(progress_module, "PROGRESS_DELAY_S", 0.3)
    StructuredDataset(data, num_workers=0, filters=[("id", "in", [3, 50, 97])])
    assert "counting rows that match filters" in capsys.readouterr().err


def test_a_log_gets_the_bar_once_the_delay_has_passed_then_at_most_every_interval(monkeypatch):
    """On a stream that is not a terminal the first line is written at the delay (not at the
    log interval), and the last line is kept."""
    import io

    monkeypatch.setattr(progress_module, "PROGRESS_DELAY_S", 0.2)
    monkeypatch.setattr(progress_module, "LOG_INTERVAL_S", 60.0)
    log = io.StringIO()

    def slow():
        for item in range(8):
            time.sleep(0.1)
            yield item

    assert list(progress_module.progress(slow(), 8, "reading footers", stream=log)) == list(range(8))
    lines = [line for line in log.getvalue().replace("\r", "\n").splitlines() if line.strip()]
    assert lines and "8/8" in lines[-1] and len(lines) <= 3  # the first at the delay, the last at the end


def test_a_batch_of_requests_that_reports_no_progress_still_shows_its_bar(monkeypatch):
    """Remote footers are fetched in one concurrent batch: its bar appears once planning has lasted
    the delay, while the batch is still running, and nothing is written for a fast one."""
    import io

    monkeypatch.setattr(progress_module, "PROGRESS_DELAY_S", 0.2)
    for seconds, shown in ((0.8, True), (0.02, False)):
        log, lines_during = io.StringIO(), []
        with progress_module.waiting(20, "fetching footers", stream=log):
            time.sleep(seconds)
            lines_during.append(log.getvalue())
        assert ("0/20" in lines_during[0]) is shown and ("20/20" in log.getvalue()) is shown
        assert shown or log.getvalue() == ""


def test_the_bar_delay_counts_from_the_start_of_planning_listing_included(capsys, data, monkeypatch):
    """Listing thousands of files (or a slow store) is planning too: the bar's delay is not started
    again when the footer reads begin."""
    from torch_dataloader_utils.catalog import build

    listed = build.discover_files

    def slow_listing(*args, **kwargs):
        time.sleep(0.4)
        return listed(*args, **kwargs)

    monkeypatch.setattr(build, "discover_files", slow_listing)
    monkeypatch.setattr(progress_module, "PROGRESS_DELAY_S", 0.3)  # passed while listing
    build_catalog(data, "parquet", None, SPLIT_BYTES)
    assert "reading footers" in capsys.readouterr().err


def test_bench_reads_nulls_in_number_columns_with_the_nulls_option(capsys, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "nulls").mkdir()
    pq.write_table(pa.table({"x": pa.array([1, None, 3] * 10, pa.int64())}), tmp_path / "nulls" / "a.parquet")
    code, _, err = run(capsys, "bench", tmp_path / "nulls", "--num-workers", 0, "--batch-size", 8, "--no-resume")
    assert code == 2 and "--nulls fill" in err and "nulls='" not in err
    for policy in ("fill", "mask"):
        code, out, _ = run(capsys, "bench", tmp_path / "nulls", "--num-workers", 0, "--batch-size", 8, "--no-resume", "--nulls", policy, "--json")
        assert code == 0 and json.loads(out)["rows"] == 30


# --------------------------------------------------------------- errors under -v
@pytest.mark.parametrize("verbose", ["-v", "-vv"])
def test_verbose_input_errors_show_the_traceback_and_still_exit_2(capsys, tmp_path, verbose):
    (tmp_path / "x.parquet").write_bytes(b"not a parquet file")
    for path, message in ((tmp_path / "no-such-dir", "no-such-dir"), (tmp_path / "x.parquet", "cannot read the parquet footer")):
        code, _, err = run(capsys, verbose, "plan", path)
        assert code == 2, err
        assert "Traceback (most recent call last)" in err
        last = err.strip().splitlines()[-1]
        assert last.startswith("tdu plan: error: ") and message in last


def test_demo_dir_that_is_a_file_is_a_usage_error(capsys, tmp_path):
    (tmp_path / "taken").write_text("x")
    code, _, err = run(capsys, "demo", "--dir", tmp_path / "taken")
    assert code == 2 and "is a file; give a new or empty directory" in err

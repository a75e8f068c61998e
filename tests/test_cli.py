"""The tdu command line: plan, inspect, bench, usage errors, exit codes, and the planning progress bar."""

import json
import os
import runpy
import subprocess
import sys

import pytest
import torch
from cli_helpers import run
from datagen import corrupt_data_pages, write_dataset

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.catalog import progress_bar as progress_module
from torch_dataloader_utils.catalog.build import build_catalog
from torch_dataloader_utils.cli import main
from torch_dataloader_utils.cli.options import parse_size

LAYOUT = [[40, 25, 30], [30], [17, 18, 20], [50, 10]]
ROWS = sum(map(sum, LAYOUT))
SPLIT_BYTES = 3000


@pytest.fixture()
def data(tmp_path):
    root = tmp_path / "data"
    write_dataset(root, LAYOUT)
    return str(root)


def saved_state(data, path, batches=3, **config):
    config = dict(batch_size=8, num_workers=2, split_bytes=SPLIT_BYTES, **config)
    loader, dataset = StructuredDataset.create_dataloader(data, **config)
    for index, _ in enumerate(loader):
        if index + 1 == batches:
            break
    state = dataset.state_dict()
    with open(path, "w") as file:
        json.dump(state, file)
    return state, dataset


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
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err, argv
    assert main([]) == 2  # no command: help, exit 2
    assert "plan" in capsys.readouterr().out


def test_parse_size():
    assert parse_size("64MiB") == 64 << 20 and parse_size("1.5KB") == 1500 and parse_size("4096") == 4096


# ------------------------------------------------------------- inspect
def test_inspect_json_state_reports_progress_and_rows_remaining(capsys, data, tmp_path):
    state, dataset = saved_state(data, tmp_path / "state.json")
    code, out, _ = run(capsys, "inspect", tmp_path / "state.json", "--json")
    assert code == 0
    (info,) = json.loads(out)
    assert info["epoch"] == 0 and info["topology"]["num_workers"] == 2
    assert info["rows_delivered"] == 24 and info["rows_remaining"] == len(dataset) - 24
    code, out, _ = run(capsys, "inspect", tmp_path / "state.json")
    assert "24 rows delivered" in out and f"{len(dataset) - 24:,} rows in epoch 0" in out


def test_inspect_finds_the_state_in_a_torch_checkpoint(capsys, data, tmp_path):
    state, _ = saved_state(data, tmp_path / "state.json")
    torch.save({"model": {"w": torch.ones(2)}, "dataset": state, "step": 3}, tmp_path / "ckpt.pt")
    code, out, _ = run(capsys, "inspect", tmp_path / "ckpt.pt")
    assert code == 0 and "at key 'dataset'" in out
    code, out, _ = run(capsys, "inspect", tmp_path / "ckpt.pt", "--key", "dataset", data)
    assert code == 0 and "matches" in out and "YES" in out
    code, _, err = run(capsys, "inspect", tmp_path / "ckpt.pt", "--key", "model")
    assert code == 2 and "not a torch_dataloader_utils dataset state" in err
    code, _, err = run(capsys, "inspect", tmp_path / "ckpt.pt", "--key", "optimizer")
    assert code == 2 and "available" in err and "dataset" in err


def test_inspect_a_worker_state_checks_it_without_loading_it(capsys, data, tmp_path):
    from torchdata.stateful_dataloader import StatefulDataLoader

    dataset = StructuredDataset(data, batch_size=8, num_workers=2, split_bytes=SPLIT_BYTES)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    worker = loader.state_dict()["_snapshot"]["_worker_snapshots"]["worker_1"]["dataset_state"]
    del it, loader
    with open(tmp_path / "worker.json", "w") as file:
        json.dump(worker, file)
    code, out, _ = run(capsys, "inspect", tmp_path / "worker.json", data)
    assert code == 0 and "YES" in out and "loader.load_state_dict" in out
    write_dataset(tmp_path / "other", [[5]], first_id=ROWS)
    code, out, _ = run(capsys, "inspect", tmp_path / "worker.json", str(tmp_path / "other"))
    assert code == 1 and "NO" in out and "file list changed" in out


def test_inspect_a_list_of_rank_states_and_a_global_state(capsys, data, tmp_path):
    from torch_dataloader_utils.distributed import merge_states

    states = [saved_state(data, tmp_path / f"s{r}.json", world_size=2, rank=r)[0] for r in range(2)]
    torch.save({"dataset_states": states, "global": merge_states(states)}, tmp_path / "ddp.pt")
    code, out, _ = run(capsys, "inspect", tmp_path / "ddp.pt", data)
    assert code == 0
    assert "'dataset_states.0'" in out and "'dataset_states.1'" in out
    assert "global (global state) rank 0" in out and "global (global state) rank 1" in out
    assert out.count("YES") == 4


def test_inspect_key_reaches_a_state_under_an_integer_dict_key(capsys, data, tmp_path):
    """{rank: state}: inspect names it 'dataset_states.1', and --key takes that name back."""
    states = {r: saved_state(data, tmp_path / f"s{r}.json", world_size=2, rank=r)[0] for r in range(2)}
    torch.save({"dataset_states": states}, tmp_path / "ddp.pt")
    code, out, _ = run(capsys, "inspect", tmp_path / "ddp.pt")
    assert code == 0 and "'dataset_states.1'" in out
    code, out, err = run(capsys, "inspect", tmp_path / "ddp.pt", "--key", "dataset_states.1", data)
    assert code == 0, err
    assert "'dataset_states.1'" in out and "rank=1," in out and "YES" in out and "dataset_states.0" not in out


def test_inspect_one_rank_entry_of_a_global_state(capsys, data, tmp_path):
    """--key ranks.1 is that rank's complete state (the entry with the global state's files);
    the entry saved on its own is named as such, not taken for changed data."""
    from torch_dataloader_utils import CheckpointMismatchError
    from torch_dataloader_utils.distributed import merge_states

    states = [saved_state(data, tmp_path / f"s{r}.json", world_size=2, rank=r)[0] for r in range(2)]
    (tmp_path / "global.json").write_text(json.dumps(merge_states(states)))
    code, out, err = run(capsys, "inspect", tmp_path / "global.json", "--key", "ranks.1", data)
    assert code == 0 and "'ranks.1'" in out and "rank=1," in out and "YES" in out, (out, err)
    entry = merge_states(states)["ranks"][1]
    (tmp_path / "entry.json").write_text(json.dumps(entry))
    code, out, _ = run(capsys, "inspect", tmp_path / "entry.json", data)
    assert code == 1 and "one rank's entry of a global state" in out and "local_state" in out and "data changed" not in out
    dataset = StructuredDataset(data, batch_size=8, num_workers=2, split_bytes=SPLIT_BYTES, world_size=2, rank=1)
    with pytest.raises(CheckpointMismatchError, match="one rank's entry of a global state"):
        dataset.load_state_dict(entry)


def test_inspect_shows_the_padding_batches_delivered_and_still_to_come(capsys, tmp_path):
    """A short rank under equalize="pad" has delivered its own rows but owes padding batches."""
    write_dataset(tmp_path / "d", [[300], [40], [40]])
    config = dict(batch_size=8, num_workers=0, world_size=3, rank=2)
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path / "d"), **config)
    total = len(loader)
    for index, _ in enumerate(loader):
        if index == 9:
            break
    state = dataset.state_dict()
    assert dataset.last_batch_is_padding and state["padding_delivered"] > 0
    (tmp_path / "state.json").write_text(json.dumps(state))
    padding_done = state["padding_delivered"] // 8
    code, out, _ = run(capsys, "inspect", tmp_path / "state.json", tmp_path / "d")
    assert code == 0
    assert f"batches    10 delivered, {padding_done} of them padding" in out
    assert f"batches: {total} in epoch 0, {total - 10} still to come, of them {total - 10} padding" in out
    code, out, _ = run(capsys, "inspect", tmp_path / "state.json", tmp_path / "d", "--json")
    (info,) = json.loads(out)
    assert (info["batches_delivered"], info["padding_delivered"], info["padding_batches_delivered"]) == (10, state["padding_delivered"], padding_done)
    check = info["matches_data"]
    assert (check["batches_total"], check["batches_remaining"], check["padding_batches_remaining"]) == (total, total - 10, total - 10)


def test_inspect_matches_data_with_columns_the_job_left_out(capsys, tmp_path):
    """The state does not record `columns`; a column the job never read needs no batch form."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(tmp_path / "d")
    pq.write_table(pa.table({"id": list(range(40)), "meta": [{"a": i} for i in range(40)]}), tmp_path / "d" / "a.parquet")
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path / "d"), batch_size=8, num_workers=0, columns=["id"])
    next(iter(loader))
    with open(tmp_path / "state.json", "w") as file:
        json.dump(dataset.state_dict(), file)
    code, out, _ = run(capsys, "inspect", tmp_path / "state.json", tmp_path / "d", "--json")
    (info,) = json.loads(out)
    assert code == 0 and info["matches_data"]["matches"], info["matches_data"]
    assert info["matches_data"]["rows_remaining"] == 32


def test_inspect_checks_a_state_with_its_own_chunk_rows_and_names_a_damaged_one(capsys, caplog, data, tmp_path):
    """chunk_rows is not a check (another value resumes in another order, with a warning): inspect
    builds its dataset with the state's value, so it neither warns nor advises another one."""
    state, _ = saved_state(data, tmp_path / "state.json", chunk_rows=16)
    assert state["chunk_rows"] == 16
    with caplog.at_level("WARNING"):
        code, out, _ = run(capsys, "inspect", tmp_path / "state.json", data)
    assert code == 0 and "YES" in out
    assert not [r for r in caplog.records if "chunk_rows" in r.getMessage()]
    with open(tmp_path / "bad.json", "w") as file:
        json.dump(dict(state, chunk_rows="many"), file)
    code, out, err = run(capsys, "inspect", tmp_path / "bad.json", data)
    assert code == 2 and out == "" and "state key 'chunk_rows' is damaged" in err


def test_inspect_with_changed_data_says_no_and_why(capsys, data, tmp_path):
    saved_state(data, tmp_path / "state.json", shuffle=True, shuffle_seed=9)
    write_dataset(data, [[5]], first_id=10_000)  # overwrites part-00000 with another size
    code, out, _ = run(capsys, "inspect", tmp_path / "state.json", data)
    assert code == 1
    assert "NO" in out and "file rewritten since the checkpoint" in out and "part-00000.parquet" in out


class _Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):  # unpickling would create the marker directory
        return (os.mkdir, (self.marker,))


@pytest.mark.parametrize("zip_format", [True, False])
def test_inspect_never_runs_code_from_a_checkpoint(capsys, tmp_path, zip_format):
    marker = tmp_path / "pwned"
    torch.save({"dataset": _Evil(marker)}, tmp_path / "evil.pt", _use_new_zipfile_serialization=zip_format)
    code, _, err = run(capsys, "inspect", tmp_path / "evil.pt")
    assert code == 2 and "weights_only=True" in err and "neither JSON nor" not in err  # torch's reason, in both formats
    assert not marker.exists()


def test_inspect_rejects_missing_and_unrelated_files(capsys, tmp_path):
    code, _, err = run(capsys, "inspect", tmp_path / "absent.json")
    assert code == 2 and "no such file" in err
    code, _, err = run(capsys, "inspect", tmp_path)
    assert code == 2 and "is a directory" in err
    (tmp_path / "other.json").write_text('{"model": 1}')
    code, _, err = run(capsys, "inspect", tmp_path / "other.json")
    assert code == 2 and "--key" in err
    (tmp_path / "table.csv").write_text("id,x\n1,2\n")
    code, _, err = run(capsys, "inspect", tmp_path / "table.csv")
    assert code == 2 and "it is neither JSON nor a file torch.save writes" in err
    (tmp_path / "scalar.json").write_text('"hello"')
    code, _, err = run(capsys, "inspect", tmp_path / "scalar.json")
    assert code == 2 and "holds a str ('hello'), not a dataset state" in err
    torch.save({"dataset": {"epoch": 0}}, tmp_path / "whole.pt")
    saved = (tmp_path / "whole.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(saved[: len(saved) // 2])  # a copy cut short: torch's reason is kept
    code, _, err = run(capsys, "inspect", tmp_path / "truncated.pt")
    assert code == 2 and "checkpoint file is corrupted" in err and "neither JSON nor" not in err


@pytest.mark.parametrize(
    "key, value, scope",
    [("rows_delivered", ["x"], "rank"), ("rows_total", "many", "rank"), ("in_progress", [{"splits": [7]}], "rank"),
     ("_world_size", 1.5, "rank"), ("rows_delivered", None, "worker"), ("epoch", "zz", "rank"), ("epoch", "zz", "worker"),
     ("next_worker", 99, "rank"), ("next_worker", "1", "rank"), ("rows_delivered", [10**9, 0], "rank"), ("rows_total", [10**6], "rank"),
     ("files", None, "rank"), ("files", [], "rank"), ("completed_shards", None, "rank"),
     ("_shuffle", "yes", "rank"), ("_drop_last", 2, "rank"), ("_shuffle_seed", -1, "rank")],
)
def test_inspect_a_damaged_state_is_an_input_error_naming_the_key(capsys, data, tmp_path, key, value, scope):
    state, _ = saved_state(data, tmp_path / "state.json")
    if scope == "worker":  # what a StatefulDataLoader worker saves
        state = {**{k: v for k, v in state.items() if k.startswith("_")}, "format_version": 1, "scope": "worker",
                 "epoch": 0, "worker": 0, "rows_delivered": 8, "files_digest": "d"}
    torch.save({"dataset": {**state, key: value}}, tmp_path / "ckpt.pt")
    for argv in (["--json"], [data]):
        code, out, err = run(capsys, "inspect", tmp_path / "ckpt.pt", *argv)
        assert code == 2 and out == ""
        assert err.startswith("tdu inspect: error: ") and err.count("\n") == 1
        assert "ckpt.pt at key 'dataset'" in err and f"state key {key!r} is damaged" in err


def test_inspect_a_state_damaged_past_its_types_is_an_input_error_before_anything_is_built(capsys, data, tmp_path):
    """Values of the right type that no saved state holds: named by the library's own checks
    (header, shape, the dataset's argument checks), exit 2 with or without PATH; a huge
    num_workers is refused at once instead of building that many workers."""
    state = StructuredDataset(data, batch_size=8, num_workers=2, split_bytes=SPLIT_BYTES).state_dict()
    worker_state = {**{k: v for k, v in state.items() if k.startswith("_")}, "format_version": 1, "scope": "worker",
                    "epoch": 0, "worker": 0, "rows_delivered": 8, "files_digest": "d"}
    for key, value, base in (
        ("padding_delivered", -3, state), ("_num_workers", 5, state), ("_num_workers", 10**9, state), ("_rank", 5, state),
        ("_world_size", 0, state), ("scope", "weird", state), ("format_version", "1", state), ("_equalize", "foo", state),
        ("_on_error", "retry", state), ("_batch_size", 0, state), ("completed_shards", [], state), ("worker", 2, worker_state),
        ("_num_workers", 10**9, worker_state),
    ):
        (tmp_path / "state.json").write_text(json.dumps({**base, key: value}))
        for argv in ([], ["--json"], [data]):
            code, out, err = run(capsys, "inspect", tmp_path / "state.json", *argv)
            assert code == 2 and out == "", (key, value, argv, out)
            assert err.startswith("tdu inspect: error: ") and err.count("\n") == 1, err
            assert f"state key {key!r}" in err, (key, err)


def test_inspect_against_damaged_data_is_an_input_error(capsys, data, tmp_path):
    saved_state(data, tmp_path / "state.json")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "part-00000.parquet").write_bytes(b"not parquet")
    code, out, err = run(capsys, "inspect", tmp_path / "state.json", tmp_path / "bad")
    assert code == 2 and "cannot read the parquet footer of" in err, (out, err)


def test_inspect_counts_the_remaining_rows_on_the_data_not_from_the_state(capsys, data, tmp_path):
    state, dataset = saved_state(data, tmp_path / "state.json")
    remaining = len(dataset) - sum(state["rows_delivered"])
    state["rows_total"] = [done + 1 for done in state["rows_delivered"]]  # informational, and here wrong
    (tmp_path / "state.json").write_text(json.dumps(state))
    code, out, _ = run(capsys, "inspect", tmp_path / "state.json", data, "--json")
    assert code == 0 and json.loads(out)[0]["matches_data"]["rows_remaining"] == remaining


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
    assert code == 2 and "pass --format or a path holding one format" in err and "format=" not in err
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
    monkeypatch.setenv("TDU_PROGRESS", "1")
    monkeypatch.setattr(progress_module, "PROGRESS_DELAY_S", 0.0)  # as if planning took longer than the delay
    build_catalog(data, "parquet", None, SPLIT_BYTES)
    assert "reading footers" in capsys.readouterr().err
    monkeypatch.delenv("TDU_PROGRESS")  # default: only on a terminal; pytest's stderr is not one
    build_catalog(data, "parquet", None, SPLIT_BYTES)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress_module, "PROGRESS_DELAY_S", 60.0)  # fast planning never shows the bar
    monkeypatch.setenv("TDU_PROGRESS", "1")
    build_catalog(data, "parquet", None, SPLIT_BYTES)
    assert capsys.readouterr().err == ""


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

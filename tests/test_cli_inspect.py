"""tdu inspect: states in JSON and torch checkpoints, checked with and without the data; damaged
states and files are input errors naming the key."""

import json
import os

import pytest
import torch
from cli_helpers import ROWS, SPLIT_BYTES, data, run, saved_state  # noqa: F401 - fixtures
from datagen import write_dataset

from torch_dataloader_utils import StructuredDataset


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
    code, _, err = run(capsys, "inspect", tmp_path / "absent.json", "--splits")
    assert code == 2 and "--splits lists the completed splits of PATH" in err
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

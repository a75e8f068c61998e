"""The compact state form (state/compact.py): exact resume, a size that does not grow with the
epoch, the same validation with a named diagnosis, merging and elastic resume, and the full list
recovered on demand."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset
from torch_dataloader_utils.distributed import merge_states
from torch_dataloader_utils.state import compact
from torch_dataloader_utils.testing import assert_resumes_exactly

ROWS = 40


def write_files(root, dirs: int, per_dir: int, rows: int = ROWS) -> None:
    for d in range(dirs):
        os.makedirs(root / f"d{d}", exist_ok=True)
        for f in range(per_dir):
            first = (d * per_dir + f) * rows
            ids = np.arange(first, first + rows, dtype=np.int64)
            pq.write_table(pa.table({"id": ids, "x": ids.astype(np.float32)}), root / f"d{d}" / f"part-{f:03d}.parquet")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("compact")
    write_files(root, 3, 12)
    return root


def compact_save(loader, dataset):
    return dataset.state_dict(form="compact")


@pytest.mark.parametrize(("workers", "shuffle"), [(0, False), (2, True)])
def test_compact_states_resume_exactly(data, workers, shuffle):
    def make():
        return StructuredDataset.create_dataloader(str(data), batch_size=16, num_workers=workers, shuffle=shuffle, shuffle_buffer_rows=200)

    assert_resumes_exactly(make, epochs=1, stride=7, deep_stride=3, save=compact_save)


def states_along_epoch(path, **options):
    loader, dataset = StructuredDataset.create_dataloader(str(path), batch_size=16, num_workers=2, **options)
    states = [json.loads(json.dumps(dataset.state_dict(form="compact")))]
    for _ in loader:
        states.append(json.loads(json.dumps(dataset.state_dict(form="compact"))))
    return states


def test_size_does_not_grow_with_completed_splits(data):
    states = states_along_epoch(data)
    sizes = [len(json.dumps(s)) for s in states]
    assert max(sizes) - min(sizes) < 200  # positions grow by digits, nothing per split
    last = states[-1]
    assert last["format_version"] == 2 and "completed_shards" not in last and "files" not in last
    assert [len(entry["ranges"]) for entry in last["completed_ranges"]] == [1, 1]  # each worker's splits: one range
    assert sum(compact.count_completed(e) for e in last["completed_ranges"]) == 36


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("small_files")
    write_files(root, 3, 100, rows=4)  # 300 splits in one shuffle window
    return root


def make_shuffled(path, workers=2):
    return StructuredDataset.create_dataloader(str(path), batch_size=16, num_workers=workers, shuffle=True)


def test_a_shuffle_window_of_many_small_splits_keeps_the_state_small(small_files):
    """A window holds every split in progress at once: each entry keeps counts and a digest, not
    hundreds of [position, rows_done] pairs (215 KB at 20,000 files, growing with the files)."""
    states = states_along_epoch(small_files, shuffle=True)
    sizes = [len(json.dumps(s)) for s in states]
    assert max(sizes) - min(sizes) < 2 * compact.LISTED_MAX * 12  # at most LISTED_MAX short pairs per worker
    digested = [e for state in states for e in state["completed_ranges"] if e["progress_digest"] is not None]
    assert {e["worker"] for e in digested} == {0, 1} and max(e["in_progress_count"] for e in digested) > 100
    assert [e["ranges"] for e in states[-1]["completed_ranges"]] == [[[0, 150]], [[0, 150]]]  # all done: listed again
    assert_resumes_exactly(lambda: make_shuffled(small_files), epochs=1, stride=11, deep_stride=5, save=compact_save)


def test_a_digested_entry_is_checked_as_strictly_as_lists(small_files, monkeypatch):
    state = states_along_epoch(small_files, shuffle=True)[20]  # worker 0 in the middle of its window
    for key, value in (("progress_digest", "0" * 32), ("completed", 1), ("in_progress_count", 3)):
        damaged = json.loads(json.dumps(state))
        damaged["completed_ranges"][0][key] = value
        assert "do not match the plan at" in refusal(small_files, damaged, shuffle=True)
    damaged = json.loads(json.dumps(state))
    damaged["completed_ranges"][0]["progress_digest"] = 5
    assert "worker 0" in refusal(small_files, damaged, shuffle=True)
    monkeypatch.setattr(compact, "LISTED_MAX", 10**6)  # an earlier version listed every range and split in progress
    listed = states_along_epoch(small_files, shuffle=True)[20]
    monkeypatch.undo()
    assert len(listed["completed_ranges"][0]["in_progress"]) > compact.LISTED_MAX
    for key in ("completed", "in_progress_count", "progress_digest"):
        del listed["completed_ranges"][0][key]
    _, dataset = make_shuffled(small_files)
    dataset.load_state_dict(listed)
    listed["completed_ranges"][0]["in_progress"][0][1] += 1
    assert "do not match the plan at" in refusal(small_files, listed, shuffle=True)


def test_auto_form_is_full_for_small_plans_and_compact_above(data, monkeypatch):
    _, dataset = StructuredDataset.create_dataloader(str(data), batch_size=16, num_workers=2)
    assert "completed_shards" in dataset.state_dict()
    monkeypatch.setattr(compact, "AUTO_FULL_MAX_SPLITS", 10)
    assert "completed_ranges" in dataset.state_dict()
    with pytest.raises(ValueError, match="form must be one of"):
        dataset.state_dict(form="small")


def expand_ranges(entry, book, lane, splits) -> tuple[list[dict], list[dict]]:
    """The full form's (completed, in-progress) split lists of a compact worker entry, by content."""
    order = compact.lane_order(book, lane, splits)
    completed = [splits[order.splits[p]].to_dict() for start, stop in entry["ranges"] for p in range(start, stop)]
    partial = [{**splits[order.splits[p]].to_dict(), "rows_done": done} for p, done in entry["in_progress"]]
    return completed, partial


def test_expanded_compact_state_equals_the_full_form(data):
    loader, dataset = StructuredDataset.create_dataloader(str(data), batch_size=16, num_workers=2, shuffle=True, shuffle_buffer_rows=200)
    for step, _ in enumerate(loader):
        if step == 20:
            break
    small, full = dataset.state_dict(form="compact"), dataset.state_dict(form="full")
    plan = dataset.delivery.plan()
    for worker, lane in enumerate(plan.lanes):
        done, partial = expand_ranges(small["completed_ranges"][worker], plan.book, lane, dataset._catalog.splits)
        assert done == full["completed_shards"][worker]["splits"]
        assert partial == full["in_progress"][worker]["splits"]


def saved_mid_epoch(path):
    loader, dataset = StructuredDataset.create_dataloader(str(path), batch_size=16, num_workers=2)
    for step, _ in enumerate(loader):
        if step == 10:
            return json.loads(json.dumps(dataset.state_dict(form="compact")))
    raise AssertionError("too few batches")


def refusal(path, state, **options) -> str:
    _, dataset = StructuredDataset.create_dataloader(str(path), batch_size=16, num_workers=2, **options)
    with pytest.raises(CheckpointMismatchError) as error:
        dataset.load_state_dict(state)
    return str(error.value)


def test_changed_files_are_named(tmp_path):
    write_files(tmp_path, 2, 40)  # 80 files: groups of 16
    state = saved_mid_epoch(tmp_path)
    time.sleep(0.01)
    os.utime(tmp_path / "d1" / "part-005.parquet")  # rewritten in place: a newer modification time
    pq.write_table(pa.table({"id": np.arange(3, dtype=np.int64), "x": np.zeros(3, np.float32)}), tmp_path / "d0" / "part-100.parquet")
    os.remove(tmp_path / "d1" / "part-030.parquet")
    message = refusal(tmp_path, state)  # 80 files: the summary lists them, so every change is named
    assert "files removed since the checkpoint (1): " in message and "d1/part-030.parquet" in message
    assert "files added since the checkpoint (1): " in message and "d0/part-100.parquet" in message
    assert "file rewritten since the checkpoint: " in message and "d1/part-005.parquet (tag checkpoint=" in message
    assert "The data changed since the checkpoint" in message


def test_changes_in_a_large_listing_are_located_to_their_group():
    listing = [[f"/data/d{i // 100}/part-{i % 100:03d}.parquet", 1000, f"mtime:{i}"] for i in range(compact.NAMED_FILES_MAX + 44)]
    summary = compact.files_summary(listing)
    assert "files" not in summary  # past NAMED_FILES_MAX, groups of files only
    now = [f for f in listing if f[0] != "/data/d1/part-030.parquet"] + [["/data/d0/part-100.parquet", 3, "mtime:1"]]
    now[5] = [now[5][0], 1001, now[5][2]]  # rewritten with an old modification time: only its group's digest tells
    causes = " ".join(compact.summary_causes(summary, now))
    assert "files from /data/d1/part-028.parquet to /data/d1/part-043.parquet: 1 removed (16 files then, 15 now)" in causes
    assert "1 added (16 files then, 17 now)" in causes
    assert "rewritten or renamed" in causes and "form='full'" in causes


def test_a_rewritten_file_with_an_old_mtime_is_named(tmp_path):
    write_files(tmp_path, 1, 40)
    state = saved_mid_epoch(tmp_path)
    target = tmp_path / "d0" / "part-020.parquet"
    stat = os.stat(target)
    write_files_one = pa.table({"id": np.arange(ROWS + 1, dtype=np.int64), "x": np.zeros(ROWS + 1, np.float32)})
    pq.write_table(write_files_one, target)
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns - 10**9))  # an older time: only its size tells
    message = refusal(tmp_path, state)
    assert "file rewritten since the checkpoint: " in message and "d0/part-020.parquet (size checkpoint=" in message


def test_other_settings_and_damage_are_named(data):
    state = saved_mid_epoch(data)
    assert "split_bytes changed: checkpoint=134217728, current=1000" in refusal(data, state, split_bytes=1000)
    other = json.loads(json.dumps(state))
    other["completed_ranges"][0]["lane_digest"] = "0" * 32
    assert "lane_digest" in refusal(data, other)
    damaged = json.loads(json.dumps(state))
    damaged["completed_ranges"][0]["ranges"] = [[0, 1]]
    assert "do not match the plan at" in refusal(data, damaged)
    damaged = json.loads(json.dumps(state))
    damaged["files_summary"]["groups"] = "x"
    assert "files_summary' entry is damaged" in refusal(data, damaged)


def test_merged_compact_states_resume_elastically(data):
    loader, dataset = StructuredDataset.create_dataloader(str(data), batch_size=16, num_workers=2)
    seen = []
    for step, batch in enumerate(loader):
        seen.append(batch["id"])
        if step == 12:
            break
    merged = json.loads(json.dumps(merge_states([dataset.state_dict(form="compact")])))
    assert "files_summary" in merged and all("files_summary" not in part for part in merged["ranks"])
    loader, dataset = StructuredDataset.create_dataloader(str(data), batch_size=16, num_workers=2)
    dataset.load_state_dict(merged)  # same topology: in place
    loader, dataset = StructuredDataset.create_dataloader(str(data), batch_size=16, num_workers=1)
    dataset.load_state_dict(merged, elastic=True)
    seen += [batch["id"] for batch in loader]
    assert sorted(torch.cat(seen).tolist()) == list(range(36 * ROWS))


def test_summary_of_many_files_stays_small():
    listing = [[f"s3://bucket/table/d{i // 1000:04d}/part-{i % 1000:05d}.parquet", 1000, f'"etag{i}"'] for i in range(100_000)]
    summary = compact.files_summary(listing)
    assert len(summary["groups"]) <= compact.MAX_GROUPS and len(json.dumps(summary)) < 100_000
    assert compact.summary_causes(summary, listing) == []
    causes = compact.summary_causes(summary, listing[:-1])
    assert "1 removed" in causes[0] and "d0099/part-00" in causes[0]


def general_and_fast(dataset) -> None:
    """The binary search over unshuffled lanes gives what walking the lane's pieces gives, at every position."""
    plan, splits = dataset.delivery.plan(), dataset._catalog.splits
    for lane in plan.lanes:
        order = compact.lane_order(plan.book, lane, splits)
        assert order.bounds is not None
        for position in range(0, lane.num_rows + 1, 3):
            fast = compact.lane_progress(plan.book, lane, position, splits)
            bounds, order.bounds = order.bounds, None
            try:
                assert compact.lane_progress(plan.book, lane, position, splits) == fast, position
            finally:
                order.bounds = bounds


def test_the_binary_search_agrees_with_the_general_count(tmp_path):
    for i in range(6):  # files of several row groups, cut into several splits
        ids = np.arange(i * 90, (i + 1) * 90, dtype=np.int64)
        pq.write_table(pa.table({"id": ids}), tmp_path / f"part-{i}.parquet", row_group_size=20)
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), batch_size=8, num_workers=2, split_bytes=400)
    assert len(dataset.splits) > 12
    general_and_fast(dataset)
    for step, _ in enumerate(loader):
        if step == 9:
            break
    merged = merge_states([dataset.state_dict(form="compact")])
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), batch_size=8, num_workers=3, split_bytes=400)
    dataset.load_state_dict(merged, elastic=True)  # dealt lanes: segments of the old streams
    assert any(len(lane.segments) > 1 for lane in dataset.delivery.plan().lanes)
    general_and_fast(dataset)
    seen = [int(i) for batch in loader for i in batch["id"]]
    assert len(seen) == len(set(seen)) == 540 - 10 * 8


def test_tdu_inspect_explains_a_compact_state_and_lists_its_splits(data, tmp_path, capsys):
    from torch_dataloader_utils.cli import main

    state = saved_mid_epoch(data)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "format_version 2" in text and "files      36" in text and "splits completed" in text
    assert main(["inspect", str(path), str(data), "--splits", "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    completed = report["completed_splits"]
    assert report["matches_data"]["matches"] and len(completed) == sum(w["splits_completed"] for w in report["workers"]) > 0
    assert all(split["path"].startswith(str(data)) for split in completed)

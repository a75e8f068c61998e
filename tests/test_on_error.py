"""on_error: "raise" names the file and split; "skip" leaves out unreadable rows, reports them,
and keeps exactly-once and resume equivalence for everything else."""

import os

import pytest
from datagen import corrupt_data_pages, write_dataset
from resume_helpers import batch_key

from torch_dataloader_utils import DataReadError, StructuredDataset
from torch_dataloader_utils.testing import assert_resumes_exactly

LAYOUT = [[20, 20], [30], [15, 15, 15], [25]]
CONFIG = dict(batch_size=8, split_bytes=2500, chunk_rows=16, shuffle_buffer_rows=40, shuffle_seed=2)


def _dataset_with_a_lost_file(tmp_path, **kwargs):
    write_dataset(tmp_path, LAYOUT)
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), **{**CONFIG, **kwargs})
    lost = os.path.join(str(tmp_path), "part-00002.parquet")
    os.remove(lost)  # deleted between planning and reading
    return loader, dataset, lost


def test_raise_names_the_file_and_split(tmp_path):
    loader, _, lost = _dataset_with_a_lost_file(tmp_path, num_workers=2)
    with pytest.raises(DataReadError, match=rf"cannot read {lost} \(split {lost}"):
        list(loader)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_skip_delivers_everything_else_exactly_once_and_resumes_exactly(tmp_path, workers, shuffle):
    write_dataset(tmp_path, LAYOUT)
    lost = os.path.join(str(tmp_path), "part-00002.parquet")
    corrupt_data_pages(lost)
    made = []

    def make():
        made.append(StructuredDataset.create_dataloader(str(tmp_path), num_workers=workers, on_error="skip", shuffle=shuffle, **CONFIG))
        return made[-1]

    def load(loader, resumed, state):
        resumed.load_state_dict(state)
        saved = [(entry["path"], entry["error"]) for entry in state["skipped_splits"]]
        assert [(split.path, message) for split, message in resumed.skipped_splits] == saved, "the report survives the checkpoint"

    reference = assert_resumes_exactly(make, epochs=1, batch_key=batch_key, load=load)
    (_, dataset), resumed = made[0], [dataset for _, dataset in made[1:]]
    full, states = reference.batches[0], reference.states[0]
    ids = sorted(i for b in full for i in b)
    lost_ids = set(range(70, 115))  # the rows of part-00002
    assert ids == sorted(set(range(140)) - lost_ids)
    assert [s.path for s, _ in dataset.skipped_splits] == [lost] * len(dataset.skipped_splits)
    assert dataset.skipped_splits and all("cannot read" in message for _, message in dataset.skipped_splits)
    assert all(message.endswith("If the file is damaged, replace or remove it") for _, message in dataset.skipped_splits)  # skip is on already
    assert states[-1]["skipped_splits"] and states[-1]["skipped_splits"][0]["path"] == lost
    # every resumed run (one per point, and the second resumes) ran to the epoch's end with the report
    assert len(resumed) > len(full) and all(dataset.skipped_splits for dataset in resumed)
    reported_before_the_end = sum(bool(state["skipped_splits"]) for state in states[:-1])
    assert reported_before_the_end, "no state saved mid-epoch carried the report: the check above tested nothing"


def test_skip_is_refused_when_it_could_hang_ddp(tmp_path):
    write_dataset(tmp_path, [[10]])
    with pytest.raises(ValueError, match="hang DDP"):
        StructuredDataset(str(tmp_path), rank=0, world_size=2, on_error="skip")
    StructuredDataset(str(tmp_path), rank=0, world_size=2, on_error="skip", equalize="none")


@pytest.mark.parametrize("workers", [1, 2])
def test_skip_keeps_the_batches_of_a_whole_first_chunk(tmp_path, workers):
    """A pass's first chunk is read in two pieces with workers (tasks.quick_start), but not with
    on_error="skip": a batch joins the rows around a lost file, and a cut would move its boundary."""
    root = str(tmp_path / "data")
    write_dataset(root, [[4], [40], [40]])
    corrupt_data_pages(os.path.join(root, "part-00001.parquet"))
    config = dict(batch_size=8, chunk_rows=64, on_error="skip")
    reference = [batch["id"].tolist() for batch in StructuredDataset.create_dataloader(root, num_workers=0, **config)[0]]
    assert reference[0] == [0, 1, 2, 3, 44, 45, 46, 47]
    make = lambda: StructuredDataset.create_dataloader(root, num_workers=workers, **config)  # noqa: E731
    full = assert_resumes_exactly(make, epochs=1, batch_key=lambda batch: batch["id"].tolist()).batches[0]
    assert full == reference


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_also_covers_the_count_of_filtered_rows(tmp_path, workers, caplog):
    """A file that cannot be read when filters= counts its rows at planning: "raise" names it; "skip"
    plans it with its rows, the readers leave them out and report the file as any unreadable split."""
    write_dataset(tmp_path, LAYOUT)
    lost = os.path.join(str(tmp_path), "part-00002.parquet")
    corrupt_data_pages(lost)
    filters = [("label", "!=", 1)]
    with pytest.raises(DataReadError, match=rf"cannot count the rows of {lost}"):
        StructuredDataset(str(tmp_path), filters=filters, **CONFIG)
    loader, dataset = StructuredDataset.create_dataloader(str(tmp_path), num_workers=workers, on_error="skip", filters=filters, **CONFIG)
    assert f"cannot count the rows of {lost}" in caplog.text
    got = sorted(i for batch in loader for i in batch_key(batch))
    assert got == [i for i in range(140) if i % 7 != 1 and not 70 <= i < 115]  # label = id % 7; part-00002 holds 70..114
    assert dataset.skipped_splits and {split.path for split, _ in dataset.skipped_splits} == {lost}


def _damaged_at_planning(root) -> tuple[str, str]:
    """LAYOUT in ``root`` with part-00001 cut in half (ids 40..69) and a file of garbage named like Parquet."""
    write_dataset(root, LAYOUT)
    cut = os.path.join(str(root), "part-00001.parquet")
    with open(cut, "rb") as file:
        data = file.read()
    with open(cut, "wb") as file:
        file.write(data[: len(data) // 2])
    garbage = os.path.join(str(root), "junk.parquet")
    with open(garbage, "wb") as file:
        file.write(b"not parquet at all " * 50)
    return cut, garbage


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_leaves_out_files_that_cannot_be_planned_and_resumes_exactly(tmp_path, workers, caplog):
    """A truncated file and garbage named .parquet fail at planning, before any split exists:
    "raise" names the file; "skip" leaves the files out, reports them (logger, skipped_splits,
    the state) and delivers every other row exactly once, resuming exactly."""
    cut, garbage = _damaged_at_planning(tmp_path)
    with pytest.raises(ValueError, match=r"cannot read the parquet footer of .*(junk|part-00001)\.parquet"):
        StructuredDataset(str(tmp_path), **CONFIG)

    def make():
        return StructuredDataset.create_dataloader(str(tmp_path), num_workers=workers, on_error="skip", shuffle=True, **CONFIG)

    loader, dataset = make()
    assert "leaving out 2 file(s) that cannot be read" in caplog.text and cut in caplog.text and garbage in caplog.text
    ids = sorted(i for batch in loader for i in batch_key(batch))
    assert ids == [i for i in range(140) if not 40 <= i < 70]
    reported = {(split.path, split.row_offset): message for split, message in dataset.skipped_splits}
    assert set(reported) == {(cut, None), (garbage, None)} and all("cannot read the parquet footer" in m for m in reported.values())
    saved = dataset.state_dict()["skipped_splits"]
    assert {(entry["path"], entry["row_offset"], entry["row_length"]) for entry in saved} == {(cut, None, None), (garbage, None, None)}
    assert_resumes_exactly(make, epochs=2, stride=2, batch_key=batch_key)


def test_skip_with_every_file_unreadable_raises_the_first_error(tmp_path):
    _, garbage = _damaged_at_planning(tmp_path)
    for name in os.listdir(tmp_path):
        if name != "junk.parquet":
            os.remove(tmp_path / name)
    with pytest.raises(ValueError, match=rf"on_error=.skip. leaves no file to read: none of the 1 file\(s\) can be read; the first: cannot read the parquet footer of {garbage}"):
        StructuredDataset(str(tmp_path), on_error="skip", **CONFIG)


def test_skip_leaves_out_an_unplannable_file_of_a_mixture_source(tmp_path):
    from torch_dataloader_utils import Source

    _damaged_at_planning(tmp_path / "a")
    write_dataset(tmp_path / "b", [[10]], first_id=1000)
    loader, dataset = StructuredDataset.create_dataloader([Source(str(tmp_path / "a")), Source(str(tmp_path / "b"))], num_workers=0, on_error="skip", **CONFIG)
    ids = sorted(i for batch in loader for i in batch_key(batch))
    assert ids == [i for i in range(140) if not 40 <= i < 70] + list(range(1000, 1010))
    assert len(dataset.skipped_splits) == 2

"""split_bytes as a size string (plan/sizes.py) and split_rows: in the plan and the state check."""

from __future__ import annotations

import pytest
from datagen import write_dataset

from torch_dataloader_utils import CheckpointMismatchError, StructuredDataset
from torch_dataloader_utils.plan.sizes import parse_size
from torch_dataloader_utils.plan.splits import FileLayout, Split, plan_splits
from torch_dataloader_utils.testing import assert_resumes_exactly


@pytest.mark.parametrize(
    ("text", "size"),
    [("64MiB", 64 << 20), ("1GB", 10**9), ("512KiB", 512 << 10), ("512 kib", 512 << 10), ("100", 100), ("1.5KiB", 1536), ("2k", 2000), (4096, 4096)],
)
def test_sizes(text, size):
    assert parse_size("split_bytes", text) == size


@pytest.mark.parametrize("bad", ["64 MiBs", "MiB", "-1KB", "1e3", "", 1.5, None])
def test_a_bad_size_names_the_accepted_forms(bad):
    with pytest.raises(ValueError, match=r"split_bytes must be an int, or a string.*KiB.*\"64MiB\""):
        parse_size("split_bytes", bad)


def test_split_rows_caps_rows_and_the_smaller_limit_wins():
    layouts = [FileLayout("a", 1000, (30, 30, 30), (100, 100, 100)), FileLayout("b", 100, (10,), (100,))]
    assert plan_splits(layouts, 250, 60) == [Split("a", 0, 60), Split("a", 60, 30), Split("b")]
    assert plan_splits(layouts, 150, 60) == [Split("a", 0, 30), Split("a", 30, 30), Split("a", 60, 30), Split("b")]
    assert plan_splits(layouts, 10_000, 25) == [Split("a", 0, 25), Split("a", 25, 5), Split("a", 30, 25), Split("a", 55, 5), Split("a", 60, 25), Split("a", 85, 5), Split("b")]
    with pytest.raises(ValueError, match="split_rows must be positive"):
        plan_splits(layouts, 100, 0)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("split")
    write_dataset(root, [[40, 40], [50]])
    return str(root)


def test_a_size_string_plans_as_its_bytes(root):
    assert StructuredDataset(root, num_workers=0, split_bytes="3KiB").splits == StructuredDataset(root, num_workers=0, split_bytes=3072).splits
    with pytest.raises(ValueError, match="split_bytes must be"):
        StructuredDataset(root, num_workers=0, split_bytes="lots")
    with pytest.raises(ValueError, match="split_rows must be >= 1"):
        StructuredDataset(root, num_workers=0, split_rows=0)


@pytest.mark.parametrize("workers", [0, 2])
def test_split_rows_inside_row_groups_resumes_exactly(root, workers):
    def make():
        return StructuredDataset.create_dataloader(root, num_workers=workers, batch_size=16, chunk_rows=32, split_rows=15, shuffle=True)

    assert max(split.row_length or 0 for split in make()[1].splits) == 15
    reference = assert_resumes_exactly(make, epochs=1, batch_key=lambda batch: tuple(batch["id"].tolist()))
    assert sorted(i for batch in reference.batches[0] for i in batch) == list(range(130))


def test_split_rows_is_checked_at_a_resume(root):
    dataset = StructuredDataset(root, num_workers=0, batch_size=10, split_rows=20)
    iterator = iter(dataset)
    next(iterator)
    state = dataset.state_dict()
    assert state["_split_rows"] == 20
    with pytest.raises(CheckpointMismatchError, match="split_rows changed: checkpoint=20, current=None"):
        StructuredDataset(root, num_workers=0, batch_size=10).load_state_dict(state)
    StructuredDataset(root, num_workers=0, batch_size=10, split_rows=20).load_state_dict(state)

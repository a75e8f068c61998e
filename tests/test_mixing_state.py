"""A mixture's compact state (state/compact.py with plan/mixing.py): exact resume, a size that does
not grow with the epoch's progress or with upsampling, the same named refusals as the full form,
elastic resume from merged compact states, and ``tdu inspect`` of a mixture's state."""

from __future__ import annotations

import collections
import json

import pytest
from datagen import write_dataset
from mixing_helpers import CONFIG, LAYOUTS, read_rank, three_sources, write_sources
from resume_helpers import batch_key

from torch_dataloader_utils import CheckpointMismatchError, Source, StructuredDataset
from torch_dataloader_utils.distributed import merge_states
from torch_dataloader_utils.state import compact
from torch_dataloader_utils.testing import assert_resumes_exactly

# source k's ids start at k * 1000: A (100 rows, 1x), B (25 rows, upsampled), C (200 rows, downsampled)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    return write_sources(tmp_path_factory.mktemp("mixing_state"))


def _sources(data, b=60, c=70):
    return three_sources(data, b, c)


def _compact(loader, dataset):
    return json.loads(json.dumps(dataset.state_dict(form="compact")))


@pytest.mark.parametrize(("workers", "shuffle"), [(0, True), (2, False)])
def test_compact_mixture_states_resume_exactly(data, workers, shuffle):
    def make():
        return StructuredDataset.create_dataloader(_sources(data), num_workers=workers, shuffle=shuffle, **CONFIG)

    reference = assert_resumes_exactly(make, epochs=2 if workers == 0 else 1, batch_key=batch_key, save=_compact, stride=2, deep_stride=3)
    assert "completed_ranges" in reference.states[0][-1] and "completed_shards" not in reference.states[0][-1]


def _sizes_along_epoch(data, b: int, shuffle: bool) -> tuple[list[int], list[int], int]:
    loader, dataset = StructuredDataset.create_dataloader(_sources(data, b=b), num_workers=2, shuffle=shuffle, **CONFIG)
    small, full = [], []
    for _ in loader:
        small.append(len(json.dumps(dataset.state_dict(form="compact"))))
        full.append(len(json.dumps(dataset.state_dict(form="full"))))
    return small, full, len(dataset._catalog.splits_at(0))


@pytest.mark.parametrize("shuffle", [False, True])
def test_the_compact_state_grows_neither_with_progress_nor_with_upsampling(data, shuffle):
    sizes = {b: _sizes_along_epoch(data, b, shuffle) for b in (60, 3000)}  # B upsampled 2.4x and 120x
    (small, full, splits), (many_small, many_full, many_splits) = sizes[60], sizes[3000]
    assert many_splits > 10 * splits and max(many_full) > 10 * max(full)  # the full form lists a split per copy
    assert max(small) - min(small) < 150 and max(many_small) - min(many_small) < 150  # positions grow by digits, nothing per split
    assert abs(max(many_small) - max(small)) < 150


def test_auto_writes_the_compact_form_for_a_mixture_of_any_size(data):
    loader, dataset = StructuredDataset.create_dataloader(_sources(data), num_workers=2, **CONFIG)
    assert len(dataset._catalog.splits_at(0)) < compact.AUTO_FULL_MAX_SPLITS
    assert "completed_ranges" in dataset.state_dict() and "completed_shards" in dataset.state_dict(form="full")


def _stopped(data, stop: int, shuffle=True, **options):
    loader, dataset = StructuredDataset.create_dataloader(_sources(data, **options), num_workers=2, shuffle=shuffle, **CONFIG)
    for step, _ in enumerate(loader):
        if step == stop:
            break
    return dataset


def test_a_loaded_compact_state_gives_back_the_full_form(data):
    saved = _stopped(data, 6)
    small, full = _compact(None, saved), json.loads(json.dumps(saved.state_dict(form="full")))
    _, dataset = StructuredDataset.create_dataloader(_sources(data), num_workers=2, shuffle=True, **CONFIG)
    dataset.load_state_dict(small)
    assert json.loads(json.dumps(dataset.state_dict(form="full"))) == full
    assert {split["source"] for key in ("completed_shards", "in_progress") for entry in full[key] for split in entry["splits"]} == {0, 1, 2}


def test_a_compact_state_of_another_mixture_is_refused_naming_the_change(data, tmp_path):
    state = _compact(None, _stopped(data, 4))
    for options, expected in [
        (dict(b=61), "source 1's rows_per_epoch changed: checkpoint=60, current=61"),
        (dict(c=71), "source 2's rows_per_epoch changed: checkpoint=70, current=71"),
    ]:
        _, other = StructuredDataset.create_dataloader(_sources(data, **options), num_workers=2, shuffle=True, **CONFIG)
        with pytest.raises(CheckpointMismatchError, match=expected):
            other.load_state_dict(state)
    weighted = [Source(data["a"], weight=1), Source(data["b"], weight=1)]
    loader, dataset = StructuredDataset.create_dataloader(weighted, epoch_rows=200, num_workers=0, **CONFIG)
    next(iter(loader))
    saved = dataset.state_dict(form="compact")
    _, other = StructuredDataset.create_dataloader([Source(data["a"], weight=1), Source(data["b"], weight=2)], epoch_rows=200, num_workers=0, **CONFIG)
    with pytest.raises(CheckpointMismatchError, match="source 1's weight changed: checkpoint=1, current=2"):
        other.load_state_dict(saved)
    _, other = StructuredDataset.create_dataloader([Source(data["a"]), Source(data["c"], rows_per_epoch=70)], num_workers=2, **CONFIG)
    with pytest.raises(CheckpointMismatchError, match="number of sources changed: checkpoint=3, current=2"):
        other.load_state_dict(state)
    damaged = json.loads(json.dumps(state))
    damaged["completed_ranges"][1]["lane_digest"] = "0" * 32
    _, same = StructuredDataset.create_dataloader(_sources(data), num_workers=2, shuffle=True, **CONFIG)
    with pytest.raises(CheckpointMismatchError, match="lane_digest"):
        same.load_state_dict(damaged)


def test_a_changed_file_of_a_source_is_named(data, tmp_path):
    for index, (name, layout) in enumerate(LAYOUTS.items()):
        write_dataset(tmp_path / name, layout, first_id=1000 * index)
    paths = {name: str(tmp_path / name) for name in LAYOUTS}
    state = _compact(None, _stopped(paths, 4))
    write_dataset(tmp_path / "b", [[12, 14]], first_id=1000)  # source B rewritten with a row more
    _, dataset = StructuredDataset.create_dataloader(_sources(paths), num_workers=2, shuffle=True, **CONFIG)
    with pytest.raises(CheckpointMismatchError) as error:
        dataset.load_state_dict(state)
    assert "source 1's rows (its data changed) changed: checkpoint=25, current=26" in str(error.value)
    assert "b/part-00000.parquet" in str(error.value)


def test_merged_compact_states_resume_elastically_with_the_planned_multiplicities(data):
    before = [read_rank(data, rank, 2, 2, stop=40, form="compact") for rank in range(2)]
    merged = merge_states([state for _, state in before])
    assert "files_summary" in merged and all("completed_ranges" in part for part in merged["ranks"])
    after = [read_rank(data, rank, 3, 1, state=merged, form="compact") for rank in range(3)]
    counts = collections.Counter(i for ids, _ in before for i in ids)
    counts.update(i for ids, _ in after for i in ids)
    by_source = [{i: n for i, n in counts.items() if i // 1000 == k} for k in range(3)]
    assert sorted(by_source[0]) == list(range(100)) and set(by_source[0].values()) == {1}
    assert sum(by_source[1].values()) == 60 and set(by_source[1].values()) == {2, 3} and len(by_source[1]) == 25
    assert sum(by_source[2].values()) == 70 and set(by_source[2].values()) == {1}


def test_tdu_inspect_shows_the_mixture_and_lists_its_splits(data, tmp_path, capsys):
    from torch_dataloader_utils.cli import main

    dataset = _stopped(data, 6, shuffle=False)
    full = json.loads(json.dumps(dataset.state_dict(form="full")))
    path = tmp_path / "state.json"
    path.write_text(json.dumps(full))
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "mixture    3 sources, 230 rows per epoch" in text and "source 1   60 of its 25 rows per epoch" in text
    path.write_text(json.dumps(_compact(None, dataset)))
    assert main(["inspect", str(path), data["a"], data["b"], data["c"], "--splits", "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["matches_data"]["matches"], report["matches_data"]
    delivered = sum(full["rows_delivered"])
    assert [s["rows_per_epoch"] for s in report["mixture"]] == [100, 60, 70] and sum(s["rows_delivered"] for s in report["mixture"]) == delivered
    listed = [{k: v for k, v in split.items() if k != "worker"} for split in report["completed_splits"]]
    assert listed == [split for entry in full["completed_shards"] for split in entry["splits"]]
    assert main(["inspect", str(path), data["a"]]) == 2
    assert "give one PATH per source" in capsys.readouterr().err

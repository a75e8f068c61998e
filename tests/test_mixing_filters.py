"""filters= with a mixture: each source is planned over the rows the filter matches, and its
rows_per_epoch / weight share those rows; exact multiplicities, exact resume, named refusals."""

from __future__ import annotations

import collections
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mixing_helpers import CONFIG, three_sources, write_sources
from resume_helpers import batch_key

from torch_dataloader_utils import CheckpointMismatchError, Source, StructuredDataset
from torch_dataloader_utils.testing import assert_resumes_exactly

# source k's ids start at k * 1000 (x = id / 2): A 100 rows, B 25, C 200
# A keeps ids 20..99 (80 rows), B ids 1000..1019 (20 rows), C ids 2000..2199 (all 200)
FILTERS = [[("x", ">=", 10.0), ("x", "<", 510.0)], [("x", ">=", 1000.0)]]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    return write_sources(tmp_path_factory.mktemp("mixing_filters"))


def _sources(data, b=50, c=70):
    return three_sources(data, b, c)


@pytest.mark.parametrize(("workers", "shuffle"), [(0, False), (2, True)])
def test_each_source_shares_the_rows_that_match(data, workers, shuffle):
    loader, dataset = StructuredDataset.create_dataloader(_sources(data), filters=FILTERS, num_workers=workers, shuffle=shuffle, **CONFIG)
    assert [s["rows"] for s in dataset._catalog.sources] == [80, 20, 200] and len(dataset) == 80 + 50 + 70
    counts = collections.Counter(i for batch in loader for i in batch_key(batch))
    by_source = [{i: n for i, n in counts.items() if i // 1000 == k} for k in range(3)]
    assert sorted(by_source[0]) == list(range(20, 100)) and set(by_source[0].values()) == {1}
    assert sorted(by_source[1]) == list(range(1000, 1020)) and sorted(by_source[1].values()) == [2] * 10 + [3] * 10  # 50 of 20 rows
    assert sum(by_source[2].values()) == 70 and set(by_source[2].values()) == {1}


def test_weights_share_the_matching_rows_and_columns_need_not_name_the_filters(data):
    weighted = [Source(data["a"], weight=1), Source(data["b"], weight=1)]
    loader, dataset = StructuredDataset.create_dataloader(weighted, filters=FILTERS, columns=["id"], num_workers=0, **CONFIG)
    assert len(dataset) == 100  # epoch_rows defaults to the matching rows: 80 + 20, shared 50 / 50
    ids = [i for batch in loader for i in batch["id"].tolist()]
    assert list(next(iter(loader))) == ["id"]
    assert sum(i < 1000 for i in ids) == 50 and sum(i >= 1000 for i in ids) == 50 and min(ids) >= 20


def test_a_filtered_mixture_resumes_exactly(data):
    def make():
        return StructuredDataset.create_dataloader(_sources(data), filters=FILTERS, num_workers=2, shuffle=True, **CONFIG)

    assert_resumes_exactly(make, epochs=1, batch_key=batch_key, stride=3, deep_stride=3)


def test_a_state_of_another_filter_is_refused(data):
    loader, dataset = StructuredDataset.create_dataloader(_sources(data), filters=FILTERS, num_workers=0, **CONFIG)
    next(iter(loader))
    state = json.loads(json.dumps(dataset.state_dict()))
    _, other = StructuredDataset.create_dataloader(_sources(data), filters=[("x", ">=", 11.0)], num_workers=0, **CONFIG)
    with pytest.raises(CheckpointMismatchError, match="filters changed"):
        other.load_state_dict(state)
    _, plain = StructuredDataset.create_dataloader(_sources(data), num_workers=0, **CONFIG)
    with pytest.raises(CheckpointMismatchError, match="filters changed"):
        plain.load_state_dict(state)


def test_a_source_without_the_filters_column_or_matching_rows_is_named(data, tmp_path):
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64())}), tmp_path / "part.parquet")
    with pytest.raises(ValueError, match=r"source 1 \(.*\): filters=.* names a column the files do not have"):
        StructuredDataset([Source(data["a"]), Source(str(tmp_path))], filters=FILTERS, columns=["id"], num_workers=0)
    for empty in (Source(data["b"], rows_per_epoch=5), Source(data["b"], weight=1), Source(data["b"])):  # also at 1x, where it would add nothing
        with pytest.raises(ValueError, match=r"source 1 .* no rows that match filters=\[\('x', '<', 5.0\)\]"):
            StructuredDataset([Source(data["a"]), empty], filters=[("x", "<", 5.0)], num_workers=0)

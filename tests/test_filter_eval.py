"""read/filter_eval.py: a filter in the DNF list form, evaluated by compute kernels directly, keeps
exactly the rows pyarrow's expression of it keeps (nulls included)."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils.catalog.filter_prune import row_filter
from torch_dataloader_utils.read.filter_eval import matching_count, matching_rows

TABLE = pa.table(
    {
        "id": pa.array(range(40), type=pa.int32()),
        "score": pa.array([None if i % 4 == 0 else i % 9 for i in range(40)], type=pa.int64()),
        "name": pa.array([None if i % 5 == 0 else f"n{i % 6}" for i in range(40)]),
        "ok": pa.array([i % 3 == 0 for i in range(40)]),
    }
).to_batches(max_chunksize=16)  # several chunks per column


@pytest.mark.parametrize(
    "filters",
    [
        [("id", "<", 10)],
        [("id", ">=", 7.5)],  # an integer column and a float value
        [("score", "!=", 3)],  # nulls: left out
        [("score", "in", [1, 2, 3])],
        [("score", "not in", [1, 2])],  # nulls: `not in` keeps them, as pyarrow's ~isin does
        [("name", "=", "n2"), ("ok", "==", True)],
        [[("name", "not in", ["n1"])], [("score", "<=", 2), ("id", ">", 30)]],
        [[("score", ">", 100)]],
    ],
)
def test_direct_evaluation_equals_pyarrows_expression(filters):
    table = pa.Table.from_batches(TABLE)
    rows_filter = row_filter(filters, table.schema)
    assert rows_filter.dnf is not None
    want = table.filter(pq.filters_to_expression(filters))
    assert matching_rows(rows_filter, table).equals(want)
    assert matching_count(rows_filter, table) == want.num_rows


def test_an_expression_is_evaluated_by_pyarrow():
    import pyarrow.compute as pc

    table = pa.Table.from_batches(TABLE)
    expression = (pc.field("id") < 10) | pc.field("ok")
    rows_filter = row_filter(expression, table.schema)
    assert rows_filter.dnf is None and matching_count(rows_filter, table) == table.filter(expression).num_rows == 20


def test_a_set_of_values_is_read_as_a_sorted_list():
    table = pa.Table.from_batches(TABLE)
    as_set = row_filter([("score", "in", {2, 1})], table.schema)  # recorded sorted: a set's order is the process's
    assert as_set.dnf == ((("score", "in", [1, 2]),),)
    assert matching_count(as_set, table) == table.filter(pq.filters_to_expression([("score", "in", {1, 2})])).num_rows

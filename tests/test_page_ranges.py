"""filters= with a Parquet page index: pages whose bounds rule the filter out are neither counted
nor read, and every promise holds as without one (read/page_ranges.py, formats/_parquet_page_index.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from servers import s3, store_registry  # noqa: F401 - fixtures

from torch_dataloader_utils import StructuredDataset
from torch_dataloader_utils.formats import _parquet_seek, parquet
from torch_dataloader_utils.read import filtering, page_ranges
from torch_dataloader_utils.testing import assert_resumes_exactly

ROWS = 1200  # per file; two files of two row groups, pages of 50 rows


@pytest.fixture(autouse=True)
def cheap_page_indexes(monkeypatch):
    """Small files: the cost model that weighs decoding a page index (and seeking) in Python
    against the column bytes it saves is set to use them at any size (forked workers inherit it).
    With real files it decides by their sizes (test_the_cost_model_leaves_small_row_groups_alone)."""
    monkeypatch.setattr(_parquet_seek, "THRIFT_BYTE_COST", 1)
    monkeypatch.setattr(_parquet_seek, "THRIFT_SKIP_BYTE_COST", 1)
    monkeypatch.setattr(_parquet_seek, "HEADER_COST", 16)


def table(first: int) -> pa.Table:
    ids = np.arange(first, first + ROWS)
    return pa.table(
        {
            "id": ids,  # sorted: pages hold narrow ranges of it
            "label": (ids % 5).astype("int32"),
            "name": [f"n{i:05d}" for i in ids],
            "score": pa.array([None if i % 9 == 0 or 400 <= i % ROWS < 520 else int(i) for i in ids], type=pa.int64()),  # a page of only nulls
        }
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[bool, str]:
    """The same rows with and without a page index."""
    paths = {}
    for index in (True, False):
        root = tmp_path_factory.mktemp(f"pages-{index}")
        for part in range(2):
            pq.write_table(
                table(part * ROWS), root / f"p{part}.parquet", row_group_size=600, write_page_index=index, data_page_size=256, write_batch_size=50
            )
        paths[index] = str(root)
    return paths


ALL = pa.concat_tables([table(0), table(ROWS)])
FILTERS = {
    "range": [("id", ">=", 130), ("id", "<", 1810)],
    "tail": pc.field("id") > 2000,
    "and-label": (pc.field("id") < 700) & (pc.field("label") == 3),
    "dnf": [[("id", "<", 60)], [("id", ">", 1700), ("label", "in", [1, 2])]],
    "string": pc.field("name") >= "n02300",
    "nulls": pc.field("score").is_null(),
    "not-null": (pc.field("score") > 1000) & (pc.field("id") < 1600),
    "none": [("id", ">", 10**9)],
    "not-in-nulls": [("score", "not in", [3, 4, 1000])],  # ~is_in keeps the null rows
    "in": [("score", "in", [100, 1500, 2301])],
    "not-equal": [("name", "!=", "n00005"), ("id", "<=", 700)],
    "equal-or": [[("id", "==", 455)], [("score", "=", 2000)]],
}


def ids(path: str, workers: int = 0, **kwargs) -> tuple[list[int], StructuredDataset]:
    loader, dataset = StructuredDataset.create_dataloader(path, batch_size=32, num_workers=workers, columns=["id", "name"], **kwargs)
    return [int(i) for batch in loader for i in batch["id"]], dataset


@pytest.mark.parametrize("name", list(FILTERS))
def test_results_equal_pyarrows_filter(files, name):
    filters = FILTERS[name]
    expression = filters if isinstance(filters, pc.Expression) else pq.filters_to_expression(filters)
    want = ALL.filter(expression)["id"].to_pylist()
    for shuffle in (False, True):  # streamed row groups (iter_filtered) and whole ones (read_filtered)
        got, dataset = ids(files[True], filters=filters, shuffle=shuffle)
        assert sorted(got) == want, (name, shuffle)
        assert len(dataset) == len(want)


def test_ranges_follow_the_pages(files):
    """A sorted column's pages cut a row group into what cannot match, what may, and what must."""
    _, dataset = ids(files[True], filters=[("id", ">=", 130), ("id", "<", 1810)])
    catalog = dataset._catalog
    reader = catalog.format.open(catalog.fs, catalog.files[0].fs_path, None, False)
    assert page_ranges.candidate_ranges(reader, 0, catalog, 0, None) == ((100, 150, page_ranges.SOME), (150, 600, page_ranges.ALL))
    nulls = StructuredDataset(files[True], filters=pc.field("score").is_null())._catalog
    pages = catalog.format.open(nulls.fs, nulls.files[0].fs_path, None, False).column_pages(0, ["score"])["score"][1]
    assert [page.only_nulls for page in pages[7:11]] == [False, True, True, False]  # rows 400..520 hold only nulls
    without = StructuredDataset(files[False], filters=[("id", ">=", 130)])._catalog
    assert page_ranges.candidate_ranges(catalog.format.open(without.fs, without.files[0].fs_path, None, False), 0, without, 0, None) is None


def test_the_cost_model_leaves_small_row_groups_alone(files, monkeypatch):
    """Decoding a footer and page indexes in Python costs more than decoding a small row group:
    with the real cost model these files are read whole (and filtered the same)."""
    monkeypatch.undo()
    page_ranges._MEMO.clear()
    _, dataset = ids(files[True], filters=[("id", ">=", 130), ("id", "<", 1810)])
    catalog = dataset._catalog
    reader = catalog.format.open(catalog.fs, catalog.files[0].fs_path, None, False)
    assert page_ranges.candidate_ranges(reader, 0, catalog, 0, None) is None


class _Counting:
    """A local file whose reads are counted (pyarrow reads it through pa.PythonFile)."""

    read_bytes = 0

    def __init__(self, path: str):
        self._file = open(path, "rb")

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        _Counting.read_bytes += len(data)
        return data

    def seek(self, *args) -> int:
        return self._file.seek(*args)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False


@pytest.mark.parametrize("filters", [[("id", ">=", 50_000)], [[("id", "<", 1_000)], [("id", ">", 55_000)]], [("id", "<", 5_000)]], ids=["tail", "ends", "head"])
def test_pages_that_cannot_match_are_not_read(tmp_path, monkeypatch, filters):
    """Bytes read by the count and by the reads, with and without a page index: with one, only
    the pages that may match (and the page indexes) are read."""
    monkeypatch.setattr(parquet, "open_input", lambda fs, path: pa.PythonFile(_Counting(path), mode="r"))
    numbers = np.arange(60_000)
    data = pa.table({"id": numbers, "noise": np.random.default_rng(0).random(len(numbers))})
    expression = pq.filters_to_expression(filters)
    read = {}
    for index in (True, False):
        (tmp_path / str(index)).mkdir()
        pq.write_table(data, tmp_path / str(index) / "p.parquet", row_group_size=60_000, write_page_index=index, data_page_size=16 * 1024, use_dictionary=False)
        filtering._MEMO.clear()
        _Counting.read_bytes = 0
        dataset = StructuredDataset(str(tmp_path / str(index)), batch_size=256, num_workers=0, filters=filters)
        counted = _Counting.read_bytes
        got = [int(i) for batch in dataset for i in batch["id"]]
        assert got == data.filter(expression)["id"].to_pylist()
        read[index] = (counted, _Counting.read_bytes - counted)
    (count_pages, read_pages), (count_whole, read_whole) = read[True], read[False]
    assert count_pages < 0.7 * count_whole, read
    assert read_pages < 0.5 * read_whole, read


BETWEEN = (pc.field("id") >= 130) & (pc.field("id") < 1810)  # ranges where every row matches: skipped by their rows on resume


@pytest.mark.parametrize(
    ("workers", "shuffle", "filters"),
    [(0, False, BETWEEN), (0, False, BETWEEN & (pc.field("label") != 2)), (0, True, BETWEEN & (pc.field("label") != 2)), (2, False, BETWEEN)],
    ids=["ranges", "label", "shuffled", "workers"],
)
def test_resume_is_exact_with_pruned_pages(files, workers, shuffle, filters):

    def make():
        return StructuredDataset.create_dataloader(files[True], num_workers=workers, shuffle=shuffle, filters=filters, columns=["id", "label"], batch_size=16, chunk_rows=32, split_bytes=4000)

    reference = assert_resumes_exactly(make, epochs=1, deep_stride=8 if workers else 4, batch_key=lambda batch: tuple(batch["id"].tolist()))
    want = ALL.filter(filters)["id"].to_pylist()
    assert sorted(i for batch in reference.batches[0] for i in batch) == want


def test_an_object_stores_files_use_their_page_index(files, s3):
    """S3 (moto): the page indexes are fetched in one round and the results are pyarrow's."""
    urls = s3.upload(files[True], "page-ranges")
    filters = [("id", ">=", 130), ("id", "<", 1810), ("label", "!=", 2)]
    for shuffle in (False, True):  # streamed row groups, and whole ones
        page_ranges._MEMO.clear()
        got, _ = ids(urls, storage_options=s3.options, filters=filters, shuffle=shuffle)
        assert sorted(got) == ALL.filter(pq.filters_to_expression(filters))["id"].to_pylist() == sorted(ids(files[True], filters=filters)[0])
        assert any(ranges is not None for ranges in page_ranges._MEMO.values())


@pytest.mark.parametrize("shuffle", [False, True])
def test_elastic_resume_with_pruned_pages_delivers_every_matching_row_once(files, shuffle):
    """Two ranks stopped at different batches, resumed elastically by three: every matching row once."""
    import collections
    import json

    from torch_dataloader_utils.distributed import merge_states

    config = dict(batch_size=16, split_bytes=4000, chunk_rows=32, shuffle=shuffle, filters=BETWEEN & (pc.field("label") != 2), columns=["id", "label"])
    seen: collections.Counter = collections.Counter()

    def run(rank, world, state=None, stop=None):
        loader, dataset = StructuredDataset.create_dataloader(files[True], rank=rank, world_size=world, num_workers=0, **config)
        if state is not None:
            dataset.load_state_dict(json.loads(json.dumps(state)), elastic=True)
        for index, batch in enumerate(loader):
            if not dataset.last_batch_is_padding:
                seen.update(batch["id"].tolist())
            if stop is not None and index + 1 == stop:
                break
        return dataset.state_dict()

    merged = merge_states([run(rank, 2, stop=3 + 4 * rank) for rank in range(2)])
    for rank in range(3):
        run(rank, 3, merged)
    assert max(seen.values()) == 1 and sorted(seen) == ALL.filter(config["filters"])["id"].to_pylist()


def test_a_damaged_column_index_prunes_nothing(tmp_path):
    """Zeros over one page's max in the column index (the data intact) pruned that page: its
    matching rows were missing without an error; pyarrow's filtered read has them all. Bounds that
    disagree with the chunk's statistics or with each other leave the column unpruned."""
    from torch_dataloader_utils.formats._parquet_footer import CHUNK_INDEXES, GROUP_COLUMNS, footer_struct, row_group

    path = tmp_path / "damaged.parquet"
    pq.write_table(table(0), path, row_group_size=ROWS, write_page_index=True, data_page_size=256, write_batch_size=50)
    chunk = row_group(footer_struct(pq.ParquetFile(path).metadata, 0), 0).structs(GROUP_COLUMNS)[0]  # "id"
    at, length = chunk.get(CHUNK_INDEXES[2]), chunk.get(CHUNK_INDEXES[3])
    data = bytearray(path.read_bytes())
    page_max = (7 * 50 + 49).to_bytes(8, "little")  # page 7 holds ids 350..399
    where = data.index(page_max, at, at + length)
    data[where : where + 8] = bytes(8)
    path.write_bytes(bytes(data))
    filters = [("id", ">=", 360), ("id", "<", 380)]
    assert pq.read_table(path, filters=filters)["id"].to_pylist() == list(range(360, 380))
    loader, dataset = StructuredDataset.create_dataloader(str(path), num_workers=0, batch_size=64, filters=filters, columns=["id"])
    assert [i for batch in loader for i in batch["id"].tolist()] == list(range(360, 380)) and len(dataset) == 20

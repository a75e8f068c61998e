"""What the object-store test modules share: the uploaded LAYOUT dataset, a loader configuration
and S3 options without the client's own retries."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datagen import write_dataset
from servers import s3, s3_options, store_registry  # noqa: F401 - fixtures

LAYOUT = [[120, 80], [150], [60, 90, 70], [110, 40]]
ROWS = sum(map(sum, LAYOUT))


@pytest.fixture(scope="module")
def uploaded(tmp_path_factory):
    """The LAYOUT dataset (Parquet and ORC) on every server that gets started, uploaded once."""
    roots = {}
    for fmt in ("parquet", "orc", "parquet_paged"):
        roots[fmt] = tmp_path_factory.mktemp(f"src-{fmt}")
        write_dataset(roots[fmt], LAYOUT, fmt.split("_")[0], paged=fmt.endswith("paged"))
    done: set = set()

    def ensure(store, fmt="parquet"):
        if (store.name, fmt) not in done:
            store.upload(str(roots[fmt]), f"data-{fmt}")
            done.add((store.name, fmt))
        return store.url(f"data-{fmt}")

    return ensure



def store_config(store, shuffle, **extra):
    config = dict(
        batch_size=25,
        num_workers=2,
        shuffle=shuffle,
        shuffle_seed=3,
        split_bytes=3000,
        chunk_rows=50,
        shuffle_buffer_rows=120,
        storage_options=store.options,
    )
    return {**config, **extra}


@pytest.fixture
def no_client_retries(s3, monkeypatch):
    """S3 options with botocore's and s3fs's own retries off, so only ours can recover."""
    import s3fs

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    yield s3_options(s3.server.endpoint, client_retries=False)
    s3.server.faults.clear()


def ids_parquet(first: int) -> bytes:
    """200 ids in 4 row groups, uncompressed: every ``first`` gives a file of the same size."""
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": pa.array(range(first, first + 200), pa.int64())}), sink, row_group_size=50, compression="none")
    return sink.getvalue().to_pybytes()

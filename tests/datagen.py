"""Small deterministic datasets for the tests: every row has a unique int64 ``id``."""

from __future__ import annotations

import os
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq

from torch_dataloader_utils.formats._parquet_seek import footer_struct, row_group
from torch_dataloader_utils.formats._thrift_compact import Struct, decode_struct, encode_struct


def make_table(first_id: int, rows: int, fixed_list: bool = True) -> pa.Table:
    ids = np.arange(first_id, first_id + rows, dtype=np.int64)
    values = np.repeat(ids.astype(np.float32), 3)
    if fixed_list:
        vec = pa.FixedSizeListArray.from_arrays(pa.array(values), 3)
    else:
        vec = pa.ListArray.from_arrays(pa.array(np.arange(0, 3 * rows + 1, 3, dtype=np.int32)), pa.array(values))
    return pa.table(
        {
            "id": ids,
            "label": (ids % 7).astype(np.int32),
            "x": ids.astype(np.float64) * 0.5,
            "vec": vec,
            "text": pa.array([f"row-{i}" for i in ids]),
        }
    )


#: ParquetWriter options for files with a page index and pages of about 5 rows
PAGED = dict(write_page_index=True, data_page_size=16, write_batch_size=5)  # (at 1 byte, pyarrow 26 writes 1-row row groups it cannot read back)


def write_dataset(root: str | os.PathLike, layout: Sequence[Sequence[int]], fmt: str = "parquet", first_id: int = 0, paged: bool = False) -> int:
    """Write one file per entry of ``layout``; each entry lists the row counts of its row groups
    (Parquet) or stripes (ORC). With ``paged``, Parquet files have a page index and pages of
    about 5 rows. Returns the total rows."""
    os.makedirs(root, exist_ok=True)
    next_id = first_id
    for index, groups in enumerate(layout):
        total = int(sum(groups))
        path = os.path.join(root, f"part-{index:05d}.{fmt}")
        if fmt == "parquet":
            table = make_table(next_id, total)
            with pq.ParquetWriter(path, table.schema, **(PAGED if paged else {})) as writer:
                offset = 0
                for size in groups:
                    writer.write_table(table.slice(offset, size), row_group_size=max(1, size))
                    offset += size
        else:
            # pyarrow's ORC writer closes a stripe when its size estimate passes stripe_size,
            # checked after every internal batch; uncompressed, that gives one stripe per write
            table = make_table(next_id, total, fixed_list=False)
            writer = orc.ORCWriter(path, stripe_size=1, batch_size=max(groups, default=1), compression="uncompressed")
            offset = 0
            for size in groups:
                writer.write(table.slice(offset, size))
                offset += size
            writer.close()
        next_id += total
    return next_id - first_id


def write_formats(tmp_path_factory, layout: Sequence[Sequence[int]]) -> dict[str, str]:
    """``layout`` written once as Parquet and once as ORC, each in a new temporary directory:
    format -> directory."""
    paths = {}
    for fmt in ("parquet", "orc"):
        root = tmp_path_factory.mktemp(fmt)
        write_dataset(root, layout, fmt)
        paths[fmt] = str(root)
    return paths


def corrupt_data_pages(path) -> None:
    """Overwrite a Parquet file's data pages with garbage, keeping its size and footer."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(b"\xff" * (size // 2))


# ------------------------------------------------------------ damaged page indexes
def offset_index_range(path: str | os.PathLike, leaf: int, unit: int = 0) -> tuple[int, int]:
    """(offset, length) of the offset index of leaf column ``leaf`` in row group ``unit``."""
    chunk = row_group(footer_struct(pq.ParquetFile(path).metadata, unit), unit).get(1).values[leaf]
    return chunk.get(4), chunk.get(5)


def set_location(location: Struct, field: int, value: int) -> None:
    """Set a field of a decoded page location (offset 1, size 2, first row 3)."""
    location.set(field, next(kind for fid, kind, _ in location.fields if fid == field), value)


def rewrite_page_index(path: str | os.PathLike, leaf: int, change: Callable[[list[Struct]], None]) -> None:
    """Edit, in place, the offset index of leaf column ``leaf`` (row group 0): ``change`` edits its
    decoded page locations; the encoding must keep its length."""
    offset, length = offset_index_range(path, leaf)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    decoded = decode_struct(bytes(data[offset : offset + length]))[0]
    change(decoded.get(1).values)
    encoded = encode_struct(decoded)
    assert len(encoded) == length, "the damaged page index must keep its encoded length"
    data[offset : offset + length] = encoded
    with open(path, "wb") as f:
        f.write(bytes(data))

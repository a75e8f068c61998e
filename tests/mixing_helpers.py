"""The three sources the mixing tests share: source k's ids start at k * 1000; A 100 rows in
two files, B 25 rows, C 200 rows (x = id / 2 in every row)."""

from __future__ import annotations

from pathlib import Path

from datagen import write_dataset

from torch_dataloader_utils import Source

LAYOUTS = {"a": [[30, 30], [40]], "b": [[12, 13]], "c": [[60, 60], [50, 30]]}
CONFIG = dict(batch_size=16, chunk_rows=32, shuffle_seed=3, shuffle_buffer_rows=40, split_bytes=3000)


def write_sources(root: Path) -> dict[str, str]:
    """The three sources written below ``root``: name -> path."""
    paths = {}
    for index, (name, layout) in enumerate(LAYOUTS.items()):
        write_dataset(root / name, layout, first_id=1000 * index)
        paths[name] = str(root / name)
    return paths


def three_sources(data: dict[str, str], b: int, c: int) -> list[Source]:
    """A at 1x, B and C at ``b`` and ``c`` rows per epoch."""
    return [Source(data["a"]), Source(data["b"], rows_per_epoch=b), Source(data["c"], rows_per_epoch=c)]

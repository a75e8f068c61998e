"""The three sources the mixing tests share: source k's ids start at k * 1000; A 100 rows in
two files, B 25 rows, C 200 rows (x = id / 2 in every row)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from datagen import write_dataset
from resume_helpers import batch_key

from torch_dataloader_utils import Source, StructuredDataset

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


def read_rank(
    data: dict[str, str], rank: int, world: int, workers: int, state: Any = None, stop: int | None = None, form: str = "auto"
) -> tuple[list[Any], Any]:
    """Rank ``rank`` of ``world`` reading the shuffled three-source mixture (batches of 8) from
    ``state`` (elastic) until ``stop`` ids: its ids (padding left out) and its state in ``form``,
    both through JSON."""
    loader, dataset = StructuredDataset.create_dataloader(
        three_sources(data, 60, 70), rank=rank, world_size=world, num_workers=workers, shuffle=True, **{**CONFIG, "batch_size": 8, "chunk_rows": 8}
    )
    if state is not None:
        dataset.load_state_dict(json.loads(json.dumps(state)), elastic=True)
    ids: list[Any] = []
    for batch in loader:
        if not dataset.last_batch_is_padding:
            ids += list(batch_key(batch))
        if stop is not None and len(ids) >= stop:
            break
    return ids, json.loads(json.dumps(dataset.state_dict(form=form)))

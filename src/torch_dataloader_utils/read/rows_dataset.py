"""A map-style torch ``Dataset`` of the dataset's rows, for any ``Sampler``."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .random_access import RowAccess
from .row_keys import split_rows


class RowsDataset(Dataset):
    """Row i of the whole dataset (all files, file order), as ``dataset[i]`` gives it.

    Two ways to use it in a ``DataLoader`` (with worker processes too: each worker opens the
    files and keeps a cache of its own):

    - rows with any ``sampler`` and ``batch_size``: ``DataLoader(rows, batch_size=B,
      sampler=RandomSampler(rows))``. A worker reads each batch's rows in one gather
      (``__getitems__``) and torch's default collate stacks them; variable-length lists then
      need a ``collate_fn`` of your own.
    - batches in the loader's own form: a ``BatchSampler`` as the sampler and
      ``batch_size=None``: ``DataLoader(rows, sampler=BatchSampler(RandomSampler(rows), B,
      drop_last=False), batch_size=None)``. Each index the loader gets is a list of rows, and
      ``rows[list]`` returns them as one batch, exactly as ``StructuredDataset[list]`` does.
    """

    def __init__(self, access: RowAccess):
        self.access = access

    def __len__(self) -> int:
        return self.access.num_rows

    def __getitem__(self, key: Any) -> Any:
        """An int: one row. A list, array, tensor or slice of rows: one batch."""
        return self.access[key]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The rows of one sampled batch, read together (torch's fetcher calls this)."""
        batch = self.access[indices if isinstance(indices, (np.ndarray, torch.Tensor)) else list(indices)]
        return split_rows(batch, len(indices))

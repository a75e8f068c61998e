"""torch_dataloader_utils: exactly-once, resumable PyTorch loading of structured data: Parquet,
ORC, Arrow IPC, CSV and JSON Lines files, and Iceberg and Delta tables.

Names are imported lazily, so that ``tdu --help`` and ``python -m torch_dataloader_utils``
start without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "CheckpointMismatchError": "errors",
    "DataReadError": "errors",
    "DeltaDataset": "table_datasets",
    "FileChangedError": "errors",
    "RemoteReadError": "errors",
    "WideningError": "errors",
    "TransformError": "errors",
    "UnsupportedFileError": "errors",
    "FileLayout": "plan.splits",
    "IcebergDataset": "table_datasets",
    "Ragged": "read.convert",
    "Source": "catalog.mixture",
    "Split": "plan.splits",
    "StructuredDataLoader": "runtime.loader",
    "StructuredDataset": "dataset",
    "assign_splits": "plan.splits",
    "epoch_order": "plan.splits",
    "plan_splits": "plan.splits",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .catalog.mixture import Source
    from .dataset import StructuredDataset
    from .errors import CheckpointMismatchError, DataReadError, FileChangedError, RemoteReadError, TransformError, UnsupportedFileError, WideningError
    from .plan.splits import FileLayout, Split, assign_splits, epoch_order, plan_splits
    from .read.convert import Ragged
    from .runtime.loader import StructuredDataLoader
    from .table_datasets import DeltaDataset, IcebergDataset


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)

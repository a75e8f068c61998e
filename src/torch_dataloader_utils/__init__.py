"""torch_dataloader_utils: exactly-once, resumable PyTorch loading of Parquet and ORC files."""

from .convert import Ragged
from .dataset import StructuredDataset
from .errors import CheckpointMismatchError, DataReadError
from .loader import StructuredDataLoader
from .planner import FileLayout, Split, assign_splits, epoch_order, plan_splits

__version__ = "0.1.0"

__all__ = [
    "CheckpointMismatchError",
    "DataReadError",
    "FileLayout",
    "Ragged",
    "Split",
    "StructuredDataLoader",
    "StructuredDataset",
    "assign_splits",
    "epoch_order",
    "plan_splits",
]

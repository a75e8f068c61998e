"""The dataset's arguments, checked once: every bad value is a ValueError naming the argument."""

from __future__ import annotations

import logging
import multiprocessing
import operator
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .plan.epoch import EQUALIZE_POLICIES
from .plan.sizes import parse_size
from .plan.splits import MAX_ROW_COUNT, MAX_SEED_WORD, MAX_SPLIT_BYTES
from .read.nulls import DEFAULT_POLICY, ColumnPolicy, check_policy

log = logging.getLogger("torch_dataloader_utils.dataset")

DEFAULT_SHUFFLE_BUFFER_ROWS = 1 << 18
#: fewer crossings of the DataLoader than smaller chunks, half as much in flight as 65536
DEFAULT_CHUNK_ROWS = 1 << 15
ON_ERROR_POLICIES = ("raise", "skip")


@dataclass(frozen=True)
class DatasetOptions:
    """Validated dataset arguments (``chunk_rows`` rounded down to whole batches)."""

    rank: int
    world_size: int
    batch_size: int
    num_workers: int
    shuffle: bool
    shuffle_seed: int
    columns: list[str] | None
    drop_last: bool
    equalize: str
    on_error: str
    shuffle_buffer_rows: int
    chunk_rows: int
    split_bytes: int
    split_rows: int | None = None
    policy: ColumnPolicy = DEFAULT_POLICY  # nulls=, fill_values=, decimals=


def check_options(
    *,
    batch_size: Any,
    num_workers: Any,
    shuffle: Any,
    shuffle_seed: Any,
    columns: Sequence[str] | None,
    split_bytes: Any,
    rank: Any,
    world_size: Any,
    drop_last: Any,
    equalize: Any,
    on_error: Any,
    shuffle_buffer_rows: Any,
    chunk_rows: Any,
    split_rows: Any = None,
    nulls: Any = "raise",
    fill_values: Any = None,
    decimals: Any = "float64",
) -> DatasetOptions:
    """The arguments as a DatasetOptions, or a ValueError naming the first bad one."""
    batch_size = at_least("batch_size", batch_size, 1, MAX_ROW_COUNT)
    shuffle, drop_last = boolean("shuffle", shuffle), boolean("drop_last", drop_last)
    num_workers = at_least("num_workers", num_workers, 0)
    shuffle_seed = at_least("shuffle_seed", shuffle_seed, 0)
    if shuffle and shuffle_seed > MAX_SEED_WORD:  # a larger seed would give the order of another (seed, epoch)
        raise ValueError(
            f"shuffle_seed must be <= {MAX_SEED_WORD} (32 bits) with shuffle=True, got {shuffle_seed}; e.g. use seed % 2**32 "
            "(a checkpoint an earlier version saved with a larger seed cannot be resumed exactly: start its epoch fresh)"
        )
    shuffle_buffer_rows = at_least("shuffle_buffer_rows", shuffle_buffer_rows, 1, MAX_ROW_COUNT)
    chunk_rows = at_least("chunk_rows", chunk_rows, 1, MAX_ROW_COUNT)
    split_bytes = at_least("split_bytes", parse_size("split_bytes", split_bytes), 1, MAX_SPLIT_BYTES)
    split_rows = None if split_rows is None else at_least("split_rows", split_rows, 1, MAX_ROW_COUNT)
    if isinstance(columns, (str, bytes)):
        raise ValueError(f"columns must be a list of column names, got {columns!r}; e.g. columns=[{columns!r}]")
    if columns is not None:
        names = list(columns) if hasattr(columns, "__iter__") else None
        if not names or not all(isinstance(name, str) for name in names):
            raise ValueError(f"columns must be a non-empty list of column names (strings), got {columns!r:.200}; pass None for all columns")
        columns = names
    if equalize not in EQUALIZE_POLICIES:
        raise ValueError(f"equalize must be one of {EQUALIZE_POLICIES}, got {equalize!r}")
    if on_error not in ON_ERROR_POLICIES:
        raise ValueError(f"on_error must be one of {ON_ERROR_POLICIES}, got {on_error!r}")
    rank, world_size = default_topology(rank, world_size)
    if on_error == "skip" and world_size > 1 and equalize != "none":
        raise ValueError(
            "on_error='skip' can leave ranks with different batch counts, which would hang DDP; "
            "use on_error='raise', or equalize='none' and handle uneven ends yourself (e.g. torch's Join)"
        )
    return DatasetOptions(
        rank=rank,
        world_size=world_size,
        batch_size=batch_size,
        num_workers=num_workers,
        shuffle=shuffle,
        shuffle_seed=shuffle_seed,
        columns=list(columns) if columns is not None else None,
        drop_last=drop_last,
        equalize=equalize,
        on_error=on_error,
        shuffle_buffer_rows=shuffle_buffer_rows,
        chunk_rows=batch_size * max(1, chunk_rows // batch_size),
        split_bytes=split_bytes,
        split_rows=split_rows,
        policy=check_policy(nulls, fill_values, decimals),
    )


def integer(name: str, value: Any) -> int:
    """``value`` as an int (numpy and torch integers too); a ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return operator.index(value)


def boolean(name: str, value: Any) -> bool:
    """``value`` as a bool (numpy's, 0 and 1 too); a ValueError naming ``name`` otherwise (it is
    saved in the state and compared at a resume, so "yes" must not pass as true)."""
    if not isinstance(value, (bool, np.bool_, int, np.integer)) or value not in (0, 1):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def at_least(name: str, value: Any, least: int, most: int | None = None) -> int:
    """``value`` as an int >= ``least`` (and <= ``most``); a ValueError naming ``name`` otherwise."""
    value = integer(name, value)
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")
    if most is not None and value > most:
        raise ValueError(f"{name} must be <= {most:,}, got {value}")
    return value


def check_loader_options(options: Mapping[str, Any]) -> None:
    """The DataLoader options that ``create_dataloader`` passes on, checked before planning (torch
    refuses some of them only when the first batch is asked for)."""
    for name in ("pin_memory", "persistent_workers"):
        if name in options:
            boolean(name, options[name])
    if options.get("prefetch_factor") is not None:
        at_least("prefetch_factor", options["prefetch_factor"], 1)
    context = options.get("multiprocessing_context")
    methods = multiprocessing.get_all_start_methods()
    if context is not None and (context not in methods if isinstance(context, str) else not hasattr(context, "get_start_method")):
        raise ValueError(f"multiprocessing_context must be a start method name of this platform {methods} or a context, got {context!r}")
    timeout = options.get("timeout", 0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ValueError(f"timeout must be a number of seconds >= 0 (0: no limit), got {timeout!r}")


def default_topology(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world_size): the given values, else torch.distributed's when initialized, else (0, 1)."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        initialized = dist.is_available() and dist.is_initialized()
        if not initialized:
            _warn_if_launched_without_process_group()
        if rank is None:
            rank = dist.get_rank() if initialized else 0
        if world_size is None:
            world_size = dist.get_world_size() if initialized else 1
    rank, world_size = integer("rank", rank), integer("world_size", world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size): got rank={rank}, world_size={world_size}")
    return rank, world_size


def _warn_if_launched_without_process_group() -> None:
    launched = os.environ.get("WORLD_SIZE", "1")
    if launched.isdigit() and int(launched) > 1:
        log.warning(
            "WORLD_SIZE=%s is set but torch.distributed is not initialized, so this process reads every row as rank 0 "
            "of 1 (each process would deliver the whole epoch). Call torch.distributed.init_process_group() before "
            "creating the dataset, or pass rank= and world_size=",
            launched,
        )

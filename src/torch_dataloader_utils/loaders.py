"""Building the loaders a ``StructuredDataset`` is read with: its own (``create_dataloader``) and
torchdata's ``StatefulDataLoader`` (``stateful_dataloader``)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Sequence

from .options import check_loader_options
from .read.output_formats import TRANSFORM_LEAVES_PROCESS
from .runtime.device_feed import check_device
from .runtime.loader import WORKER_MODES, StructuredDataLoader

if TYPE_CHECKING:
    from .dataset import StructuredDataset

#: the DataLoader options create_dataloader passes on (StructuredDataLoader's keyword arguments)
LOADER_OPTIONS = tuple(name for name, p in inspect.signature(StructuredDataLoader.__init__).parameters.items() if p.kind is p.KEYWORD_ONLY)
#: DataLoader options the loader sets itself
FIXED_LOADER_OPTIONS = {"collate_fn", "worker_init_fn", "sampler", "batch_sampler", "generator", "in_order"}


def create_dataloader(
    dataset_class: type[StructuredDataset], path: str | Sequence[str], format: str | None, kwargs: dict[str, Any]
) -> tuple[StructuredDataLoader, StructuredDataset]:
    """``StructuredDataset.create_dataloader``: the loader options checked before planning, then the dataset and its loader."""
    loader_kwargs = {k: kwargs.pop(k) for k in LOADER_OPTIONS if k in kwargs}
    fixed = sorted(set(kwargs) & FIXED_LOADER_OPTIONS)
    if fixed:
        raise TypeError(f"create_dataloader does not take the DataLoader option(s) {fixed}: the loader sets them itself (batches come "
                        f"from the dataset's batch_size, order from its plan). It takes {list(LOADER_OPTIONS)}; for a DataLoader of "
                        "your own, see docs/stateful-dataloader.md")  # fmt: skip
    check_loader_options(loader_kwargs)
    mode = loader_kwargs.get("worker_mode", "process")
    if mode not in WORKER_MODES:
        raise ValueError(f"worker_mode must be one of {WORKER_MODES}, got {mode!r}")
    device = check_device(loader_kwargs.get("device"))  # before planning: a machine without CUDA fails at once
    if device is not None and (kwargs.get("output_format", "torch") != "torch" or kwargs.get("transform") is not None):
        raise ValueError("device= feeds torch batches: it takes output_format='torch' without a transform; move your batches yourself")
    token = TRANSFORM_LEAVES_PROCESS.set(mode == "process")
    try:
        dataset = dataset_class(path, format, **kwargs)
    finally:
        TRANSFORM_LEAVES_PROCESS.reset(token)
    return StructuredDataLoader(dataset, **loader_kwargs), dataset


def create_dataloader_signature(dataset_class: type, base: type | None = None) -> inspect.Signature:
    """What the classmethod ``create_dataloader`` takes, for ``help()`` and ``inspect``: ``cls``,
    the dataset's arguments (a subclass's own, then those of ``base`` it passes on through
    ``**kwargs``), then the loader's."""
    own = list(inspect.signature(dataset_class).parameters.values())
    params = [inspect.Parameter("cls", inspect.Parameter.POSITIONAL_OR_KEYWORD), *(p for p in own if p.kind is not p.VAR_KEYWORD)]
    if base is not None and any(p.kind is p.VAR_KEYWORD for p in own):  # the rest goes on to base
        names = {p.name for p in params}
        params += [p for p in inspect.signature(base).parameters.values() if p.kind is p.KEYWORD_ONLY and p.name not in names]
    loader = [p for name, p in inspect.signature(StructuredDataLoader.__init__).parameters.items() if name in LOADER_OPTIONS]
    return inspect.Signature(params + loader, return_annotation=f"tuple[StructuredDataLoader, {dataset_class.__name__}]")


def stateful_dataloader(dataset: StructuredDataset, **kwargs: Any) -> Any:
    """torchdata's ``StatefulDataLoader`` over ``dataset``, with ``batch_size=None`` and the dataset's ``num_workers``."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as error:
        raise ImportError(
            f"{error}; StatefulDataLoader comes with torchdata: pip install torchdata "
            '(or, in a checkout of this library: pip install -e ".[torchdata]")'
        ) from error
    for name, wanted in (("batch_size", None), ("num_workers", dataset.num_workers)):
        if name in kwargs and kwargs[name] != wanted:
            raise ValueError(
                f"stateful_dataloader takes {name}={wanted!r} (the dataset yields whole batches of its batch_size, and plans one stream "
                f"per worker of its num_workers), got {name}={kwargs[name]!r}: set it on the dataset instead"
            )
        kwargs[name] = wanted
    return StatefulDataLoader(dataset, **kwargs)

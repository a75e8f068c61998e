"""Run a loader, record every batch and the state after it, and resume from any point."""

from __future__ import annotations

import json
from typing import Any, Callable

import torch

from torch_dataloader_utils import StructuredDataset


def batch_key(batch: dict[str, Any]) -> tuple:
    """A comparable fingerprint of a batch: its ids plus a check of the other columns."""
    ids = batch["id"].tolist()
    assert batch["text"] == [f"row-{i}" for i in ids], "text column out of step with id"
    assert torch.equal(batch["x"], batch["id"].double() * 0.5)
    return tuple(ids)


def make(path: str, **kwargs: Any):
    return StructuredDataset.create_dataloader(path, **kwargs)


def run_epoch(loader, dataset, states: list | None = None, key: Callable[[dict], tuple] = batch_key) -> list[tuple]:
    """All batches of one pass (as ``key``s); with ``states`` also the JSON state after every batch."""
    batches = []
    for batch in loader:
        batches.append(key(batch))
        if states is not None:
            states.append(as_json(dataset.state_dict()))
    return batches


def resume(path: str, state: dict, epoch: int | None = None, **kwargs: Any) -> list[tuple]:
    """A fresh dataset and loader that load ``state`` and run to the end of the epoch."""
    loader, dataset = make(path, **kwargs)
    dataset.load_state_dict(as_json(state))
    if epoch is not None:
        dataset.set_epoch(epoch)
    return run_epoch(loader, dataset)


def assert_exactly_once(batches: list[tuple], total_rows: int) -> None:
    ids = [i for b in batches for i in b]
    assert len(ids) == len(set(ids)), "a row was delivered twice"
    assert sorted(ids) == list(range(total_rows)), "rows were lost"


def stop_failed_workers(error: BaseException) -> None:
    """Shut down the workers of an iterator that failed while starting.

    torchdata leaves them to the garbage collector, which may close their queues
    first and then wait 5 s per worker; a job that exits on the error is unaffected.
    """
    frame = error.__traceback__
    while frame is not None:
        owner = frame.tb_frame.f_locals.get("self")
        if type(owner).__name__ == "_StatefulMultiProcessingDataLoaderIter":
            owner._shutdown_workers()
            return
        frame = frame.tb_next


def as_json(value: Any) -> Any:
    """``value`` after a round trip through JSON, as a checkpoint file gives it back."""
    return json.loads(json.dumps(value))


def canonical_config(world: int, workers: int, global_rows: int, lanes: int, **settings: Any) -> dict:
    """create_dataloader settings for one of ``world`` ranks sharing a global batch of
    ``global_rows`` over ``lanes`` canonical lanes (two batches a chunk); ``settings`` add or override."""
    config = dict(
        batch_size=global_rows // world, num_workers=workers, world_size=world, canonical_lanes=lanes,
        shuffle=True, chunk_rows=2 * global_rows // world,
    )  # fmt: skip
    return {**config, **settings}


def rank_batches(source: Any, config: dict, epochs=(0,), state: dict | None = None, elastic: bool = False, stop: tuple | None = None):
    """Each batch of one rank (``batch_key``), per epoch, and its state (through JSON) where it
    stopped: ``stop=(epoch, n)`` stops after the n-th batch of that epoch."""
    loader, dataset = StructuredDataset.create_dataloader(source, **config)
    if state is not None:
        dataset.load_state_dict(as_json(state), elastic=elastic)
    out: list[list[tuple]] = []
    for epoch in epochs:
        if state is None or epoch != dataset.epoch:
            dataset.set_epoch(epoch)
        out.append([])
        for batch in loader:
            out[-1].append(batch_key(batch))
            if stop is not None and (epoch, len(out[-1])) == stop:
                break
        else:
            continue
        break
    return out, as_json(dataset.state_dict())

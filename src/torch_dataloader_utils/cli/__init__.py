"""The ``tdu`` command line (also ``python -m torch_dataloader_utils``).

Commands: ``plan`` (how a path is cut into splits and dealt to ranks and
workers), ``inspect`` (explain a saved dataset state, and check it against the
data), ``bench`` (this loader's throughput on your data) and ``demo`` (train,
crash, resume, check every row was seen once).

Exit codes: 0 success; 1 the check ran and failed (demo not exactly-once, the
state does not fit the data); 2 usage or input error (bad arguments, missing
files, not a dataset state).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import math
import os
import re
import statistics
import sys
import time
from typing import Any, Callable, Sequence

from ..plan.splits import MAX_ROW_COUNT, MAX_SEED_WORD, MAX_SPLIT_BYTES

log = logging.getLogger("torch_dataloader_utils.cli")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad input from the user: printed without a traceback, exit code 2."""


# ------------------------------------------------------------- helpers
_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "M": 1000**2, "MB": 1000**2, "G": 1000**3, "GB": 1000**3,
          "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3}


def parse_size(text: str) -> int:
    """'134217728', '128MiB', '64MB', '1.5GiB' -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else None
    if not match or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 1048576, 64MiB, 128MB, 1GiB)")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    if value > MAX_SPLIT_BYTES:
        raise argparse.ArgumentTypeError(f"size must be <= {MAX_SPLIT_BYTES:,} bytes: {text!r}")
    return value


def _int_at_least(minimum: int, maximum: int = MAX_ROW_COUNT) -> Callable[[str], int]:
    """An argparse type: an integer in [``minimum``, ``maximum``]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}: {text!r}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum:,}: {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _storage_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r} (example: anon=true)")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _storage_options(args: argparse.Namespace) -> dict | None:
    return dict(args.storage_option) if args.storage_option else None


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


# ---------------------------------------------------------------- plan
def _split_bytes_of(layout: Any, start: int, stop: int) -> int:
    """Compressed bytes of the units that hold rows [start, stop) of a file."""
    total, first = 0, 0
    for rows, size in zip(layout.unit_rows, layout.unit_bytes):
        if first < stop and first + rows > start:
            total += size
        first += rows
    return total


def compute_plan(
    catalog: Any, world_size: int, num_workers: int, batch_size: int, shuffle: bool, seed: int, epoch: int, equalize: str = "pad"
) -> dict:
    """Files, splits, and what every (rank, worker) reads in ``epoch``, from a built catalog."""
    from ..plan.splits import assign_splits, epoch_order

    layouts = catalog.layouts
    split_rows = [r.stop - r.start for r in catalog.split_rows]
    split_bytes = [_split_bytes_of(layouts[r.file], r.start, r.stop) for r in catalog.split_rows]
    order = epoch_order(len(catalog.splits), shuffle, seed, epoch)
    workers, ranks = [], []
    for rank in range(world_size):
        own = []
        for worker, indices in enumerate(assign_splits(order, rank, world_size, num_workers)):
            rows = sum(split_rows[i] for i in indices)
            own.append({"rank": rank, "worker": worker, "splits": len(indices), "rows": rows,
                        "bytes": sum(split_bytes[i] for i in indices), "batches": -(-rows // batch_size)})
        workers += own
        ranks.append({"rank": rank, "rows": sum(w["rows"] for w in own), "batches": sum(w["batches"] for w in own)})
    files_cut = sum(1 for count in collections.Counter(s.path for s in catalog.splits).values() if count > 1)
    counts = [r["batches"] for r in ranks]
    # under DDP every rank delivers the same number of batches (see StructuredDataset's equalize)
    delivered = max(counts) if equalize == "pad" else min(counts) if equalize == "drop" else None
    for r in ranks:
        r["batches_delivered"] = r["batches"] if world_size == 1 or delivered is None else delivered
    return {
        "format": catalog.format.name,
        "files": len(catalog.files),
        "rows": sum(layout.num_rows for layout in layouts),
        "bytes": sum(f.size for f in catalog.files),
        "largest_file_bytes": max((f.size for f in catalog.files), default=0),
        "units": sum(len(layout.unit_rows) for layout in layouts),
        "splits": len(catalog.splits),
        "files_cut": files_cut,
        "split_bytes": catalog.split_bytes,
        "split_rows": {"min": min(split_rows, default=0), "median": int(statistics.median(split_rows)) if split_rows else 0,
                       "max": max(split_rows, default=0)},
        "world_size": world_size,
        "num_workers": num_workers,
        "batch_size": batch_size,
        "shuffle": shuffle,
        "shuffle_seed": seed,
        "epoch": epoch,
        "equalize": equalize,
        "workers": workers,
        "ranks": ranks,
    }


def _spread(values: Sequence[int]) -> str:
    mean = sum(values) / len(values) if values else 0
    above = (max(values) / mean - 1) if mean else 0.0
    return f"min {min(values):,} / max {max(values):,} (max is {above:.0%} above the mean)"


def plan_advice(plan: dict) -> list[str]:
    """Warnings about an unbalanced or starved plan, with what to change."""
    advice = []
    slots = plan["world_size"] * max(1, plan["num_workers"])
    idle = sum(1 for w in plan["workers"] if w["splits"] == 0)
    if idle:
        advice.append(
            f"{idle} of {slots} workers get no split and idle: there are {plan['splits']} splits for {slots} "
            f"(rank, worker) slots. "
            + (
                f"Lower --split-bytes (now {human_bytes(plan['split_bytes'])}) or use fewer workers."
                if plan["splits"] < plan["units"]
                else "Every row group (ORC: stripe) is already a split of its own: use fewer workers, or write smaller row groups."
            )
        )
    rows = [w["rows"] for w in plan["workers"]]
    mean = sum(rows) / len(rows) if rows else 0
    if not idle and mean and max(rows) / mean > 1.25:
        advice.append(
            "the busiest worker reads more than 25% above the mean: "
            + (
                "smaller splits (--split-bytes) balance better."
                if plan["splits"] < plan["units"]
                else "every row group (ORC: stripe) is already a split of its own: write smaller or more even row groups, or use fewer workers."
            )
        )
    return advice


def print_plan(plan: dict, path: str, show_all: bool) -> None:
    print(f"plan of {path} ({plan['format']})")
    print(f"  files     {plan['files']:,}: {plan['rows']:,} rows, {human_bytes(plan['bytes'])}, "
          f"{plan['units']:,} {'row groups' if plan['format'] == 'parquet' else 'stripes'}, "
          f"largest file {human_bytes(plan['largest_file_bytes'])}")
    rows = plan["split_rows"]
    print(f"  splits    {plan['splits']:,} at split_bytes {human_bytes(plan['split_bytes'])}: rows per split "
          f"min {rows['min']:,} / median {rows['median']:,} / max {rows['max']:,}; {plan['files_cut']} files cut into several splits")
    shuffle = f"shuffle on (seed {plan['shuffle_seed']})" if plan["shuffle"] else "shuffle off"
    print(f"  topology  world_size {plan['world_size']} x num_workers {plan['num_workers']}, epoch {plan['epoch']}, "
          f"{shuffle}, batch_size {plan['batch_size']:,}")
    workers = plan["workers"]
    if show_all or len(workers) <= 32:
        print()
        print(f"  {'rank':>5} {'worker':>6} {'splits':>7} {'rows':>12} {'bytes':>11} {'batches':>8}")
        for w in workers:
            print(f"  {w['rank']:>5} {w['worker']:>6} {w['splits']:>7,} {w['rows']:>12,} {human_bytes(w['bytes']):>11} {w['batches']:>8,}")
    else:
        print(f"  ({len(workers)} rank/worker rows hidden; --all shows them)")
    print()
    print(f"  balance   rows per worker: {_spread([w['rows'] for w in workers])}")
    if plan["world_size"] > 1:
        print(f"            rows per rank: {_spread([r['rows'] for r in plan['ranks']])}")
        print(f"            batches per rank: {_spread([r['batches'] for r in plan['ranks']])}")
        delivered = plan["ranks"][0]["batches_delivered"]
        if plan["equalize"] == "pad":
            print(f"            equalize=pad: every rank delivers {delivered:,} batches (short ranks repeat some of their own rows)")
        elif plan["equalize"] == "drop":
            print(f"            equalize=drop: every rank delivers {delivered:,} batches (the rest of longer ranks is skipped)")
    for line in plan_advice(plan):
        print(f"  note: {line}")


def cmd_plan(args: argparse.Namespace) -> int:
    from ..catalog.build import build_catalog

    started = time.perf_counter()
    catalog = build_catalog(args.path, args.format, _storage_options(args), args.split_bytes)
    log.info("planned in %.2f s", time.perf_counter() - started)
    plan = compute_plan(
        catalog, args.world_size, args.num_workers, args.batch_size, args.shuffle, args.shuffle_seed, args.epoch, args.equalize
    )
    if args.json:
        _print_json(plan)
    else:
        print_plan(plan, " ".join(args.path), args.all)
    return EXIT_OK


# ------------------------------------------------------------- inspect
def _looks_like_state(value: Any) -> bool:
    return isinstance(value, dict) and "format_version" in value and ("rows_delivered" in value or "completed_shards" in value)


def _rank_parts(state: dict, key: str) -> list[tuple[str, dict]]:
    """A global state (every rank in one dict) as one rank state per rank."""
    from ..distributed import local_state

    ranks = state.get("ranks")
    if not isinstance(ranks, list) or not ranks or not all(isinstance(part, dict) for part in ranks):
        raise UsageError(f"the global state at {key or 'the top level'!r} has no 'ranks' list of rank states; it is damaged")
    label = f"{key} " if key else ""
    return [(f"{label}(global state) rank {rank}", local_state(state, rank)) for rank in range(len(ranks))]


def find_states(value: Any, key: str = "", depth: int = 0) -> list[tuple[str, dict]]:
    """Every dataset state inside a loaded checkpoint, with its key path (``a.b.0``)."""
    if isinstance(value, dict) and "format_version" in value and value.get("scope") == "global":
        return _rank_parts(value, key)
    if _looks_like_state(value):
        return [(key, value)]
    if depth >= 6:
        return []
    items: list[tuple[Any, Any]] = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    found = []
    for name, child in items:
        found += find_states(child, f"{key}.{name}" if key else str(name), depth + 1)
    return found


def _select(value: Any, key: str) -> Any:
    for part in key.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, (list, tuple)) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            options = list(value)[:20] if isinstance(value, dict) else f"indices 0..{len(value) - 1}" if isinstance(value, (list, tuple)) else "none"
            raise UsageError(f"--key {key!r}: no {part!r} here; available: {options}")
    return value


def load_checkpoint(path: str) -> Any:
    """A JSON file, or a torch checkpoint loaded with weights_only=True (loading never runs code)."""
    if not os.path.isfile(path):
        raise UsageError(f"no such file: {path}")
    with open(path, "rb") as file:
        head = file.read(64).lstrip()
    if head.startswith((b"{", b"[")):
        try:
            with open(path) as file:
                return json.load(file)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise UsageError(f"{path} looks like JSON but does not parse: {error}") from None
    if head[:1] and head[:1] in b'"-0123456789tfn':  # a JSON value that is not an object: states_in says what it holds
        try:
            with open(path) as file:
                return json.load(file)
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any failure means we cannot read it safely
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        reason = next((line for line in lines if "Unsupported global" in line), lines[0] if lines else type(error).__name__)
        if not _looks_like_torch_save(path):
            reason = "it is neither JSON nor a file torch.save writes"
        raise UsageError(
            f"cannot read {path} as JSON or as a torch checkpoint with weights_only=True ({reason}). "
            "tdu never unpickles arbitrary objects; save dataset.state_dict() as plain data (it is JSON-able)."
        ) from None


def _looks_like_torch_save(path: str) -> bool:
    """Starts like a zip archive (torch.save's format; a truncated one too) or a pickle (its legacy format)."""
    with open(path, "rb") as file:
        head = file.read(4)
    return head[:1] == b"\x80" or head == b"PK\x03\x04"  # the pickle protocol opcode, a zip entry's signature


def states_in(checkpoint: Any, key: str | None, path: str) -> list[tuple[str, dict]]:
    """The dataset state(s) to inspect: at ``key``, or all found in the checkpoint."""
    if key:
        value = _select(checkpoint, key)
        found = find_states(value, key)
        if not found:
            raise UsageError(f"{path}: the value at --key {key!r} is not a torch_dataloader_utils dataset state")
        return found
    found = find_states(checkpoint)
    if not found:
        if not isinstance(checkpoint, (dict, list)):
            raise UsageError(f"{path}: holds a {type(checkpoint).__name__} ({checkpoint!r:.40}), not a dataset state; "
                             "save dataset.state_dict() (a dict) or a dict that holds it")
        keys = list(checkpoint)[:20] if isinstance(checkpoint, dict) else f"a list of {len(checkpoint)}"
        raise UsageError(f"{path}: no torch_dataloader_utils dataset state found (top-level keys: {keys}); "
                         "name the key that holds dataset.state_dict() with --key")
    return found


def _is_count(value: Any) -> bool:
    """state.is_count, written again here: importing state would import numpy for `tdu --help`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _are_counts(value: Any) -> bool:
    return isinstance(value, list) and all(map(_is_count, value))


def _is_split(value: Any) -> bool:
    """A split as states store it: a dict with, if cut from a file, an integer row range."""
    if not isinstance(value, dict):
        return False
    offset = value.get("row_offset")
    return (offset is None or _is_count(offset) and _is_count(value.get("row_length"))) and _is_count(value.get("rows_done", 0))


def _are_worker_splits(value: Any) -> bool:
    """'completed_shards' / 'in_progress': per worker, a dict whose 'splits' is a list of splits."""
    return isinstance(value, list) and all(
        isinstance(entry, dict) and isinstance(entry.get("splits", []), list) and all(map(_is_split, entry.get("splits", [])))
        for entry in value
    )


_MISSING = object()
_Field = tuple[Callable[[Any], bool], str]  # (check, what the value must be)


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is _MISSING or value is None or check(value)


_COUNTS = "a list of row counts (integers >= 0), one per worker"
_WORKER_SPLITS = "a list of {'worker': N, 'splits': [...]} entries"
# the configuration values that become dataset arguments (inspect with PATH) and must be integers
_TOPOLOGY_FIELDS: dict[str, _Field] = {
    **{
        key: (lambda v: v is _MISSING or _is_count(v), "an integer >= 0")
        for key in ("_num_workers", "_world_size", "_rank", "_split_bytes", "_batch_size", "_shuffle_seed", "_shuffle_buffer_rows")
    },
    **{key: (lambda v: v is _MISSING or v in (True, False), "true or false") for key in ("_shuffle", "_drop_last")},
    "epoch": (_is_count, "an epoch number (an integer >= 0)"),
}
# what describe_state and print_state read, by scope
_RANK_FIELDS: dict[str, _Field] = {
    "rows_delivered": (_are_counts, _COUNTS),
    "next_worker": (_optional(_is_count), "the index of a worker (an integer >= 0)"),
    "rows_total": (_optional(_are_counts), _COUNTS),
    "batches_delivered": (_optional(_is_count), "a batch count (an integer >= 0)"),
    "files": (_optional(lambda v: isinstance(v, list)), "a list of [path, size, tag] entries"),
    "completed_shards": (_optional(_are_worker_splits), _WORKER_SPLITS),
    "in_progress": (_optional(_are_worker_splits), _WORKER_SPLITS),
    "skipped_splits": (_optional(lambda v: isinstance(v, list) and all(map(_is_split, v))), "a list of splits"),
    **_TOPOLOGY_FIELDS,
}
_WORKER_FIELDS: dict[str, _Field] = {"rows_delivered": (_is_count, "a row count (an integer >= 0)"), **_TOPOLOGY_FIELDS}


def check_state_fields(state: dict) -> None:
    """Raise UsageError naming the first key that ``describe_state`` cannot read."""
    fields = _WORKER_FIELDS if state.get("scope") == "worker" else _RANK_FIELDS
    for key, (valid, expected) in fields.items():
        value = state.get(key, _MISSING)
        if not valid(value):
            found = "it is missing" if value is _MISSING else f"found {value!r:.80}"
            raise _damaged(key, f"expected {expected}, {found}")
    if state.get("scope") != "worker":
        delivered, next_worker = state["rows_delivered"], state.get("next_worker")
        if isinstance(next_worker, int) and next_worker >= max(1, len(delivered)):
            raise _damaged("next_worker", f"there are {len(delivered)} workers, found {next_worker}")
        totals = state.get("rows_total")
        if isinstance(totals, list) and (len(totals) != len(delivered) or any(d > t for d, t in zip(delivered, totals))):
            raise _damaged("rows_total", f"one total per worker, each at least its rows_delivered ({delivered}), found {totals!r:.80}")


def _damaged(key: str, detail: str) -> UsageError:
    return UsageError(f"state key {key!r} is damaged: {detail}. The state was altered or not saved from "
                      "dataset.state_dict(); use an intact copy of the checkpoint or discard it")


def describe_state(state: dict) -> dict:
    """Epoch, progress, rows remaining and topology of a state, from the state alone."""
    from ..state.checkpoint import CONFIG_KEYS

    check_state_fields(state)
    topology = {name: state.get(key) for key, name in CONFIG_KEYS.items()}
    info: dict[str, Any] = {"scope": state.get("scope", "rank"), "format_version": state.get("format_version"),
                            "epoch": state.get("epoch"), "topology": topology}
    if info["scope"] == "worker":
        info.update(worker=state.get("worker"), rows_delivered=state.get("rows_delivered"), files_digest=state.get("files_digest"))
        return info
    delivered = state["rows_delivered"]
    totals = state.get("rows_total")
    workers = []
    for index, done in enumerate(delivered):
        completed = _entry_splits(state.get("completed_shards"), index)
        partial = _entry_splits(state.get("in_progress"), index)
        total = totals[index] if isinstance(totals, list) and index < len(totals) else None
        workers.append({"worker": index, "rows_delivered": done, "rows_total": total,
                        "rows_remaining": None if total is None else total - done,
                        "splits_completed": len(completed), "in_progress": partial})
    files = state.get("files") or []
    info.update(
        files=len(files),
        files_bytes=sum(f[1] for f in files if isinstance(f, list) and len(f) > 1 and isinstance(f[1], int)),
        next_worker=state.get("next_worker"),
        rows_delivered=sum(delivered),
        rows_total=sum(totals) if isinstance(totals, list) else None,
        rows_remaining=sum(totals) - sum(delivered) if isinstance(totals, list) else None,
        workers=workers,
        skipped_splits=list(state.get("skipped_splits") or []),
    )
    return info


def _entry_splits(entries: Any, worker: int) -> list[dict]:
    if isinstance(entries, list) and worker < len(entries) and isinstance(entries[worker], dict):
        return list(entries[worker].get("splits") or [])
    return []


def _split_text(split: dict) -> str:
    where = "full file" if split.get("row_offset") is None else f"rows [{split['row_offset']:,}, {split['row_offset'] + split['row_length']:,})"
    done = f", {split['rows_done']:,} rows done" if "rows_done" in split else ""
    return f"{split.get('path')}  {where}{done}"


def print_state(info: dict, label: str) -> None:
    topo = info["topology"]
    print(f"dataset state{label}: {info['scope']} state, format_version {info['format_version']}")
    print(f"  epoch      {info['epoch']}")
    print("  topology   " + ", ".join(f"{k}={v}" for k, v in topo.items()))
    if info["scope"] == "worker":
        print(f"  progress   worker {info['worker']}: {info['rows_delivered']:,} rows delivered (a StatefulDataLoader worker state)")
        return
    total = info["rows_total"]
    share = f" of {total:,} ({info['rows_delivered'] / total:.1%})" if total else ""
    print(f"  files      {info['files']:,} ({human_bytes(info['files_bytes'])})")
    print(f"  progress   {info['rows_delivered']:,} rows delivered{share}; next batch from worker {info['next_worker']}")
    if info["rows_remaining"] is not None:
        print(f"  remaining  {info['rows_remaining']:,} rows in epoch {info['epoch']}")
    else:
        print("  remaining  unknown: this state has no 'rows_total' (older version); give PATH to compute it")
    for w in info["workers"]:
        rest = "" if w["rows_remaining"] is None else f", {w['rows_remaining']:,} remaining"
        print(f"  worker {w['worker']:<3} {w['rows_delivered']:,} rows delivered{rest}; "
              f"{w['splits_completed']} splits completed, {len(w['in_progress'])} in progress")
        for split in w["in_progress"][:3]:
            print(f"               in progress: {_split_text(split)}")
        if len(w["in_progress"]) > 3:
            print(f"               ... and {len(w['in_progress']) - 3} more")
    for split in info["skipped_splits"]:
        print(f"  skipped    {_split_text(split)}: {split.get('error', 'read error')} (on_error='skip')")


def check_against_data(state: dict, path: Sequence[str], args: argparse.Namespace) -> tuple[bool, str, int | None]:
    """Build a dataset with the state's topology on ``path`` and try load_state_dict.

    Returns (matches, explanation, rows remaining if it matches).
    """
    from .. import CheckpointMismatchError, StructuredDataset
    from ..state.checkpoint import CONFIG_KEYS

    # every configuration value the state records, under the dataset's own argument names
    options: dict[str, Any] = {name: state[key] for key, name in CONFIG_KEYS.items() if key in state}
    if _is_count(state.get("chunk_rows")) and state["chunk_rows"] >= 1:  # else load_state_dict warns of another order, or names the damage
        options["chunk_rows"] = state["chunk_rows"]
    options.update(format=args.format, storage_options=_storage_options(args))
    class PlanOnly(StructuredDataset):
        def _check_columns(self) -> None:
            """Nothing is read: the job's columns (not in the state) need no batch form here."""

        def check(self, state: dict) -> None:
            """load_state_dict's checks; a worker state loads only in its worker, so it is checked, not loaded."""
            if state.get("scope") == "worker":
                self._check_worker_state(state)
            else:
                self.load_state_dict(state)

    try:
        dataset = PlanOnly(list(path), **options)
    except (TypeError, ValueError) as error:
        PlanOnly(list(path), format=args.format, storage_options=_storage_options(args), num_workers=0)  # unreadable data: exit 2
        return False, f"cannot build a dataset with the state's configuration on this data: {error}", None
    try:
        dataset.check(state)
    except CheckpointMismatchError as error:
        return False, str(error), None
    if state.get("scope") == "worker":
        return True, "it fits this data: a StatefulDataLoader resumes that worker exactly with loader.load_state_dict(...)", None
    remaining = None
    if isinstance(state.get("rows_delivered"), list):  # a rank's state: what the loaded dataset has left, not what the state says
        loaded = dataset.state_dict()
        remaining = sum(loaded["rows_total"]) - sum(loaded["rows_delivered"])
    return True, "load_state_dict accepts it: a resume continues exactly where the state left off", remaining


def _where(key: str) -> str:
    """Where a state sits in its checkpoint, for messages: '', ' at key 'dataset'' or ' global (global state) rank 0'."""
    return "" if not key else f" {key}" if "(global state)" in key else f" at key {key!r}"


def cmd_inspect(args: argparse.Namespace) -> int:
    checkpoint = load_checkpoint(args.state)
    states = states_in(checkpoint, args.key, args.state)
    report, all_match = [], True
    for key, state in states:
        try:
            info = describe_state(state)
        except UsageError as error:
            raise UsageError(f"{args.state}{_where(key)}: {error}") from None
        if args.path:
            matches, why, remaining = check_against_data(state, args.path, args)
            info["matches_data"] = {"matches": matches, "explanation": why, "rows_remaining": remaining}
            all_match &= matches
        report.append((key, info))
    if args.json:
        _print_json([{"key": key, **info} for key, info in report])
    else:
        for number, (key, info) in enumerate(report):
            if number:
                print()
            print_state(info, _where(key))
            check = info.get("matches_data")
            if check:
                verdict = "YES" if check["matches"] else "NO"
                print(f"  matches {' '.join(args.path)}: {verdict}")
                if check["matches"]:
                    rest = "" if check["rows_remaining"] is None else f"; {check['rows_remaining']:,} rows remaining"
                    print(f"             {check['explanation']}{rest}")
                else:
                    print("\n".join("             " + line if line else "" for line in check["explanation"].splitlines()))
    return EXIT_OK if all_match else EXIT_FAILED


# --------------------------------------------------------------- bench
def run_bench(args: argparse.Namespace) -> dict:
    """Iterate the loader on the user's data for one epoch or the time budget; measure a resume."""
    from .. import StructuredDataset

    config = dict(format=args.format, batch_size=args.batch_size, num_workers=args.num_workers, shuffle=args.shuffle,
                  shuffle_seed=args.shuffle_seed, split_bytes=args.split_bytes, storage_options=_storage_options(args))
    if args.columns:
        config["columns"] = [c.strip() for c in args.columns.split(",") if c.strip()]
    if args.chunk_rows:
        config["chunk_rows"] = args.chunk_rows
    started = time.perf_counter()
    loader, dataset = StructuredDataset.create_dataloader(list(args.path), **config)
    constructed = time.perf_counter() - started
    total_batches = len(loader)
    planned = min(total_batches, args.max_batches or total_batches)
    states = _MidpointStates(dataset.state_dict, planned_midpoint=max(1, planned // 2))
    deadline = time.perf_counter() + args.seconds
    for index, _ in enumerate(loader, start=1):
        states.after_batch(index)
        if time.perf_counter() >= deadline or (args.max_batches and index >= args.max_batches):
            break
    stats = loader.stats.last_pass
    steady = stats.wait_s + stats.loop_s
    shown = {k: sorted(v) if k == "storage_options" else v for k, v in config.items() if v is not None}  # names, never secrets
    result: dict[str, Any] = {
        "config": shown,
        "rows_in_epoch": len(dataset),
        "batches_in_epoch": total_batches,
        "batches": stats.batches,
        "rows": stats.rows,
        "construct_s": constructed,
        "first_batch_s": stats.startup_s,
        "elapsed_s": stats.elapsed_s,
        "rows_per_s": stats.rows_per_s,
        # only meaningful once the pass outlasts its start-up (several chunks per worker)
        "steady_rows_per_s": (stats.rows - args.batch_size) / steady if steady >= max(0.5, stats.startup_s) else None,
        "bytes_per_s": _scanned_bytes(dataset, stats.rows) / stats.elapsed_s if stats.elapsed_s > 0 else None,
    }
    middle = states.middle()
    if middle is not None and not args.no_resume:
        result["resume"] = _measure_resume(list(args.path), config, middle[1], middle[0])
    return result


class _MidpointStates:
    """Dataset states saved during a loop, to resume from the middle of however much it read.

    The loop can stop early (``--seconds``), so states are saved at the planned midpoint
    and at batches about 25% apart (a few dozen saves, not one per batch); only those that
    can still be nearest to the middle are kept.
    """

    def __init__(self, state_dict: Callable[[], dict], planned_midpoint: int) -> None:
        self._state_dict = state_dict
        self._planned = planned_midpoint
        self._next = 1
        self._read = 0
        self._saved: list[tuple[int, dict]] = []  # (batches read, state), oldest first

    def after_batch(self, index: int) -> None:
        """Call with the number of batches read so far."""
        self._read = index
        if index not in (self._next, self._planned):
            return
        self._saved.append((index, self._state_dict()))
        if index == self._next:
            self._next = max(index + 1, int(index * 1.25))
        while len(self._saved) > 1 and self._saved[1][0] <= index / 2:
            self._saved.pop(0)  # a later state is already at or before the middle

    def middle(self) -> tuple[int, dict] | None:
        """(batch, state) nearest the middle of what was read; None if nothing was read."""
        if not self._saved:
            return None
        return min(self._saved, key=lambda saved: abs(saved[0] - self._read / 2))


def _scanned_bytes(dataset: Any, rows: int) -> float:
    files = dataset._catalog.files
    total_rows = sum(layout.num_rows for layout in dataset._catalog.layouts)
    return sum(f.size for f in files) * rows / total_rows if total_rows else 0.0


def _measure_resume(path: list[str], config: dict, state: dict, at_batch: int) -> dict:
    from .. import StructuredDataset

    started = time.perf_counter()
    loader, dataset = StructuredDataset.create_dataloader(path, **config)
    constructed = time.perf_counter()
    dataset.load_state_dict(state)
    first = next(iter(loader), None)
    done = time.perf_counter()
    return {"at_batch": at_batch, "construct_s": constructed - started, "load_to_first_batch_s": done - constructed,
            "got_batch": first is not None}


def print_bench(result: dict) -> None:
    config = ", ".join(f"{k}={human_bytes(v) if k == 'split_bytes' else v}" for k, v in result["config"].items())
    print(f"bench: {config}")
    print(f"  epoch        {result['rows_in_epoch']:,} rows in {result['batches_in_epoch']:,} batches")
    print(f"  read         {result['batches']:,} batches, {result['rows']:,} rows in {result['elapsed_s']:.2f} s")
    print(f"  throughput   {result['rows_per_s']:,.0f} rows/s overall"
          + (f", {result['steady_rows_per_s']:,.0f} rows/s after the first batch" if result["steady_rows_per_s"] else "")
          + (f", ~{human_bytes(result['bytes_per_s'])}/s of files" if result["bytes_per_s"] else ""))
    print(f"  start        construction {result['construct_s']:.3f} s, then first batch {result['first_batch_s']:.3f} s")
    resume = result.get("resume")
    if resume and not resume["got_batch"]:
        print(f"  resume       at batch {resume['at_batch']:,}: no batch comes after it (the epoch ends there), nothing to time")
    elif resume:
        print(f"  resume       at batch {resume['at_batch']:,}: construction {resume['construct_s']:.3f} s, "
              f"load_state_dict -> first batch {resume['load_to_first_batch_s']:.3f} s")


def cmd_bench(args: argparse.Namespace) -> int:
    result = run_bench(args)
    if args.json:
        _print_json(result)
    else:
        print_bench(result)
    return EXIT_OK


# ---------------------------------------------------------------- demo
def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
        if os.listdir(args.dir):
            raise UsageError(f"--dir {args.dir} is not empty; give a new or empty directory")
    report = run_demo(args.dir, args.format, args.checkpoint_at)
    return EXIT_OK if report.ok else EXIT_FAILED


# -------------------------------------------------------------- parser
def _add_data_options(parser: argparse.ArgumentParser, split_bytes: bool = True) -> None:
    parser.add_argument("--format", choices=["parquet", "orc"], default=None,
                        help="file format (default: inferred from the file extensions)")
    if split_bytes:
        parser.add_argument("--split-bytes", type=parse_size, default=128 * 1024 * 1024, metavar="SIZE",
                            help="largest split, compressed (e.g. 64MiB; default 128MiB)")
    parser.add_argument("--storage-option", type=_storage_option, action="append", metavar="KEY=VALUE",
                        help="fsspec storage option for remote paths, repeatable (e.g. anon=true, "
                             'client_kwargs=\'{"endpoint_url": "http://localhost:9000"}\')')


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tdu",
        description="torch_dataloader_utils: exactly-once, resumable PyTorch loading of Parquet and ORC files.",
        epilog="Exit codes: 0 success; 1 the check failed (demo, inspect with PATH); 2 usage or input error.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help="log more (-v info, -vv debug)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    plan = commands.add_parser("plan", parents=[common], help="show how PATH is cut into splits and dealt to ranks and workers",
                               description="Read the footers of PATH and show files, splits, rows and bytes, "
                                           "and the balance across ranks and workers.")
    plan.add_argument("path", nargs="+", metavar="PATH", help="file, directory, glob or URL (several allowed)")
    plan.add_argument("--world-size", type=_positive_int, default=1, metavar="N", help="number of ranks (default 1)")
    plan.add_argument("--num-workers", type=_non_negative_int, default=2, metavar="W", help="DataLoader workers per rank (default 2)")
    plan.add_argument("--batch-size", type=_positive_int, default=1024, metavar="N", help="for the batch counts (default 1024)")
    plan.add_argument("--shuffle", action="store_true", help="plan a shuffled epoch")
    plan.add_argument("--shuffle-seed", type=_int_at_least(0, MAX_SEED_WORD), default=0, metavar="S")
    plan.add_argument("--epoch", type=_int_at_least(0, MAX_SEED_WORD), default=0, metavar="E", help="epoch to show (matters with --shuffle)")
    plan.add_argument("--equalize", choices=["pad", "drop", "none"], default="pad",
                      help="how ranks get equal batch counts under DDP (default pad)")
    plan.add_argument("--all", action="store_true", help="list every (rank, worker), however many")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    _add_data_options(plan)
    plan.set_defaults(run=cmd_plan)

    inspect = commands.add_parser("inspect", parents=[common], help="explain a saved dataset state; with PATH, check it against the data",
                                  description="Explain a dataset state saved from dataset.state_dict(): a JSON file, "
                                              "or a torch checkpoint that holds it (found automatically, or named with --key). "
                                              "With PATH, build a dataset with the state's topology and report whether "
                                              "load_state_dict accepts it, and why not.")
    inspect.add_argument("state", metavar="STATE", help="JSON file or torch checkpoint")
    inspect.add_argument("path", nargs="*", metavar="PATH", help="the data the state should resume on")
    inspect.add_argument("--key", help="where the state sits in the checkpoint, dotted (e.g. dataset, dataset_states.1)")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    _add_data_options(inspect, split_bytes=False)
    inspect.set_defaults(run=cmd_inspect)

    bench = commands.add_parser("bench", parents=[common], help="measure this loader's throughput on your data",
                                description="Iterate PATH with create_dataloader for one epoch (or --seconds), "
                                            "report rows/s and start-up time, and time a resume from the middle.")
    bench.add_argument("path", nargs="+", metavar="PATH")
    bench.add_argument("--batch-size", type=_positive_int, default=1024, metavar="N")
    bench.add_argument("--num-workers", type=_non_negative_int, default=2, metavar="W")
    bench.add_argument("--shuffle", action="store_true")
    bench.add_argument("--shuffle-seed", type=_int_at_least(0, MAX_SEED_WORD), default=0, metavar="S")
    bench.add_argument("--columns", help="comma-separated columns to read (default: all)")
    bench.add_argument("--chunk-rows", type=_positive_int, default=None, metavar="N", help="rows per worker read (default 32768)")
    bench.add_argument("--seconds", type=float, default=30.0, metavar="S", help="time budget (default 30)")
    bench.add_argument("--max-batches", type=_positive_int, default=None, metavar="N", help="stop after N batches")
    bench.add_argument("--no-resume", action="store_true", help="skip the resume measurement")
    bench.add_argument("--json", action="store_true", help="machine-readable output")
    _add_data_options(bench)
    bench.set_defaults(run=cmd_bench)

    demo = commands.add_parser("demo", parents=[common], help="train, checkpoint, crash, resume, and check every row was seen once",
                               description="Write a small dataset, train a tiny model with 2 workers, checkpoint, "
                                           "kill the training process, resume in a new one, and check that every row "
                                           "was seen exactly once. Exit code 1 if not.")
    demo.add_argument("--format", choices=["parquet", "orc"], default="parquet")
    demo.add_argument("--dir", help="keep the data and checkpoint here (default: a temporary directory)")
    demo.add_argument("--checkpoint-at", type=float, default=0.45, metavar="F",
                      help="checkpoint after this fraction of the epoch (default 0.45)")
    demo.set_defaults(run=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``tdu`` and ``python -m torch_dataloader_utils``."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "inspect" and not any(e.startswith("-") for e in extra):
        args.path += extra  # PATH given after options: argparse leaves it over
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    if args.command == "demo" and not 0 < args.checkpoint_at < 1:
        parser.error("demo --checkpoint-at must be a fraction strictly between 0 and 1 (e.g. 0.4)")
    if args.command == "bench" and not (math.isfinite(args.seconds) and args.seconds > 0):
        parser.error(f"bench --seconds must be a positive number of seconds, got {args.seconds}")
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="tdu: %(levelname)s: %(name)s: %(message)s")
    try:
        return args.run(args)
    except BrokenPipeError:  # output piped into head & co.
        sys.stdout = open(os.devnull, "w")
        return EXIT_OK
    except UsageError as error:
        print(f"tdu {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (FileNotFoundError, ValueError, OSError, ImportError) as error:
        if args.verbose:
            raise
        print(f"tdu {args.command}: error: {in_cli_terms(without_worker_traceback(error))}", file=sys.stderr)
        return EXIT_USAGE


_CLI_TERMS = (  # the library's advice names Python arguments; tdu's users type options
    ("format='parquet' or 'orc'", "--format parquet or --format orc"),
    ("format='parquet' or format='orc'", "--format parquet or --format orc"),
    ("format='parquet'", "--format parquet"),
    ("format='orc'", "--format orc"),
    ("(or format=None to infer it)", "(or no --format to infer it)"),
    ("storage_options", "--storage-option"),
    ("pass format= or a path", "pass --format or a path"),
    ("; pass None for all columns", "; leave out --columns for all columns"),
    (", or pass on_error='skip' to leave out rows that cannot be read", ""),  # tdu has no such option
)


def without_worker_traceback(error: BaseException) -> str:
    """The error's message; for an error torch re-raised from a DataLoader worker ("Caught X in
    DataLoader worker process N. Original Traceback ..."), the worker's error without its traceback."""
    message = str(error)
    if "\nOriginal Traceback (most recent call last):\n" not in message:
        return message
    name = type(error).__qualname__
    names = (f"{type(error).__module__}.{name}: ", f"{name}: ")
    lines = message.splitlines()
    last = max((i for i, line in enumerate(lines) if line.startswith(names)), default=None)
    if last is None:
        return message
    first_line = lines[last]
    prefix = next(p for p in names if first_line.startswith(p))
    return "\n".join([first_line[len(prefix) :], *lines[last + 1 :]]).strip()


def in_cli_terms(message: str) -> str:
    """An error message of the library with its advice in tdu's options."""
    for python, option in _CLI_TERMS:
        message = message.replace(python, option)
    return message


if __name__ == "__main__":
    sys.exit(main())

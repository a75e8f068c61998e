"""``tdu inspect``: explain a saved dataset state and, given PATH, check it against the data."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from ..errors import UsageError
from ..state.schema import (
    BATCHES_DELIVERED,
    CHUNK_ROWS,
    COMPLETED_RANGES,
    COMPLETED_SHARDS,
    EPOCH,
    FILES,
    FILES_DIGEST,
    FILES_SUMMARY,
    IN_PROGRESS,
    NEXT_WORKER,
    PADDING_DELIVERED,
    ROWS_DELIVERED,
    ROWS_TOTAL,
    SCOPE,
    SKIPPED_SPLITS,
    VERSION,
    WORKER,
)
from .inspect_mixture import describe_mixture, mixture_for_state, mixture_sources, mixture_sources_of, print_mixture, rows_by_source
from .options import storage_options
from .output import EXIT_FAILED, EXIT_OK, human_bytes, print_json
from .state_check import check_state_fields
from .state_file import load_checkpoint, states_in


def describe_state(state: dict) -> dict:
    """Epoch, progress, rows remaining and topology of a state, from the state alone."""
    from ..state.canonical import CANONICAL_LANES
    from ..state.schema import CONFIG_KEYS

    check_state_fields(state)
    topology = {name: state.get(key) for key, name in CONFIG_KEYS.items()}
    if state.get(CANONICAL_LANES) is not None:
        topology["canonical_lanes"] = state[CANONICAL_LANES]
    info: dict[str, Any] = {"scope": state.get(SCOPE, "rank"), "format_version": state.get(VERSION),
                            "epoch": state.get(EPOCH), "topology": topology}
    if info["scope"] == "worker":
        info.update(worker=state.get(WORKER), rows_delivered=state.get(ROWS_DELIVERED), files_digest=state.get(FILES_DIGEST))
        return info
    delivered = state[ROWS_DELIVERED]
    totals = state.get(ROWS_TOTAL)
    workers = []
    for index, done in enumerate(delivered):
        completed, partial, partial_count = _worker_content(state, index)
        total = totals[index] if isinstance(totals, list) and index < len(totals) else None
        workers.append({"worker": index, "rows_delivered": done, "rows_total": total,
                        "rows_remaining": None if total is None else total - done,
                        "splits_completed": completed, "in_progress": partial, "in_progress_count": partial_count})
    files = state.get(FILES) or []
    summary = state.get(FILES_SUMMARY)
    info.update(
        files=summary["count"] if isinstance(summary, dict) else len(files),
        files_bytes=summary.get("total_bytes") or 0 if isinstance(summary, dict) else
        sum(f[1] for f in files if isinstance(f, list) and len(f) > 1 and isinstance(f[1], int)),
        next_worker=state.get(NEXT_WORKER),
        rows_delivered=sum(delivered),
        rows_total=sum(totals) if isinstance(totals, list) else None,
        rows_remaining=sum(totals) - sum(delivered) if isinstance(totals, list) else None,
        workers=workers,
        skipped_splits=list(state.get(SKIPPED_SPLITS) or []),
        batches_delivered=state.get(BATCHES_DELIVERED),
        padding_delivered=state.get(PADDING_DELIVERED) or 0,  # rows repeated so far to equal the ranks' batch counts
        padding_batches_delivered=(state.get(PADDING_DELIVERED) or 0) // max(1, state.get("_batch_size") or 1),
    )
    mixture = describe_mixture(state)
    if mixture is not None:
        info["mixture"] = mixture
    return info


def _worker_content(state: dict, worker: int) -> tuple[int, list[dict], int]:
    """(splits completed, splits in progress, how many are in progress) of a worker, from either
    form of a rank state; the compact form names a split in progress by its position in the
    worker's lane order, and only counts them where a shuffle window holds many."""
    if COMPLETED_RANGES not in state:
        partial = _entry_splits(state.get(IN_PROGRESS), worker)
        return len(_entry_splits(state.get(COMPLETED_SHARDS), worker)), partial, len(partial)
    from ..state.compact import count_completed

    entries = state[COMPLETED_RANGES]
    entry = entries[worker] if worker < len(entries) else {}
    listed = [{"lane_position": p, "rows_done": d} for p, d in entry.get("in_progress", [])]
    return count_completed(entry), listed, entry.get("in_progress_count", len(listed))


def _entry_splits(entries: Any, worker: int) -> list[dict]:
    if isinstance(entries, list) and worker < len(entries) and isinstance(entries[worker], dict):
        return list(entries[worker].get("splits") or [])
    return []


def _split_text(split: dict) -> str:
    if "path" not in split:  # a compact state's split in progress
        return f"split {split.get('lane_position')} of the worker's lane order, {split.get('rows_done', 0):,} rows done"
    where = "full file" if split.get("row_offset") is None else f"rows [{split['row_offset']:,}, {split['row_offset'] + split['row_length']:,})"
    done = f", {split['rows_done']:,} rows done" if "rows_done" in split else ""
    return f"{split.get('path')}  {where}{done}"


def print_state(info: dict, label: str) -> None:
    """``describe_state``'s result as text; ``label`` says where the state sits in its file."""
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
    pads = info["padding_delivered"] or (topo.get("world_size") or 1) > 1 and topo.get("equalize") == "pad"
    if info["batches_delivered"] is not None or pads:
        parts = [] if info["batches_delivered"] is None else [f"{info['batches_delivered']:,} delivered"]
        if pads:
            parts.append(f"{info['padding_batches_delivered']:,} of them padding ({info['padding_delivered']:,} rows repeated "
                         "so that every rank delivers the same number of batches)")
        print("  batches    " + ", ".join(parts))
    if info.get("mixture") is not None:
        print_mixture(info["mixture"])
    for w in info["workers"]:
        rest = "" if w["rows_remaining"] is None else f", {w['rows_remaining']:,} remaining"
        print(f"  worker {w['worker']:<3} {w['rows_delivered']:,} rows delivered{rest}; "
              f"{w['splits_completed']} splits completed, {w['in_progress_count']} in progress")
        for split in w["in_progress"][:3]:
            print(f"               in progress: {_split_text(split)}")
        if w["in_progress"] and w["in_progress_count"] > 3:
            print(f"               ... and {w['in_progress_count'] - 3} more")
        elif w["in_progress_count"] > len(w["in_progress"]):
            print("               (counted, not listed: they share one shuffle window)")
    for split in info["skipped_splits"]:
        print(f"  skipped    {_split_text(split)}: {split.get('error', 'read error')} (on_error='skip')")


def _dataset_for_state(path: list[Any], **options: Any) -> Any:
    """A StructuredDataset on ``path`` planned with a state's settings. A state does not depend on
    the job's columns (it does not record them), so when some column has no batch form the
    dataset selects the columns that have one; a mixture (whose job may have needed columns=
    for a source that lacks a number column) is planned for Arrow batches, which hold any column."""
    from .. import StructuredDataset

    try:
        return StructuredDataset(path, **options)
    except (TypeError, ValueError) as error:
        if mixture_sources_of(path):  # a state does not depend on the columns: any one all sources share plans it
            for columns in (None, *([name] for name in _shared_columns(path, options))):
                try:
                    return StructuredDataset(path, output_format="arrow", columns=columns, **options)
                except (TypeError, ValueError):
                    continue
            raise error from None
        columns = _columns_with_batch_form(path, options)
        if not columns:
            raise error from None
        return StructuredDataset(path, columns=columns, **options)


def _shared_columns(sources: list[Any], options: dict[str, Any]) -> list[str]:
    """The columns every source of a mixture holds (a state's job may have selected only those)."""
    from ..catalog.build import build_catalog
    from ..plan.splits import DEFAULT_SPLIT_BYTES
    from ..storage.remote import IOOptions

    split_bytes = options.get("split_bytes") or DEFAULT_SPLIT_BYTES
    names: list[str] | None = None
    for source in sources:
        catalog = build_catalog(source.path, source.format or options.get("format"), options.get("storage_options"), split_bytes, IOOptions())
        held = [] if catalog.schema is None else catalog.schema.names
        names = held if names is None else [name for name in names if name in held]
    return names or []


def _columns_with_batch_form(path: list[str], options: dict[str, Any]) -> list[str]:
    from ..catalog.build import build_catalog
    from ..plan.splits import DEFAULT_SPLIT_BYTES
    from ..read.convert import batch_form_problem
    from ..storage.remote import IOOptions

    split_bytes = options.get("split_bytes") or DEFAULT_SPLIT_BYTES
    catalog = build_catalog(path, options.get("format"), options.get("storage_options"), split_bytes, IOOptions())
    if catalog.schema is None:
        return []
    lacking = {name for names in catalog.missing_columns for name in names}
    return [f.name for f in catalog.schema if batch_form_problem(f.type) is None and f.name not in lacking and f.name not in catalog.repeated_columns]


def check_against_data(state: dict, path: Sequence[str], args: argparse.Namespace) -> tuple[bool, str, int | None]:
    """Build a dataset with the state's topology on ``path`` and try load_state_dict.

    Returns (matches, explanation, rows remaining if it matches).
    """
    from .. import CheckpointMismatchError
    from ..state.canonical import CANONICAL_LANES
    from ..state.schema import CONFIG_KEYS
    from ..state.validate import is_count

    # every configuration value the state records, under the dataset's own argument names
    options: dict[str, Any] = {name: state[key] for key, name in CONFIG_KEYS.items() if key in state}
    if is_count(state.get(CHUNK_ROWS)) and state[CHUNK_ROWS] >= 1:  # else load_state_dict warns of another order, or names the damage
        options["chunk_rows"] = state[CHUNK_ROWS]
    if state.get(CANONICAL_LANES) is not None:  # (a damaged value is named by the dataset's check)
        options["canonical_lanes"] = state[CANONICAL_LANES]
    options.update(format=args.format, storage_options=storage_options(args))
    if args.filters is not None:
        options["filters"] = args.filters
    mixture = mixture_sources(state) is not None
    try:
        if mixture:  # the sources the state records, on PATHs (one per source) where given
            sources, epoch_rows = mixture_for_state(state, path)
            dataset = _dataset_for_state(sources, epoch_rows=epoch_rows, **options)
        else:
            dataset = _dataset_for_state(list(path), **options)
    except (TypeError, ValueError) as error:
        if not mixture:
            _dataset_for_state(list(path), format=args.format, storage_options=storage_options(args), num_workers=0)  # unreadable data: exit 2
        return False, f"cannot build a dataset with the state's configuration on this data: {error}", None
    try:
        if state.get(SCOPE) == "worker":
            dataset.check_state_dict(state)  # a worker state loads only inside its worker
        else:
            dataset.load_state_dict(state)  # loaded, to count the rows it leaves
    except CheckpointMismatchError as error:
        return False, str(error), None
    if state.get(SCOPE) == "worker":
        return True, "it fits this data: a StatefulDataLoader resumes that worker exactly with loader.load_state_dict(...)", None
    remaining = None
    if isinstance(state.get(ROWS_DELIVERED), list):  # a rank's state: what the loaded dataset has left, not what the state says
        loaded = dataset.state_dict(form="full")  # every completed split by content, also for a compact state
        remaining = sum(loaded["rows_total"]) - sum(loaded["rows_delivered"])
        args.batches = _batches_left(dataset, loaded)
        if getattr(args, "splits", False):
            args.completed_splits = [{**split, "worker": entry["worker"]} for entry in loaded[COMPLETED_SHARDS] for split in entry["splits"]]
        if mixture:
            args.source_rows_delivered = rows_by_source(dataset)
    return True, "load_state_dict accepts it: a resume continues exactly where the state left off", remaining


def _batches_left(dataset: Any, loaded: dict) -> dict:
    """The epoch's batches of a loaded dataset (padding included), those still to come, and how
    many of those are padding (rows repeated once the rank's own rows are delivered)."""
    plan, size = dataset.delivery.plan(), dataset.batch_size
    total = dataset.num_batches()
    delivered = loaded.get(BATCHES_DELIVERED)
    return {"batches_total": total, "batches_remaining": None if delivered is None else total - delivered,
            "padding_batches_remaining": (plan.padding_rows - (loaded.get(PADDING_DELIVERED) or 0)) // size}


def _where(key: str) -> str:
    """Where a state sits in its checkpoint, for messages: '', ' at key 'dataset'' or ' global (global state) rank 0'."""
    return "" if not key else f" {key}" if "(global state)" in key else f" at key {key!r}"


def cmd_inspect(args: argparse.Namespace) -> int:
    """Describe each state in ``args.state``; with PATH, exit 1 unless every one fits the data."""
    if getattr(args, "splits", False) and not args.path:
        raise UsageError("--splits lists the completed splits of PATH: give the data's PATH after the state file")
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
            if matches and remaining is not None:
                info["matches_data"].update(args.batches)
            if getattr(args, "splits", False) and matches:
                info["completed_splits"] = getattr(args, "completed_splits", [])
            if matches and info.get("mixture") is not None:
                for source, rows in zip(info["mixture"], getattr(args, "source_rows_delivered", [])):
                    source["rows_delivered"] = rows
            all_match &= matches
        report.append((key, info))
    if args.json:
        print_json([{"key": key, **info} for key, info in report])
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
                    if check.get("batches_total") is not None:
                        left = "" if check["batches_remaining"] is None else f", {check['batches_remaining']:,} still to come"
                        padding = check["padding_batches_remaining"]
                        print(f"             batches: {check['batches_total']:,} in epoch {info['epoch']}{left}"
                              + (f", of them {padding:,} padding" if padding else ""))
                    for split in info.get("completed_splits", []):
                        print(f"  completed  worker {split['worker']}: {_split_text(split)}")
                else:
                    print("\n".join("             " + line if line else "" for line in check["explanation"].splitlines()))
    return EXIT_OK if all_match else EXIT_FAILED

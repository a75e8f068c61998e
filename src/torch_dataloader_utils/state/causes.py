"""What differs between a checkpoint and the dataset now: its settings and its files, one line each."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from .compact import summary_causes
from .mixture import mixture_causes
from .schema import CONFIG_KEYS, FILTERS, MIXTURE, READER_OPTIONS, SHUFFLE_ONLY_KEYS


def config_causes(state: Mapping[str, Any], config: Mapping[str, Any], same_files: Callable[[], bool] | None = None) -> list[str]:
    """One line per configuration value that differs between the checkpoint and now (where
    ``same_files()`` says the state's files are the current ones in their order, a mixture's
    source path spelled otherwise is none)."""
    causes = []
    for key, name in CONFIG_KEYS.items():
        saved = state.get(key)
        if key in SHUFFLE_ONLY_KEYS and not (state.get("_shuffle") or config["_shuffle"]):
            continue
        if saved != config[key]:
            same_type = type(saved) is type(config[key])  # else show the types: "0" and 0 print alike
            shown = (saved, config[key]) if same_type else (repr(saved), repr(config[key]))
            damaged = saved is not None and config[key] is not None and not same_type and not _both_numbers(saved, config[key])
            why = f" (state key {key!r} holds {type(saved).__name__}, expected {type(config[key]).__name__}: the state is damaged)" if damaged else ""
            causes.append(f"{name} changed: checkpoint={shown[0]}, current={shown[1]}{why}")
    if state.get(FILTERS) != config.get(FILTERS):  # (absent: no filter, also in states saved before filters existed)
        causes.append(f"filters changed: checkpoint={state.get(FILTERS) or 'none'}, current={config.get(FILTERS) or 'none'} (digests of the filter)")
    if state.get(READER_OPTIONS) != config.get(READER_OPTIONS):  # (absent: none given, also before they were recorded)
        causes.append(
            f"csv_options/json_options changed: checkpoint={state.get(READER_OPTIONS) or 'none'}, current={config.get(READER_OPTIONS) or 'none'} "
            "(digests of the options; skip_rows, quoting, delimiters and the like decide which records a file holds)"
        )
    return causes + mixture_causes(state.get(MIXTURE), config.get(MIXTURE), same_files)


def _both_numbers(a: Any, b: Any) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))


def summary_file_causes(summary: Any, current: list[list]) -> list[str]:
    """A compact state's file changes: by name where its summary lists the files (small
    listings), else located to their group of files (``summary_causes``)."""
    causes = summary_causes(summary, current)
    listed = summary.get("files") if isinstance(summary, dict) else None
    if causes and isinstance(listed, list):
        return file_causes(listed, current) or causes  # the same files in another order: the summary says so
    return causes


def file_causes(saved: Any, current: list[list]) -> list[str]:
    """What changed in the file list: added, removed or rewritten files, by name."""
    def well_formed(entry: Any) -> bool:
        return (
            isinstance(entry, list)
            and len(entry) == 3
            and isinstance(entry[0], str)
            and isinstance(entry[1], int)
            and (entry[2] is None or isinstance(entry[2], str))
        )

    if not isinstance(saved, list) or not all(well_formed(f) for f in saved):
        return ["the state's 'files' entry is damaged (each entry must be [path, size, tag])"]
    old = {f[0]: tuple(f[1:]) for f in saved}
    new = {f[0]: tuple(f[1:]) for f in current}
    causes = []
    removed = sorted(set(old) - set(new))
    added = sorted(set(new) - set(old))
    changed = sorted(p for p in set(old) & set(new) if old[p] != new[p])
    if removed:
        causes.append(f"files removed since the checkpoint ({len(removed)}): {', '.join(removed[:3])}")
    if added:
        causes.append(f"files added since the checkpoint ({len(added)}): {', '.join(added[:3])}")
    for path in changed[:3]:
        (size_then, tag_then), (size_now, tag_now) = old[path], new[path]
        detail = f"size checkpoint={size_then}, current={size_now}" if size_then != size_now else f"tag checkpoint={tag_then}, current={tag_now}"
        causes.append(f"file rewritten since the checkpoint: {path} ({detail})")
    gcs = [p for p in changed if p.startswith(("gs://", "gcs://"))]
    if any(old[p][0] == new[p][0] and str(new[p][1]).isdigit() and not str(old[p][1]).isdigit() for p in gcs):
        causes.append(
            "or the checkpoint is from a version of this library before 2026-11-22, which identified GCS files by "
            "their ETag; they are now identified by their generation (the ETag also changes with metadata), so such "
            "a checkpoint cannot be resumed exactly: start the epoch afresh"
        )
    return causes

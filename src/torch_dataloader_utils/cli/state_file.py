"""Dataset states out of a file: a JSON file, or a torch checkpoint loaded without running code.

A checkpoint may hold the state under any key, several rank states in a list, or a
global state (every rank in one dict); ``states_in`` finds them all, or the one at ``--key``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import UsageError
from ..state.schema import RANKS, SCOPE


def _looks_like_state(value: Any) -> bool:
    return isinstance(value, dict) and "format_version" in value and ("rows_delivered" in value or "completed_shards" in value)


def _rank_parts(state: dict, key: str) -> list[tuple[str, dict]]:
    """A global state (every rank in one dict) as one rank state per rank."""
    from ..distributed import local_state

    ranks = state.get(RANKS)
    if not isinstance(ranks, list) or not ranks or not all(isinstance(part, dict) for part in ranks):
        raise UsageError(f"the global state at {key or 'the top level'!r} has no 'ranks' list of rank states; it is damaged")
    label = f"{key} " if key else ""
    return [(f"{label}(global state) rank {rank}", local_state(state, rank)) for rank in range(len(ranks))]


def find_states(value: Any, key: str = "", depth: int = 0) -> list[tuple[str, dict]]:
    """Every dataset state inside a loaded checkpoint, with its key path (``a.b.0``)."""
    if isinstance(value, dict) and "format_version" in value and value.get(SCOPE) == "global":
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
        elif isinstance(value, dict) and part.lstrip("-").isdigit() and int(part) in value:  # {rank: state}: find_states names it so
            value = value[int(part)]
        elif isinstance(value, (list, tuple)) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            options = list(value)[:20] if isinstance(value, dict) else f"indices 0..{len(value) - 1}" if isinstance(value, (list, tuple)) else "none"
            raise UsageError(f"--key {key!r}: no {part!r} here; available: {options}")
    return value


def _rank_of_global(checkpoint: Any, key: str) -> dict | None:
    """The complete state of one rank when ``key`` names an entry of a global state's 'ranks'
    (``ranks.1``): the entry with the global state's file list, which the entry itself lacks."""
    *parent_key, ranks, index = ["", *key.split(".")]
    if ranks != RANKS or not index.isdigit():
        return None
    parent = _select(checkpoint, ".".join(parent_key[1:])) if parent_key[1:] else checkpoint
    entries = parent.get(RANKS) if isinstance(parent, dict) and parent.get(SCOPE) == "global" else None
    if not isinstance(entries, list) or not isinstance(entries[int(index)], dict):
        return None
    from ..distributed import local_state

    return local_state(parent, int(index))


def load_checkpoint(path: str) -> Any:
    """A JSON file, or a torch checkpoint loaded with weights_only=True (loading never runs code)."""
    if os.path.isdir(path):
        raise UsageError(f"{path} is a directory; give the file that holds the state (a JSON file or a torch checkpoint)")
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
        rank_of_global = _rank_of_global(checkpoint, key)
        if rank_of_global is not None:
            return [(key, rank_of_global)]
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

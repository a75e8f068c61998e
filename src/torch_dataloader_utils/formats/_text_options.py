"""``csv_options`` / ``json_options``: one flat dict of pyarrow's reader options, sorted onto
pyarrow's ReadOptions, ParseOptions and ConvertOptions by name."""

from __future__ import annotations

from typing import Any, Callable

#: options the dataset sets itself, with what to do instead
REFUSED = {
    "use_threads": "the dataset decides (its reader threads)",
    "include_columns": "use the dataset's columns=[...]",
    "include_missing_columns": "use the dataset's columns=[...]; a column missing from a file is read as nulls",
    "skip_rows_after_names": "rows are counted at planning; skip them in the data, or drop them after loading",
    "invalid_row_handler": "every row is counted at planning, so a row cannot be dropped while reading",
    "encoding": "records are found by scanning bytes for newlines: the files must be UTF-8 (or ASCII)",
}


def sort_options(kind: str, options: dict[str, Any], groups: dict[str, tuple[str, ...]]) -> dict[str, dict[str, Any]]:
    """``options`` split into ``groups`` (name -> accepted keys); a ValueError names a key that is
    refused or unknown, and the accepted keys."""
    sorted_options: dict[str, dict[str, Any]] = {group: {} for group in groups}
    accepted = [key for keys in groups.values() for key in keys]
    for key, value in options.items():
        if key in REFUSED:
            raise ValueError(f"{kind} option {key!r} is not accepted: {REFUSED[key]}")
        group = next((name for name, keys in groups.items() if key in keys), None)
        if group is None:
            raise ValueError(f"unknown {kind} option {key!r}; the accepted options are {sorted(accepted)} (see docs/formats.md)")
        sorted_options[group][key] = value
    return sorted_options


def check_values(kind: str, grouped: dict[str, dict[str, Any]], builders: dict[str, Callable[..., Any]]) -> None:
    """A ValueError naming the options pyarrow refuses (``delimiter=';;'``, ``block_size='1MiB'``):
    each group is built into its pyarrow options object once, here, not first when a file is read."""
    for group, options in grouped.items():
        try:
            builders[group](**options)
        except (TypeError, ValueError, ArithmeticError) as error:
            raise ValueError(f"{kind}_options {options!r:.200} are refused by pyarrow's {builders[group].__name__}: {error}") from None

"""``tdu rows``: print rows of a dataset by global row number (``dataset[i]``), with the file and
row within the file each comes from."""

from __future__ import annotations

import argparse
import re
from typing import Any

from ..errors import UsageError
from .options import storage_options
from .output import EXIT_OK, print_json

_INT = r"\s*-?\d+\s*"


def parse_rows(text: str) -> int | slice | list[int]:
    """'5' -> 5; '-1' -> -1; '1000:1010' / ':10' / '::100' -> a slice; '1,5,9' -> a list."""
    if re.fullmatch(_INT, text):
        return int(text)
    if re.fullmatch(rf"({_INT})?:({_INT})?(:({_INT})?)?", text):
        parts = [int(p) if p.strip() else None for p in text.split(":")]
        if len(parts) == 3 and parts[2] == 0:
            raise argparse.ArgumentTypeError(f"a slice step cannot be 0: {text!r}")
        return slice(*parts)
    if re.fullmatch(rf"{_INT}(,{_INT})+,?", text):
        return [int(p) for p in text.split(",") if p.strip()]
    raise argparse.ArgumentTypeError(f"not rows: {text.strip()!r} (examples: 1000, -1, 1000:1010, ::100, 3,17,42)")


def _plain(value: Any, width: int) -> Any:
    """A row value as JSON-friendly Python: tensors as (nested) lists, long text cut to ``width``."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, bytes):
        value = value.hex() if width <= 0 else value[: width // 2].hex() + ("..." if len(value) > width // 2 else "")
    if isinstance(value, str) and 0 < width < len(value):
        value = value[: width - 3] + "..."
    return value


def _unmasked(values: dict[str, Any]) -> dict[str, Any]:
    """A row read with nulls="mask": a null as None, without the masks (a mask's name is never a column's)."""
    from ..read.nulls import MASK_SUFFIX  # (pyarrow: not at the CLI's start)

    masks = {name for name in values if name.endswith(MASK_SUFFIX) and name[: -len(MASK_SUFFIX)] in values}
    nulls = {name[: -len(MASK_SUFFIX)] for name in masks if not bool(values[name])}
    return {name: None if name in nulls else value for name, value in values.items() if name not in masks}


def select_rows(dataset: Any, key: int | slice | list[int], width: int, masked: bool = False) -> list[dict]:
    """The selected rows as dicts: global row, file, row within the file, and the values (read in
    one gather; ``masked``: the dataset reads with nulls="mask", and a null shows as None)."""
    from ..read.row_keys import split_rows

    rows = list(range(*key.indices(dataset.num_rows))) if isinstance(key, slice) else [key] if isinstance(key, int) else key
    try:
        values = [_unmasked(value) if masked else value for value in split_rows(dataset[rows], len(rows))]
        located = [dataset.locate(row) for row in rows]
    except IndexError as error:
        raise UsageError(str(error)) from None
    return [
        {"row": row % dataset.num_rows, "file": path, "row_in_file": within, "values": {k: _plain(v, width) for k, v in value.items()}}
        for row, (path, within), value in zip(rows, located, values)
    ]


def _text(rows: slice) -> str:
    parts = ["" if part is None else str(part) for part in (rows.start, rows.stop, rows.step)]
    return ":".join(parts if rows.step is not None else parts[:2])


def cmd_rows(args: argparse.Namespace) -> int:
    from ..dataset import StructuredDataset

    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    options: dict[str, Any] = dict(num_workers=0, columns=columns, storage_options=storage_options(args))
    try:  # nulls="mask": a null number prints as None instead of refusing the files (real data has them)
        dataset, masked = StructuredDataset(args.path, args.format, nulls="mask", **options), True
    except ValueError as error:
        if "would name the masks" not in str(error):  # a column already named '<column>.valid': no masks
            raise
        dataset, masked = StructuredDataset(args.path, args.format, **options), False
    if isinstance(args.rows, slice):
        count = len(range(*args.rows.indices(dataset.num_rows)))
        if count > args.limit:
            raise UsageError(f"{_text(args.rows)} selects more than --limit {args.limit} rows; narrow it or raise --limit")
        if count == 0:
            total = dataset.num_rows
            if total == 0:
                raise UsageError(f"{_text(args.rows)} selects no row: the dataset has no rows")
            raise UsageError(f"{_text(args.rows)} selects no row of the dataset's {total:,} rows (valid: -{total} to {total - 1})")
    rows = select_rows(dataset, args.rows, 0 if args.json else args.width, masked)
    if args.json:
        print_json({"num_rows": dataset.num_rows, "rows": rows})
        return EXIT_OK
    for row in rows:
        print(f"row {row['row']:,}  ({row['file']}, row {row['row_in_file']:,})")
        for name, value in row["values"].items():
            print(f"  {name}: {value}")
    return EXIT_OK

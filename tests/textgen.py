"""Text test data (CSV, TSV, JSON Lines, plain and gzip) whose rows carry unique ids."""

from __future__ import annotations

import gzip
import json
import os


def _name(i: int) -> str:
    """A CSV field: plain, quoted with a delimiter, a doubled quote, or a newline inside."""
    return [f"n{i}", f'"a,{i}"', f'"say ""{i}"""', f'"two\nlines {i}"', f'"crlf\r\n{i}"'][i % 5]


def write_csv(path: str | os.PathLike, first: int, rows: int, *, sep: str = ",", crlf: bool = False, blank_every: int = 0, integer_val: bool = False) -> int:
    end = "\r\n" if crlf else "\n"
    lines = [sep.join(("id", "name", "val"))]
    for i in range(first, first + rows):
        name = _name(i) if sep == "," else f"t{i}"
        lines.append(sep.join((str(i), name, str(i) if integer_val else f"{i / 4}")))
        if blank_every and i % blank_every == 0:
            lines.append("")
    data = (end.join(lines) + end).encode()
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as handle:
        handle.write(data)
    return rows


def write_jsonl(path: str | os.PathLike, first: int, rows: int, blank_every: int = 0) -> int:
    lines = []
    for i in range(first, first + rows):
        lines.append(json.dumps({"id": i, "text": f"line\n{i} {{x}}", "val": i / 2}))
        if blank_every and i % blank_every == 0:
            lines.append("   ")
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as handle:
        handle.write(("\n".join(lines) + "\n").encode())
    return rows


def write_csv_dataset(root: str | os.PathLike) -> int:
    """Three CSV files (one with CRLF ends and blank lines), a gzip one and a TSV one; ids 0..N-1."""
    os.makedirs(root, exist_ok=True)
    n = write_csv(os.path.join(root, "a.csv"), 0, 230)
    n += write_csv(os.path.join(root, "b.csv"), n, 170, crlf=True, blank_every=7)
    n += write_csv(os.path.join(root, "c.csv.gz"), n, 60, integer_val=True)
    n += write_csv(os.path.join(root, "d.tsv"), n, 40, sep="\t")
    return n


def write_jsonl_dataset(root: str | os.PathLike) -> int:
    os.makedirs(root, exist_ok=True)
    n = write_jsonl(os.path.join(root, "a.jsonl"), 0, 260, blank_every=9)
    n += write_jsonl(os.path.join(root, "b.ndjson"), n, 120)
    n += write_jsonl(os.path.join(root, "c.jsonl.gz"), n, 50)
    return n

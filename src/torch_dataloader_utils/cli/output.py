"""What tdu hands back: exit codes, sizes for people, JSON for programs."""

from __future__ import annotations

import json
from typing import Any

# 0 success; 1 the check ran and failed (demo not exactly-once, the state does not fit the
# data); 2 usage or input error (bad arguments, missing files, not a dataset state)
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def human_bytes(n: float) -> str:
    """A byte count in B, KiB, MiB, GiB or TiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def print_json(data: Any) -> None:
    """``--json`` output: indented, anything JSON cannot hold as its str()."""
    print(json.dumps(data, indent=2, default=str))

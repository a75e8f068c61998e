"""Private: a module imported when one of its names is first used.

``pyarrow.compute`` costs every process about 9 MB when imported, and a planning-only main
process (the DataLoader's workers read) never calls it.
"""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """Stands for the module ``name``: the first attribute asked for imports it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(importlib.import_module(self._name), attribute)


compute = LazyModule("pyarrow.compute")

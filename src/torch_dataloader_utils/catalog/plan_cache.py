"""A cache of what planning reads from each file's footer, in ``cache_dir``, for local files.

Re-planning 100,000 unchanged files reads 100,000 footers again; with the cache it reads
one JSON file. The cache is keyed by the listing (the paths given and the format), and
each file's entry is trusted only while its size and modification time are the ones
listed now: a file changed since is read again, and the cache is rewritten with it.
Entries are plain JSON (the schemas as Arrow IPC bytes, base64): loading the cache runs
no code. A damaged or unreadable cache is ignored (planning reads the footers), and a
cache that cannot be written is skipped with a debug log line.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Sequence

import pyarrow as pa

from ..plan.splits import FileLayout
from ..storage.versions import FileEntry

log = logging.getLogger(__name__)
_VERSION = 2
_FOLDER = "plans"

#: per file: (layout, schema), what planning keeps of a footer
Planned = tuple[FileLayout, pa.Schema]


class PlanCache:
    """The footers' planning facts of one listing: ``lookup`` what is still valid, ``store`` the lot."""

    def __init__(self, cache_dir: str, paths: Sequence[str], format_name: str):
        key = hashlib.sha256(json.dumps([_VERSION, format_name, list(paths)]).encode()).hexdigest()[:32]
        self.path = os.path.join(cache_dir, _FOLDER, key + ".json")

    def lookup(self, files: Sequence[FileEntry]) -> list[Planned | None]:
        """Per file, its cached (layout, schema) when the cache has it at this size and tag, else None."""
        found: list[Planned | None] = [None] * len(files)
        try:
            with open(self.path, encoding="utf-8") as file:
                saved = json.load(file)
            schemas = [pa.ipc.read_schema(pa.py_buffer(base64.b64decode(s))) for s in saved["schemas"]]
            units = [(tuple(rows), tuple(sizes), schemas[schema]) for rows, sizes, schema in saved["layouts"]]
            where = dict(zip(saved["urls"], zip(saved["sizes"], saved["tags"], saved["layout_of"])))
        except FileNotFoundError:
            return found
        except (OSError, ValueError, KeyError, TypeError, IndexError, pa.ArrowException) as error:
            log.debug("plan cache %s is unreadable, reading every footer: %s", self.path, error)
            return found
        for i, entry in enumerate(files):
            cached = where.get(entry.url)
            if cached is None or cached[0] != entry.size or cached[1] != entry.tag or not 0 <= cached[2] < len(units):
                continue
            rows, sizes, schema = units[cached[2]]
            found[i] = (FileLayout(entry.url, entry.size, rows, sizes), schema)
        return found

    def store(self, files: Sequence[FileEntry], planned: Sequence[Planned]) -> None:
        """Write every file's entry (atomically: a temporary file renamed into place). Files
        written alike share one layout entry and one schema entry."""
        schemas: dict[int, int] = {}  # id(schema) -> index (the catalog shares equal schemas' objects)
        encoded: list[bytes] = []
        layouts: dict[tuple, int] = {}
        layout_of = []
        for layout, schema in planned:
            index = schemas.get(id(schema))
            if index is None:
                index = schemas[id(schema)] = len(encoded)
                encoded.append(schema.serialize().to_pybytes())
            layout_of.append(layouts.setdefault((layout.unit_rows, layout.unit_bytes, index), len(layouts)))
        text = json.dumps(
            {
                "schemas": [base64.b64encode(s).decode() for s in encoded],
                "layouts": [list(key) for key in layouts],
                "urls": [f.url for f in files],
                "sizes": [f.size for f in files],
                "tags": [f.tag for f in files],
                "layout_of": layout_of,
            },
            separators=(",", ":"),
        )
        temporary = f"{self.path}.{uuid.uuid4().hex}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(temporary, "w", encoding="utf-8") as file:
                file.write(text)
            os.replace(temporary, self.path)
        except OSError as error:
            log.debug("plan cache %s not written: %s", self.path, error)
            try:
                os.remove(temporary)
            except OSError:
                pass


def cache_for(cache_dir: str | None, paths: Sequence[str], format_name: str, local: bool) -> PlanCache | None:
    """The plan cache of a listing, or None (no cache_dir, or files that are not local)."""
    if cache_dir is None or not local:
        return None
    return PlanCache(cache_dir, [os.path.abspath(p) if "://" not in p else p for p in paths], format_name)

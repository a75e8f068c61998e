"""The catalog's files as columns: one blob of URLs (and of filesystem paths where they differ),
sizes in an array, content tags in a blob; ``FileEntry`` made on access (plan/columns.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..plan.columns import Column, Strings
from ..storage.versions import FileEntry


class FileTable(Column[FileEntry]):
    """The files of a catalog, in plan order."""

    __slots__ = ("urls", "_fs_paths", "_sizes", "_tags")

    def __init__(self, files: Sequence[FileEntry]):
        self.urls = Strings(f.url for f in files)
        same = all(f.fs_path == f.url for f in files)
        self._fs_paths = self.urls if same else Strings(f.fs_path for f in files)
        self._sizes = np.fromiter((f.size for f in files), dtype=np.int64, count=len(files))
        self._tags = Strings(f.tag for f in files)

    def __len__(self) -> int:
        return len(self._sizes)

    def _item(self, index: int) -> FileEntry:
        return FileEntry(self._fs_paths[index], self.urls[index], int(self._sizes[index]), self._tags[index])

    def fingerprint(self) -> list[list]:
        """(url, size, tag) of every file, without making each entry."""
        return [[url, size, tag] for url, size, tag in zip(self.urls, self._sizes.tolist(), self._tags)]


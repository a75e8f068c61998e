"""Which version of a file was planned: its size and a content tag, checked again before reading."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import FileChangedError


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One data file: the path its filesystem uses, its full path or URL, size and content tag."""

    fs_path: str
    url: str
    size: int
    tag: str | None


def content_tag(info: dict) -> str | None:
    """What tells two versions of a file apart besides size: GCS's generation (its ETag also
    changes with the object's metadata), the store's ETag, or a local file's modification time."""
    for key in ("generation", "ETag", "etag", "md5Hash", "content_md5"):
        value = info.get(key)
        if value:
            return str(value).strip('"')
    mtime = info.get("mtime")
    if isinstance(mtime, (int, float)):
        return f"mtime:{mtime:.6f}"
    return None


def check_version(info: dict, size: int, tag: str | None) -> None:
    """FileChangedError unless ``info`` (fsspec's info of a file) still describes the planned size and tag."""
    now = (int(info.get("size") or 0), content_tag(info))
    if now != (size, tag):
        raise FileChangedError(f"the file changed after planning (size/tag {size}/{tag} -> {now[0]}/{now[1]}); create the loader again")

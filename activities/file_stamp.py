"""When a file mounted from a Secret (a token, a key ring) has changed: the kubelet swaps in a new
file on an update, so its modification time, size or inode differ, and a reader re-reads it only then."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class FileStamp:
    mtime_ns: int
    size: int
    inode: int


def file_stamp(path: str | os.PathLike[str]) -> FileStamp:
    """The file's stamp now (OSError when it cannot be looked at)."""
    st = os.stat(path)
    return FileStamp(st.st_mtime_ns, st.st_size, st.st_ino)

"""Bounded reads: what torchcal reads back cannot hang it or exhaust its memory
(:func:`read_bytes_bounded`: only a regular file, of at most ``max_bytes`` bytes).

Standard library only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["read_bytes_bounded"]


def read_bytes_bounded(path: str | os.PathLike, *, max_bytes: int | None,
                       what: str = "File", error: type[Exception] = ValueError) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``max_bytes`` bytes.

    A FIFO, a device (also through a symbolic link, e.g. to ``/dev/zero``), a socket or a
    directory is refused before it is opened, so reading cannot block or run forever; the file
    is opened with ``O_NONBLOCK`` and checked again (it may have been swapped meanwhile) and at
    most ``max_bytes + 1`` bytes are read.

    Raises:
        FileNotFoundError: ``path`` does not exist (callers tell "missing" from "bad").
        error: not a regular file, or larger than ``max_bytes`` (the message names the file).
        OSError: it cannot be read.
    """
    path = Path(path)

    def check(st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {str(path)!r} is not a regular file (a directory, FIFO, "
                        "device or socket): refused")
        if max_bytes is not None and st.st_size > max_bytes:
            raise error(f"{what} {str(path)!r} has {st.st_size:,} bytes, more than the "
                        f"{max_bytes:,} such a file may have: refused")

    check(os.stat(path))
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(
        os, "O_BINARY", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as f:
        check(os.fstat(fd))
        data = f.read(-1 if max_bytes is None else max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:
        raise error(f"{what} {str(path)!r} grew past {max_bytes:,} bytes while read: refused")
    return data

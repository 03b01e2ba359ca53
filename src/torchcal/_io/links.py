"""Symbolic links and special files: what torchcal writes, locks or walks is never reached
through a link that leaves it.

* :func:`check_own_path` refuses a path torchcal is about to write, lock or delete when it is a
  link or not the kind of file torchcal writes there (:func:`file_kind` names what it is).
* :func:`find_files` walks a run tree without following links that leave it, and returns them
  so that the caller names them; :func:`is_within` tells whether a path resolves inside a tree.

Standard library only (and :mod:`torchcal.errors`).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from ..errors import UnsafePathError

__all__ = ["file_kind", "check_own_path", "is_within", "find_files"]


_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISREG, "a regular file"))


def file_kind(st: os.stat_result) -> str:
    """What an ``lstat`` result describes, in words (``"a FIFO (named pipe)"``, ...)."""
    return next((name for test, name in _KINDS if test(st.st_mode)), "a special file")


def check_own_path(path: str | os.PathLike, what: str = "File", *,
                   directory: bool = False) -> None:
    """Refuse a path torchcal is about to write, lock or delete when it is not what torchcal
    writes there: a symbolic link (never followed: writing through it would change the link's
    target, a user's file), or something other than a regular file (``directory=False``) or a
    directory (``directory=True``).  Nothing there is fine.

    Raises:
        UnsafePathError: one line naming ``path`` and what it is.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "l").symlink_to(d / "x")
    >>> check_own_path(d / "l", "Lock file")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    torchcal.errors.UnsafePathError: Lock file '.../l' is a symbolic link (to '.../x'): ...
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:  # pragma: no cover - replaced meanwhile
            target = "?"
        raise UnsafePathError(f"{what} {str(path)!r} is a symbolic link (to {target!r}): "
                              "torchcal does not write, lock or delete through links; remove "
                              "the link or give the real path")
    ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    if not ok:
        expected = "a directory" if directory else "a regular file"
        raise UnsafePathError(f"{what} {str(path)!r} is {file_kind(st)}, not {expected}: "
                              "refused; remove it or give another path")


def is_within(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Whether ``path`` resolves (all links followed) to ``root`` itself or somewhere below it."""
    real, top = os.path.realpath(path), os.path.realpath(root)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def _holds(directory: Path, name: str) -> bool:
    """Whether ``directory`` holds a file ``name`` itself, in a child or in a grandchild."""
    with contextlib.suppress(OSError):
        return any(next(directory.glob(pat), None) is not None
                   for pat in (name, f"*/{name}", f"*/*/{name}"))
    return False


def find_files(root: str | os.PathLike, name: str,
               ) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """The files called ``name`` under the tree ``root`` (itself included), by torchcal's
    symbolic-link policy for run trees and data roots: **a link is followed only where it
    stays inside the tree**.

    Directory links are never descended into (what they point to inside the tree is found
    under its real path; following them could loop).  A link that leaves the tree - a file link
    called ``name``, or a directory link to a directory holding ``name`` up to two levels down
    (another run, another tree of runs) - is not followed and comes back in the second list as
    ``(link, resolved target)`` so that the caller names it.

    Returns:
        ``(files, leaving)``, each sorted.
    """
    root = Path(root)
    files: list[Path] = []
    leaving: list[tuple[Path, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        for d in dirnames:
            link = here / d
            if link.is_symlink() and not is_within(link, root) and _holds(link, name):
                leaving.append((link, Path(os.path.realpath(link))))
        if name in filenames:
            f = here / name
            if f.is_symlink() and not is_within(f, root):
                leaving.append((f, Path(os.path.realpath(f))))
            else:
                files.append(f)
    return sorted(files), sorted(leaving)

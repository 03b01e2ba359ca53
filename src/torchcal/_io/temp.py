"""Temporary directories, and the removal of the temporary files and directories that a
killed process left behind (only when their writer is gone; never through a link).

Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import re
import secrets
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from .atomic import TEMP_RE, signals_deferred

__all__ = ["make_temp_dir", "staged_temp_dir", "remove_stale_temp_files", "remove_stale_temp_dirs"]


def make_temp_dir(parent: str | os.PathLike, prefix: str) -> Path:
    """A new directory ``parent/PREFIX<random>`` with mode ``0o777 & ~umask``
    (:func:`tempfile.mkdtemp` would make it 0700, and so the directory it is renamed to)."""
    parent = Path(parent)
    for _ in range(100):
        d = parent / f"{prefix}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            os.mkdir(d, 0o777)
            return d
        except FileExistsError:  # pragma: no cover - 32 random bits collided
            continue
    raise FileExistsError(errno.EEXIST, "No free temporary directory name", str(parent))  # pragma: no cover



@contextlib.contextmanager
def staged_temp_dir(parent: str | os.PathLike, prefix: str) -> Iterator[Path]:
    """:func:`make_temp_dir` for the block, removed when the block ends (when the block moved
    it into place, there is nothing left to remove).  It is created with SIGINT/SIGTERM held
    back, so a Ctrl-C or ``kill`` delivered right after ``mkdir`` is raised where its removal
    is sure, and no folder is left behind.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> with staged_temp_dir(root, ".x.tmp-") as d:
    ...     d.is_dir()
    True
    >>> list(root.iterdir())
    []
    """
    made: list[Path] = []
    try:
        with signals_deferred():
            made.append(make_temp_dir(parent, prefix))
        yield made[0]
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process is not writing while it cleans up: a reused pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists (another user's process), or cannot tell: keep its file
    return True


def _temp_entries(directory: str | os.PathLike, pattern: re.Pattern,
                  names: Iterable[str]) -> list[tuple[Path, re.Match]]:
    """The entries of ``directory`` whose name matches ``pattern`` with a ``NAME`` group that
    matches one of ``names`` (sorted); none when ``directory`` is a link (never followed: its
    target is not torchcal's) or is missing."""
    directory = Path(directory)
    patterns = list(names)
    if directory.is_symlink():
        return []
    try:
        entries = sorted(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for p in entries:
        m = pattern.match(p.name)
        if m is not None and any(fnmatch.fnmatchcase(m["name"], pat) for pat in patterns):
            out.append((p, m))
    return out


def remove_stale_temp_files(directory: str | os.PathLike,
                            names: Iterable[str] = ("*",)) -> list[Path]:
    """Remove the temporary files of atomic writes that a killed process left in ``directory``.

    Only files named like this module's (or :func:`tempfile.mkstemp`'s, of older versions)
    temporary files ``.NAME.PID-RANDOM.tmp`` whose ``NAME`` matches one of the glob patterns
    ``names`` are candidates, and one is removed only when the process ``PID`` that wrote it is
    gone (a live writer's file is kept); never a link, nor a ``directory`` that is one.  Not
    recursive.

    Returns:
        The removed paths.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / ".last.pt.abcd1234.tmp").write_bytes(b"x"); _ = (d / "keep.tmp").write_bytes(b"")
    >>> [p.name for p in remove_stale_temp_files(d, ["last.pt"])], sorted(p.name for p in d.iterdir())
    (['.last.pt.abcd1234.tmp'], ['keep.tmp'])
    """
    removed: list[Path] = []
    for p, m in _temp_entries(directory, TEMP_RE, names):
        if m["pid"] is not None and _pid_alive(int(m["pid"])):
            continue
        if not p.is_file() or p.is_symlink():
            continue
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            removed.append(p)
    return removed


_TEMP_DIR_RE = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[0-9a-f]+$")


def remove_stale_temp_dirs(directory: str | os.PathLike,
                           names: Iterable[str] = ("*",)) -> list[Path]:
    """Remove the temporary folders of :func:`make_temp_dir` (``.NAME.tmp-PID-RANDOM``, e.g. an
    embedding cache being built) that a killed process left in ``directory``: only those whose
    ``NAME`` matches one of ``names`` and whose process ``PID`` is gone; never a link, nor a
    ``directory`` that is one.  Not recursive.

    Returns:
        The removed paths.
    """
    removed: list[Path] = []
    for p, m in _temp_entries(directory, _TEMP_DIR_RE, names):
        if _pid_alive(int(m["pid"])) or p.is_symlink() or not p.is_dir():
            continue
        shutil.rmtree(p, ignore_errors=True)  # rmtree never follows links inside
        removed.append(p)
    return removed

"""Atomic file writing and JSON conversion, the one implementation every writer uses.

A file is written to a temporary file in the destination directory (``.NAME.PID-RANDOM.tmp``),
flushed and fsync'ed, then moved into place with :func:`os.replace` (and the directory
fsync'ed), so a reader sees either the old complete file or the new complete one, never a torn
write - also when the process is killed mid-write.

* New files get the permissions the process' umask gives any new file (``0o666 & ~umask``,
  e.g. 0644), like ``open(path, "w")``; :func:`tempfile.mkstemp` would make them 0600.
* A write that fails (a full disk, a read-only file system) raises an :class:`OSError` whose
  message names the file; a full disk says so (``ENOSPC``/``EDQUOT``).
* The temporary file carries the writer's process id, so :func:`remove_stale_temp_files` can
  remove the ones a killed process left behind without touching a live writer's.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import json
import math
import os
import re
import secrets
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

__all__ = [
    "fsync_dir",
    "atomic_writer",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "append_text",
    "make_temp_dir",
    "remove_stale_temp_files",
    "write_error",
    "to_jsonable",
]

_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
# ".NAME.PID-HEX.tmp" (this module) or ".NAME.XXXXXXXX.tmp" (tempfile.mkstemp, older versions)
_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.(?:(?P<pid>\d+)-[0-9a-f]+|[a-z0-9_]{8})\.tmp$")


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory (or file) so a completed rename survives a power cut; best effort."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. directories on Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def write_error(exc: OSError, path: str | os.PathLike) -> OSError:
    """``exc`` as an :class:`OSError` whose message names ``path`` (and says so when the disk is full).

    >>> str(write_error(OSError(errno.ENOSPC, "No space left on device"), "/r/results.json"))
    "[Errno 28] No space left on device: the disk is full, cannot write '/r/results.json'"
    """
    path = str(path)
    if exc.errno in _DISK_FULL:
        what = "disk quota exceeded" if exc.errno != errno.ENOSPC else "the disk is full"
        return OSError(exc.errno, f"{exc.strerror or 'No space left on device'}: {what}, "
                                  f"cannot write {path!r}")
    if exc.filename is not None:
        return exc
    return OSError(exc.errno, f"{exc.strerror or exc}: cannot write {path!r}")


def _new_temp_file(path: Path) -> tuple[int, Path]:
    """Create ``.NAME.PID-RANDOM.tmp`` beside ``path`` with mode ``0o666 & ~umask``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(
        os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:  # pragma: no cover - 32 random bits collided
            continue
    raise FileExistsError(errno.EEXIST, "No free temporary file name", str(path))  # pragma: no cover


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """A binary file object whose content replaces ``path`` atomically when the block ends.

    The content goes to a temporary file beside ``path``; at the end of the ``with`` block it
    is flushed, fsync'ed and moved into place.  An exception inside the block (or while
    writing) removes the temporary file and leaves ``path`` untouched; an :class:`OSError`
    comes back naming ``path`` (:func:`write_error`).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.bin"
    >>> with atomic_writer(p) as f:
    ...     _ = f.write(b"abc")
    >>> p.read_bytes()
    b'abc'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = _new_temp_file(path)
    except OSError as exc:
        raise write_error(exc, path) from exc
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            raise write_error(exc, path) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, fsync, replace).

    >>> import tempfile, pathlib
    >>> p = atomic_write_bytes(pathlib.Path(tempfile.mkdtemp()) / "a" / "x.bin", b"abc")
    >>> p.read_bytes()
    b'abc'
    """
    path = Path(path)
    with atomic_writer(path) as f:
        f.write(data)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def append_text(path: str | os.PathLike, text: str) -> None:
    """Append UTF-8 ``text`` to ``path`` (created if absent), flushed and fsync'ed.

    An :class:`OSError` names ``path`` (:func:`write_error`).
    """
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise write_error(exc, path) from exc


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


def remove_stale_temp_files(directory: str | os.PathLike,
                            names: Iterable[str] = ("*",)) -> list[Path]:
    """Remove the temporary files of atomic writes that a killed process left in ``directory``.

    Only files named like this module's (or :func:`tempfile.mkstemp`'s, of older versions)
    temporary files ``.NAME.PID-RANDOM.tmp`` whose ``NAME`` matches one of the glob patterns
    ``names`` are candidates, and one is removed only when the process ``PID`` that wrote it is
    gone (a live writer's file is kept).  Not recursive.

    Returns:
        The removed paths.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / ".last.pt.abcd1234.tmp").write_bytes(b"x"); _ = (d / "keep.tmp").write_bytes(b"")
    >>> [p.name for p in remove_stale_temp_files(d, ["last.pt"])], sorted(p.name for p in d.iterdir())
    (['.last.pt.abcd1234.tmp'], ['keep.tmp'])
    """
    directory = Path(directory)
    patterns = list(names)
    removed: list[Path] = []
    try:
        entries = sorted(directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for p in entries:
        m = _TEMP_RE.match(p.name)
        if m is None or not any(fnmatch.fnmatchcase(m["name"], pat) for pat in patterns):
            continue
        if m["pid"] is not None and _pid_alive(int(m["pid"])):
            continue
        if not p.is_file() or p.is_symlink():
            continue
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            removed.append(p)
    return removed


def to_jsonable(x: Any) -> Any:
    """Plain-JSON version of ``x``: NaN/Inf -> None, tensors/arrays -> lists/numbers, paths -> str.

    >>> to_jsonable({"a": float("nan"), "b": torch.tensor([1.5]), "c": np.int64(2)})
    {'a': None, 'b': [1.5], 'c': 2}
    """
    if isinstance(x, Mapping):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, torch.Tensor):
        return to_jsonable(x.detach().cpu().tolist() if x.ndim else x.item())
    if isinstance(x, np.ndarray):
        return to_jsonable(x.tolist())
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return v if math.isfinite(v) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, Path):
        return str(x)
    return x


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> Path:
    """Write ``to_jsonable(obj)`` as strict JSON (no NaN tokens) atomically."""
    text = json.dumps(to_jsonable(obj), indent=indent, allow_nan=False)
    return atomic_write_text(path, text + "\n")

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

:func:`exclusive_lock` makes one process the owner of a directory (a run directory, a report's
output directory) for as long as it writes there.

Reading back what torchcal wrote:

* **Integrity**: :func:`write_verified` writes a file with its SHA-256 beside it
  (``NAME.sha256``) and :func:`read_verified` checks it on every read - the one check of every
  file torchcal writes and later trusts (checkpoints, uncertainty heads, the embedding cache's
  manifest, ``torchcal calibrate``'s output); :func:`check_sha256` checks a large file against
  a digest listed in such a verified file.
* **Bounded reads**: :func:`read_json` (via :func:`read_bytes_bounded` and :func:`parse_json`)
  reads only regular files of bounded size, with bounded nesting and integer length and no
  NaN/Infinity.
* **Symbolic links**: :func:`find_files` walks a run tree without following links that leave it,
  and returns them so that the caller names them; :func:`is_within` tells whether a path
  resolves inside a tree.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import stat
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from .errors import ChecksumError, InUseError, UnsafePathError
from .errors import RefusedJSONValueError as _Refused

try:  # POSIX; on Windows there is no fcntl and exclusive_lock does not lock (see there)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "fsync_dir",
    "atomic_writer",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "atomic_write_files",
    "json_text",
    "append_text",
    "fsync_file",
    "make_temp_dir",
    "remove_stale_temp_files",
    "remove_stale_temp_dirs",
    "exclusive_lock",
    "read_lock_command",
    "LOCK_NAME",
    "write_error",
    "to_jsonable",
    "checksum_path",
    "sha256_file",
    "write_verified",
    "replace_verified",
    "read_verified",
    "check_sha256",
    "check_listed",
    "read_digests",
    "read_bytes_bounded",
    "parse_json",
    "read_json",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT_DIGITS",
    "is_within",
    "find_files",
    "file_kind",
    "check_own_path",
    "TEMP_RE",
]

_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
# ".NAME.PID-HEX.tmp" (this module) or ".NAME.XXXXXXXX.tmp" (tempfile.mkstemp, older versions)
TEMP_RE = _TEMP_RE = re.compile(r"^\.(?P<name>.+)\.(?:(?P<pid>\d+)-[0-9a-f]+|[a-z0-9_]{8})\.tmp$")


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
    check_own_path(path, "Output file")
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


def atomic_write_files(files: Mapping[str | os.PathLike, bytes | str]) -> list[Path]:
    """Write several files (``{path: content}``, text as UTF-8) so that they are replaced
    together, the pages of one report: every file is written to its temporary file
    (``.NAME.PID-RANDOM.tmp``, fsync'ed) first, and only when all are written is each moved
    into place.  A failure while writing any of them (a full disk) removes the temporary files
    and leaves every old file as it was: never a new file beside an old one of the set.  (The
    moves themselves are renames in the same directory, which allocate nothing.)

    Returns:
        The paths, in the order given.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> [p.name for p in atomic_write_files({d / "a.md": "# a", d / "a.html": b"<p>a</p>"})]
    ['a.md', 'a.html']
    """
    items = [(Path(p), data.encode("utf-8") if isinstance(data, str) else bytes(data))
             for p, data in files.items()]
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in items:
            path.parent.mkdir(parents=True, exist_ok=True)
            check_own_path(path, "Output file")
            try:
                fd, tmp = _new_temp_file(path)
                staged.append((path, tmp))
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:
                raise write_error(exc, path) from exc
        for path, tmp in staged:  # every file is written: commit them together
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise write_error(exc, path) from exc
    except BaseException:
        for _path, tmp in staged:  # those not yet moved into place
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    for directory in dict.fromkeys(path.parent for path, _tmp in staged):
        fsync_dir(directory)
    return [path for path, _data in items]


def append_text(path: str | os.PathLike, text: str, *, fsync: bool = True) -> None:
    """Append UTF-8 ``text`` to ``path`` (created if absent), flushed and (with ``fsync``)
    fsync'ed; without it the line reaches the OS (a killed process loses nothing) and a later
    :func:`fsync_file` makes it durable.

    An :class:`OSError` names ``path`` (:func:`write_error`).
    """
    check_own_path(path, "Output file")
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_CLOEXEC", 0))
    try:
        with os.fdopen(os.open(path, flags, 0o666), "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
    except OSError as exc:
        raise write_error(exc, path) from exc


def fsync_file(path: str | os.PathLike) -> None:
    """fsync an existing file's data (a log appended without fsync); absent: nothing to do."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise write_error(exc, path) from exc
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    for p, m in _temp_entries(directory, _TEMP_RE, names):
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


#: The lock file :func:`exclusive_lock` keeps in a directory while a process owns it.
LOCK_NAME = ".torchcal.lock"

# directories this process holds, resolved path -> [depth, fd]: re-entrant in one process
# (``train`` inside the demo's run lock), as a second flock of the same file would refuse
_HELD: dict[str, list[int]] = {}
_HELD_GUARD = threading.Lock()


def _lock_holder(lock_file: Path) -> str:
    """``"process 1234 (torchcal train ...)"`` from a lock file, or ``"another process"``."""
    try:  # bounded: a lock file replaced by /dev/zero is not read forever
        info = json.loads(read_bytes_bounded(lock_file, max_bytes=1 << 16).decode("utf-8"))
        pid, cmd = int(info["pid"]), str(info.get("command") or "").strip()
    except (OSError, ValueError, TypeError, KeyError, UnicodeDecodeError):
        return "another process"  # written this instant, or by something else
    return f"process {pid}" + (f" ({cmd})" if cmd else "")


def read_lock_command(directory: str | os.PathLike) -> str | None:
    """The command line recorded in ``directory``'s lock file (also a stale one a killed process
    left), or None."""
    try:  # bounded, as _lock_holder
        info = json.loads(read_bytes_bounded(Path(directory) / LOCK_NAME,
                                             max_bytes=1 << 16).decode("utf-8"))
        cmd = info.get("command")
    except (OSError, ValueError, AttributeError, UnicodeDecodeError):
        return None
    return str(cmd) if cmd else None


def _command_line() -> str:
    """This process' command line, ``torchcal ...`` for ``python -m torchcal``."""
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    if prog == "__main__.py" and "torchcal" in sys.argv[0]:
        prog = "torchcal"
    return " ".join([prog, *sys.argv[1:]])


def _open_locked(lock_file: Path, what: str) -> int:
    """Open and ``flock`` ``lock_file`` (non-blocking); raise :class:`InUseError` if held.

    The lock file is never followed (``O_NOFOLLOW``) nor opened when it is not a regular file:
    a link to a user's file would be truncated, a FIFO would block, ``/dev/zero`` cannot be
    locked (:class:`~torchcal.errors.UnsafePathError` naming it)."""
    flags = (os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_NONBLOCK", 0))
    while True:
        check_own_path(lock_file, "Lock file")
        try:
            fd = os.open(lock_file, flags, 0o666)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.EISDIR):
                check_own_path(lock_file, "Lock file")  # swapped meanwhile: names it
            raise write_error(exc, lock_file) from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # pragma: no cover - swapped meanwhile
            os.close(fd)
            check_own_path(lock_file, "Lock file")
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InUseError(  # no errno: the message is the one line the user reads
                f"{what} {str(lock_file.parent)!r} is in use by "
                f"{_lock_holder(lock_file)}; wait for it to end (or stop it), or use another "
                "directory") from None
        except OSError:  # pragma: no cover - a file system without flock: do not lock
            os.close(fd)
            return -1
        # the holder unlinks the file before releasing it: make sure the file we locked is
        # still the one at the path, else a third process could lock a new file beside ours
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock_file))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextlib.contextmanager
def exclusive_lock(directory: str | os.PathLike, *, what: str = "Run directory") -> Iterator[Path]:
    """Own ``directory`` for the block: an advisory lock on ``directory/.torchcal.lock``.

    A second process asking for the same directory fails at once with
    :class:`~torchcal.errors.InUseError`, whose message names the holder's pid and command
    line (kept in the lock file).  The lock is ``fcntl.flock``: the kernel releases it when the
    holder ends in any way (also SIGKILL), so a lock file a killed process left is simply taken
    over.  Re-entrant within one process.  ``directory`` is created if needed; at the end the
    lock file is removed, and so is ``directory`` when this call created it and it is empty
    (a run that failed its checks leaves nothing behind).

    Nothing is followed: ``directory`` or its lock file being a symbolic link (or the lock file
    a FIFO or a device) is refused with :class:`~torchcal.errors.UnsafePathError` naming it,
    before anything is written (a link's target is a user's, never the run's).

    On Windows (no ``fcntl``) nothing is locked: the block runs as without the lock.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()) / "run"
    >>> with exclusive_lock(d):
    ...     sorted(p.name for p in d.iterdir())
    ['.torchcal.lock']
    >>> d.exists()
    False
    """
    directory = Path(directory)
    if directory.is_symlink():  # never a link: its target is not ours
        check_own_path(directory, what, directory=True)
    created = not directory.exists()
    if fcntl is None:  # pragma: no cover - Windows: no advisory lock, run unlocked
        yield directory
        return
    if not created and not directory.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(directory))
    directory.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(directory)
    lock_file = directory / LOCK_NAME
    with _HELD_GUARD:
        held = _HELD.get(key)
        if held is None:
            fd = _open_locked(lock_file, what)
            if fd >= 0:
                info = {"pid": os.getpid(), "command": _command_line()}
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)
            held = _HELD[key] = [0, fd]
        held[0] += 1
    try:
        yield directory
    finally:
        with _HELD_GUARD:
            held[0] -= 1
            if held[0] == 0:
                del _HELD[key]
                if held[1] >= 0:
                    with contextlib.suppress(OSError):
                        os.unlink(lock_file)
                    os.close(held[1])  # releases the flock
                if created:
                    with contextlib.suppress(OSError):
                        directory.rmdir()  # only if empty


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


def json_text(obj: Any, *, indent: int | None = 2) -> str:
    """``to_jsonable(obj)`` as strict JSON (no NaN tokens) and a final newline: the text
    :func:`atomic_write_json` writes."""
    return json.dumps(to_jsonable(obj), indent=indent, allow_nan=False) + "\n"


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> Path:
    """Write ``to_jsonable(obj)`` as strict JSON (no NaN tokens) atomically."""
    return atomic_write_text(path, json_text(obj, indent=indent))


# ------------------------------------------------------------------------------------------
# integrity: every file torchcal writes and later trusts is verified on read the same way
# ------------------------------------------------------------------------------------------
_DIGEST_RE = re.compile(r"^([0-9a-f]{64})  \*?(.+)$")
_CHUNK = 1 << 20


def checksum_path(path: str | os.PathLike) -> Path:
    """The SHA-256 file beside ``path``: ``last.pt`` -> ``last.pt.sha256``."""
    path = Path(path)
    return path.with_name(path.name + ".sha256")


def sha256_file(path: str | os.PathLike) -> str:
    """The hex SHA-256 of the file ``path``, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _read_digests(path: Path, what: str, error: type[Exception]) -> list[str]:
    """The digests listed in ``path``'s SHA-256 file (``error`` if unreadable or malformed)."""
    side = checksum_path(path)
    try:
        lines = read_bytes_bounded(side, max_bytes=1 << 16, what="Checksum file",
                                   error=error).decode("ascii").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"Checksum file {str(side)!r} of {what.lower()} {str(path)!r} cannot be "
                    f"read: {exc}") from exc
    digests = []
    for line in lines:
        m = _DIGEST_RE.match(line.strip())
        if m is None or m.group(2) != path.name:
            raise error(f"Checksum file {str(side)!r} is malformed: expected lines "
                        f"'<sha256 hex>  {path.name}', got {line[:80]!r}")
        digests.append(m.group(1))
    if not digests:
        raise error(f"Checksum file {str(side)!r} is empty")
    return digests


def _write_digests(side: Path, digests: list[str], name: str) -> None:
    with atomic_writer(side) as f:
        f.write("".join(f"{d}  {name}\n" for d in digests).encode("ascii"))


def write_verified(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically and its SHA-256 to ``path + ".sha256"``
    (``sha256sum`` format: ``sha256sum -c NAME.sha256`` checks it by hand).

    The new digest is first added to the SHA-256 file, then the file is replaced, then only
    the new digest is kept: a kill between any two steps leaves a file matching one of the
    listed digests (or, replacing a file of an older torchcal, one without a SHA-256 file).
    Read it back with :func:`read_verified`.
    """
    path = Path(path)
    digest = hashlib.sha256(data).hexdigest()
    side = checksum_path(path)
    if not (path.is_file() and not side.is_file()):  # else: replacing an unverified file
        previous: list[str] = []
        if path.is_file():
            with contextlib.suppress(ChecksumError, OSError):
                previous = [d for d in _read_digests(path, "File", ChecksumError)
                            if d != digest][:7]
        _write_digests(side, [digest, *previous], path.name)
    atomic_write_bytes(path, data)
    _write_digests(side, [digest], path.name)
    return path


def replace_verified(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Move the verified file ``src`` (written by :func:`write_verified`) onto ``dst`` with the
    protocol of :func:`write_verified`: ``src``'s digest is added to ``dst``'s SHA-256 file, the
    file is renamed into place, then only its digest is kept and ``src``'s SHA-256 file goes.
    A kill between any two steps leaves ``dst`` matching one of its listed digests (the old
    or the new file) and ``src`` still verifiable until it has been moved.

    Raises:
        ChecksumError: ``src`` does not match its SHA-256 file.
    """
    src, dst = Path(src), Path(dst)
    digest = _read_digests(src, "File", ChecksumError)[0]
    side = checksum_path(dst)
    previous: list[str] = []
    if dst.is_file() and side.is_file():
        with contextlib.suppress(ChecksumError, OSError):
            previous = [d for d in _read_digests(dst, "File", ChecksumError) if d != digest][:7]
    _write_digests(side, [digest, *previous], dst.name)
    try:
        os.replace(src, dst)
    except OSError as exc:
        raise write_error(exc, dst) from exc
    fsync_dir(dst.parent)
    _write_digests(side, [digest], dst.name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(checksum_path(src))
    return dst


def _mismatch(path: Path, what: str, where: str, expected: str, got: str, hint: str,
              error: type[Exception]) -> Exception:
    return error(f"{what} {str(path)!r} does not match its SHA-256 in {where} (expected "
                 f"{expected[:16]}..., got {got[:16]}...): the file was corrupted or modified "
                 f"after it was written; {hint}")


def read_verified(path: str | os.PathLike, *, what: str = "File",
                  error: type[Exception] = ChecksumError, hint: str = "do not use it",
                  max_bytes: int | None = None) -> bytes:
    """The bytes of ``path`` (written by :func:`write_verified`), checked against its SHA-256
    file: the one integrity check of every file torchcal writes and later trusts.

    Args:
        path: the file.
        what: how the error messages name the file (``"Checkpoint"``, ``"Uncertainty head"``).
        error: the exception type raised (a :class:`~torchcal.errors.TorchcalError`).
        hint: what to do about a mismatch (``"re-run torchcal uncertainty fit"``).
        max_bytes: refuse larger files (None: no limit); see :func:`read_bytes_bounded`.

    A file without a SHA-256 file (written before torchcal verified it) is read with a
    :class:`UserWarning`.

    Raises:
        error: the file (or its SHA-256 file) is not a readable regular file, or its SHA-256
            matches none of the listed digests (the message names the file and ``hint``).
    """
    path = Path(path)
    try:
        data = read_bytes_bounded(path, max_bytes=max_bytes, what=what, error=error)
    except OSError as exc:
        raise error(f"{what} {str(path)!r} cannot be read: {exc}") from exc
    side = checksum_path(path)
    if not side.exists():
        warnings.warn(f"{what} {str(path)!r} has no {side.name} (it was written before "
                      "torchcal verified its files): read without an integrity check",
                      stacklevel=3)
        return data
    digests = _read_digests(path, what, error)
    got = hashlib.sha256(data).hexdigest()
    if got not in digests:
        raise _mismatch(path, what, side.name, digests[0], got, hint, error)
    return data


def read_digests(path: str | os.PathLike, what: str = "File",
                 error: type[Exception] = ChecksumError) -> list[str]:
    """The digests listed in ``path``'s SHA-256 file, newest first (``error`` if it is
    unreadable or malformed; ``FileNotFoundError`` if absent)."""
    path = Path(path)
    if not checksum_path(path).exists():
        raise FileNotFoundError(errno.ENOENT, "No SHA-256 file", str(checksum_path(path)))
    return _read_digests(path, what, error)


def check_listed(path: str | os.PathLike, *, what: str = "File",
                 error: type[Exception] = ChecksumError, hint: str = "do not use it") -> str:
    """Check a (large) file against the digests of its SHA-256 file (written by
    :func:`write_verified`), streaming; the same message as :func:`read_verified`.

    Returns:
        The file's digest.
    """
    path = Path(path)
    digests = _read_digests(path, what, error)
    got = sha256_file(path)
    if got not in digests:
        raise _mismatch(path, what, checksum_path(path).name, digests[0], got, hint, error)
    return got


def check_sha256(path: str | os.PathLike, expected: str, *, what: str = "File",
                 where: str = "its manifest", error: type[Exception] = ChecksumError,
                 hint: str = "do not use it") -> None:
    """Check a (large, memory-mapped) file against a SHA-256 recorded elsewhere (``where``, e.g.
    a verified manifest), streaming: the same check and message as :func:`read_verified`."""
    path = Path(path)
    got = sha256_file(path)
    if got != str(expected):
        raise _mismatch(path, what, where, str(expected), got, hint, error)


# ------------------------------------------------------------------------------------------
# bounded reads: what torchcal reads back cannot hang it, exhaust its memory or its stack
# ------------------------------------------------------------------------------------------
#: Largest JSON file :func:`read_json` reads (results, configs, manifests, calibrations).
MAX_JSON_BYTES = 16 << 20
#: Deepest nesting of arrays and objects :func:`parse_json` accepts.
MAX_JSON_DEPTH = 64
#: Most digits of a JSON integer :func:`parse_json` accepts (Python refuses > 4300 anyway).
MAX_JSON_INT_DIGITS = 64
_STRING_RE = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


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


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-')):,} digits (at most "
                       f"{MAX_JSON_INT_DIGITS} allowed)")
    return int(text)


def _parse_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise _Refused(f"the number {text[:40]} overflows to {v}")
    return v


def _parse_constant(name: str) -> Any:
    raise _Refused(f"the non-finite value {name} (torchcal writes null)")


def _max_depth(data: bytes) -> int:
    """Deepest nesting of ``[``/``{`` outside strings (vectorised: no recursion, no loop)."""
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return 0
    arr = np.frombuffer(_STRING_RE.sub(b"", data), dtype=np.uint8)
    step = (((arr == ord("[")) | (arr == ord("{"))).astype(np.int32)
            - ((arr == ord("]")) | (arr == ord("}"))).astype(np.int32))
    return int(np.cumsum(step).max(initial=0))


def parse_json(data: bytes | str, *, what: str = "File", path: str | os.PathLike = "",
               error: type[Exception] = ValueError) -> Any:
    """Strict JSON of bounded shape: ``error`` naming ``path`` for invalid UTF-8 or JSON,
    nesting deeper than :data:`MAX_JSON_DEPTH`, integers longer than
    :data:`MAX_JSON_INT_DIGITS` digits, ``NaN``/``Infinity`` or numbers that overflow.

    >>> parse_json(b'{"a": [1, 2.5, null]}')
    {'a': [1, 2.5, None]}
    >>> parse_json("[" * 100, path="x.json")
    Traceback (most recent call last):
    ValueError: File 'x.json' is nested 100 levels deep (at most 64 allowed): refused
    """
    name = f"{what} {str(path)!r}"
    raw = data.encode("utf-8") if isinstance(data, str) else data
    depth = _max_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise error(f"{name} is nested {depth} levels deep (at most {MAX_JSON_DEPTH} allowed): "
                    "refused")
    try:
        text = raw.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                          parse_constant=_parse_constant)
    except UnicodeDecodeError as exc:
        raise error(f"{name} cannot be read: it is not UTF-8 text ({exc})") from None
    except _Refused as exc:
        raise error(f"{name} holds {exc}: refused") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise error(f"{name} is not valid JSON: {str(exc)[:200]}") from None


def read_json(path: str | os.PathLike, *, what: str = "File", error: type[Exception] = ValueError,
              max_bytes: int | None = None, verified: bool = False,
              hint: str = "do not use it") -> Any:
    """The one reader of JSON that torchcal reads back: :func:`read_bytes_bounded` (a regular
    file of at most ``max_bytes``, default :data:`MAX_JSON_BYTES`), then :func:`parse_json`;
    with ``verified`` the file is first checked against its SHA-256 file (:func:`read_verified`).

    Raises:
        FileNotFoundError: ``path`` does not exist (unless ``verified``: then ``error``).
        error: anything else, the message naming the file.
    """
    path = Path(path)
    max_bytes = MAX_JSON_BYTES if max_bytes is None else max_bytes
    if verified:
        if not path.exists():
            raise error(f"{what} {str(path)!r} does not exist")
        data = read_verified(path, what=what, error=error, hint=hint, max_bytes=max_bytes)
    else:
        try:
            data = read_bytes_bounded(path, max_bytes=max_bytes, what=what, error=error)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise error(f"{what} {str(path)!r} cannot be read: {exc}") from exc
    return parse_json(data, what=what, path=path, error=error)


# ------------------------------------------------------------------------------------------
# symbolic links: run trees and data roots are not left through a link
# ------------------------------------------------------------------------------------------
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

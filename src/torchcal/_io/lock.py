"""Locks: :func:`exclusive_lock` makes one process the owner of a directory (a run directory, a
report's output directory) for as long as it writes there (``fcntl.flock`` on
:data:`LOCK_NAME`, released by the kernel however the holder ends); :func:`read_lock_command`
reads the command line a holder recorded.

Standard library only (and :mod:`torchcal.errors`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from ..errors import InUseError
from .atomic import write_error
from .bounded import read_bytes_bounded
from .links import check_own_path

try:  # POSIX; on Windows there is no fcntl and exclusive_lock does not lock (see there)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["exclusive_lock", "read_lock_command", "LOCK_NAME"]


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

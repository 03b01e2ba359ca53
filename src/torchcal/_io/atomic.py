"""Atomic file writing: the one implementation every writer uses.

A file is written to a temporary file in the destination directory (``.NAME.PID-RANDOM.tmp``,
:func:`new_temp_file`), flushed and fsync'ed, then moved into place with :func:`os.replace`
(and the directory fsync'ed), so a reader sees either the old complete file or the new
complete one, never a torn write - also when the process is killed mid-write.

* New files get the permissions the process' umask gives any new file (``0o666 & ~umask``,
  e.g. 0644), like ``open(path, "w")``; :func:`tempfile.mkstemp` would make them 0600.
* A write that fails (a full disk, a read-only file system) raises an :class:`OSError` whose
  message names the file; a full disk says so (``ENOSPC``/``EDQUOT``; :func:`write_error`).
* The temporary file carries the writer's process id (:data:`TEMP_RE`), so
  :func:`torchcal._io.temp.remove_stale_temp_files` can remove the ones a killed process left
  behind without touching a live writer's.
* :func:`atomic_write_files` replaces several files together (a report's pages);
  :func:`append_text` appends (a log) and :func:`fsync_file` makes the appended lines durable.

Standard library only (and :mod:`torchcal.errors`, through :mod:`.links`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from .links import check_own_path

__all__ = [
    "fsync_dir",
    "write_error",
    "new_temp_file",
    "atomic_writer",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_files",
    "append_text",
    "fsync_file",
    "signals_deferred",
    "TEMP_RE",
]

_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
# ".NAME.PID-HEX.tmp" (this module) or ".NAME.XXXXXXXX.tmp" (tempfile.mkstemp, older versions)
TEMP_RE = re.compile(r"^\.(?P<name>.+)\.(?:(?P<pid>\d+)-[0-9a-f]+|[a-z0-9_]{8})\.tmp$")


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


def new_temp_file(path: Path) -> tuple[int, Path]:
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
    made: list[tuple[IO[bytes], Path]] = []
    try:
        try:
            # the file and its name together: a Ctrl-C or SIGTERM delivered right after the
            # file is created is raised here, where the clean-up below knows its name
            with signals_deferred():
                fd, tmp = new_temp_file(path)
                made.append((os.fdopen(fd, "wb"), tmp))
            f, tmp = made[0]
            with f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            raise write_error(exc, path) from exc
    except BaseException:
        for f, tmp in made:
            with contextlib.suppress(OSError):
                f.close()
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


#: The signals that end a command (:func:`signals_deferred` holds them during a commit).
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back for the block and delivered when it ends, so a Ctrl-C or
    ``kill`` cannot stop a commit of several renames half-way (a report's pages and figures)
    or come between a temporary file's creation and its name.

    Blocked for this thread (``pthread_sigmask``), and, in the main thread, their Python
    handlers replaced by one that only notes them for the block: another thread that does not
    block them (a test runner's, a library's) may take the signal, and Python then runs its
    handler in the main thread, inside the block.  The signals noted are raised again at the
    end.  Where signals cannot be blocked (Windows), the block runs as it is."""
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - Windows
        yield
        return
    held: list[int] = []
    handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _STOP_SIGNALS:
            if callable(signal.getsignal(signum)):  # a Python handler: noted, not run
                handlers[signum] = signal.signal(signum, lambda s, _frame: held.append(s))
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a pending one is noted here
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(held):
            signal.raise_signal(signum)  # its own handler now (KeyboardInterrupt)


def atomic_write_files(files: Mapping[str | os.PathLike, bytes | str], *,
                       before_commit: Callable[[], object] | None = None) -> list[Path]:
    """Write several files (``{path: content}``, text as UTF-8) so that they are replaced
    together, the pages of one report: every file is written to its temporary file
    (``.NAME.PID-RANDOM.tmp``, fsync'ed) first, and only when all are written is each moved
    into place.  A failure while writing any of them (a full disk) removes the temporary files
    and leaves every old file as it was: never a new file beside an old one of the set.  (The
    moves themselves are renames in the same directory, which allocate nothing.)  SIGINT and
    SIGTERM are held back during the moves (:func:`signals_deferred`); ``before_commit``, when
    given, runs there too, first: more renames that belong to the same commit (a report's
    figures).

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
                with signals_deferred():  # created and staged together (see atomic_writer)
                    fd, tmp = new_temp_file(path)
                    staged.append((path, tmp))
                    f = os.fdopen(fd, "wb")
                with f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:
                raise write_error(exc, path) from exc
        with signals_deferred():  # every file is written: commit them together, unbroken
            if before_commit is not None:
                before_commit()
            for path, tmp in staged:
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


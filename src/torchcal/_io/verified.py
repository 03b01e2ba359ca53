"""Verified files: every file torchcal writes and later trusts (checkpoints, uncertainty
heads, the embedding cache's manifest, ``torchcal calibrate``'s output) is written with its
SHA-256 beside it (``NAME.sha256``, :func:`write_verified`, :func:`replace_verified`) and
checked on every read (:func:`read_verified`); :func:`check_listed` and :func:`check_sha256`
check a large file, streaming, against a listed or recorded digest.

Standard library only (and :mod:`torchcal.errors`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import warnings
from pathlib import Path

from ..errors import ChecksumError
from .atomic import atomic_write_bytes, atomic_writer, fsync_dir, write_error
from .bounded import read_bytes_bounded

__all__ = [
    "checksum_path",
    "sha256_file",
    "write_verified",
    "replace_verified",
    "read_verified",
    "check_sha256",
    "check_listed",
    "read_digests",
]

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

"""The logits file: ``RUN_DIR/logits/{val,test}.npz`` and ``ood_<name>.npz``, the interchange
format between training and evaluation (DESIGN.md).

An ``.npz`` archive of ``logits`` (N, C) float32 and ``labels`` (N,) int64, written atomically
with its SHA-256 beside it (``NAME.npz.sha256``).  :func:`load_logits` reads it hardened: the
file must be a regular file holding a zip archive, match its SHA-256 when it has one, and
declare no array larger than it holds (a "zip bomb" or a forged ``.npy`` header is refused
before NumPy allocates anything); every refusal is a
:class:`~torchcal.errors.ResultsFileError` naming the file.
"""

from __future__ import annotations

import io
import math
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._io import check_listed, checksum_path, read_digests, write_verified
from ._validation import as_tensor
from .errors import ResultsFileError

__all__ = [
    "save_logits",
    "load_logits",
    "logits_digest",
    "MAX_LOGITS_BYTES",
    "MAX_NPZ_RATIO",
    "NPZ_RATIO_FROM",
]


def save_logits(path: str | os.PathLike, logits: Any, labels: Any) -> Path:
    """Save ``logits`` (N, C) as float32 and ``labels`` (N,) as int64 to an ``.npz`` file, atomically,
    with its SHA-256 in ``path + ".sha256"`` (:func:`torchcal._io.write_verified`), which
    :func:`load_logits` checks.

    OOD sets may use label -1 (unknown).  Returns the path written.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> p = save_logits(d / "test.npz", np.array([[2.0, 0.0]]), np.array([0]))
    >>> z, y = load_logits(p)
    >>> z.dtype, z.tolist(), y.dtype, y.tolist()
    (dtype('float32'), [[2.0, 0.0]], dtype('int64'), [0])
    """
    z = as_tensor(logits, "logits").detach().cpu()
    if not z.is_floating_point():
        raise TypeError(f"Expected `logits` to have a floating dtype, got {z.dtype}")
    if z.ndim != 2:
        raise ValueError(f"Expected `logits` to be 2-D of shape (N, C), got shape {tuple(z.shape)}")
    y = as_tensor(labels, "labels").detach().cpu()
    if y.is_floating_point() or y.dtype == torch.bool or y.ndim != 1 or y.shape[0] != z.shape[0]:
        raise ValueError(
            f"Expected `labels` to be 1-D integers with {z.shape[0]} entries, "
            f"got dtype {y.dtype} and shape {tuple(y.shape)}"
        )

    buf = io.BytesIO()
    np.savez(buf, logits=z.float().numpy(), labels=y.long().numpy())
    return write_verified(path, buf.getvalue())  # with its SHA-256 beside it


_ZIP_MAGIC = b"PK\x03\x04"


def _check_npz_file(path: Path) -> None:
    """ResultsFileError unless ``path`` is a regular file starting as a zip archive (an
    ``.npz``): a missing file, a broken link, a directory or device (a link to ``/dev/zero``)
    and a file of another format are each named for what they are, before NumPy sees them
    (NumPy would try a non-zip file as a pickle and advise loading it unsafely)."""
    name = f"Logits file {str(path)!r}"
    if not path.exists():
        broken = f" (a broken symbolic link to {os.readlink(path)!r})" if path.is_symlink() else ""
        raise ResultsFileError(f"{name} does not exist{broken}")
    if not path.is_file():
        raise ResultsFileError(f"{name} is not a regular file (a directory, FIFO, device or "
                               "socket): expected an .npz archive of `logits` and `labels`")
    try:
        with open(path, "rb") as f:
            head = f.read(len(_ZIP_MAGIC))
    except OSError as exc:
        raise ResultsFileError(f"{name} cannot be read: {exc}") from exc
    if head != _ZIP_MAGIC:
        what = ("an empty file" if not head else "a single .npy array" if head.startswith(
            b"\x93NUM") else "not a zip archive")
        raise ResultsFileError(f"{name} is not an .npz archive ({what}): expected the `logits` "
                               "and `labels` arrays of numpy.savez / torchcal.evaluate."
                               "save_logits")


#: Largest array a logits ``.npz`` member may declare (50,000 samples x 21,841 classes of
#: ImageNet-21k in float32 are 4.4 GB).
MAX_LOGITS_BYTES = 16 << 30
#: Largest uncompressed-to-compressed ratio of a deflated ``.npz`` member declaring more than
#: :data:`NPZ_RATIO_FROM` bytes (float logits deflate by at most ~1.2x; a member of zeros
#: deflates ~1000x: a "zip bomb"; small members, e.g. sorted labels, may deflate more).
MAX_NPZ_RATIO = 100
#: The size (bytes) above which a deflated ``.npz`` member is held to :data:`MAX_NPZ_RATIO`.
NPZ_RATIO_FROM = 64 << 20


def _check_npz_members(path: Path) -> None:
    """Refuse an ``.npz`` whose members would make NumPy allocate more than they hold, before
    anything is loaded: each member's declared array (shape x dtype, read from its ``.npy``
    header) must fit in the member (a header may declare 10^12 elements over 10 bytes), be
    at most :data:`MAX_LOGITS_BYTES`, and a compressed member may expand at most
    :data:`MAX_NPZ_RATIO` times."""
    name = f"Logits file {str(path)!r}"
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                ratio = info.file_size / max(info.compress_size, 1)
                if (info.compress_type != zipfile.ZIP_STORED and ratio > MAX_NPZ_RATIO
                        and info.file_size > NPZ_RATIO_FROM):
                    raise ResultsFileError(
                        f"{name} member {info.filename!r} expands {info.compress_size:,} bytes "
                        f"to {info.file_size:,} ({ratio:,.0f}x, at most {MAX_NPZ_RATIO}x "
                        "allowed): refused")
                with zf.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                            else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = read(f)
                    header = f.tell()
                size = math.prod(shape) * dtype.itemsize
                if size > MAX_LOGITS_BYTES or size > info.file_size - header:
                    raise ResultsFileError(
                        f"{name} member {info.filename!r} declares an array of shape "
                        f"{tuple(shape)} {dtype} ({size:,} bytes) in {info.file_size:,} bytes "
                        f"(at most {MAX_LOGITS_BYTES:,} allowed): refused")
    except ResultsFileError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, NotImplementedError):
        return  # not a readable npz of .npy members: load_logits names what it is


def logits_digest(path: str | os.PathLike) -> str | None:
    """The SHA-256 recorded beside a logits file (the first digest of ``NAME.npz.sha256``), or
    None when it has none (or it cannot be read)."""
    try:
        return read_digests(Path(path), "Logits file", ResultsFileError)[0]
    except (OSError, ResultsFileError):
        return None


def _check_logits_digest(path: Path) -> None:
    """ResultsFileError when ``path`` has a SHA-256 file and matches none of its digests (a
    file copied over it, edited, or corrupted); nothing to check without one."""
    if not checksum_path(path).exists():
        return
    check_listed(path, what="Logits file", error=ResultsFileError,
                 hint="it was replaced or edited after torchcal wrote it; evaluate the run "
                      "again (torchcal eval RUN_DIR) to rewrite it")


def load_logits(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Load ``(logits float32 (N, C), labels int64 (N,))`` saved by :func:`save_logits`.

    Raises :class:`~torchcal.errors.ResultsFileError` naming the file when it is missing,
    unreadable, does not match the SHA-256 beside it (``NAME.npz.sha256``; a file without one,
    written by hand or by a torchcal before 0.x verified logits, is read unchecked) or does not
    hold a 2-D floating ``logits`` and matching 1-D integer ``labels``.
    """
    path = Path(path)
    _check_npz_file(path)
    _check_logits_digest(path)
    _check_npz_members(path)
    try:
        with np.load(path, allow_pickle=False) as f:
            keys = set(f.files)
            missing = {"logits", "labels"} - keys
            if missing:
                raise ResultsFileError(
                    f"Logits file {str(path)!r} is malformed: missing array(s) {sorted(missing)} "
                    f"(found {sorted(keys)})"
                )
            z = f["logits"]
            y = f["labels"]
    except ResultsFileError:
        raise
    except Exception as exc:  # zipfile.BadZipFile, OSError, ValueError (pickled data), EOFError
        raise ResultsFileError(
            f"Logits file {str(path)!r} is malformed or truncated: {type(exc).__name__}: {exc}"
        ) from exc
    if z.ndim != 2 or not np.issubdtype(z.dtype, np.floating):
        hint = ("; a binary classifier's scores of shape (N,) are stacked into (N, 2): "
                "np.stack([np.zeros_like(z), z], 1) for logits z, "
                "np.log(np.stack([1 - p, p], 1)) for probabilities p") if z.ndim == 1 else ""
        raise ResultsFileError(
            f"Logits file {str(path)!r} is malformed: expected `logits` 2-D floating, "
            f"got dtype {z.dtype} shape {z.shape}{hint}"
        )
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer) or y.shape[0] != z.shape[0]:
        raise ResultsFileError(
            f"Logits file {str(path)!r} is malformed: expected `labels` 1-D integer with "
            f"{z.shape[0]} entries, got dtype {y.dtype} shape {y.shape}"
        )
    return z.astype(np.float32, copy=False), y.astype(np.int64, copy=False)

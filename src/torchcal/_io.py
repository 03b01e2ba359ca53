"""Atomic file writing and JSON conversion, the one implementation every writer uses.

A file is written to a temporary file in the destination directory, flushed and fsync'ed, then
moved into place with :func:`os.replace` (and the directory fsync'ed), so a reader sees either
the old complete file or the new complete one, never a torn write - also when the process is
killed mid-write.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["fsync_dir", "atomic_write_bytes", "atomic_write_text", "atomic_write_json", "to_jsonable"]


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


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, fsync, replace).

    >>> import tempfile, pathlib
    >>> p = atomic_write_bytes(pathlib.Path(tempfile.mkdtemp()) / "a" / "x.bin", b"abc")
    >>> p.read_bytes()
    b'abc'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


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

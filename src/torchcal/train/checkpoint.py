"""Checkpoints: one dict, written atomically, loadable with ``torch.load(weights_only=True)``,
verified by its SHA-256 on every load.

Layout (``RUN_DIR/checkpoints/last.pt`` and ``best.pt``)::

    {"format": "torchcal.checkpoint/1", "epoch": completed epochs, "config": TrainConfig dict,
     "model": state_dict, "optimizer": ..., "scheduler": ..., "loss": loss.state_dict(),
     "scaler": ... or None, "head": ... or None, "head_optimizer": ... or None,
     "num_classes": int, "input_shape": [int, ...],
     "best": {"metric": name, "value": float, "epoch": int}, "rng": rng_state_tensors(),
     "history": {...}}

``best.pt`` has the same layout for the epoch with the best validation metric, without the
optimiser, scheduler and scaler states (it is for evaluation, not for resuming).

Every RNG state is stored as tensors (the Python ``random`` and NumPy Mersenne-Twister states
converted), so the file holds only tensors and plain Python containers.

Integrity: beside each checkpoint ``NAME.pt`` lies ``NAME.pt.sha256`` in the format of
``sha256sum`` (``<hex digest>  NAME.pt``; ``sha256sum -c last.pt.sha256`` checks it by hand).
:func:`save_checkpoint` first adds the new digest to that file, then replaces the checkpoint,
then leaves only the new digest, so a kill at any moment leaves a checkpoint that matches one
of the listed digests (or, replacing a checkpoint of an older torchcal, one without the file):
:func:`torchcal._io.write_verified`, the one writer of every file torchcal verifies later.
:func:`load_checkpoint` hashes the bytes it loads (:func:`torchcal._io.read_verified`) and raises
:class:`~torchcal.errors.CheckpointError` when they match none (a flipped bit, an edited file);
a checkpoint without the file (written before torchcal checked checkpoints) loads with a
warning.  The fields a loader uses to build things (``epoch``, ``num_classes``,
``input_shape``, ``rng``) are checked too, each error naming its field.
"""

from __future__ import annotations

import io
import math
import numbers
import os
import pickle
import random
import re
import stat
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._io import file_kind, read_verified, write_verified
from .._io import remove_stale_temp_files as _remove_stale
from ..errors import CheckpointError
from ..run_dir import RunDir

__all__ = [
    "FORMAT",
    "MAX_CLASSES",
    "save_checkpoint",
    "load_checkpoint",
    "rng_state_tensors",
    "restore_rng_state",
    "remove_stale_run_temp_files",
]

FORMAT = "torchcal.checkpoint/1"
#: Largest ``num_classes`` a checkpoint may declare (ImageNet-21k has 21,841 classes).
MAX_CLASSES = 1_000_000
_MAX_SIDE = 1 << 16  # largest entry of ``input_shape``


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Serialise ``state`` with :func:`torch.save`, write it to ``path`` atomically and its
    SHA-256 to ``path + ".sha256"``."""
    path = Path(path)
    buf = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buf)
    return write_verified(path, buf.getvalue())


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` (``weights_only=True``).

    The file's SHA-256 is checked against ``path + ".sha256"`` (a checkpoint without that file,
    from an older torchcal, loads with a warning), then the fields used to rebuild a run are
    checked: ``epoch`` a non-negative integer, ``num_classes`` an integer in
    ``1..MAX_CLASSES`` matching the model's ``fc`` layer, ``input_shape`` 1 to 4 positive
    integers, ``rng`` the tensors of :func:`rng_state_tensors`.

    Raises:
        CheckpointError: the file is missing, truncated/corrupt, does not match its SHA-256,
            is not a torchcal checkpoint, or a field is invalid (the message names it).
    """
    path = Path(path)
    _check_is_file(path)
    data = read_verified(path, what="Checkpoint", error=CheckpointError)
    try:
        state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if _GLOBAL_RE.search(str(exc)):
            raise _refused_code(path, exc) from None
        raise CheckpointError(f"Checkpoint {str(path)!r} is corrupt or truncated "
                              f"(UnpicklingError: {_torch_reason(exc)[:200]})") from None
    except Exception as exc:  # RuntimeError/EOFError/zip errors
        msg = _torch_reason(exc)
        raise CheckpointError(
            f"Checkpoint {str(path)!r} is corrupt or truncated ({type(exc).__name__}: {msg[:200]})"
        ) from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"Checkpoint {str(path)!r} is not a torchcal checkpoint ({FORMAT})")
    for key in ("model", "epoch", "config"):
        if key not in state:
            raise CheckpointError(f"Checkpoint {str(path)!r} is incomplete: no {key!r} entry")
    _check_fields(state, path)
    return state


def _check_is_file(path: Path) -> None:
    """CheckpointError naming what ``path`` is when it is not a regular file: missing, a broken
    link, a FIFO, a directory, a device (also through a link, e.g. to ``/dev/zero``)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if path.is_symlink():
            raise CheckpointError(f"Checkpoint {str(path)!r} is a broken symbolic link (to "
                                  f"{os.readlink(path)!r})") from None
        raise CheckpointError(f"Checkpoint {str(path)!r} does not exist") from None
    except OSError as exc:
        raise CheckpointError(f"Checkpoint {str(path)!r} cannot be read: {exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        link = f" (through a symbolic link to {os.readlink(path)!r})" if path.is_symlink() else ""
        raise CheckpointError(f"Checkpoint {str(path)!r} is {file_kind(st)}{link}, not a "
                              "regular file: refused")


_GLOBAL_RE = re.compile(r"GLOBAL (\S+)")


def _torch_reason(exc: BaseException) -> str:
    """The line of a ``torch.load`` error that says what is wrong: not torch's paragraph about
    ``weights_only`` (whose advice to load the file unsafely torchcal never repeats)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    lines = [ln for ln in lines if "weights_only" not in ln and "Weights only" not in ln
             and not ln.startswith("Check the documentation")]
    return lines[0] if lines else type(exc).__name__


def _refused_code(path: Path, exc: BaseException) -> CheckpointError:
    """The refusal of a checkpoint holding pickled code (what torch's ``weights_only`` loader
    stopped at), without torch's advice to load it unsafely."""
    m = _GLOBAL_RE.search(str(exc))
    what = f" ({m.group(1)})" if m else ""
    return CheckpointError(f"Checkpoint {str(path)!r} holds Python code{what}, not only weights "
                           "and plain data: refused (torchcal never runs code from a "
                           "checkpoint); it was not written by torchcal, do not load it")


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _check_fields(state: dict[str, Any], path: Path) -> None:
    def bad(field: str, expected: str, value: Any) -> CheckpointError:
        text = repr(value)
        text = text if len(text) <= 80 else text[:77] + "..."
        return CheckpointError(f"Checkpoint {str(path)!r} has an invalid {field!r}: expected "
                               f"{expected}, got {text}")

    if not isinstance(state["model"], dict):
        raise bad("model", "a state dict", type(state["model"]).__name__)
    if not isinstance(state["config"], dict):
        raise bad("config", "a dict", type(state["config"]).__name__)
    if not _is_int(state["epoch"]) or state["epoch"] < 0:
        raise bad("epoch", "a non-negative integer", state["epoch"])
    total = state["config"].get("epochs")
    if _is_int(total) and state["epoch"] > total:  # a run never goes past its epochs
        raise bad("epoch", f"at most the config's {total} epochs", state["epoch"])
    if "num_classes" in state:
        k = state["num_classes"]
        if not _is_int(k) or not 1 <= k <= MAX_CLASSES:
            raise bad("num_classes", f"an integer in 1..{MAX_CLASSES}", k)
        w = state["model"].get("fc.weight")
        if isinstance(w, torch.Tensor) and w.ndim == 2 and w.shape[0] != k:
            raise bad("num_classes", f"{w.shape[0]}, the rows of the model's fc.weight", k)
    if "input_shape" in state:
        s = state["input_shape"]
        if (not isinstance(s, (list, tuple)) or not 1 <= len(s) <= 4
                or not all(_is_int(v) and 1 <= v <= _MAX_SIDE for v in s)):
            raise bad("input_shape", f"1 to 4 integers in 1..{_MAX_SIDE}", s)
    if state.get("rng") is not None:
        problem = _rng_problem(state["rng"])
        if problem:
            raise CheckpointError(f"Checkpoint {str(path)!r} has an invalid 'rng' (the RNG "
                                  f"states of rng_state_tensors()): {problem}")


def remove_stale_run_temp_files(run_dir: str | os.PathLike) -> list[Path]:
    """Remove the temporary files that a killed ``torchcal train`` / ``eval`` left in ``run_dir``.

    Only the temporary files of the run's own atomic writes are candidates (``config.json``,
    ``results.json``, ``log.jsonl``, ``checkpoints/*.pt`` and their ``.sha256``,
    ``logits/*.npz``, e.g. ``checkpoints/.last.pt.<pid>-<random>.tmp``), and only those whose
    writing process is gone (:func:`torchcal._io.remove_stale_temp_files`).
    """
    removed: list[Path] = []
    for directory, patterns in RunDir(run_dir).stale_temp_patterns():
        removed += _remove_stale(directory, patterns)
    return removed


# ------------------------------------------------------------------------------------------
# RNG states as tensors
# ------------------------------------------------------------------------------------------
def rng_state_tensors() -> dict[str, Any]:
    """The torch (CPU and CUDA), NumPy and Python ``random`` states, as tensors.

    >>> s = rng_state_tensors(); a = random.random(); restore_rng_state(s); a == random.random()
    True
    """
    kind, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002
    version, py_state, gauss_next = random.getstate()
    out: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.int64).copy()),
        "numpy_meta": torch.tensor([int(pos), int(has_gauss)], dtype=torch.int64),
        "numpy_cached": torch.tensor(float(cached), dtype=torch.float64),
        "python_state": torch.tensor(py_state, dtype=torch.int64),
        "python_version": torch.tensor(int(version), dtype=torch.int64),
        "python_gauss": torch.tensor(
            [0.0 if gauss_next is None else float(gauss_next), float(gauss_next is not None)],
            dtype=torch.float64,
        ),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = list(torch.cuda.get_rng_state_all())
    return out


_RNG_LAYOUT = {  # key -> (dtype, shape); "torch" has the size of this build's CPU generator state
    "numpy_keys": (torch.int64, (624,)), "numpy_meta": (torch.int64, (2,)),
    "numpy_cached": (torch.float64, ()), "python_state": (torch.int64, (625,)),
    "python_version": (torch.int64, ()), "python_gauss": (torch.float64, (2,)),
}


def _rng_problem(state: Any) -> str:
    """What is wrong with an RNG state dict of :func:`rng_state_tensors` ('' if nothing)."""
    if not isinstance(state, dict):
        return "not a dict"
    layout = {"torch": (torch.uint8, tuple(torch.get_rng_state().shape)), **_RNG_LAYOUT}
    for key, (dtype, shape) in layout.items():
        v = state.get(key)
        if not isinstance(v, torch.Tensor) or v.dtype != dtype or tuple(v.shape) != shape:
            got = (f"{v.dtype} {tuple(v.shape)}" if isinstance(v, torch.Tensor)
                   else type(v).__name__)
            return f"{key!r} must be a {dtype} tensor of shape {shape}, got {got}"
    keys, meta = state["numpy_keys"], state["numpy_meta"].tolist()
    if bool(((keys < 0) | (keys >= 1 << 32)).any()) or not 0 <= meta[0] <= 624 or meta[1] not in (0, 1):
        return "'numpy_keys'/'numpy_meta' out of range"
    py = state["python_state"]
    if (bool(((py[:624] < 0) | (py[:624] >= 1 << 32)).any()) or not 0 <= int(py[624]) <= 624
            or int(state["python_version"]) != 3):
        return "'python_state'/'python_version' out of range"
    g = state["python_gauss"].tolist()
    if g[1] not in (0.0, 1.0) or not math.isfinite(g[0]) or not math.isfinite(
            float(state["numpy_cached"])):
        return "'python_gauss'/'numpy_cached' not finite"
    return ""


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`rng_state_tensors`.

    Raises:
        CheckpointError: ``state`` is not such a dict (naming the entry), or a generator rejects
            its state; the global generators are then left as they were.
    """
    problem = _rng_problem(state)
    if problem:
        raise CheckpointError(f"Invalid RNG state 'rng': {problem}")
    saved = rng_state_tensors()
    try:
        _set_rng_state(state)
    except (RuntimeError, ValueError, TypeError, OverflowError) as exc:
        _set_rng_state(saved)
        raise CheckpointError(f"Invalid RNG state 'rng': {str(exc).splitlines()[0]}") from exc


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    keys = state["numpy_keys"].cpu().numpy().astype(np.uint32)
    pos, has_gauss = (int(v) for v in state["numpy_meta"].tolist())
    np.random.set_state(("MT19937", keys, pos, has_gauss, float(state["numpy_cached"])))  # noqa: NPY002
    g = state["python_gauss"].tolist()
    random.setstate((int(state["python_version"]), tuple(int(v) for v in state["python_state"].tolist()),
                     g[0] if g[1] else None))
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda_states])

"""Checkpoints: one dict, written atomically, loadable with ``torch.load(weights_only=True)``.

Layout (``RUN_DIR/checkpoints/last.pt`` and ``best.pt``)::

    {"format": "torchcal.checkpoint/1", "epoch": completed epochs, "config": TrainConfig dict,
     "model": state_dict, "optimizer": ..., "scheduler": ..., "loss": loss.state_dict(),
     "scaler": ... or None, "head": ... or None, "head_optimizer": ... or None,
     "best": {"metric": name, "value": float, "epoch": int}, "rng": rng_state_tensors(),
     "history": {...}}

``best.pt`` has the same layout for the epoch with the best validation metric, without the
optimiser, scheduler and scaler states (it is for evaluation, not for resuming).

Every RNG state is stored as tensors (the Python ``random`` and NumPy Mersenne-Twister states
converted), so the file holds only tensors and plain Python containers.
"""

from __future__ import annotations

import io
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._io import atomic_write_bytes
from ..errors import CheckpointError

__all__ = [
    "FORMAT",
    "save_checkpoint",
    "load_checkpoint",
    "rng_state_tensors",
    "restore_rng_state",
    "atomic_copy",
]

FORMAT = "torchcal.checkpoint/1"


def save_checkpoint(path: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Serialise ``state`` with :func:`torch.save` and write it to ``path`` atomically."""
    path = Path(path)
    buf = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buf)
    atomic_write_bytes(path, buf.getvalue())
    return path


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Copy ``src`` to ``dst`` atomically (temp file in ``dst``'s directory, fsync, replace)."""
    dst = Path(dst)
    atomic_write_bytes(dst, Path(src).read_bytes())
    return dst


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` (``weights_only=True``).

    Raises:
        CheckpointError: the file is missing, truncated/corrupt, or not a torchcal checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"Checkpoint {str(path)!r} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # RuntimeError/EOFError/UnpicklingError/zip errors
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"Checkpoint {str(path)!r} is corrupt or truncated ({type(exc).__name__}: {msg[:200]})"
        ) from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"Checkpoint {str(path)!r} is not a torchcal checkpoint ({FORMAT})")
    for key in ("model", "epoch", "config"):
        if key not in state:
            raise CheckpointError(f"Checkpoint {str(path)!r} is incomplete: no {key!r} entry")
    return state


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


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`rng_state_tensors`."""
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

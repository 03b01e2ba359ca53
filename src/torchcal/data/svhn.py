"""SVHN (official ``train_32x32.mat`` / ``test_32x32.mat``, cropped digits format), read with
:func:`scipy.io.loadmat`.  ``X`` is (32, 32, 3, N) uint8 and ``y`` (N, 1) with label 10 for the
digit 0 (mapped to 0 here).  torchcal uses the test set as an OOD set for CIFAR models."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ._base import ArrayDataset
from .download import data_lock, fetch_resource

__all__ = ["load_svhn"]


def load_svhn(root: str | os.PathLike, split: str = "test", *, download: bool = False,
              verify: bool = True) -> ArrayDataset:
    """The SVHN ``split`` ("train" or "test") from ``root`` (or ``root/svhn``).

    Returns:
        ArrayDataset of uint8 images (N, 3, 32, 32) and int64 labels 0..9.
    """
    if split not in ("train", "test"):
        raise ValueError(f"Expected `split` to be 'train' or 'test', got {split!r}")
    # deferred: scipy is slow to import: only when it is used (start-up time)
    from scipy.io import loadmat

    root = Path(root)
    name = f"{split}_32x32.mat"
    path = next((p for p in (root / name, root / "svhn" / name) if p.is_file()), None)
    if path is None or verify:
        base = path.parent if path is not None else root
        with data_lock(base, create=download):
            path = fetch_resource(f"svhn_{split}", base, download=download, verify=verify)
    mat = loadmat(path)
    if "X" not in mat or "y" not in mat:
        raise ValueError(f"Expected variables 'X' and 'y' in {path}, got {sorted(k for k in mat if not k.startswith('__'))}")
    x = np.asarray(mat["X"])
    y = np.asarray(mat["y"]).reshape(-1).astype(np.int64)
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.shape[3] != y.shape[0]:
        raise ValueError(f"Expected 'X' of shape (32, 32, 3, N) and N labels in {path}, got {x.shape} and {y.shape}")
    imgs = np.ascontiguousarray(x.astype(np.uint8).transpose(3, 2, 0, 1))
    return ArrayDataset(torch.from_numpy(imgs), torch.from_numpy(y % 10))

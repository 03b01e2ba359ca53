"""Containers shared by the data loaders: :class:`ArrayDataset`, :class:`DataSplits`, and the
papers' split rules."""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .._validation import check_scalar

__all__ = ["ArrayDataset", "DataSplits", "split_indices", "stratified_holdout",
           "check_fraction"]

#: Normalisation of CIFAR-10 and CIFAR-100 in the papers' code (REFERENCE §6).
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
#: Standard deviations of the CIFAR normalisation (with :data:`CIFAR_MEAN`).
CIFAR_STD = (0.2023, 0.1994, 0.2010)
#: ImageNet statistics (Tiny-ImageNet and ImageNet).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
#: Standard deviations of the ImageNet normalisation (with :data:`IMAGENET_MEAN`).
IMAGENET_STD = (0.229, 0.224, 0.225)


class ArrayDataset(Dataset):
    """A whole data set held in two tensors.

    Args:
        data: uint8 images of shape (N, C, H, W) or float32 features of shape (N, D).
        labels: int64 labels of shape (N,) (``-1`` for unlabelled OOD samples).

    ``ds[i]`` returns ``(data[i], labels[i])``; the trainer usually slices ``.data`` /
    ``.labels`` directly (whole batches, no per-sample Python).

    >>> ds = ArrayDataset(torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.arange(4))
    >>> len(ds), ds[1][1].item(), ds.data.dtype
    (4, 1, torch.uint8)
    """

    def __init__(self, data: Tensor | np.ndarray, labels: Tensor | np.ndarray) -> None:
        data = torch.as_tensor(data)
        labels = torch.as_tensor(labels)
        if data.dim() < 2:
            raise ValueError(f"Expected `data` of shape (N, ...), got {tuple(data.shape)}")
        if labels.dim() != 1 or labels.shape[0] != data.shape[0]:
            raise ValueError(
                f"Expected `labels` of shape ({data.shape[0]},), got {tuple(labels.shape)}"
            )
        if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
            raise ValueError(f"Expected integer `labels`, got {labels.dtype}")
        self.data = data
        self.labels = labels.to(torch.int64)

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def __getitem__(self, index):
        return self.data[index], self.labels[index]

    def subset(self, indices: Tensor | np.ndarray) -> ArrayDataset:
        """A new data set with the rows ``indices`` (copied)."""
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.int64)
        return ArrayDataset(self.data[idx], self.labels[idx])

    def __repr__(self) -> str:
        return f"ArrayDataset(data={tuple(self.data.shape)} {self.data.dtype}, n={len(self)})"


@dataclass
class DataSplits:
    """The three splits of a data set and what a trainer needs to know about them.

    Attributes:
        train, val, test: :class:`ArrayDataset` (or a torch ``Dataset`` for the ImageNet folders,
            whose items are already-transformed uint8 (3, 224, 224) images).
        num_classes: number of classes.
        input_shape: shape of one sample, e.g. ``(3, 32, 32)`` or ``(64,)``.
        mean, std: per-channel normalisation for :func:`torchcal.data.augment.normalize` of the
            uint8 images, or ``None`` when the data are already float features (digits).
        augment: whether the trainer applies :func:`torchcal.data.augment.random_crop_flip` to
            training batches.
        name: the data set's name.
        padding: zero padding of the random crop (4 on CIFAR).
        info: free-form facts about the splits (sizes, seeds, files used).
    """

    train: Any
    val: Any
    test: Any
    num_classes: int
    input_shape: tuple[int, ...]
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    augment: bool
    name: str
    padding: int = 4
    info: dict | None = None


def default_root(root: str | os.PathLike | None = None) -> Path:
    """``root``, else ``$TORCHCAL_DATA_ROOT``, else ``./data``."""
    if root is not None:
        return Path(root)
    return Path(os.environ.get("TORCHCAL_DATA_ROOT", "data"))


def check_fraction(val_fraction: float) -> float:
    """``val_fraction`` checked to be a float in (0, 1)."""
    return check_scalar(val_fraction, "val_fraction", float, min_val=0.0, max_val=1.0,
                        include_boundaries="neither", expected="in (0, 1)")


def split_indices(n: int, val_fraction: float = 0.1, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Train / validation indices as in the papers' code.

    ``np.random.seed(seed); np.random.shuffle(indices)`` on ``indices = range(n)`` (here with a
    private ``np.random.RandomState(seed)``, which gives the same permutation), then the first
    ``floor(val_fraction * n)`` shuffled indices are the validation set and the rest, in shuffled
    order, the training set.  With n = 50,000 and the defaults: 45,000 / 5,000.  At least one
    sample goes to each side (so tiny files work).

    Returns:
        (train_idx, val_idx), int64 arrays.

    >>> tr, va = split_indices(10, 0.2, seed=1)
    >>> va.tolist(), sorted(tr.tolist() + va.tolist()) == list(range(10))
    ([2, 9], True)
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 2:
        raise ValueError(f"Expected at least 2 training samples to split, got {n!r}")
    frac = check_fraction(val_fraction)
    perm = np.arange(n, dtype=np.int64)
    np.random.RandomState(seed).shuffle(perm)
    n_val = min(max(int(math.floor(frac * n)), 1), n - 1)
    return perm[n_val:], perm[:n_val]


def stratified_holdout(labels: np.ndarray, per_class: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Hold out ``per_class`` samples of every class (Tiny-ImageNet: 50 per class).

    A ``RandomState(seed)`` permutation of all indices, stably sorted by label; the first
    ``per_class`` of each class in that order are held out.  Vectorised (no per-sample loop).

    Returns:
        (kept_idx, held_idx), int64 arrays in increasing order.

    >>> kept, held = stratified_holdout(np.array([0, 0, 0, 1, 1, 1]), 1, seed=0)
    >>> len(held), sorted(np.array([0, 0, 0, 1, 1, 1])[held].tolist())
    (2, [0, 1])
    """
    labels = np.asarray(labels)
    check_scalar(per_class, "per_class", int, min_val=1)
    n = labels.shape[0]
    perm = np.random.RandomState(seed).permutation(n)
    order = perm[np.argsort(labels[perm], kind="stable")]
    sorted_labels = labels[order]
    first = np.searchsorted(sorted_labels, sorted_labels, side="left")
    rank = np.arange(n) - first
    counts = np.bincount(np.unique(sorted_labels, return_inverse=True)[1])
    if counts.min() <= per_class:
        raise ValueError(
            f"Expected more than `per_class`={per_class} samples in every class, "
            f"smallest class has {int(counts.min())}"
        )
    held = np.sort(order[rank < per_class])
    kept = np.sort(order[rank >= per_class])
    return kept.astype(np.int64), held.astype(np.int64)

"""The embedded benchmark: scikit-learn's 8x8 digits with fixed Gaussian pixel noise.

Always present (bundled with scikit-learn), small enough to train an MLP in seconds on a CPU,
and noisy enough that the network overfits and cross-entropy becomes over-confident, as on
CIFAR.  Construction for a ``seed``:

1. ``X = load_digits().data / 16`` (1,797 images, 64 pixels in [0, 1]), labels 0..9.
2. A stratified split of the images into train / validation / test (default 60/10/30), drawn
   with scikit-learn's ``train_test_split(stratify=...)`` and ``random_state=seed``.
3. Gaussian noise of std ``noise_std`` (default 0.5, no clipping) drawn once per image copy from
   ``np.random.default_rng([seed, 0])``, in the order train, validation, test: each training
   image gets one noisy copy; each validation / test image gets ``n_copies`` (default 5)
   independent noisy copies (the idea of CIFAR-10-C's Gaussian noise, and more evaluation samples
   for the calibration metrics).

The OOD set (:func:`load_digits_ood`): 8x8 patches of the two photographs bundled with
scikit-learn (``load_sample_images()``: a Chinese temple and a flower), converted to grey
(ITU-R 601 luma), downscaled 4x by block averaging (so a patch holds edges and texture at about
the scale of a digit's strokes), min-max scaled per patch to the digits' [0, 1] range, with the
same Gaussian noise.  Patch positions and noise come from ``np.random.default_rng([seed, 1])``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .._validation import check_scalar
from ._base import ArrayDataset, DataSplits

__all__ = ["load_digits_splits", "load_digits_ood", "check_seed"]


def check_seed(seed) -> int:
    """``seed`` checked to be a non-negative int."""
    return check_scalar(seed, "seed", int, min_val=0)


def _noisy(x: np.ndarray, copies: int, std: float, rng: np.random.Generator) -> np.ndarray:
    x = np.repeat(x, copies, axis=0)
    return (x + std * rng.standard_normal(x.shape)).astype(np.float32)


def load_digits_splits(seed: int = 0, noise_std: float = 0.5, n_copies: int = 5,
                       split: Sequence[float] = (0.6, 0.1, 0.3)) -> DataSplits:
    """Noisy digits, split for one seed (see the module docstring for the construction).

    Args:
        seed: seed of the split and the noise (each seed draws its own).
        noise_std: std of the Gaussian pixel noise on the [0, 1] scale.
        n_copies: noisy copies of each validation and test image (copies of one image are
            adjacent: rows ``k * n_copies ... (k + 1) * n_copies - 1``).
        split: train / validation / test fractions of the 1,797 images (sum 1).

    Returns:
        :class:`DataSplits` with float32 features (N, 64), ``mean = std = None``,
        ``augment = False``.  Sizes with the defaults: 1,077 train, 5 x 180 validation,
        5 x 540 test.

    >>> s = load_digits_splits(seed=0)
    >>> len(s.train), len(s.val), len(s.test), s.train.data.dtype, s.input_shape
    (1077, 900, 2700, torch.float32, (64,))
    """
    # deferred: scikit-learn is slow to import: only when the data set is built (start-up time)
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    seed = check_seed(seed)
    std = check_scalar(noise_std, "noise_std", float, min_val=0.0)
    n_copies = check_scalar(n_copies, "n_copies", int, min_val=1)
    fr = [float(f) for f in split] if isinstance(split, (list, tuple)) else []
    if len(fr) != 3 or any(not (0 < f < 1) for f in fr) or abs(sum(fr) - 1) > 1e-9:
        raise ValueError(f"Expected `split` to be three fractions in (0, 1) summing to 1, got {split!r}")
    x, y = load_digits(return_X_y=True)
    x = x.astype(np.float64) / 16.0
    idx = np.arange(len(y))
    trval, test = train_test_split(idx, test_size=fr[2], stratify=y, random_state=seed)
    train, val = train_test_split(trval, test_size=fr[1] / (fr[0] + fr[1]), stratify=y[trval],
                                  random_state=seed)
    rng = np.random.default_rng([seed, 0])
    parts = []
    for ids, copies in ((train, 1), (val, n_copies), (test, n_copies)):
        xs = _noisy(x[ids], copies, std, rng)
        ys = np.repeat(y[ids], copies).astype(np.int64)
        parts.append(ArrayDataset(torch.from_numpy(xs), torch.from_numpy(ys)))
    return DataSplits(
        train=parts[0], val=parts[1], test=parts[2], num_classes=10, input_shape=(64,),
        mean=None, std=None, augment=False, name="digits", padding=0,
        info={"seed": seed, "noise_std": std, "n_copies": n_copies, "split": tuple(fr),
              "images": {"train": len(train), "val": len(val), "test": len(test)}},
    )


def load_digits_ood(seed: int = 0, noise_std: float = 0.5, n: int = 1000,
                    downscale: int = 4) -> ArrayDataset:
    """The digits benchmark's out-of-distribution set: noisy 8x8 patches of natural photos.

    Args:
        seed: seed of the patch positions and the noise.
        noise_std: std of the Gaussian noise (the digits' default 0.5).
        n: number of patches.
        downscale: block-averaging factor applied to the photos before cutting patches.

    Returns:
        ArrayDataset of float32 features (n, 64) and labels -1.

    >>> ood = load_digits_ood(seed=0, n=5)
    >>> tuple(ood.data.shape), ood.labels.tolist()
    ((5, 64), [-1, -1, -1, -1, -1])
    """
    # deferred: scikit-learn is slow to import: only when the data set is built (start-up time)
    from sklearn.datasets import load_sample_images

    seed = check_seed(seed)
    std = check_scalar(noise_std, "noise_std", float, min_val=0.0)
    n = check_scalar(n, "n", int, min_val=1)
    downscale = check_scalar(downscale, "downscale", int, min_val=1)
    greys = []
    for img in load_sample_images().images:
        g = img[..., :3].astype(np.float64) @ np.array([0.299, 0.587, 0.114])
        h, w = (g.shape[0] // downscale) * downscale, (g.shape[1] // downscale) * downscale
        g = g[:h, :w].reshape(h // downscale, downscale, w // downscale, downscale).mean((1, 3))
        greys.append(g)
    rng = np.random.default_rng([seed, 1])
    which = rng.integers(0, len(greys), n)
    out = np.empty((n, 8, 8))
    for k, g in enumerate(greys):  # one vectorised gather per photo (two photos)
        sel = np.flatnonzero(which == k)
        r = rng.integers(0, g.shape[0] - 8 + 1, sel.size)
        c = rng.integers(0, g.shape[1] - 8 + 1, sel.size)
        rows = r[:, None, None] + np.arange(8)[None, :, None]
        cols = c[:, None, None] + np.arange(8)[None, None, :]
        out[sel] = g[rows, cols]
    flat = out.reshape(n, 64)
    lo, hi = flat.min(1, keepdims=True), flat.max(1, keepdims=True)
    flat = (flat - lo) / np.where(hi - lo > 1e-12, hi - lo, 1.0)
    xs = (flat + std * rng.standard_normal(flat.shape)).astype(np.float32)
    return ArrayDataset(torch.from_numpy(xs), torch.full((n,), -1, dtype=torch.int64))

"""The registrations of torchcal's own data sets and OOD sets (:mod:`torchcal.data.registry`):
for each, its loader, its declared options and its default OOD sets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._base import CIFAR_MEAN, CIFAR_STD, DataSplits, check_fraction, default_root, split_indices
from .cifar import load_cifar, load_cifar10c
from .digits import load_digits_ood, load_digits_splits
from .imagenet import load_imagenet_splits
from .mnist1d import load_mnist1d_ood, load_mnist1d_splits
from .mnist1d_params import load_mnist1d_param_splits
from .registry import DataOption, DataSet, OodDefault, OodSet, register_dataset, register_ood_set
from .svhn import load_svhn
from .tinyimagenet import load_tinyimagenet_splits

__all__: list[str] = []

_VERIFY = DataOption("verify", "check the MD5 of archives already present (default true)", bool)
_CACHE = DataOption("cache", "keep the decoded / generated set under the data root", bool)
#: MNIST-1D keywords that choose the generator's settings.
_MNIST1D_GENERATOR_KEYS = ("corr_noise_scale", "iid_noise_scale", "shear_scale")
#: MNIST-1D keywords that select :func:`load_mnist1d_param_splits` (signals with parameters).
_MNIST1D_PARAM_KEYS = ("classes", "with_params", *_MNIST1D_GENERATOR_KEYS)


def _positive(name: str, doc: str) -> DataOption:
    return DataOption(name, doc, int, min_val=1)


def _split_array(train, test, *, seed: int, val_fraction: float):
    tr_idx, va_idx = split_indices(len(train), val_fraction, seed)
    return train.subset(tr_idx), train.subset(va_idx), test


def _digits(root: Path | None, *, download: bool, seed: int, val_fraction: float,
            **opts: Any) -> DataSplits:
    """The ``digits`` splits, with ``split`` derived from ``val_fraction`` unless given."""
    if "split" not in opts:
        vf = check_fraction(val_fraction)
        if vf >= 0.7:
            raise ValueError(f"Expected `val_fraction` < 0.7 for digits (30% is the test split), got {val_fraction!r}")
        opts["split"] = (round(0.7 - vf, 12), vf, 0.3)
    return load_digits_splits(seed=seed, **opts)


def _mnist1d(root: Path | None, *, download: bool, seed: int, val_fraction: float,
             **opts: Any) -> DataSplits:
    root = default_root(root)
    if set(opts) & set(_MNIST1D_PARAM_KEYS):
        gen = {k: opts.pop(k) for k in _MNIST1D_GENERATOR_KEYS if k in opts}
        opts.pop("with_params", None)
        return load_mnist1d_param_splits(root, seed=seed, generator=gen, **opts)
    return load_mnist1d_splits(root, seed=seed, **opts)


def _cifar(name: str):
    def load(root: Path | None, *, download: bool, seed: int, val_fraction: float,
             **opts: Any) -> DataSplits:
        root = default_root(root)
        train, test, classes = load_cifar(name, root, download=download, **opts)
        tr, va, te = _split_array(train, test, seed=seed, val_fraction=val_fraction)
        return DataSplits(tr, va, te, 10 if name == "cifar10" else 100, (3, 32, 32), CIFAR_MEAN,
                          CIFAR_STD, True, name, 4,
                          {"root": str(root), "seed": seed, "classes": classes})
    return load


def _svhn(root: Path | None, *, download: bool, seed: int, val_fraction: float,
          **opts: Any) -> DataSplits:
    root = default_root(root)
    train = load_svhn(root, "train", download=download, **opts)
    test = load_svhn(root, "test", download=download, **opts)
    tr, va, te = _split_array(train, test, seed=seed, val_fraction=val_fraction)
    return DataSplits(tr, va, te, 10, (3, 32, 32), CIFAR_MEAN, CIFAR_STD, False, "svhn", 0,
                      {"root": str(root), "seed": seed})


def _tinyimagenet(root: Path | None, *, download: bool, seed: int, val_fraction: float,
                  **opts: Any) -> DataSplits:
    return load_tinyimagenet_splits(default_root(root), download=download, seed=seed, **opts)


def _imagenet(root: Path | None, *, download: bool, seed: int, val_fraction: float,
              **opts: Any) -> DataSplits:
    return load_imagenet_splits(default_root(root), seed=seed, val_fraction=val_fraction, **opts)


_NOISE = DataOption("noise_std", "std of the Gaussian pixel noise (default 0.5)", float, min_val=0.0)
_SVHN_OOD = OodDefault("svhn")
register_dataset(DataSet(
    "cifar10", _cifar("cifar10"), (_VERIFY,),
    (_SVHN_OOD, OodDefault("cifar10c", {"corruption": "gaussian_noise", "severity": 5})),
    "CIFAR-10 (download)"))
register_dataset(DataSet("cifar100", _cifar("cifar100"), (_VERIFY,), (_SVHN_OOD,),
                         "CIFAR-100 (download)"))
register_dataset(DataSet(
    "digits", _digits,
    (_NOISE, _positive("n_copies", "noisy copies of each validation/test image (default 5)"),
     DataOption("split", "train/validation/test fractions, e.g. [0.6, 0.1, 0.3]")),
    (OodDefault("digits_ood", seeded=True, shared=("noise_std",)),),
    "scikit-learn's 8x8 digits with pixel noise (embedded)"))
register_dataset(DataSet("imagenet", _imagenet, (
    _positive("image_size", "crop size (default 224)"),
    _positive("resize_size", "resize before the centre crop (default 256)")),
    summary="ImageNet class folders (root/train, root/val)"))
register_dataset(DataSet("mnist1d", _mnist1d, (
    _positive("n_train", "training signals (default 2,000)"),
    _positive("n_val", "validation signals (default 2,000)"),
    _positive("n_test", "test signals (default 8,000)"), _CACHE,
    DataOption("classes", "a class subset, e.g. \"0-4\""),
    DataOption("with_params", "return each signal's generator parameters", bool),
    *(DataOption(k, "generator setting of a shifted set", float, min_val=0.0)
      for k in _MNIST1D_GENERATOR_KEYS)),
    (OodDefault("mnist1d_shuffled"),), "MNIST-1D (generated, cached)"))
register_dataset(DataSet("svhn", _svhn, (_VERIFY,), summary="SVHN (download)"))
register_dataset(DataSet("tinyimagenet", _tinyimagenet, (
    _VERIFY, _positive("per_class", "validation images held out per class (default 50)"), _CACHE),
    summary="Tiny-ImageNet (download)"))


def _svhn_ood(root: Path | None, *, download: bool, seed: int, **opts: Any):
    keep = bool(opts.pop("keep_labels", False))
    ds = load_svhn(default_root(root), "test", download=download, **opts)
    if not keep:
        ds.labels.fill_(-1)
    return ds


register_ood_set(OodSet(
    "cifar10c", lambda root, *, download, seed, **o: load_cifar10c(
        default_root(root), download=download, **o),
    (DataOption("corruption", "the corruption (default gaussian_noise)", str),
     DataOption("severity", "1 to 5 (default 5)"), _VERIFY), "CIFAR-10-C (download)"))
register_ood_set(OodSet(
    "digits_ood", lambda root, *, download, seed, **o: load_digits_ood(seed=seed, **o),
    (_NOISE, _positive("n", "patches (default 1,000)"),
     _positive("downscale", "downscaling of the photographs (default 4)")),
    "noisy 8x8 natural-photo patches"))
register_ood_set(OodSet(
    "mnist1d_shuffled", lambda root, *, download, seed, **o: load_mnist1d_ood(
        default_root(root), seed=seed, **o),
    (_positive("n", "signals (default 1,000)"), _CACHE), "MNIST-1D, positions permuted"))
register_ood_set(OodSet("svhn", _svhn_ood, (_VERIFY, DataOption(
    "keep_labels", "keep the digit labels (default: -1)", bool)), "the SVHN test set"))

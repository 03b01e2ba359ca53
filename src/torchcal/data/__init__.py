"""torchcal.data: the papers' data sets, splits, batched augmentation, verified downloads.

* :func:`load_splits` - train / validation / test of ``"cifar10"``, ``"cifar100"``,
  ``"tinyimagenet"``, ``"svhn"``, ``"imagenet"`` (class folders) and ``"digits"`` (embedded).
* :func:`load_ood` - OOD sets: ``"svhn"`` (test set), ``"cifar10c"`` (a corruption at a
  severity), ``"digits_ood"`` (noisy natural-photo patches for the digits benchmark).
* :mod:`torchcal.data.augment` - :func:`random_crop_flip`, :func:`normalize` (batched, on device).
* :mod:`torchcal.data.download` - :func:`download_url`, :func:`extract_archive`, published MD5s.
* :mod:`torchcal.data.fake` - writers of tiny files in the official formats (for tests / demos).
* :func:`prepare` - download (verified) and extract a data set without loading it; the
  ``torchcal data list | check | download`` commands (:mod:`torchcal.cli.data`).

Images are kept as uint8 (N, C, H, W) tensors in :class:`ArrayDataset`; the trainer augments and
normalises whole batches on the device with ``splits.mean`` / ``splits.std``.  The data root is
``root``, else the environment variable ``TORCHCAL_DATA_ROOT``, else ``./data``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ._base import (
    CIFAR_MEAN,
    CIFAR_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    ArrayDataset,
    DataSplits,
    split_indices,
    stratified_holdout,
)
from .augment import normalize, random_crop_flip
from .digits import load_digits_ood, load_digits_splits
from .download import RESOURCES, download_url, extract_archive, md5sum
from .prepare import prepare

__all__ = [
    "ArrayDataset",
    "DataSplits",
    "load_splits",
    "load_ood",
    "list_datasets",
    "list_ood_sets",
    "default_ood_sets",
    "default_root",
    "split_indices",
    "stratified_holdout",
    "random_crop_flip",
    "normalize",
    "load_digits_splits",
    "load_digits_ood",
    "download_url",
    "extract_archive",
    "md5sum",
    "prepare",
    "RESOURCES",
    "CIFAR_MEAN",
    "CIFAR_STD",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
]

_DATASETS = ("cifar10", "cifar100", "digits", "imagenet", "svhn", "tinyimagenet")
_OOD = ("cifar10c", "digits_ood", "svhn")
_DEFAULT_OOD = {"cifar10": ("svhn", "cifar10c"), "cifar100": ("svhn",), "digits": ("digits_ood",)}


def list_datasets() -> list[str]:
    """Names accepted by :func:`load_splits`.

    >>> list_datasets()
    ['cifar10', 'cifar100', 'digits', 'imagenet', 'svhn', 'tinyimagenet']
    """
    return list(_DATASETS)


def list_ood_sets() -> list[str]:
    """Names accepted by :func:`load_ood`.

    >>> list_ood_sets()
    ['cifar10c', 'digits_ood', 'svhn']
    """
    return list(_OOD)


def default_ood_sets(name: str) -> tuple[str, ...]:
    """The papers' OOD sets for an in-distribution data set (empty when there are none).

    >>> default_ood_sets("cifar10"), default_ood_sets("tinyimagenet")
    (('svhn', 'cifar10c'), ())
    """
    return _DEFAULT_OOD.get(name, ())


def default_root(root: str | os.PathLike | None = None) -> Path:
    """``root``, else ``$TORCHCAL_DATA_ROOT``, else ``./data``."""
    if root is not None:
        return Path(root)
    return Path(os.environ.get("TORCHCAL_DATA_ROOT", "data"))


def _split_array(train, test, *, seed: int, val_fraction: float):
    tr_idx, va_idx = split_indices(len(train), val_fraction, seed)
    return train.subset(tr_idx), train.subset(va_idx), test


def load_splits(name: str, root: str | os.PathLike | None = None, *, download: bool = False,
                seed: int = 1, val_fraction: float = 0.1, **kw) -> DataSplits:
    """Train / validation / test splits of a data set, as in the papers.

    * ``cifar10`` / ``cifar100``: the official training set shuffled with NumPy seed ``seed``
      (default 1, as the papers); the first ``floor(val_fraction * N)`` (5,000 of 50,000) are
      validation, the rest training; the official test set is the test split.
      Normalisation mean (0.4914, 0.4822, 0.4465), std (0.2023, 0.1994, 0.2010) for both;
      ``augment=True`` (random crop 32 with padding 4, horizontal flip).
    * ``svhn``: the same rule on ``train_32x32.mat``; ``test_32x32.mat`` is the test split;
      CIFAR normalisation; ``augment=False`` (a horizontal flip changes what a digit is).
    * ``tinyimagenet``: ``per_class`` (default 50) images of every class of the official
      training set held out for validation (seeded); the official validation set is the test
      split.  ImageNet normalisation, ``augment=True`` (padding 4 crop of the 64x64 images, flip).
    * ``imagenet``: lazy class-folder data sets (``root/train/<class>/*``, ``root/val/<class>/*``);
      validation is a seeded ``val_fraction`` of ``train`` (with the evaluation transform), test
      is ``val``.  Items are uint8 (3, 224, 224), transforms done by the data set.
    * ``digits``: :func:`load_digits_splits` with ``seed`` (its split and noise),
      ``split=(1 - 0.3 - val_fraction, val_fraction, 0.3)`` unless ``split`` is given, and the
      keywords ``noise_std``, ``n_copies``; ``root`` and ``download`` are not used.

    Args:
        name: a name of :func:`list_datasets`.
        root: data root (see :func:`default_root`).
        download: download missing official files (verified against the published MD5).
        seed: seed of the train / validation split (the papers: 1).
        val_fraction: share of the training set held out for validation.
        **kw: per data set: ``verify`` (check the MD5 of files already present, default True),
            ``per_class`` and ``cache`` (Tiny-ImageNet), ``noise_std`` / ``n_copies`` / ``split``
            (digits), ``image_size`` / ``resize_size`` (ImageNet).

    Raises:
        ValueError: unknown ``name`` (lists the valid ones) or unknown keyword.
        DataNotFoundError: files absent and not downloadable (the message says what to put where).
        ChecksumError: a present or downloaded archive does not match its published MD5.

    >>> s = load_splits("digits", seed=0)
    >>> s.name, s.num_classes, len(s.val) // 5
    ('digits', 10, 180)
    """
    if name not in _DATASETS:
        raise ValueError(f"Unknown data set {name!r}; expected one of: {', '.join(_DATASETS)}")

    def take(*allowed: str) -> dict:
        extra = sorted(set(kw) - set(allowed))
        if extra:
            raise ValueError(f"Unexpected keyword(s) for data set {name!r}: {', '.join(extra)}; "
                             f"accepted: {', '.join(allowed) or 'none'}")
        return dict(kw)

    if name == "digits":
        opts = take("noise_std", "n_copies", "split")
        if "split" not in opts:
            from ._base import _check_fraction

            vf = _check_fraction(val_fraction)
            if vf >= 0.7:
                raise ValueError(f"Expected `val_fraction` < 0.7 for digits (30% is the test split), got {val_fraction!r}")
            opts["split"] = (round(0.7 - vf, 12), vf, 0.3)
        return load_digits_splits(seed=seed, **opts)

    root = default_root(root)
    if name in ("cifar10", "cifar100"):
        from .cifar import load_cifar

        opts = take("verify")
        train, test, classes = load_cifar(name, root, download=download, **opts)
        tr, va, te = _split_array(train, test, seed=seed, val_fraction=val_fraction)
        return DataSplits(tr, va, te, 10 if name == "cifar10" else 100, (3, 32, 32), CIFAR_MEAN,
                          CIFAR_STD, True, name, 4,
                          {"root": str(root), "seed": seed, "classes": classes})
    if name == "svhn":
        from .svhn import load_svhn

        opts = take("verify")
        train = load_svhn(root, "train", download=download, **opts)
        test = load_svhn(root, "test", download=download, **opts)
        tr, va, te = _split_array(train, test, seed=seed, val_fraction=val_fraction)
        return DataSplits(tr, va, te, 10, (3, 32, 32), CIFAR_MEAN, CIFAR_STD, False, name, 0,
                          {"root": str(root), "seed": seed})
    if name == "tinyimagenet":
        from .tinyimagenet import load_tinyimagenet_splits

        opts = take("verify", "per_class", "cache")
        return load_tinyimagenet_splits(root, download=download, seed=seed, **opts)
    # imagenet
    from .imagenet import load_imagenet_splits

    opts = take("image_size", "resize_size")
    return load_imagenet_splits(root, seed=seed, val_fraction=val_fraction, **opts)


def load_ood(name: str, root: str | os.PathLike | None = None, *, download: bool = False,
             seed: int = 0, **kw) -> ArrayDataset:
    """An out-of-distribution evaluation set.

    * ``svhn``: the SVHN test set (26,032 images), labels set to -1 unless ``keep_labels=True``.
    * ``cifar10c``: CIFAR-10-C ``corruption`` (default ``"gaussian_noise"``) at ``severity``
      (default 5), the papers' shifted-distribution set; labels are the true CIFAR-10 labels.
    * ``digits_ood``: :func:`load_digits_ood` (noisy 8x8 natural-photo patches, labels -1) with
      ``seed`` and the keywords ``noise_std``, ``n``.

    ``seed`` is used by ``digits_ood`` only (accepted by all so callers can pass it uniformly).

    >>> load_ood("digits_ood", seed=0, n=3).data.shape
    torch.Size([3, 64])
    """
    if name not in _OOD:
        raise ValueError(f"Unknown OOD set {name!r}; expected one of: {', '.join(_OOD)}")

    def take(*allowed: str) -> dict:
        extra = sorted(set(kw) - set(allowed))
        if extra:
            raise ValueError(f"Unexpected keyword(s) for OOD set {name!r}: {', '.join(extra)}; "
                             f"accepted: {', '.join(allowed)}")
        return dict(kw)

    if name == "digits_ood":
        return load_digits_ood(seed=seed, **take("noise_std", "n", "downscale"))
    root = default_root(root)
    if name == "svhn":
        from .svhn import load_svhn

        opts = take("verify", "keep_labels")
        keep = bool(opts.pop("keep_labels", False))
        ds = load_svhn(root, "test", download=download, **opts)
        if not keep:
            ds.labels.fill_(-1)
        return ds
    from .cifar import load_cifar10c

    return load_cifar10c(root, download=download, **take("corruption", "severity", "verify"))

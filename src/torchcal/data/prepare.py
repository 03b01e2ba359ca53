"""Make a data root ready without loading anything: download (verified) and extract the
official files of a data set, or report what is present."""

from __future__ import annotations

import os
from pathlib import Path

from .._registry import unknown_name
from .download import RESOURCES, data_lock, extract_archive, fetch_resource

__all__ = ["PREPARABLE", "prepare", "status"]

#: data set -> (resource keys, files that must exist afterwards, relative to the root)
PREPARABLE: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "cifar10": (("cifar10",), ("cifar-10-batches-py/data_batch_1", "cifar-10-batches-py/test_batch")),
    "cifar100": (("cifar100",), ("cifar-100-python/train", "cifar-100-python/test")),
    "svhn": (("svhn_train", "svhn_test"), ("train_32x32.mat", "test_32x32.mat")),
    "tinyimagenet": (("tinyimagenet",), ("tiny-imagenet-200/wnids.txt",
                                         "tiny-imagenet-200/val/val_annotations.txt")),
    "cifar10c": (("cifar10c",), ("CIFAR-10-C/gaussian_noise.npy", "CIFAR-10-C/labels.npy")),
}

_ARCHIVES = {"cifar10", "cifar100", "tinyimagenet", "cifar10c"}


def _check(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if name not in PREPARABLE:
        raise ValueError(unknown_name("data set", name, PREPARABLE) + " (the data sets to prepare)")
    return PREPARABLE[name]


def status(name: str, root: str | os.PathLike) -> dict:
    """What of ``name`` is in ``root``: ``{"ready": bool, "missing": [...], "archives": {file:
    present}}`` (no checksum computed)."""
    keys, needed = _check(name)
    root = Path(root)
    missing = [f for f in needed if not (root / f).is_file()]
    archives = {RESOURCES[k].filename: (root / RESOURCES[k].filename).is_file() for k in keys}
    return {"ready": not missing, "missing": missing, "archives": archives}


def prepare(name: str, root: str | os.PathLike, *, download: bool = True, verify: bool = True,
            progress: bool = True) -> Path:
    """Fetch (MD5-verified) and extract the official files of ``name`` into ``root``.

    Nothing is done for files already in place.  Safe to run from several processes at once
    (the data root is locked).  Returns ``root``.

    Raises:
        DataNotFoundError: absent and ``download`` is false, or the download failed.
        ChecksumError: an archive does not match its published MD5.
    """
    keys, needed = _check(name)
    root = Path(root)
    if all((root / f).is_file() for f in needed):
        return root
    with data_lock(root, create=download):
        for key in keys:
            path = fetch_resource(key, root, download=download, verify=verify, progress=progress)
            if key in _ARCHIVES and not all((root / f).is_file() for f in needed):
                extract_archive(path, root)
    return root

"""Tiny-ImageNet-200 from the official ``tiny-imagenet-200.zip`` layout.

* ``tiny-imagenet-200/wnids.txt``: the 200 WordNet ids (class index = position in the *sorted*
  list, as a class-folder loader on ``train/`` assigns them);
* ``train/<wnid>/images/<wnid>_<i>.JPEG``: 500 training images per class;
* ``val/images/val_<j>.JPEG`` with ``val/val_annotations.txt`` (tab-separated: file name, wnid,
  bounding box): 50 per class, used as the test split (the test set has no labels).

All images are 64x64 JPEGs, some grey-scale (converted to RGB).  Decoded once into a uint8
(N, 3, 64, 64) tensor; with ``cache=True`` the decoded arrays are saved next to the data
(``torchcal-cache.npz``, written atomically) so later runs skip the JPEG decoding.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._io import atomic_writer
from ..errors import DataNotFoundError
from ._base import IMAGENET_MEAN, IMAGENET_STD, ArrayDataset, DataSplits, stratified_holdout
from .download import data_lock, extract_archive, fetch_resource

__all__ = ["load_tinyimagenet", "load_tinyimagenet_splits"]

_FOLDER = "tiny-imagenet-200"
_CACHE = "torchcal-cache.npz"


def _find_folder(root: Path, download: bool, verify: bool) -> Path:
    folder = root / _FOLDER

    def ok() -> bool:
        return (folder / "wnids.txt").is_file() and (folder / "val" / "val_annotations.txt").is_file()

    if ok():
        return folder
    with data_lock(root, create=download):
        if not ok():
            archive = fetch_resource("tinyimagenet", root, download=download, verify=verify,
                                     expected=f"its extracted folder {_FOLDER}/")
            extract_archive(archive, root)
    if not ok():
        raise DataNotFoundError(f"{root / 'tiny-imagenet-200.zip'} did not contain {_FOLDER}/wnids.txt "
                                "and val/val_annotations.txt")
    return folder


def _decode(paths: list[Path]) -> np.ndarray:
    # deferred: Pillow: only when images are decoded (start-up time)
    from PIL import Image

    out = np.empty((len(paths), 64, 64, 3), dtype=np.uint8)
    for i, p in enumerate(paths):  # JPEG decoding is per file by nature
        with Image.open(p) as im:
            im = im.convert("RGB")
            if im.size != (64, 64):
                raise ValueError(f"Expected a 64x64 image, got {im.size} in {p}")
            out[i] = np.asarray(im)
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2))


def load_tinyimagenet(root: str | os.PathLike, *, download: bool = False, verify: bool = True,
                      cache: bool = False) -> tuple[ArrayDataset, ArrayDataset, list[str]]:
    """The official Tiny-ImageNet training set and validation set (the latter used as test).

    Returns:
        (train, val, wnids): uint8 images (N, 3, 64, 64), int64 labels indexing ``wnids``
        (sorted).
    """
    folder = _find_folder(Path(root), download, verify)
    wnids = sorted({w.strip() for w in (folder / "wnids.txt").read_text().split() if w.strip()})
    index = {w: i for i, w in enumerate(wnids)}
    train_paths: list[Path] = []
    train_labels: list[int] = []
    for w in wnids:
        files = sorted((folder / "train" / w / "images").glob("*.JPEG"))
        if not files:
            raise DataNotFoundError(f"No training images in {folder / 'train' / w / 'images'}")
        train_paths += files
        train_labels += [index[w]] * len(files)
    val_paths: list[Path] = []
    val_labels: list[int] = []
    for line in (folder / "val" / "val_annotations.txt").read_text().splitlines():
        parts = line.split("\t")
        if len(parts) < 2:
            continue
        if parts[1] not in index:
            raise ValueError(f"Unknown wnid {parts[1]!r} in val_annotations.txt")
        val_paths.append(folder / "val" / "images" / parts[0])
        val_labels.append(index[parts[1]])
    ytr = np.asarray(train_labels, dtype=np.int64)
    yva = np.asarray(val_labels, dtype=np.int64)
    cache_path = folder / _CACHE
    xtr = xva = None
    if cache and cache_path.is_file():
        xtr, xva = _read_cache(cache_path, ytr, yva)
    if xtr is None:
        xtr, xva = _decode(train_paths), _decode(val_paths)
        if cache:
            with atomic_writer(cache_path) as f:
                np.savez(f, train_x=xtr, train_y=ytr, val_x=xva, val_y=yva)
    return (ArrayDataset(torch.from_numpy(np.asarray(xtr)), torch.from_numpy(ytr)),
            ArrayDataset(torch.from_numpy(np.asarray(xva)), torch.from_numpy(yva)), wnids)


def _read_cache(path: Path, ytr: np.ndarray, yva: np.ndarray) -> tuple[Any, Any]:
    """The cached ``(train_x, val_x)`` if the cache is readable and holds these labels, else
    ``(None, None)``; ANY unreadable cache (truncated, bit flips) is stale: warn, decode again."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if z["train_y"].shape == ytr.shape and np.array_equal(z["train_y"], ytr) \
                    and np.array_equal(z["val_y"], yva):
                return z["train_x"], z["val_x"]
    except Exception as exc:  # noqa: BLE001 - BadZipFile, EOFError, zlib.error, KeyError, ...
        warnings.warn(f"Tiny-ImageNet cache {str(path)!r} unreadable ({type(exc).__name__}: "
                      f"{str(exc)[:200]}); decoding the images again", stacklevel=3)
    return None, None


def load_tinyimagenet_splits(root: str | os.PathLike, *, download: bool = False, seed: int = 1,
                             per_class: int = 50, verify: bool = True,
                             cache: bool = False) -> DataSplits:
    """Tiny-ImageNet splits as in the papers: ``per_class`` (50) training images of every class
    held out for validation (seeded, :func:`stratified_holdout`), the rest for training, the
    official validation set as test.  ImageNet normalisation; ``augment=True``."""
    train, test, wnids = load_tinyimagenet(root, download=download, verify=verify, cache=cache)
    kept, held = stratified_holdout(train.labels.numpy(), per_class, seed)
    return DataSplits(train.subset(kept), train.subset(held), test, len(wnids), (3, 64, 64),
                      IMAGENET_MEAN, IMAGENET_STD, True, "tinyimagenet", 4,
                      {"root": str(root), "seed": seed, "per_class": per_class, "wnids": wnids})

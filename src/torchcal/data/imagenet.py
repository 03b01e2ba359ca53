"""ImageNet in the usual class-folder layout, loaded lazily (``root/train/<wnid>/*.JPEG``,
``root/val/<wnid>/*.JPEG``), with the standard transforms written with Pillow and tensors (no
torchvision):

* training: random-resized crop (area scale U(0.08, 1), log-uniform aspect ratio in
  [3/4, 4/3], 10 attempts then a centre crop, as Inception / torchvision) to 224x224 (bilinear),
  then a horizontal flip with probability 1/2;
* evaluation: resize the shorter side to 256 (bilinear), centre crop 224x224.

Items are ``(uint8 tensor (3, 224, 224), int64 label)``; normalisation (ImageNet mean / std)
is done by the trainer on the device, as for the in-memory data sets.  Random numbers come
from torch's global generator (DataLoader seeds each worker), so runs are reproducible under
``torch.manual_seed``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DataNotFoundError
from ._base import IMAGENET_MEAN, IMAGENET_STD, DataSplits, split_indices

__all__ = ["ImageFolderDataset", "load_imagenet_splits", "random_resized_crop_box",
           "center_crop_box"]

_EXTENSIONS = (".jpeg", ".jpg", ".png")


def random_resized_crop_box(width: int, height: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                            generator: torch.Generator | None = None) -> tuple[int, int, int, int]:
    """A random crop box ``(left, top, right, bottom)`` of the Inception-style random-resized
    crop: area ``U(scale) * W * H``, aspect ``exp(U(log ratio))``; 10 attempts, then the
    largest centred box with an aspect inside ``ratio``."""
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        u = torch.rand(2, generator=generator).tolist()
        target = area * (scale[0] + (scale[1] - scale[0]) * u[0])
        aspect = math.exp(log_lo + (log_hi - log_lo) * u[1])
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def center_crop_box(width: int, height: int, size: int) -> tuple[int, int, int, int]:
    """The centred ``size`` x ``size`` box (torchvision's rounding).

    >>> center_crop_box(256, 341, 224)
    (16, 58, 240, 282)
    """
    top = int(round((height - size) / 2.0))
    left = int(round((width - size) / 2.0))
    return left, top, left + size, top + size


class ImageFolderDataset(Dataset):
    """Images in ``root/<class>/<file>`` with the ImageNet training or evaluation transform.

    Args:
        root: folder with one sub-folder per class (classes are the sorted folder names, unless
            ``classes`` is given).
        train: use the training transform (random-resized crop + flip) instead of the
            evaluation one (resize + centre crop).
        image_size: output side (224).
        resize_size: shorter side before the evaluation centre crop (256).
        classes: class names (fixes the label order, e.g. the training set's for ``val``).
        samples: explicit ``(path, label)`` list (used for train/validation subsets).
    """

    def __init__(self, root: str | os.PathLike, *, train: bool, image_size: int = 224,
                 resize_size: int = 256, classes: list[str] | None = None,
                 samples: list[tuple[str, int]] | None = None) -> None:
        self.root = Path(root)
        self.train = bool(train)
        self.image_size = int(image_size)
        self.resize_size = int(resize_size)
        if classes is None:
            if not self.root.is_dir():
                raise DataNotFoundError(f"Image folder {self.root} does not exist")
            classes = sorted(p.name for p in self.root.iterdir() if p.is_dir())
        self.classes = list(classes)
        if samples is None:
            samples = []
            for i, c in enumerate(self.classes):
                d = self.root / c
                if d.is_dir():
                    samples += [(str(p), i) for p in sorted(d.iterdir())
                                if p.suffix.lower() in _EXTENSIONS]
        if not samples:
            raise DataNotFoundError(f"No images ({', '.join(_EXTENSIONS)}) found in the class folders of {self.root}")
        self.samples = samples
        self.labels = torch.tensor([s[1] for s in samples], dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.samples)

    def with_samples(self, indices, *, train: bool) -> ImageFolderDataset:
        """The subset ``indices`` with the training or evaluation transform."""
        return ImageFolderDataset(self.root, train=train, image_size=self.image_size,
                                  resize_size=self.resize_size, classes=self.classes,
                                  samples=[self.samples[int(i)] for i in indices])

    def load(self, index: int):
        """The transformed PIL image of item ``index``."""
        # deferred: Pillow: only when images are decoded (start-up time)
        from PIL import Image

        path, _ = self.samples[index]
        with Image.open(path) as im:
            im = im.convert("RGB")
            s = self.image_size
            if self.train:
                box = random_resized_crop_box(*im.size)
                out = im.resize((s, s), Image.BILINEAR, box=box)
                if torch.rand(1).item() < 0.5:
                    out = out.transpose(Image.FLIP_LEFT_RIGHT)
            else:
                w, h = im.size
                r = self.resize_size
                nw, nh = (r, int(r * h / w)) if w <= h else (int(r * w / h), r)
                out = im.resize((nw, nh), Image.BILINEAR).crop(center_crop_box(nw, nh, s))
        return out

    def __getitem__(self, index: int):
        arr = np.asarray(self.load(index), dtype=np.uint8)
        return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous(), self.labels[index]


def load_imagenet_splits(root: str | os.PathLike, *, seed: int = 1, val_fraction: float = 0.1,
                         image_size: int = 224, resize_size: int = 256) -> DataSplits:
    """ImageNet splits from class folders: ``val_fraction`` of ``root/train`` (seeded,
    :func:`split_indices`) is the validation split (evaluation transform), the rest the training
    split, and ``root/val`` the test split.  ``augment=False``: the data set itself augments."""
    root = Path(root)
    if not (root / "train").is_dir() or not (root / "val").is_dir():
        raise DataNotFoundError(
            f"ImageNet not found: put the class folders of the ILSVRC-2012 training and validation "
            f"images (from https://image-net.org/download.php; the validation images sorted into "
            f"one folder per wnid) in {root.resolve()}/train/<wnid>/ and {root.resolve()}/val/<wnid>/"
        )
    full = ImageFolderDataset(root / "train", train=True, image_size=image_size,
                              resize_size=resize_size)
    tr_idx, va_idx = split_indices(len(full), val_fraction, seed)
    test = ImageFolderDataset(root / "val", train=False, image_size=image_size,
                              resize_size=resize_size, classes=full.classes)
    return DataSplits(full.with_samples(tr_idx, train=True), full.with_samples(va_idx, train=False),
                      test, len(full.classes), (3, image_size, image_size), IMAGENET_MEAN,
                      IMAGENET_STD, False, "imagenet", 0,
                      {"root": str(root), "seed": seed, "classes": full.classes})

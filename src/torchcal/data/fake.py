"""Tiny data sets in the official file formats, for tests, examples and offline trials.

Each writer produces exactly the layout the real download has (the same archive names, folder
names, pickle keys, ``.mat`` variables, ``.npy`` shapes, JPEG files), only with few images.  The
images are learnable: class ``k`` has its own mean colour plus noise, so a small net trained for
a couple of epochs beats chance.  The archives do not match the published MD5s, so load them with
``verify=False`` (or write the extracted folders with ``archive=False``).

>>> import tempfile
>>> from torchcal.data import load_splits
>>> with tempfile.TemporaryDirectory() as d:
...     _ = write_fake_cifar(d, "cifar10", n_train=50, n_test=10, archive=False)
...     s = load_splits("cifar10", d)
...     (len(s.train), len(s.val), len(s.test), tuple(s.train.data.shape[1:]))
(45, 5, 10, (3, 32, 32))
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile
import zipfile
from pathlib import Path

import numpy as np

__all__ = [
    "fake_images",
    "write_fake_cifar",
    "write_fake_svhn",
    "write_fake_cifar10c",
    "write_fake_tinyimagenet",
    "write_fake_imagenet_folder",
]


def fake_images(labels: np.ndarray, size: int | tuple[int, int] = 32, seed: int = 0,
                num_classes: int | None = None) -> np.ndarray:
    """uint8 images (N, H, W, 3): a per-class mean colour plus Gaussian noise (std 40)."""
    labels = np.asarray(labels)
    h, w = (size, size) if isinstance(size, int) else size
    k = int(num_classes or (labels.max() + 1 if labels.size else 1))
    rng = np.random.default_rng(seed)
    colours = np.random.default_rng(12345).uniform(40, 215, (max(k, 1), 3))
    x = colours[labels][:, None, None, :] + rng.normal(0, 40, (labels.size, h, w, 3))
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def _pickle_bytes(obj) -> bytes:
    return pickle.dumps(obj, protocol=2)


def write_fake_cifar(root: str | os.PathLike, name: str = "cifar10", n_train: int = 100,
                     n_test: int = 20, seed: int = 0, archive: bool = True) -> Path:
    """Write a tiny CIFAR-10 / CIFAR-100 in the official python layout.

    ``archive=True``: ``root/cifar-10-python.tar.gz`` (``cifar-100-python.tar.gz``) holding the
    ``cifar-10-batches-py`` (``cifar-100-python``) folder; else that folder itself.  The training
    images are spread over the 5 ``data_batch_*`` files (CIFAR-10).  Labels cycle through the
    classes.  Returns the archive or folder path.
    """
    if name not in ("cifar10", "cifar100"):
        raise ValueError(f"Expected `name` to be 'cifar10' or 'cifar100', got {name!r}")
    k = 10 if name == "cifar10" else 100
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {}

    def batch(labels: np.ndarray, s: int, label_key: bytes, extra: dict | None = None) -> bytes:
        x = fake_images(labels, 32, s, k).transpose(0, 3, 1, 2).reshape(len(labels), 3072)
        d = {b"batch_label": b"fake batch", b"data": np.ascontiguousarray(x),
             label_key: [int(v) for v in labels], b"filenames": [b"x.png"] * len(labels)}
        d.update(extra or {})
        return _pickle_bytes(d)

    ytr = np.arange(n_train) % k
    yte = np.arange(n_test) % k
    if name == "cifar10":
        folder = "cifar-10-batches-py"
        for i, part in enumerate(np.array_split(np.arange(n_train), 5)):
            files[f"data_batch_{i + 1}"] = batch(ytr[part], seed + i, b"labels")
        files["test_batch"] = batch(yte, seed + 10, b"labels")
        files["batches.meta"] = _pickle_bytes(
            {b"label_names": [f"class{i}".encode() for i in range(k)], b"num_vis": 3072})
        arc = "cifar-10-python.tar.gz"
    else:
        folder = "cifar-100-python"
        files["train"] = batch(ytr, seed, b"fine_labels", {b"coarse_labels": [int(v) // 5 for v in ytr]})
        files["test"] = batch(yte, seed + 10, b"fine_labels", {b"coarse_labels": [int(v) // 5 for v in yte]})
        files["meta"] = _pickle_bytes({b"fine_label_names": [f"class{i}".encode() for i in range(k)],
                                       b"coarse_label_names": [f"super{i}".encode() for i in range(20)]})
        arc = "cifar-100-python.tar.gz"
    if not archive:
        (root / folder).mkdir(exist_ok=True)
        for fname, data in files.items():
            (root / folder / fname).write_bytes(data)
        return root / folder
    path = root / arc
    with tarfile.open(path, "w:gz") as tf:
        d = tarfile.TarInfo(folder)
        d.type = tarfile.DIRTYPE
        d.mode = 0o755
        tf.addfile(d)
        for fname, data in files.items():
            info = tarfile.TarInfo(f"{folder}/{fname}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def write_fake_svhn(root: str | os.PathLike, split: str = "test", n: int = 30, seed: int = 0) -> Path:
    """Write ``root/<split>_32x32.mat`` with ``X`` (32, 32, 3, n) uint8 and ``y`` (n, 1) in
    1..10 (10 is the digit 0), as the official files."""
    # deferred: scipy is slow to import: only when it is used (start-up time)
    from scipy.io import savemat

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    digits = np.arange(n) % 10
    x = fake_images(digits, 32, seed, 10).transpose(1, 2, 3, 0)
    y = np.where(digits == 0, 10, digits).astype(np.uint8).reshape(n, 1)
    path = root / f"{split}_32x32.mat"
    savemat(path, {"X": x, "y": y})
    return path


def write_fake_cifar10c(root: str | os.PathLike, corruptions=("gaussian_noise",), n: int = 20,
                        seed: int = 0) -> Path:
    """Write ``root/CIFAR-10-C/<corruption>.npy`` of shape (5n, 32, 32, 3) uint8 (severity s in
    rows ``(s-1)n .. sn-1``, brighter with s so the blocks differ) and ``labels.npy`` (5n,)."""
    folder = Path(root) / "CIFAR-10-C"
    folder.mkdir(parents=True, exist_ok=True)
    labels = np.tile(np.arange(n) % 10, 5)
    for j, c in enumerate(corruptions):
        x = fake_images(labels, 32, seed + j, 10).astype(np.int64)
        sev = np.repeat(np.arange(5), n)[:, None, None, None]
        np.save(folder / f"{c}.npy", np.clip(x + 10 * sev, 0, 255).astype(np.uint8))
    np.save(folder / "labels.npy", labels.astype(np.uint8))
    return folder


def _jpeg(img: np.ndarray) -> bytes:
    # deferred: Pillow: only when images are decoded (start-up time)
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def write_fake_tinyimagenet(root: str | os.PathLike, n_classes: int = 3, n_train: int = 8,
                            n_val: int = 2, seed: int = 0, archive: bool = True) -> Path:
    """Write a tiny ``tiny-imagenet-200.zip`` in the official layout.

    ``tiny-imagenet-200/wnids.txt``, ``words.txt``, ``train/<wnid>/<wnid>_boxes.txt`` and
    ``train/<wnid>/images/<wnid>_<i>.JPEG``, ``val/images/val_<j>.JPEG`` with
    ``val/val_annotations.txt`` (tab-separated: file, wnid, box), ``test/images/test_<j>.JPEG``.
    64x64 RGB JPEGs (one grey-scale image per class, as the real set has some).  ``n_train`` /
    ``n_val`` are per class.  Returns the zip (or, with ``archive=False``, the folder) path.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    wnids = [f"n{10000000 + 7 * i:08d}" for i in range(n_classes)]
    base = "tiny-imagenet-200"
    files: dict[str, bytes] = {
        f"{base}/wnids.txt": "".join(f"{w}\n" for w in wnids[::-1]).encode(),  # not sorted, as the real file
        f"{base}/words.txt": "".join(f"{w}\tthing {i}\n" for i, w in enumerate(wnids)).encode(),
    }
    for c, w in enumerate(wnids):
        imgs = fake_images(np.full(n_train, c), 64, seed + c, n_classes)
        boxes = []
        for i in range(n_train):
            img = imgs[i]
            if i == 0:  # a grey-scale JPEG
                # deferred: Pillow: only when images are decoded (start-up time)
                from PIL import Image

                buf = io.BytesIO()
                Image.fromarray(img).convert("L").save(buf, format="JPEG")
                data = buf.getvalue()
            else:
                data = _jpeg(img)
            files[f"{base}/train/{w}/images/{w}_{i}.JPEG"] = data
            boxes.append(f"{w}_{i}.JPEG\t0\t0\t63\t63\n")
        files[f"{base}/train/{w}/{w}_boxes.txt"] = "".join(boxes).encode()
    val_labels = np.repeat(np.arange(n_classes), n_val)
    perm = np.random.default_rng(seed).permutation(val_labels.size)
    val_labels = val_labels[perm]
    vimgs = fake_images(val_labels, 64, seed + 99, n_classes)
    ann = []
    for j, c in enumerate(val_labels):
        files[f"{base}/val/images/val_{j}.JPEG"] = _jpeg(vimgs[j])
        ann.append(f"val_{j}.JPEG\t{wnids[c]}\t0\t0\t63\t63\n")
    files[f"{base}/val/val_annotations.txt"] = "".join(ann).encode()
    files[f"{base}/test/images/test_0.JPEG"] = _jpeg(vimgs[0])
    if not archive:
        for name, data in files.items():
            p = root / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        return root / base
    path = root / "tiny-imagenet-200.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def write_fake_imagenet_folder(root: str | os.PathLike, n_classes: int = 2, n_train: int = 4,
                               n_val: int = 2, size: tuple[int, int] = (48, 40), seed: int = 0) -> Path:
    """Write ``root/train/<wnid>/*.JPEG`` and ``root/val/<wnid>/*.JPEG`` (the usual ImageNet
    class-folder layout) with ``size`` = (H, W) RGB JPEGs.  Returns ``root``."""
    root = Path(root)
    wnids = [f"n{20000000 + i:08d}" for i in range(n_classes)]
    for split, n in (("train", n_train), ("val", n_val)):
        for c, w in enumerate(wnids):
            d = root / split / w
            d.mkdir(parents=True, exist_ok=True)
            imgs = fake_images(np.full(n, c), size, seed + c + (100 if split == "val" else 0), n_classes)
            for i in range(n):
                (d / f"{w}_{i}.JPEG").write_bytes(_jpeg(imgs[i]))
    return root

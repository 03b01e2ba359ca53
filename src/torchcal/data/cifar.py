"""CIFAR-10, CIFAR-100 (official python-pickle tarballs) and CIFAR-10-C (official ``.npy``).

Layouts read (as published):

* ``cifar-10-python.tar.gz`` -> ``cifar-10-batches-py/data_batch_1..5`` and ``test_batch``:
  pickled dicts with ``data`` (10000, 3072) uint8 (row-major 3x32x32, RGB planes) and
  ``labels`` (list of ints); ``batches.meta`` with ``label_names``.
* ``cifar-100-python.tar.gz`` -> ``cifar-100-python/train`` and ``test`` with ``data``,
  ``fine_labels`` (and ``coarse_labels``); ``meta`` with ``fine_label_names``.
* ``CIFAR-10-C.tar`` -> ``CIFAR-10-C/<corruption>.npy`` of shape (50000, 32, 32, 3) uint8: the
  10,000 test images at severity 1, then 2, ..., 5; and ``CIFAR-10-C/labels.npy``.

The pickles are read with a restricted unpickler that only admits what the CIFAR files contain
(NumPy arrays, dicts, lists, strings): a tampered file cannot run code.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import numpy as np
import torch

from ..errors import DataNotFoundError, RefusedPickleError
from ._base import ArrayDataset
from .download import RESOURCES, data_lock, extract_archive, fetch_resource

__all__ = ["load_cifar", "load_cifar10c", "CIFAR10C_CORRUPTIONS", "read_cifar_pickle"]

CIFAR10C_CORRUPTIONS = (
    "brightness", "contrast", "defocus_blur", "elastic_transform", "fog", "frost",
    "gaussian_blur", "gaussian_noise", "glass_blur", "impulse_noise", "jpeg_compression",
    "motion_blur", "pixelate", "saturate", "shot_noise", "snow", "spatter", "speckle_noise",
    "zoom_blur",
)

_LAYOUT = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
                "labels", "batches.meta", "label_names"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "fine_labels", "meta",
                 "fine_label_names"),
}

_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise RefusedPickleError(f"it asks for {module}.{name}")
        if module.startswith("numpy.core"):
            module = "numpy._core" + module[len("numpy.core"):]
            try:
                __import__(module)
            except ImportError:  # NumPy < 2
                module = "numpy.core" + module[len("numpy._core"):]
        return super().find_class(module, name)


def read_cifar_pickle(path: str | os.PathLike) -> dict:
    """Load one CIFAR pickle (Python 2 or 3 protocol) safely; keys returned as ``str``.

    Raises:
        ValueError: one line naming the file when it is truncated or corrupt, or when it asks
            for anything but the NumPy arrays, dicts, lists and strings of the official files
            (a tampered pickle: refused, nothing of it is run).
    """
    again = (f"delete {os.fspath(Path(path).parent)} and extract the official archive again "
             "(or pass --download)")
    try:
        with open(path, "rb") as f:
            obj = _SafeUnpickler(io.BufferedReader(f), encoding="latin1").load()
    except RefusedPickleError as exc:
        raise ValueError(f"CIFAR file {os.fspath(path)!r} refused: {exc}, which the official "
                         f"files never contain (a tampered file?); {again}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, UnicodeDecodeError, MemoryError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else "unexpected end"
        raise ValueError(f"CIFAR file {os.fspath(path)!r} is truncated or corrupt "
                         f"({type(exc).__name__}: {msg[:120]}); {again}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"Expected a dict in CIFAR pickle {path}, got {type(obj).__name__}")
    return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}


def _read_batches(folder: Path, names: list[str], label_key: str) -> tuple[np.ndarray, np.ndarray]:
    datas, labels = [], []
    for name in names:
        d = read_cifar_pickle(folder / name)
        if "data" not in d or label_key not in d:
            raise ValueError(f"Expected keys 'data' and {label_key!r} in {folder / name}, got {sorted(d)}")
        x = np.asarray(d["data"], dtype=np.uint8)
        if x.ndim != 2 or x.shape[1] != 3072:
            raise ValueError(f"Expected 'data' of shape (N, 3072) in {folder / name}, got {x.shape}")
        y = np.asarray(d[label_key], dtype=np.int64)
        if y.shape != (x.shape[0],):
            raise ValueError(f"Expected {x.shape[0]} labels in {folder / name}, got {y.shape}")
        datas.append(x.reshape(-1, 3, 32, 32))
        labels.append(y)
    return np.concatenate(datas), np.concatenate(labels)


def load_cifar(name: str, root: str | os.PathLike, *, download: bool = False,
               verify: bool = True) -> tuple[ArrayDataset, ArrayDataset, list[str]]:
    """The official CIFAR-10 / CIFAR-100 training and test sets.

    Looks for the extracted folder (``cifar-10-batches-py`` / ``cifar-100-python``) in ``root``;
    else extracts the official tarball found in ``root`` (MD5-verified unless ``verify=False``);
    else downloads it when ``download``; else raises :class:`DataNotFoundError`.

    Returns:
        (train, test, class_names); images uint8 (N, 3, 32, 32), labels int64.
    """
    if name not in _LAYOUT:
        raise ValueError(f"Expected `name` to be 'cifar10' or 'cifar100', got {name!r}")
    folder_name, train_names, test_names, label_key, meta_name, names_key = _LAYOUT[name]
    root = Path(root)
    folder = root / folder_name
    needed = train_names + test_names
    if not all((folder / n).is_file() for n in needed):
        with data_lock(root, create=download):
            if not all((folder / n).is_file() for n in needed):  # another process may have won
                archive = fetch_resource(name, root, download=download, verify=verify,
                                         expected=f"its extracted folder {folder_name}/")
                extract_archive(archive, root)
        missing = [n for n in needed if not (folder / n).is_file()]
        if missing:
            raise DataNotFoundError(
                f"{root / RESOURCES[name].filename} did not contain {folder_name}/{missing[0]}: not the official "
                f"{RESOURCES[name].description} archive"
            )
    xtr, ytr = _read_batches(folder, train_names, label_key)
    xte, yte = _read_batches(folder, test_names, label_key)
    classes: list[str] = []
    if (folder / meta_name).is_file():
        meta = read_cifar_pickle(folder / meta_name)
        classes = [c.decode() if isinstance(c, bytes) else str(c) for c in meta.get(names_key, [])]
    return (ArrayDataset(torch.from_numpy(xtr), torch.from_numpy(ytr)),
            ArrayDataset(torch.from_numpy(xte), torch.from_numpy(yte)), classes)


def load_cifar10c(root: str | os.PathLike, corruption: str = "gaussian_noise", severity: int = 5,
                  *, download: bool = False, verify: bool = True) -> ArrayDataset:
    """One corruption at one severity of CIFAR-10-C (Hendrycks & Dietterich 2019).

    Reads ``root/CIFAR-10-C/<corruption>.npy`` (memory-mapped; only the requested severity's
    block of N/5 rows is copied) and ``labels.npy``.  The ``.npy`` files may also be directly in
    ``root``.  Absent: extracts ``CIFAR-10-C.tar`` from ``root`` or downloads it.

    Returns:
        ArrayDataset with uint8 images (N/5, 3, 32, 32) and their true CIFAR-10 labels.
    """
    if corruption not in CIFAR10C_CORRUPTIONS:
        raise ValueError(f"Unknown CIFAR-10-C `corruption` {corruption!r}; expected one of: "
                         f"{', '.join(CIFAR10C_CORRUPTIONS)}")
    if isinstance(severity, bool) or not isinstance(severity, int) or not 1 <= severity <= 5:
        raise ValueError(f"Expected `severity` to be an integer in 1..5, got {severity!r}")
    root = Path(root)
    folder = next((f for f in (root / "CIFAR-10-C", root) if (f / f"{corruption}.npy").is_file()
                   and (f / "labels.npy").is_file()), None)
    if folder is None:
        folder = root / "CIFAR-10-C"
        with data_lock(root, create=download):
            if not (folder / f"{corruption}.npy").is_file():
                archive = fetch_resource(
                    "cifar10c", root, download=download, verify=verify,
                    expected=f"the extracted CIFAR-10-C/{corruption}.npy and CIFAR-10-C/labels.npy",
                )
                extract_archive(archive, root)
        if not (folder / f"{corruption}.npy").is_file() or not (folder / "labels.npy").is_file():
            raise DataNotFoundError(
                f"{root / RESOURCES['cifar10c'].filename} did not contain CIFAR-10-C/{corruption}.npy "
                "and CIFAR-10-C/labels.npy")
    x = np.load(folder / f"{corruption}.npy", mmap_mode="r", allow_pickle=False)
    y = np.load(folder / "labels.npy", mmap_mode="r", allow_pickle=False)
    if x.ndim != 4 or x.shape[1:] != (32, 32, 3) or x.shape[0] % 5 != 0:
        raise ValueError(f"Expected {corruption}.npy of shape (5*N, 32, 32, 3), got {x.shape}")
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"Expected labels.npy with {x.shape[0]} labels, got {y.shape}")
    n = x.shape[0] // 5
    block = slice((severity - 1) * n, severity * n)
    imgs = np.ascontiguousarray(np.asarray(x[block], dtype=np.uint8).transpose(0, 3, 1, 2))
    return ArrayDataset(torch.from_numpy(imgs), torch.from_numpy(np.asarray(y[block], dtype=np.int64)))

"""MNIST-1D (Greydanus & Kobak, "Scaling down deep learning with MNIST-1D", ICML 2024), generated
locally with the ``mnist1d`` package's own generator: no download, cached as ``.npz``.

Construction for sizes ``(n_train, n_val, n_test)`` and a ``seed``:

1. ``args = mnist1d.data.get_dataset_args()`` with only two fields changed:
   ``args.num_samples = 10 * ceil(N / 10)`` (``N = n_train + n_val + n_test``; the generator
   draws ``num_samples // 10`` signals per class) and ``args.seed = seed``.  Every other field
   keeps the package's default (40-sample signals, template length 12, padding [36, 60],
   translation 48, correlated noise 0.25, iid noise 0.02, shear 0.75, no sequence shuffle).
2. ``d = mnist1d.data.make_dataset(args)``; its 80/20 split is undone (``x`` then ``x_test``,
   which is the generator's shuffled order) and the first ``N`` signals are kept.  The generator
   standardises the whole set (mean 0, std 1 over all values).
3. Rows ``[0, n_train)`` are the training set, the next ``n_val`` the validation set, the last
   ``n_test`` the test set.  With ``(3600, 400, 1000)`` and seed 42 the training and validation
   sets are exactly the package's default ``x`` and the test set its ``x_test`` (the paper's
   4,000 / 1,000 split).

The generator seeds NumPy's and Python's global random generators (``mnist1d.utils.set_seed``);
the caller's states of both are restored afterwards, so loading the data does not change any
other random stream.

Generation takes about 1 ms per signal, so each generated set is cached under the data root as
``mnist1d/mnist1d[_shuffled]_n{num_samples}_seed{seed}_v{version}.npz`` (float32 ``x``, int64
``y``, the generator's arguments as JSON, and the SHA-256 of the three), written atomically.  A
cached file whose hash, arguments or format do not match is regenerated (with a warning).

The OOD set (:func:`load_mnist1d_ood`) is the package's own "shuffle" variant
(``shuffle_seq=True``: one fixed random permutation of the 40 positions for every signal, as in
the paper's "MNIST-1D (shuffle)" row): the same values and the same marginal statistics as the
in-distribution signals, with the spatial structure a CNN relies on destroyed.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import warnings
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from .._io import atomic_write_bytes
from .._validation import check_positive_int
from ._base import ArrayDataset, DataSplits, default_root
from .digits import check_seed

__all__ = ["load_mnist1d_splits", "load_mnist1d_ood", "generate_mnist1d", "mnist1d_cache_path",
           "MNIST1D_SIZES", "MNIST1D_SEED"]

#: Default (train, validation, test) sizes of :func:`load_mnist1d_splits`: a training set small
#: enough that the 1-D CNN overfits it (cross-entropy over-confident), a test set large enough
#: for an ECE noise floor below 1%.  Chosen by measuring cross-entropy alone
#: (``benchmarks/results/mnist1d_ce_sizing.md``).
MNIST1D_SIZES = (2000, 2000, 8000)
#: The package's default generator seed (``get_dataset_args().seed``).
MNIST1D_SEED = 42
_NUM_CLASSES = 10
_LENGTH = 40  # get_dataset_args().final_seq_length
_FORMAT = 1  # cache file layout version


def _check_seed(seed) -> int:
    seed = check_seed(seed)
    if seed >= 2**32:  # np.random.seed's range
        raise ValueError(f"Expected `seed` to be below 2**32, got {seed!r}")
    return seed


def _version() -> str:
    return metadata.version("mnist1d")


def _resolve_root(root: str | os.PathLike | None) -> Path:
    return default_root(root)


def mnist1d_cache_path(num_samples: int, seed: int, root: str | os.PathLike | None = None, *,
                       shuffle_seq: bool = False) -> Path:
    """Where :func:`generate_mnist1d` caches the set of ``num_samples`` signals for ``seed``.

    The file name holds everything that determines the data: the sample count, the seed, the
    sequence shuffle and the ``mnist1d`` version (whose ``get_dataset_args()`` gives the rest).

    >>> mnist1d_cache_path(50, 0, "/tmp/d").parent.as_posix()
    '/tmp/d/mnist1d'
    """
    tag = "mnist1d_shuffled" if shuffle_seq else "mnist1d"
    name = f"{tag}_n{num_samples}_seed{seed}_v{_version()}.npz"
    return _resolve_root(root) / "mnist1d" / name


def _digest(x: np.ndarray, y: np.ndarray, args_json: str) -> str:
    h = hashlib.sha256()
    for part in (np.ascontiguousarray(x, dtype="<f4"), np.ascontiguousarray(y, dtype="<i8")):
        h.update(str(part.shape).encode())
        h.update(part.tobytes())
    h.update(args_json.encode("utf-8"))
    return h.hexdigest()


def _make(num_samples: int, seed: int, shuffle_seq: bool) -> tuple[np.ndarray, np.ndarray, str]:
    """Run the package's generator; restore NumPy's and Python's global RNG states afterwards."""
    # imported here: ``mnist1d`` imports matplotlib.pyplot and scipy.interpolate (about 2 s),
    # needed only on a cache miss
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = num_samples
    args.seed = seed
    if shuffle_seq:
        args.shuffle_seq = True
    py_state, np_state = random.getstate(), np.random.get_state()  # noqa: NPY002
    try:
        d = make_dataset(args)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)  # noqa: NPY002
    x = np.concatenate([d["x"], d["x_test"]]).astype(np.float32)
    y = np.concatenate([d["y"], d["y_test"]]).astype(np.int64)
    record = {k: v for k, v in vars(args).items() if k != "url"}
    record["mnist1d_version"] = _version()
    return x, y, json.dumps(record, sort_keys=True)


def _read_cache(path: Path, num_samples: int, seed: int, shuffle_seq: bool):
    """``(x, y)`` from a valid cache file, else ``None`` (with a warning when it is corrupt:
    whatever the exception, an unreadable cache is regenerated, never fatal)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            x, y = z["x"], z["y"]
            args_json, digest = str(z["args"]), str(z["sha256"])
            fmt = int(z["format"])
        args = json.loads(args_json)
        ok = (fmt == _FORMAT and args.get("num_samples") == num_samples and args.get("seed") == seed
              and bool(args.get("shuffle_seq")) == shuffle_seq
              and args.get("mnist1d_version") == _version()
              and x.dtype == np.float32 and y.dtype == np.int64
              and _digest(x, y, args_json) == digest)
    except Exception as exc:  # noqa: BLE001 - ANY unreadable cache is stale (BadZipFile,
        # EOFError, zlib.error, ... from a bit flip or a truncation): warn and regenerate
        warnings.warn(f"MNIST-1D cache {str(path)!r} unreadable ({type(exc).__name__}: "
                      f"{str(exc)[:200]}); regenerating", stacklevel=3)
        return None
    if not ok:
        warnings.warn(f"MNIST-1D cache {str(path)!r} does not match its content hash or "
                      "arguments; regenerating", stacklevel=3)
        return None
    return x, y


def generate_mnist1d(num_samples: int, seed: int = MNIST1D_SEED,
                     root: str | os.PathLike | None = None, *, shuffle_seq: bool = False,
                     cache: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The ``mnist1d`` generator's data set of ``num_samples`` signals for ``seed``, cached.

    ``mnist1d.data.make_dataset(args)`` with ``args = get_dataset_args()`` except
    ``num_samples``, ``seed`` (and ``shuffle_seq`` when asked); the package's train/test split is
    undone (``x`` then ``x_test``).  NumPy's and Python's global RNG states are restored after
    generation.

    Args:
        num_samples: number of signals, a positive multiple of 10 (the generator draws
            ``num_samples // 10`` per class).
        seed: the generator's seed.
        root: data root (see :func:`torchcal.data.default_root`); the cache is
            :func:`mnist1d_cache_path`.
        shuffle_seq: the package's "shuffle" variant (one fixed permutation of the positions).
        cache: read and write the cache; ``False`` always generates and writes nothing.

    Returns:
        ``(x, y)``: float32 (num_samples, 40) signals and int64 (num_samples,) labels 0..9.

    >>> import tempfile
    >>> x, y = generate_mnist1d(20, seed=0, root=tempfile.mkdtemp())
    >>> x.shape, x.dtype, sorted(np.bincount(y).tolist())
    ((20, 40), dtype('float32'), [2, 2, 2, 2, 2, 2, 2, 2, 2, 2])
    """
    num_samples = check_positive_int(num_samples, "num_samples")
    if num_samples % _NUM_CLASSES:
        raise ValueError(f"Expected `num_samples` to be a multiple of {_NUM_CLASSES}, got {num_samples}")
    seed = _check_seed(seed)
    shuffle_seq = bool(shuffle_seq)
    path = mnist1d_cache_path(num_samples, seed, root, shuffle_seq=shuffle_seq) if cache else None
    if path is not None:
        hit = _read_cache(path, num_samples, seed, shuffle_seq)
        if hit is not None:
            return hit
    x, y, args_json = _make(num_samples, seed, shuffle_seq)
    if path is not None:
        buf = io.BytesIO()
        np.savez(buf, x=x, y=y, args=np.array(args_json), sha256=np.array(_digest(x, y, args_json)),
                 format=np.array(_FORMAT))
        atomic_write_bytes(path, buf.getvalue())
    return x, y


def load_mnist1d_splits(root: str | os.PathLike | None = None, seed: int = MNIST1D_SEED,
                        n_train: int = MNIST1D_SIZES[0], n_val: int = MNIST1D_SIZES[1],
                        n_test: int = MNIST1D_SIZES[2], cache: bool = True) -> DataSplits:
    """MNIST-1D train / validation / test sets (see the module docstring for the construction).

    Args:
        root: data root holding the cache (see :func:`torchcal.data.default_root`).
        seed: the generator's seed (default 42, the package's).
        n_train: training set size (default ``MNIST1D_SIZES[0]``).
        n_val: validation set size (default ``MNIST1D_SIZES[1]``).
        n_test: test set size (default ``MNIST1D_SIZES[2]``).
        cache: read / write the ``.npz`` cache (see :func:`generate_mnist1d`).

    Returns:
        :class:`DataSplits` of float32 signals (N, 40), ``mean = std = None`` (the generator
        already standardised them), ``augment = False``.

    >>> import tempfile
    >>> s = load_mnist1d_splits(tempfile.mkdtemp(), seed=0, n_train=30, n_val=10, n_test=15)
    >>> len(s.train), len(s.val), len(s.test), s.input_shape, s.train.data.dtype
    (30, 10, 15, (40,), torch.float32)
    """
    sizes = [check_positive_int(v, k) for k, v in (("n_train", n_train), ("n_val", n_val),
                                                   ("n_test", n_test))]
    total = sum(sizes)
    num_samples = _NUM_CLASSES * math.ceil(total / _NUM_CLASSES)
    x, y = generate_mnist1d(num_samples, seed, root, cache=cache)
    x, y = torch.from_numpy(x[:total]), torch.from_numpy(y[:total])
    a, b = sizes[0], sizes[0] + sizes[1]
    parts = [ArrayDataset(x[i:j], y[i:j]) for i, j in ((0, a), (a, b), (b, total))]
    return DataSplits(
        train=parts[0], val=parts[1], test=parts[2], num_classes=_NUM_CLASSES,
        input_shape=(_LENGTH,), mean=None, std=None, augment=False, name="mnist1d", padding=0,
        info={"seed": seed, "num_samples": num_samples, "mnist1d_version": _version(),
              "sizes": {"train": sizes[0], "val": sizes[1], "test": sizes[2]}},
    )


def load_mnist1d_ood(root: str | os.PathLike | None = None, seed: int = 0, n: int = 1000,
                     cache: bool = True) -> ArrayDataset:
    """MNIST-1D's "shuffle" variant as an OOD set: ``n`` signals, labels -1.

    The package's generator with ``shuffle_seq=True`` (one fixed random permutation of the 40
    positions, drawn from ``seed``), ``ceil(n / 10) * 10`` signals of which the first ``n``.

    >>> import tempfile
    >>> ood = load_mnist1d_ood(tempfile.mkdtemp(), n=5)
    >>> tuple(ood.data.shape), ood.labels.tolist()
    ((5, 40), [-1, -1, -1, -1, -1])
    """
    n = check_positive_int(n, "n")
    x, _ = generate_mnist1d(_NUM_CLASSES * math.ceil(n / _NUM_CLASSES), seed, root,
                            shuffle_seq=True, cache=cache)
    return ArrayDataset(torch.from_numpy(x[:n]), torch.full((n,), -1, dtype=torch.int64))

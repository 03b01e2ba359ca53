"""MNIST-1D with each signal's generator parameters: torchcal's own copy of the ``mnist1d``
package's transform chain that records what it draws.

The package (``mnist1d.data.make_dataset``, ``mnist1d.transform.transform``) turns each of the
ten 12-sample digit templates into a 40-sample signal by, in this order (``args`` the
generator's settings, every random number from NumPy's global generator seeded with
``args.seed``; Python's ``random`` is seeded too but never drawn from):

1. **pad**: ``p = padding[0] + int(rand() * (padding[1] - padding[0] + 1))`` zeros appended to
   ``template + 1e-8``;
2. **dilate**: linear interpolation of the padded signal to ``template_len + padding[1]``
   (72) points;
3. **scale**: multiplied by ``1 + scale_coeff * (rand() - 0.5)``;
4. **translate**: ``k = choice(max_translation)``, a circular shift by ``k`` positions;
5. **correlated noise**: ``gaussian_filter(corr_noise_scale * randn(72), 2)`` replaces the
   values that are exactly zero (the padding);
6. **iid noise**: ``iid_noise_scale * randn(72)`` added everywhere;
7. **shear**: ``c = shear_scale * (rand() - 0.5)``; ``c * linspace(-0.5, 0.5, 72)`` subtracted;
8. **subsample**: linear interpolation to ``final_seq_length`` (40) points.

(Each interpolation is SciPy's ``interp1d`` on one 1-D signal, which evaluates ``np.interp``.)

``num_samples // 10`` signals are made per class (class 0 first), then the rows are shuffled
with ``permutation(num_samples)``, optionally the positions with ``permutation(40)``
(``shuffle_seq``), and the whole set is standardised (one mean and one standard deviation over
every value).  :func:`generate_mnist1d_with_params` does exactly this, drawing the random
numbers in the package's order (one signal at a time) and doing the arithmetic vectorised, and
returns the drawn parameters beside the signals; its signals equal the package's bit for bit
for the same arguments and seed (``tests/data/test_mnist1d_params.py``).

Recorded parameters (one value per signal, in the shuffled order of the signals):

* ``padding``: ``p`` (36..60 by default): the template occupies the first ``12 / (12 + p)`` of
  the dilated signal, so a larger ``p`` makes the digit narrower;
* ``scale``: the amplitude factor (0.8..1.2);
* ``translation``: ``k`` (0..47), the circular shift in dilated samples;
* ``shear``: ``c`` (-0.375..0.375), the slope of the linear trend subtracted;
* ``corr_noise_rms`` / ``iid_noise_rms``: the root mean square of the signal's two noise
  draws after scaling (and smoothing), over the 72 dilated positions.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import random
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._io import atomic_write_bytes
from .._validation import check_positive_int
from ._base import ArrayDataset, DataSplits, default_root

__all__ = ["GENERATOR_DEFAULTS", "PARAM_NAMES", "ParamDataset", "generate_mnist1d_with_params",
           "load_mnist1d_param_splits", "mnist1d_params_cache_path", "mnist1d_templates"]

#: The package's ``get_dataset_args()`` (without ``url``, ``num_samples``, ``seed`` and
#: ``train_split``, which do not change a signal).
GENERATOR_DEFAULTS: dict[str, Any] = {
    "template_len": 12, "padding": (36, 60), "scale_coeff": 0.4, "max_translation": 48,
    "corr_noise_scale": 0.25, "iid_noise_scale": 2e-2, "shear_scale": 0.75,
    "shuffle_seq": False, "final_seq_length": 40,
}
#: The per-signal generator parameters :func:`generate_mnist1d_with_params` returns.
PARAM_NAMES = ("padding", "scale", "translation", "shear", "corr_noise_rms", "iid_noise_rms")
_EPS = 1e-8  # transform()'s eps


def mnist1d_templates() -> tuple[np.ndarray, np.ndarray]:
    """The ten digit templates ``(x (10, 12), t (12,))`` of ``mnist1d.data.get_templates``.

    Each template is whitened (mean 0, std 1), shifted to start at 0 and divided by 6.

    >>> x, t = mnist1d_templates()
    >>> x.shape, float(x[0, 0]), float(t[-1]) == 5 / 6
    ((10, 12), 0.0, True)
    """
    rows = [
        [5, 6, 6.5, 6.75, 7, 7, 7, 7, 6.75, 6.5, 6, 5],
        [5, 3, 3, 3.4, 3.8, 4.2, 4.6, 5, 5.4, 5.8, 5, 5],
        [5, 6, 6.5, 6.5, 6, 5.25, 4.75, 4, 3.5, 3.5, 4, 5],
        [5, 6, 6.5, 6.5, 6, 5, 5, 6, 6.5, 6.5, 6, 5],
        [5, 4.4, 3.8, 3.2, 2.6, 2.6, 5, 5, 5, 5, 5, 5],
        [5, 3, 3, 3, 3, 5, 6, 6.5, 6.5, 6, 4.5, 5],
        [5, 4, 3.5, 3.25, 3, 3, 3, 3, 3.25, 3.5, 4, 5],
        [5, 7, 7, 6.6, 6.2, 5.8, 5.4, 5, 4.6, 4.2, 5, 5],
        [5, 4, 3.5, 3.5, 4, 5, 5, 4, 3.5, 3.5, 4, 5],
        [5, 4, 3.5, 3.5, 4, 5, 5, 5, 5, 4.7, 4.3, 5],
    ]
    x = np.stack([np.asarray(r, dtype=np.float64) for r in rows])
    x -= x.mean(1, keepdims=True)
    x /= x.std(1, keepdims=True)
    x -= x[:, :1]
    return x / 6.0, np.linspace(-5, 5, 12) / 6.0


def _settings(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    s = dict(GENERATOR_DEFAULTS)
    for k, v in (overrides or {}).items():
        if k not in s:
            raise ValueError(f"Unknown MNIST-1D generator setting {k!r}; expected one of: "
                             f"{', '.join(sorted(s))}")
        s[k] = v
    for k in ("corr_noise_scale", "iid_noise_scale", "shear_scale", "scale_coeff"):
        v = s[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
            raise ValueError(f"Expected `{k}` to be a finite number >= 0, got {v!r}")
    lo, hi = (int(v) for v in s["padding"])
    if not 0 <= lo <= hi:
        raise ValueError(f"Expected `padding` to be (low, high) with 0 <= low <= high, got "
                         f"{s['padding']!r}")
    s["padding"] = (lo, hi)
    return s


def _draws(n_per_class: int, s: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every random number of the transform chain, drawn in the package's order."""
    n = 10 * n_per_class
    length = s["template_len"] + s["padding"][1]
    lo, hi = s["padding"]
    pad = np.empty(n, dtype=np.int64)
    scale, shear = np.empty(n), np.empty(n)
    shift = np.empty(n, dtype=np.int64)
    corr, iid = np.empty((n, length)), np.empty((n, length))
    rand, randn, choice = np.random.rand, np.random.randn, np.random.choice  # noqa: NPY002
    for i in range(n):
        pad[i] = lo + int(rand() * (hi - lo + 1))
        scale[i] = 1 + s["scale_coeff"] * (rand() - 0.5)
        shift[i] = choice(s["max_translation"])
        corr[i] = s["corr_noise_scale"] * randn(length)
        iid[i] = s["iid_noise_scale"] * randn(length)
        shear[i] = s["shear_scale"] * (rand() - 0.5)
    return {"pad": pad, "scale": scale, "shift": shift, "corr": corr, "iid": iid,
            "shear": shear}


def _interp_rows(x: np.ndarray, n_out: int) -> np.ndarray:
    """``mnist1d.transform.interpolate`` applied to every row of ``x``.

    The package calls ``scipy.interpolate.interp1d(..., kind="linear")`` on one 1-D signal at a
    time, which SciPy evaluates with ``np.interp``; ``interp1d`` on a 2-D array takes another
    arithmetic path (different in the last bit), so the rows go through ``np.interp`` one by one
    (about 5 microseconds each).
    """
    old, new = np.linspace(0, 1, x.shape[1]), np.linspace(0, 1, n_out)
    return np.stack([np.interp(new, old, row) for row in x]) if len(x) else np.empty((0, n_out))


def _dilated(labels: np.ndarray, pad: np.ndarray, templates: np.ndarray,
             length: int) -> np.ndarray:
    """Steps 1-2: every padded template dilated to ``length`` points (grouped by padding)."""
    out = np.empty((labels.shape[0], length))
    for p in np.unique(pad):
        rows = np.flatnonzero(pad == p)
        x = templates[labels[rows]] + _EPS
        x = np.concatenate([x, np.zeros((rows.shape[0], int(p)))], axis=1)
        out[rows] = _interp_rows(x, length)
    return out


def _transform_all(labels: np.ndarray, d: dict[str, np.ndarray], s: dict[str, Any]) -> np.ndarray:
    """Steps 1-8 for every signal, from its draws."""
    from scipy.ndimage import gaussian_filter1d  # deferred: scipy.ndimage import cost

    templates, _ = mnist1d_templates()
    length = s["template_len"] + s["padding"][1]
    x = _dilated(labels, d["pad"], templates, length)
    x *= d["scale"][:, None]
    # circular shift by k: concatenate([x[-k:], x[:-k]]) (k = 0 leaves x unchanged)
    cols = (np.arange(length)[None, :] - d["shift"][:, None]) % length
    x = np.take_along_axis(x, cols, axis=1)
    mask = x != 0
    corr = gaussian_filter1d(d["corr"], 2, axis=1, mode="reflect", truncate=4.0)
    x = mask * x + (1 - mask) * corr
    x = x + d["iid"]
    x = x - d["shear"][:, None] * np.linspace(-0.5, 0.5, length)[None, :]
    d["corr_smoothed"] = corr
    return _interp_rows(x, s["final_seq_length"])


def generate_mnist1d_with_params(num_samples: int, seed: int,
                                 settings: Mapping[str, Any] | None = None,
                                 ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``mnist1d.data.make_dataset``'s signals with each signal's generator parameters.

    Args:
        num_samples: signals to make (``num_samples // 10`` per class, as the package).
        seed: the generator's seed (NumPy's and Python's global generators are seeded with it
            and restored afterwards).
        settings: overrides of :data:`GENERATOR_DEFAULTS` (e.g. ``{"corr_noise_scale": 0.6}``).

    Returns:
        ``(x, y, params)``: float64 (N, final_seq_length) standardised signals, int64 (N,)
        labels (the package's order: its ``x`` then ``x_test``) and ``{name: (N,) array}`` for
        every name of :data:`PARAM_NAMES`.

    >>> x, y, p = generate_mnist1d_with_params(20, seed=0)
    >>> x.shape, sorted(p) == sorted(PARAM_NAMES), bool(0 <= p["translation"].min())
    ((20, 40), True, True)
    """
    s = _settings(settings)
    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) \
            or num_samples < 10:
        raise ValueError(f"Expected `num_samples` to be an integer >= 10, got {num_samples!r}")
    n_per_class = int(num_samples) // 10
    py_state, np_state = random.getstate(), np.random.get_state()  # noqa: NPY002
    try:
        random.seed(seed)
        np.random.seed(seed)  # noqa: NPY002
        d = _draws(n_per_class, s)
        labels = np.repeat(np.arange(10, dtype=np.int64), n_per_class)
        x = _transform_all(labels, d, s)
        perm = np.random.permutation(labels.shape[0])  # noqa: NPY002
        x, labels = x[perm], labels[perm]
        if s["shuffle_seq"]:
            x = x[..., np.random.permutation(s["final_seq_length"])]  # noqa: NPY002
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)  # noqa: NPY002
    x = (x - x.mean()) / x.std()
    params = {"padding": d["pad"], "scale": d["scale"], "translation": d["shift"],
              "shear": d["shear"],
              "corr_noise_rms": np.sqrt((d["corr_smoothed"] ** 2).mean(1)),
              "iid_noise_rms": np.sqrt((d["iid"] ** 2).mean(1))}
    return x, labels, {k: np.asarray(v)[perm].astype(np.float64) for k, v in params.items()}


# ------------------------------------------------------------------------------------------
# splits with parameters: class subsets, generator settings, cache
# ------------------------------------------------------------------------------------------
_PARAM_FORMAT = 1  # cache file layout version


class ParamDataset(ArrayDataset):
    """An :class:`ArrayDataset` that also holds each signal's generator parameters.

    ``params`` maps every name of :data:`PARAM_NAMES` to a float64 (N,) tensor; ``subset``
    keeps them aligned with the rows.
    """

    def __init__(self, data: Any, labels: Any, params: Mapping[str, Any]) -> None:
        super().__init__(data, labels)
        self.params = {k: torch.as_tensor(np.asarray(v), dtype=torch.float64)
                       for k, v in params.items()}
        for k, v in self.params.items():
            if v.shape != (len(self),):
                raise ValueError(f"Expected parameter {k!r} of shape ({len(self)},), got "
                                 f"{tuple(v.shape)}")

    def subset(self, indices: Any) -> ParamDataset:
        """A new data set with the rows ``indices`` (copied), parameters included."""
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.int64)
        return ParamDataset(self.data[idx], self.labels[idx],
                            {k: v[idx] for k, v in self.params.items()})


def _check_classes(classes: Any) -> tuple[int, ...]:
    if classes is None:
        return tuple(range(10))
    if isinstance(classes, str):  # "0-4" or "5,6,7"
        text = classes.strip()
        if "-" in text and "," not in text:
            a, _, b = text.partition("-")
            classes = range(int(a), int(b) + 1) if a.strip().isdigit() and b.strip().isdigit() \
                else [text]
        else:
            classes = [c for c in text.split(",") if c.strip()]
    try:
        out = tuple(int(c) for c in classes)
    except (TypeError, ValueError):
        out = ()
    if not out or len(set(out)) != len(out) or not all(0 <= c <= 9 for c in out):
        raise ValueError(f"Expected `classes` to be distinct digits 0..9 (e.g. '0-4' or "
                         f"[5, 6, 7]), got {classes!r}")
    return out


def mnist1d_params_cache_path(num_samples: int, seed: int, settings: Mapping[str, Any],
                              root: Any = None) -> Path:
    """Where :func:`load_mnist1d_param_splits` caches one generated set (the settings'
    hash is part of the name)."""
    key = json.dumps({k: list(v) if isinstance(v, tuple) else v
                      for k, v in _settings(settings).items()}, sort_keys=True)
    tag = hashlib.sha256(key.encode()).hexdigest()[:12]
    return default_root(root) / "mnist1d" / f"mnist1d_params_n{num_samples}_seed{seed}_{tag}.npz"


def _param_digest(arrays: Mapping[str, np.ndarray], meta: str) -> str:
    h = hashlib.sha256(meta.encode())
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _read_param_cache(path: Path, meta: str):
    """The cached arrays, or None when absent or not readable as exactly this set (any
    failure to read means stale: the set is regenerated)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k not in ("meta", "sha256")}
            ok = str(z["meta"]) == meta and str(z["sha256"]) == _param_digest(arrays, meta)
    except Exception as exc:  # noqa: BLE001 - any unreadable cache is stale, never fatal
        warnings.warn(f"MNIST-1D cache {str(path)!r} unreadable ({exc}); regenerating",
                      stacklevel=4)
        return None
    if not ok:
        warnings.warn(f"MNIST-1D cache {str(path)!r} does not match; regenerating", stacklevel=4)
        return None
    return arrays


def _generated(num_samples: int, seed: int, settings: Mapping[str, Any], root: Any,
               cache: bool) -> dict[str, np.ndarray]:
    """``{"x": float32, "y": int64, <param>: float64}`` of one generated set, cached."""
    meta = json.dumps({"num_samples": num_samples, "seed": seed, "format": _PARAM_FORMAT,
                       "settings": {k: list(v) if isinstance(v, tuple) else v
                                    for k, v in _settings(settings).items()}}, sort_keys=True)
    path = mnist1d_params_cache_path(num_samples, seed, settings, root) if cache else None
    hit = _read_param_cache(path, meta) if path is not None else None
    if hit is not None:
        return hit
    x, y, params = generate_mnist1d_with_params(num_samples, seed, settings)
    arrays = {"x": x.astype(np.float32), "y": y.astype(np.int64), **params}
    if path is not None:
        buf = io.BytesIO()
        np.savez(buf, meta=np.array(meta), sha256=np.array(_param_digest(arrays, meta)), **arrays)
        atomic_write_bytes(path, buf.getvalue())
    return arrays


def load_mnist1d_param_splits(root: Any = None, seed: int = 42, n_train: int = 2000,
                              n_val: int = 2000, n_test: int = 8000, *, classes: Any = None,
                              generator: Mapping[str, Any] | None = None,
                              cache: bool = True) -> DataSplits:
    """MNIST-1D splits of a class subset and generator setting, with generator parameters.

    The set is :func:`generate_mnist1d_with_params` of ``10 * ceil(N / k)`` signals (``N`` the
    three sizes' sum, ``k`` the number of classes kept), so that each kept class has
    ``ceil(N / k)`` signals; its signals of the kept classes, in the generator's shuffled
    order, are cut into train / validation / test as :func:`load_mnist1d_splits` does.  Labels
    are renumbered ``0..k-1`` in the order of ``classes`` (``info["classes"]`` keeps the
    digits).  With every class and default settings the signals are those of
    :func:`load_mnist1d_splits` for the same sizes and seed.  Standardisation is the package's:
    over the whole generated set (all ten classes) of this setting.

    Args:
        root: data root of the cache (``root/mnist1d/mnist1d_params_*.npz``).
        seed: the generator's seed.
        n_train: training split size (of the kept classes).
        n_val: validation split size.
        n_test: test split size.
        classes: digits to keep (``None``: all; ``"0-4"``, ``"5,6"`` or a sequence).
        generator: overrides of :data:`GENERATOR_DEFAULTS` (``corr_noise_scale``,
            ``iid_noise_scale``, ``shear_scale``, ...), for shifted sets.
        cache: read / write the cache.

    Returns:
        :class:`DataSplits` whose splits are :class:`ParamDataset`.

    >>> import tempfile
    >>> s = load_mnist1d_param_splits(tempfile.mkdtemp(), 0, 30, 10, 20, classes="5-9")
    >>> len(s.train), s.num_classes, s.info["classes"], sorted(s.test.params)[0]
    (30, 5, [5, 6, 7, 8, 9], 'corr_noise_rms')
    """
    sizes = [check_positive_int(v, k) for k, v in (("n_train", n_train), ("n_val", n_val),
                                                   ("n_test", n_test))]
    keep = _check_classes(classes)
    settings = dict(generator or {})
    _settings(settings)
    total = sum(sizes)
    num_samples = 10 * math.ceil(total / len(keep))
    arrays = _generated(num_samples, int(seed), settings, root, cache)
    lookup = np.full(10, -1, dtype=np.int64)
    lookup[list(keep)] = np.arange(len(keep))
    rows = np.flatnonzero(lookup[arrays["y"]] >= 0)[:total]
    x = torch.from_numpy(arrays["x"][rows])
    y = torch.from_numpy(lookup[arrays["y"][rows]])
    params = {k: arrays[k][rows] for k in PARAM_NAMES}
    a, b = sizes[0], sizes[0] + sizes[1]
    parts = [ParamDataset(x[i:j], y[i:j], {k: v[i:j] for k, v in params.items()})
             for i, j in ((0, a), (a, b), (b, total))]
    return DataSplits(
        train=parts[0], val=parts[1], test=parts[2], num_classes=len(keep),
        input_shape=(int(x.shape[1]),), mean=None, std=None, augment=False, name="mnist1d",
        padding=0, info={"seed": int(seed), "num_samples": num_samples, "classes": list(keep),
                         "generator": {k: list(v) if isinstance(v, tuple) else v
                                       for k, v in _settings(settings).items()},
                         "sizes": {"train": sizes[0], "val": sizes[1], "test": sizes[2]},
                         "params": list(PARAM_NAMES)})

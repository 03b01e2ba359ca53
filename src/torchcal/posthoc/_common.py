"""Input checks and the estimator plumbing shared by the post-hoc calibrators."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch

from .._validation import as_tensor, check_labels
from ..errors import NotFittedError

__all__ = ["Calibrator", "default_grid", "check_grid", "prepare_fit", "prepare_logits"]

_SCHEMA_VERSION = 1


def default_grid() -> tuple[float, ...]:
    """The papers' temperature grid ``0.1, 0.2, ..., 10.0`` as exact decimals.

    Built as ``k / 10`` for ``k = 1..100`` in float64, so every entry is the double nearest to
    its decimal (``0.3``, not the ``0.30000000000000004`` of ``np.arange(0.1, 10.05, 0.1)``).

    >>> g = default_grid()
    >>> len(g), g[0], g[2], g[10], g[-1]
    (100, 0.1, 0.3, 1.1, 10.0)
    """
    return tuple(k / 10 for k in range(1, 101))


def check_grid(grid: Any) -> tuple[float, ...]:
    """Validate a grid of temperatures: a non-empty 1-D sequence of positive finite numbers.

    Returns the temperatures as a tuple of Python floats in the given order (``None`` gives
    :func:`default_grid`).

    >>> check_grid([0.5, 2])
    (0.5, 2.0)
    """
    if grid is None:
        return default_grid()
    if isinstance(grid, torch.Tensor):
        values = grid.detach().cpu().double().reshape(-1).tolist() if grid.ndim <= 1 else None
    elif isinstance(grid, (str, bytes)) or isinstance(grid, numbers.Number):
        values = None
    else:
        try:
            arr = np.asarray(grid)
        except Exception:  # noqa: BLE001 - any failure means "not a sequence of numbers"
            arr = None
        ok = arr is not None and arr.ndim == 1 and (
            np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
        )
        values = [float(v) for v in arr.tolist()] if ok else None
    if values is None:
        raise TypeError(
            f"Expected `grid` to be a 1-D sequence of temperatures, got {type(grid).__name__}"
        )
    if len(values) == 0:
        raise ValueError("Expected `grid` to hold at least one temperature, got an empty grid")
    for i, v in enumerate(values):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(
                f"Expected `grid` to hold positive finite temperatures, got {v!r} at index {i}"
            )
    return tuple(values)


def prepare_logits(logits: Any, name: str = "logits") -> torch.Tensor:
    """Validate logits of shape (N, C): floating dtype, 2-D, non-empty, C >= 2, finite."""
    z = as_tensor(logits, name)
    if not z.is_floating_point():
        raise TypeError(f"Expected `{name}` to have a floating dtype, got {z.dtype}")
    if z.ndim != 2:
        raise ValueError(f"Expected `{name}` to be 2-D of shape (N, C), got shape {tuple(z.shape)}")
    if z.shape[0] == 0:
        raise ValueError(f"Expected `{name}` to be non-empty, got shape {tuple(z.shape)}")
    if z.shape[1] < 2:
        raise ValueError(
            f"Expected `{name}` to have at least 2 classes (columns), got {z.shape[1]}"
        )
    lo, hi = torch.aminmax(z.detach())
    if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
        n_bad = int((~torch.isfinite(z.detach())).sum())
        raise ValueError(f"Expected `{name}` to be finite, found {n_bad} NaN/Inf value(s)")
    return z


def prepare_fit(logits: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated (detached) validation logits (N, C) and int64 labels (N,) on the logits' device.

    Errors name the problem: non-floating or non-2-D logits, fewer than two samples or
    classes, NaN/Inf, labels of the wrong length, dtype or range.
    """
    z = prepare_logits(logits).detach()
    if z.shape[0] < 2:
        raise ValueError(
            f"Expected at least 2 validation samples (rows of `logits`), got {z.shape[0]}"
        )
    y = check_labels(labels, n=z.shape[0], num_classes=z.shape[1], device=z.device)
    return z, y


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half precision, else the dtype itself (float32 / float64)."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def finite_float(value: Any, name: str) -> float:
    """``value`` as a Python float, or ValueError naming ``name`` if it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(
        float(value)
    ):
        raise ValueError(f"Expected `{name}` to be a finite number, got {value!r}")
    return float(value)


def float_list(value: Any, name: str, *, length: int | None = None,
               allow_none: bool = False) -> list:
    """A JSON list of finite floats (or ``None`` entries when ``allow_none``), validated."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"Expected `{name}` to be a list of numbers, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise ValueError(f"Expected `{name}` to have {length} entries, got {len(value)}")
    out = []
    for i, v in enumerate(value):
        if v is None and allow_none:
            out.append(None)
        else:
            out.append(finite_float(v, f"{name}[{i}]"))
    return out


class Calibrator:
    """Base of the post-hoc calibrators (scikit-learn's estimator contract).

    The constructor stores settings; :meth:`fit` learns attributes ending in ``_`` and returns
    ``self``; :meth:`transform` maps logits to calibrated logits and :meth:`predict_proba` to
    probabilities; :meth:`to_dict` / ``from_dict`` round-trip through JSON.  Using an
    unfitted calibrator raises :class:`torchcal.errors.NotFittedError`.
    """

    _fitted_attr: str = ""

    def fit(self, logits: Any, labels: Any) -> Calibrator:  # pragma: no cover - abstract
        raise NotImplementedError

    def transform(self, logits: Any) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def predict_proba(self, logits: Any) -> torch.Tensor:
        """Calibrated probabilities (N, C): ``softmax(transform(logits))``, computed in at least
        float32 and returned in the logits' floating dtype (as the metrics do)."""
        zt = self.transform(logits)
        return torch.softmax(zt.to(work_dtype(zt.dtype)), dim=1).to(zt.dtype)

    def fit_transform(self, logits: Any, labels: Any) -> torch.Tensor:
        """``fit(logits, labels).transform(logits)``."""
        return self.fit(logits, labels).transform(logits)

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` (or ``from_dict``) has set the learned attributes."""
        return getattr(self, self._fitted_attr, None) is not None

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            name = type(self).__name__
            raise NotFittedError(
                f"This {name} instance is not fitted yet; call `fit(logits, labels)` before "
                "using it"
            )

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def _check_dict(cls, d: Any, keys: tuple[str, ...]) -> None:
        if not isinstance(d, dict):
            raise TypeError(f"Expected `d` to be a dict from to_dict(), got {type(d).__name__}")
        if d.get("type") != cls.__name__:
            raise ValueError(
                f"Expected `d['type']` to be {cls.__name__!r}, got {d.get('type')!r}"
            )
        if d.get("version") != _SCHEMA_VERSION:
            raise ValueError(
                f"Expected `d['version']` to be {_SCHEMA_VERSION}, got {d.get('version')!r}"
            )
        missing = [k for k in keys if k not in d]
        if missing:
            raise ValueError(f"Expected `d` to have the key(s) {missing} written by to_dict()")

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self._params().items())
        return f"{type(self).__name__}({params})"

    def _params(self) -> dict[str, Any]:  # pragma: no cover - abstract
        return {}

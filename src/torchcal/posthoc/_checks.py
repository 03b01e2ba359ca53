"""The post-hoc calibrators' checks of their inputs and settings: logits, validation rows,
temperature grids, fitted parameters read back by ``from_dict``, choices and class counts.

Each raises one ``ValueError`` / ``TypeError`` naming the argument and what was expected.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch

from .._validation import as_tensor, check_finite, check_labels, check_logits, check_scalar
from ..metrics import IGNORE_INDEX, warn_if_probabilities
from ._layout import fit_rows, resolve_class_axis

__all__ = [
    "default_grid",
    "check_grid",
    "prepare_logits",
    "check_dense_logits",
    "dense_axis",
    "prepare_fit",
    "prepare_fit_weighted",
    "finite_float",
    "MAX_PARAMETER",
    "PARAMETER_BOUNDS",
    "float_list",
    "check_choice",
    "check_n_classes",
    "absent_classes",
    "describe_classes",
]


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
    """Validate logits of shape (N, C): floating dtype, 2-D, non-empty, C >= 2, finite
    (:func:`torchcal._validation.check_logits`)."""
    return check_logits(logits, name)


def check_dense_logits(logits: Any, name: str = "logits") -> torch.Tensor:
    """Validate scores of shape (N, C) or (N, C, d1, ...) / (N, T, C): floating dtype,
    non-empty, finite; 2-D input as :func:`prepare_logits`."""
    z = as_tensor(logits, name)
    if z.ndim <= 2:
        return prepare_logits(z, name)
    if not z.is_floating_point():
        raise TypeError(f"Expected `{name}` to have a floating dtype, got {z.dtype}")
    if z.numel() == 0:
        raise ValueError(f"Expected `{name}` to be non-empty, got shape {tuple(z.shape)}")
    check_finite(z.detach(), name)
    return z


def dense_axis(z: torch.Tensor, class_axis: Any = None, *, fitted_axis: int | None = None,
               n_classes: int | None = None) -> int:
    """:func:`resolve_class_axis` for validated scores, checking that the class axis has at
    least 2 entries."""
    axis = resolve_class_axis(tuple(z.shape), class_axis, fitted_axis=fitted_axis,
                              n_classes=n_classes)
    if z.ndim > 2 and z.shape[axis] < 2:
        raise ValueError(f"Expected `logits` to have at least 2 classes on axis {axis}, got "
                         f"shape {tuple(z.shape)}")
    return axis


def prepare_fit(logits: Any, labels: Any, *, one_class_ok: bool = False,
                ignore_index: Any = IGNORE_INDEX, sample_weight: Any = None,
                class_axis: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated (detached) validation logits (M, C) and int64 labels (M,) on the logits'
    device (:func:`prepare_fit_weighted` without the weights)."""
    z, y, _, _ = prepare_fit_weighted(logits, labels, one_class_ok=one_class_ok,
                                      ignore_index=ignore_index, sample_weight=sample_weight,
                                      class_axis=class_axis)
    return z, y


def prepare_fit_weighted(logits: Any, labels: Any, *, one_class_ok: bool = False,
                         ignore_index: Any = IGNORE_INDEX, sample_weight: Any = None,
                         class_axis: Any = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int | None]:
    """Validated (detached) validation rows ``(z (M, C), labels (M,) int64, weights (M,)
    float64 or None, class axis)`` (:func:`fit_rows`: dense and token layouts,
    ``ignore_index``, ``sample_weight``).

    Errors name the problem: non-floating logits or logits of the wrong shape, fewer than two
    samples or classes, NaN/Inf, labels of the wrong length, dtype or range, and labels that
    are all of one class (a calibrator fitted on them predicts that class with probability 1;
    a conformal predictor passes ``one_class_ok=True``).
    """
    rows, yr, w, axis = fit_rows(logits, labels, ignore_index=ignore_index,
                                 sample_weight=sample_weight, class_axis=class_axis)
    if rows.ndim == 2 and rows.shape[0] < 2 and as_tensor(labels, "labels").numel() >= 2:
        raise ValueError(
            f"Expected at least 2 validation samples (rows of `logits` with a label other than "
            f"ignore_index={ignore_index} and a positive weight), got {rows.shape[0]}")
    z = prepare_logits(rows).detach()
    warn_if_probabilities(z, what="the calibrator",  # as the metrics do (fit(probs, y))
                          instead="Pass logits (or log-probabilities: log(probs)) instead.")
    if z.shape[0] < 2:
        raise ValueError(
            f"Expected at least 2 validation samples (rows of `logits` with a label other than "
            f"ignore_index and a positive weight), got {z.shape[0]}"
        )
    y = check_labels(yr, n=z.shape[0], num_classes=z.shape[1], device=z.device)
    if not one_class_ok and bool((y == y[0]).all()):
        raise ValueError(
            f"Expected `labels` of at least 2 different classes to fit a calibrator, got "
            f"{y.shape[0]} labels all equal to {int(y[0])}"
        )
    if w is not None and bool((w == 1).all()):
        w = None  # unit weights: the unweighted fit, exactly
    return z, y, w, axis


def finite_float(value: Any, name: str) -> float:
    """``value`` as a Python float, or ValueError naming ``name`` if it is not a finite number."""
    return check_scalar(value, name, float)


#: Largest magnitude of a fitted parameter (a weight, bias or coefficient) that ``from_dict``
#: accepts, and the temperature range ``[1 / MAX_PARAMETER, MAX_PARAMETER]``: a fit never gets
#: near it, while a larger value (a file edited by hand, a corrupted fit) overflows the float32
#: calibrated logits into NaN probabilities.
MAX_PARAMETER = 1e6


def float_list(value: Any, name: str, *, length: int | None = None,
               allow_none: bool = False, bounds: tuple[float, float] | None = None) -> list:
    """A JSON list of finite floats (or ``None`` entries when ``allow_none``), validated;
    with ``bounds=(lo, hi)`` every number must lie in ``[lo, hi]``.

    >>> float_list([0.5, 1], "d['values']", bounds=(0.0, 1.0))
    [0.5, 1.0]
    >>> float_list([2.0], "d['values']", bounds=(0.0, 1.0))
    Traceback (most recent call last):
    ValueError: Expected `d['values'][0]` to lie in [0, 1], got 2.0
    """
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"Expected `{name}` to be a list of numbers, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise ValueError(f"Expected `{name}` to have {length} entries, got {len(value)}")
    out = []
    for i, v in enumerate(value):
        if v is None and allow_none:
            out.append(None)
            continue
        f = finite_float(v, f"{name}[{i}]")
        if bounds is not None and not bounds[0] <= f <= bounds[1]:
            raise ValueError(f"Expected `{name}[{i}]` to lie in [{bounds[0]:g}, {bounds[1]:g}], "
                             f"got {f!r}")
        out.append(f)
    return out


#: ``bounds`` of :func:`float_list` for fitted weights, biases and coefficients.
PARAMETER_BOUNDS = (-MAX_PARAMETER, MAX_PARAMETER)


def check_choice(value: Any, name: str, choices: tuple) -> Any:
    """``value`` if it is one of ``choices``, else ValueError naming ``name``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"Expected `{name}` to be one of {choices}, got {value!r}")
    return value


def check_n_classes(z: torch.Tensor, n_classes: int | None, name: str = "logits") -> None:
    """Raise if ``z`` has a different number of columns than the data the calibrator saw."""
    if n_classes is not None and z.shape[1] != n_classes:
        raise ValueError(
            f"Expected `{name}` to have {n_classes} classes (columns) as in fit, "
            f"got {z.shape[1]}"
        )


def absent_classes(y: torch.Tensor, c: int) -> list[int]:
    """The class indices in [0, C) that never occur in ``y``."""
    return (torch.bincount(y, minlength=c) == 0).nonzero().flatten().tolist()


def describe_classes(classes: list[int]) -> str:
    """``"0, 3, 7"`` (the first ten, then ``...``)."""
    return ", ".join(map(str, classes[:10])) + (", ..." if len(classes) > 10 else "")

"""Input checks and the estimator plumbing shared by the post-hoc calibrators."""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from typing import Any

import numpy as np
import torch

from .._validation import as_tensor, check_finite, check_labels, check_logits, check_scalar
from ..errors import (
    CalibrationFitError,
    MemorizedValidationWarning,
    NotFittedError,
    WorseThanIdentityWarning,
)
from ..metrics import IGNORE_INDEX, warn_if_probabilities
from ..metrics.layout import check_ignore_index

__all__ = [
    "Calibrator",
    "CalibrationFitError",
    "WorseThanIdentityWarning",
    "MemorizedValidationWarning",
    "Estimator",
    "default_grid",
    "check_grid",
    "prepare_fit",
    "prepare_logits",
    "fit_rows",
    "apply_rows",
    "row_chunks",
    "CHUNK_ELEMENTS",
]

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
    """Validate logits of shape (N, C): floating dtype, 2-D, non-empty, C >= 2, finite
    (:func:`torchcal._validation.check_logits`)."""
    return check_logits(logits, name)


#: Elements (rows x classes) of one chunk of the fits' float64 passes and of the dense
#: predictions (512 KiB of float64): a (8, 21, 512, 512) segmentation batch is never copied to
#: float64 as a whole, every pass over its rows holds one chunk at a time.
CHUNK_ELEMENTS = 1 << 16
#: Inputs of at most this many elements (2 MiB of float64) are one chunk: the unchunked
#: arithmetic of small inputs (and of every committed result) is unchanged.
SINGLE_CHUNK_ELEMENTS = 1 << 18


def row_chunks(n: int, c: int) -> list[slice]:
    """Slices of ``range(n)``: one when ``n * c <= SINGLE_CHUNK_ELEMENTS`` (small inputs take
    the unchunked arithmetic), else of ``CHUNK_ELEMENTS // c`` rows each."""
    if n * c <= SINGLE_CHUNK_ELEMENTS:
        return [slice(0, n)]
    step = max(1, CHUNK_ELEMENTS // max(c, 1))
    return [slice(a, min(a + step, n)) for a in range(0, n, step)]


def resolve_class_axis(shape: tuple[int, ...], class_axis: Any = None,
                       labels_shape: tuple[int, ...] | None = None,
                       fitted_axis: int | None = None, n_classes: int | None = None) -> int:
    """The class axis of scores of ``shape``: 1 (``F.cross_entropy``'s (N, C, d1, ...), the
    default) or -1 (token logits (N, T, V)).  2-D input: 1.  Otherwise, in this order: an
    explicit ``class_axis`` (1 or -1, or its non-negative spelling); labels of shape
    ``shape[:-1]`` and not ``(N, d1, ...)``: -1; the axis the calibrator was fitted on; the
    one axis of size ``n_classes``; else 1."""
    nd = len(shape)
    if nd <= 2:
        return 1
    if class_axis is not None:
        if isinstance(class_axis, bool) or class_axis not in (1, -1, nd - 1):
            raise ValueError(f"Expected `class_axis` to be 1 (N, C, d1, ...) or -1 (N, T, C), "
                             f"got {class_axis!r}")
        return 1 if class_axis == 1 else -1
    if labels_shape is not None:
        dense = (shape[0],) + tuple(shape[2:])
        if tuple(labels_shape) == dense:
            return 1
        if tuple(labels_shape) == tuple(shape[:-1]):
            return -1
        raise ValueError(
            f"Expected `labels` of shape (N, d1, ...) = {dense} for `logits` of shape (N, C, "
            f"d1, ...), or {tuple(shape[:-1])} for token logits (N, T, C), got "
            f"{tuple(labels_shape)}")
    if fitted_axis is not None:
        return fitted_axis
    if n_classes is not None and (shape[1] == n_classes) != (shape[-1] == n_classes):
        return 1 if shape[1] == n_classes else -1
    return 1


def _check_sample_weight(sample_weight: Any, labels_shape: tuple[int, ...],
                         device: torch.device) -> torch.Tensor:
    """scikit-learn's convention: one finite weight >= 0 per label (the labels' shape), not
    all 0; float64 on ``device``."""
    w = as_tensor(sample_weight, "sample_weight")
    if w.is_complex() or w.dtype == torch.bool:
        raise TypeError(f"Expected `sample_weight` to be real numbers, got {w.dtype}")
    if tuple(w.shape) != tuple(labels_shape):
        raise ValueError(f"Expected `sample_weight` of the labels' shape {tuple(labels_shape)}, "
                         f"got {tuple(w.shape)}")
    w = w.detach().to(device=device, dtype=torch.float64)
    check_finite(w, "sample_weight")
    if w.numel() and bool((w < 0).any()):
        raise ValueError("Expected `sample_weight` to be >= 0, got negative weight(s)")
    if w.numel() and not bool((w > 0).any()):
        raise ValueError("Expected `sample_weight` to have a positive weight, but every "
                         "weight is zero")
    return w


def fit_rows(logits: Any, labels: Any, *, ignore_index: Any = IGNORE_INDEX,
             sample_weight: Any = None, class_axis: Any = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int | None]:
    """The rows a calibrator is fitted on: ``(z (M, C), labels (M,), weights (M,) or None,
    class axis)``.

    (N, C) logits with (N,) labels, dense (N, C, d1, ...) logits with (N, d1, ...) labels, or
    token logits (N, T, C) with (N, T) labels (:func:`resolve_class_axis`); rows whose label is
    ``ignore_index`` (default -100, None keeps all) or whose weight is 0 are dropped.  Only
    the kept rows are copied, in the logits' dtype (never a float64 copy of the whole tensor).
    The class axis is None for 2-D input."""
    ignore_index = check_ignore_index(ignore_index)
    z = as_tensor(logits, "logits")
    y = as_tensor(labels, "labels")
    if z.ndim < 3 or not z.is_floating_point():
        axis, rows, yr, shape = None, z, y, tuple(y.shape)
    else:
        axis = resolve_class_axis(tuple(z.shape), class_axis, labels_shape=tuple(y.shape))
        rows, yr, shape = z, y, tuple(y.shape)
    w = None if sample_weight is None else _check_sample_weight(sample_weight, shape, z.device)
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        return rows, yr, w, axis  # check_labels names the dtype
    keep = None
    if ignore_index is not None:
        keep = y != ignore_index
    if w is not None:
        pos = w > 0
        keep = pos if keep is None else keep & pos.to(keep.device)
    if keep is not None and bool(keep.all()):
        keep = None
    if axis is None:
        if keep is not None and z.ndim == 2 and y.ndim == 1 and y.shape[0] == z.shape[0]:
            rows, yr = z[keep.to(z.device)], y[keep]
            w = None if w is None else w[keep.to(w.device)]
        return rows, yr, w, axis
    c = z.shape[1] if axis == 1 else z.shape[-1]
    zm = z.movedim(1, -1) if axis == 1 else z
    if keep is None:
        rows, yr = zm.reshape(-1, c), y.reshape(-1)
        w = None if w is None else w.reshape(-1)
    else:
        rows, yr = zm[keep.to(z.device)], y[keep]
        w = None if w is None else w[keep.to(w.device)]
    return rows, yr, w, axis


def apply_rows(fn: Any, z: torch.Tensor, axis: int, *, with_offset: bool = False
               ) -> torch.Tensor:
    """``fn`` (rows (m, C) -> (m, C)) applied to the rows of (N, C, d1, ...) (``axis=1``) or
    (..., C) (``axis=-1``) scores, chunk by chunk (``CHUNK_ELEMENTS``), into an output of the
    input's shape; 2-D input: ``fn(z)``.  The rows are visited in the order of
    ``z.movedim(axis, -1).reshape(-1, C)``; with ``with_offset`` ``fn(rows, start)`` also gets
    the index of the chunk's first row in that order."""
    call = fn if with_offset else (lambda rows, _start: fn(rows))
    if z.ndim <= 2:
        return call(z, 0)
    if axis == -1:
        c = z.shape[-1]
        rows = z.reshape(-1, c)
        parts = [call(rows[sl], sl.start) for sl in row_chunks(rows.shape[0], c)]
        return torch.cat(parts).reshape(z.shape) if len(parts) > 1 else parts[0].reshape(z.shape)
    n, c = z.shape[0], z.shape[1]
    z3 = z.reshape(n, c, -1)
    s = z3.shape[2]
    out = None
    per = max(1, CHUNK_ELEMENTS // max(s * c, 1))  # images per block
    for a in range(0, n, per):
        block = z3[a:a + per]
        nb = block.shape[0]
        for sl in (row_chunks(s, c) if nb == 1 else [slice(0, s)]):
            rows = block[:, :, sl].transpose(1, 2).reshape(-1, c)
            res = call(rows, a * s + sl.start)
            if out is None:
                out = torch.empty((n, c, s), dtype=res.dtype, device=res.device)
            out[a:a + nb, :, sl] = res.reshape(nb, -1, c).transpose(1, 2)
    assert out is not None
    return out.reshape(z.shape)


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


def weighted_equal_mass_edges(values: torch.Tensor, w: torch.Tensor, n_bins: int
                              ) -> torch.Tensor:
    """Interior equal-mass edges of ``values`` (..., N) under sample weights ``w`` (N,):
    :func:`torchcal.metrics.binning.equal_mass_edges` of the values each repeated ``w_i``
    times for integer weights (``e_k = s_j`` at the repeated position
    ``max(floor(k W / B) - 1, 0)``, ``W = sum w``), the same rule for any weights.

    >>> weighted_equal_mass_edges(torch.tensor([0.9, 0.1, 0.3]), torch.tensor([1.0, 1, 2]), 2)
    tensor([0.3000])
    """
    s, order = torch.sort(values, dim=-1)
    cw = torch.cumsum(w.to(torch.float64)[order], dim=-1)
    total = cw[..., -1:]
    k = torch.arange(1, n_bins, device=values.device, dtype=torch.float64)
    pos = torch.clamp(torch.div(k * total, n_bins, rounding_mode="floor") - 1, min=0)
    j = torch.searchsorted(cw.contiguous(), pos.contiguous(), right=True)
    return s.gather(-1, j.clamp(max=values.shape[-1] - 1))


def top_label_rows(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of logits ``z`` (m, C): the float64 ``log p`` (m, C) of ``p = softmax(z)``,
    the predicted class (arg-max of the logits, first on ties) and ``log(1 - p_top)``
    (the log-sum-exp of the other classes' log-probabilities, exact where ``p_top`` rounds
    to 1)."""
    lp = torch.log_softmax(z.to(torch.float64), dim=1)
    top, pred = lp.max(dim=1)
    rest = torch.logsumexp(lp.scatter(1, pred.unsqueeze(1), -math.inf), dim=1)
    return lp, pred, rest


def keep_top_label(p: torch.Tensor, pred: torch.Tensor, h: torch.Tensor,
                   out_dtype: torch.dtype) -> torch.Tensor:
    """Probabilities (m, C) whose arg-max is ``pred`` and whose top probability is the
    calibrated confidence ``h`` (float64 (m,)): the top-label calibrators' prediction.

    The other classes share ``1 - h`` in proportion to their probabilities ``p`` (equally when
    those are all 0), mixed with the uniform share just enough that none reaches ``h``
    (a strict margin of ``4 eps`` of ``out_dtype``, so the arg-max survives the rounding to
    it).  A confidence below about ``1 / C`` cannot be the largest of C probabilities: it is
    raised to that bound (no top-1 probability is smaller)."""
    c = p.shape[1]
    if c == 1:
        return torch.ones_like(p, dtype=out_dtype)
    delta = 4 * torch.finfo(out_dtype).eps
    lower = (1 + delta) / ((1 - delta) * (c - 1) + 1)
    q_top = h.to(torch.float64).clamp(min=lower, max=1.0)
    p64 = p.to(torch.float64).scatter(1, pred.unsqueeze(1), 0.0)
    rest = p64.sum(dim=1, keepdim=True)
    u = 1.0 / (c - 1)
    r = torch.where(rest > 0, p64 / rest.clamp(min=torch.finfo(torch.float64).tiny), u)
    r = r.scatter(1, pred.unsqueeze(1), 0.0)
    m = r.max(dim=1).values
    t = q_top * (1 - delta) / (1 - q_top).clamp(min=torch.finfo(torch.float64).tiny)
    alpha = torch.where(m > t, (m - t) / (m - u).clamp(min=torch.finfo(torch.float64).tiny),
                        torch.zeros_like(m)).clamp(0.0, 1.0)
    others = (1 - q_top).unsqueeze(1) * ((1 - alpha).unsqueeze(1) * r + alpha.unsqueeze(1) * u)
    q = others.scatter(1, pred.unsqueeze(1), q_top.unsqueeze(1))
    return q.to(out_dtype)


def log_proba(q: torch.Tensor) -> torch.Tensor:
    """``log q`` clamped at the dtype's smallest normal number (finite "logits" whose softmax
    gives back the probabilities ``q``: the transform of the probability-level calibrators)."""
    return torch.log(q.clamp(min=torch.finfo(q.dtype).tiny))


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half precision, else the dtype itself (float32 / float64)."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


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


_NOT_FITTED: list[type] = []  # the class of not_fitted_error, made on first use


def not_fitted_error(message: str) -> NotFittedError:
    """The error an unfitted estimator raises: a :class:`torchcal.errors.NotFittedError` that
    is also scikit-learn's ``NotFittedError`` (its estimator checks and ``except
    sklearn.exceptions.NotFittedError`` recognise it).  Its class is made on the first call,
    which imports scikit-learn: importing the calibrators does not (issue 43)."""
    if not _NOT_FITTED:
        # deferred: scikit-learn's import (2 s of CPU) only once an unfitted estimator is used
        from sklearn.exceptions import NotFittedError as SklearnNotFittedError

        _NOT_FITTED.append(type("NotFittedError", (NotFittedError, SklearnNotFittedError), {
            "__module__": NotFittedError.__module__, "__doc__": NotFittedError.__doc__,
            "__reduce__": lambda self: (not_fitted_error, (str(self),))}))
    return _NOT_FITTED[0](message)


#: Relative margin of :class:`WorseThanIdentityWarning`: it is raised when the calibrated NLL
#: exceeds the identity's by more than this fraction (noise on a held-out set of a calibrator
#: that barely changes the probabilities stays quiet).
IDENTITY_MARGIN = 0.01


def identity_check(name: str, nll_calibrated: float, nll_identity: float, where: str) -> None:
    """Warn (:class:`WorseThanIdentityWarning`) when ``nll_calibrated`` exceeds
    ``nll_identity`` by more than ``IDENTITY_MARGIN`` of it."""
    if nll_calibrated > nll_identity * (1 + IDENTITY_MARGIN) or (
            math.isnan(nll_calibrated) and not math.isnan(nll_identity)):
        held_out = where != "validation"
        cause = ("it over-fits its validation set, or these data differ from it"
                 if held_out else "it over-fits its validation set, or its fit failed")
        advice = ("fit it on validation data drawn like these" if name == "TemperatureScaling"
                  else "regularise it (e.g. reg='odir' with larger `lam`/`mu`), fit it on more "
                  "samples, or use a calibrator with fewer parameters (TemperatureScaling)")
        warnings.warn(
            f"{name}: the calibrated NLL on the {where} data ({nll_calibrated:.4g}) is worse "
            f"than the uncalibrated probabilities' ({nll_identity:.4g}, the identity map): "
            f"{cause}; {advice}", WorseThanIdentityWarning, stacklevel=3)


def like_input(out: torch.Tensor, ref: Any) -> Any:
    """``out`` as a NumPy array when the input ``ref`` was one (NumPy in, NumPy out), else the
    tensor itself."""
    if isinstance(ref, np.ndarray):
        return out.detach().cpu().numpy()
    return out


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


# Largest |gradient| of a validation objective accepted when L-BFGS stops on its budget.
GRAD_TOL = 1e-6


def lbfgs_fit(params: list[torch.Tensor], objective: Any, *, max_iter: int, name: str,
              hint: str = "") -> tuple[float, float]:
    """Minimise ``objective`` (a 0-d float64 tensor of ``params``) with L-BFGS (strong Wolfe
    line search) and return its ``(start, end)`` values.

    ``objective(backward)`` returns the objective's value (detached) and, when ``backward``
    is true, adds its gradient to the parameters' ``.grad`` (so a large objective can be
    summed and differentiated chunk by chunk).  L-BFGS stops once the largest |gradient| is
    at most ``GRAD_TOL`` (the tolerance the result is accepted at: running on past it costs
    evaluations and changes the fit by rounding only; issue 43).  Raises
    :class:`CalibrationFitError` with the reason if the objective becomes non-finite, or if
    L-BFGS uses up its budget (``max_iter`` iterations or ``1.25 * max_iter`` evaluations) with
    the gradient still above ``GRAD_TOL``; ``hint`` (e.g. why the objective may have no finite
    minimiser) is added to that message.
    """
    opt = torch.optim.LBFGS(
        params, lr=1.0, max_iter=max_iter, tolerance_grad=GRAD_TOL, tolerance_change=1e-14,
        history_size=20, line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        return objective(True)

    with torch.enable_grad():
        with torch.no_grad():
            start = float(objective(False))
        opt.step(closure)
        state = opt.state[opt.param_groups[0]["params"][0]]
        n_iter, n_eval = state.get("n_iter", 0), state.get("func_evals", 0)
        opt.zero_grad(set_to_none=False)
        loss = objective(True)
        grads = [p.grad for p in params]
    end = float(loss.detach())
    if not math.isfinite(end):
        raise CalibrationFitError(
            f"{name} failed: L-BFGS reached a non-finite validation objective ({end!r}) after "
            f"{n_iter} iterations"
        )
    grad = max(float(g.abs().max()) for g in grads)
    max_eval = opt.param_groups[0]["max_eval"]
    if (n_iter >= max_iter or n_eval >= max_eval) and not grad <= GRAD_TOL:
        raise CalibrationFitError(
            f"{name} failed: L-BFGS used its budget ({n_iter} iterations, {n_eval} function "
            f"evaluations; max_iter={max_iter}) with the validation NLL gradient still "
            f"{grad:.3g} (> {GRAD_TOL:g}){hint}; increase `max_iter`"
        )
    return start, end


def backtrack(objective: Any, theta: torch.Tensor, f: float, step: torch.Tensor, slope: float
              ) -> tuple[torch.Tensor, float] | None:
    """Armijo backtracking along ``-step`` from ``theta`` (objective value ``f``; ``slope`` the
    directional derivative ``<grad, step>``) for the damped Newton fits.

    Returns the first ``(theta - t step, value)`` with ``t = 1, 1/2, ...`` that decreases
    ``objective`` strictly and by at least ``1e-4 t slope``, or ``None`` when no ``t`` down to
    ``1e-12`` does: the minimum is then reached to rounding (a non-strict test would accept
    equal values forever).
    """
    t = 1.0
    while t > 1e-12:
        cand = theta - t * step
        f_new = objective(cand)
        if f_new < f and f_new <= f - 1e-4 * t * slope:
            return cand, f_new
        t /= 2
    return None


#: Seed of :func:`cv_folds`'s permutation (the same data give the same folds).
CV_SEED = 0


def cv_folds(n: int, k: int, device: Any = None) -> list[torch.Tensor]:
    """``k`` disjoint index sets covering ``range(n)``: a fixed permutation (seed ``CV_SEED``)
    dealt round-robin, so fold sizes differ by at most one.  The folds of the calibrators'
    cross-validation (``lam="cv"``) and of ``torchcal calibrate``'s held-out numbers.

    >>> [f.tolist() for f in cv_folds(5, 2)]
    [[4, 1, 2], [0, 3]]
    """
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(CV_SEED))
    return [perm[i::k].to(device) for i in range(k)]


def absent_classes(y: torch.Tensor, c: int) -> list[int]:
    """The class indices in [0, C) that never occur in ``y``."""
    return (torch.bincount(y, minlength=c) == 0).nonzero().flatten().tolist()


def describe_classes(classes: list[int]) -> str:
    """``"0, 3, 7"`` (the first ten, then ``...``)."""
    return ", ".join(map(str, classes[:10])) + (", ..." if len(classes) > 10 else "")


def _same(a: Any, b: Any) -> bool:
    """Whether two setting values are equal (False when they cannot be compared)."""
    if a is b:
        return True
    try:
        return bool(a == b) and type(a) is type(b)
    except (TypeError, ValueError, RuntimeError):
        return False


class Estimator:
    """scikit-learn's estimator contract shared by the calibrators and the conformal predictor.

    ``get_params`` / ``set_params`` as :class:`sklearn.base.BaseEstimator`'s (so
    ``sklearn.base.clone``, ``Pipeline`` and ``GridSearchCV`` work): every constructor stores
    its arguments unchanged under their own names, after checking them, and ``fit`` checks
    them again (``set_params`` does not).  Learned attributes end in ``_``; using an unfitted
    estimator raises :class:`torchcal.errors.NotFittedError` (a ``ValueError`` and an
    ``AttributeError``, as scikit-learn's own).  Written here rather than inherited from
    ``BaseEstimator`` so that importing the calibrators imports no scikit-learn (2 s of CPU in
    every process that evaluates a run, issue 43); scikit-learn is imported only by the
    methods that only scikit-learn calls (``__sklearn_tags__``) and by the calibrators that
    use it (isotonic regression, the conformal predictor's random state).
    """

    _fitted_attr: str = ""

    @classmethod
    def _get_param_names(cls) -> list[str]:
        """The constructor's argument names, sorted (scikit-learn's rule: no ``*args``)."""
        init = cls.__init__
        if init is object.__init__:
            return []
        params = [p for p in inspect.signature(init).parameters.values()
                  if p.name != "self" and p.kind != p.VAR_KEYWORD]
        if any(p.kind == p.VAR_POSITIONAL for p in params):
            raise RuntimeError(f"{cls.__name__}'s constructor takes *args: scikit-learn's "
                               "estimators must name every setting")
        return sorted(p.name for p in params)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The settings by name (scikit-learn's ``get_params``; ``deep``: also those of nested
        estimators, as ``name__setting``)."""
        out: dict[str, Any] = {}
        for key in self._get_param_names():
            value = getattr(self, key)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                out.update((f"{key}__{k}", v) for k, v in value.get_params().items())
            out[key] = value
        return out

    def _set_params(self, **params: Any) -> Estimator:
        """scikit-learn's ``set_params``: names checked, nested ``name__setting`` passed on."""
        if not params:
            return self
        valid = self.get_params(deep=True)
        nested: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            key, delim, sub_key = key.partition("__")
            if key not in valid:
                raise ValueError(f"Invalid parameter {key!r} for estimator {self}. "
                                 f"Valid parameters are: {self._get_param_names()!r}.")
            if delim:
                nested.setdefault(key, {})[sub_key] = value
            else:
                setattr(self, key, value)
                valid[key] = value
        for key, sub_params in nested.items():
            valid[key].set_params(**sub_params)
        return self

    def __sklearn_tags__(self) -> Any:
        """scikit-learn's tags (``BaseEstimator``'s defaults): ``fit`` needs the labels
        (``target_tags.required``)."""
        # deferred: only scikit-learn calls this, and scikit-learn's import costs 2 s of CPU
        from sklearn.utils import Tags, TargetTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=True),
                    transformer_tags=None, regressor_tags=None, classifier_tags=None)

    def __sklearn_is_fitted__(self) -> bool:
        return self.is_fitted

    @property
    def is_fitted(self) -> bool:
        """Whether ``fit`` (or ``from_dict``) has set the learned attributes."""
        return getattr(self, self._fitted_attr, None) is not None

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            name = type(self).__name__
            if self.__dict__.get("_refit_needed"):
                raise not_fitted_error(
                    f"This {name} instance's settings were changed by `set_params` after "
                    "`fit`, so its fitted state was dropped; call `fit(logits, labels)` again"
                )
            raise not_fitted_error(
                f"This {name} instance is not fitted yet; call `fit(logits, labels)` before "
                "using it"
            )

    def set_params(self, **params: Any) -> Estimator:
        """Set settings (scikit-learn's ``set_params``), checked as the constructor checks
        them, before any is changed.  On a fitted estimator a changed setting drops the fitted
        state: using it raises :class:`~torchcal.errors.NotFittedError` until ``fit`` runs
        again (a fitted threshold or map never silently serves other settings)."""
        current = self.get_params(deep=False)
        if not params or any(k not in current for k in params):
            return self._set_params(**params)  # scikit-learn's error for unknown names
        type(self)(**{**current, **params})  # raises on a bad value; nothing changed yet
        changed = [k for k, v in params.items() if not _same(current[k], v)]
        self._set_params(**params)
        if changed and self.is_fitted:
            setattr(self, self._fitted_attr, None)
            self.__dict__["_refit_needed"] = True
        return self

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

    def _header(self) -> dict[str, Any]:
        """The ``type`` / ``version`` / settings part of ``to_dict`` (JSON-safe)."""
        return {"type": type(self).__name__, "version": _SCHEMA_VERSION,
                **self.get_params(deep=False)}

    def __repr__(self, N_CHAR_MAX: int = 700) -> str:  # noqa: N803 - BaseEstimator's signature
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params(deep=False).items())
        return f"{type(self).__name__}({params})"


class Calibrator(Estimator):
    """Base of the post-hoc calibrators (scikit-learn's estimator contract).

    The constructor stores settings; :meth:`fit` learns attributes ending in ``_`` and returns
    ``self``; :meth:`transform` maps logits to calibrated logits and :meth:`predict_proba` to
    probabilities; :meth:`score` is the mean log-likelihood (higher is better, what
    ``GridSearchCV`` maximises); :meth:`to_dict` / ``from_dict`` round-trip through JSON.
    Torch tensors in give tensors out (same device and dtype); NumPy arrays in give NumPy
    arrays out.  Subclasses implement :meth:`_transform` (and :meth:`_predict_proba` when the
    probabilities come first) on validated tensors.
    """

    def __sklearn_tags__(self) -> Any:
        """scikit-learn's tags: a transformer (logits to calibrated logits) needing labels."""
        from sklearn.utils import TransformerTags  # sklearn >= 1.6, only for the checks

        tags = super().__sklearn_tags__()
        tags.transformer_tags = TransformerTags()
        return tags

    #: Whether ``fit`` takes dense (N, C, d1, ...) and token (N, T, C) layouts with
    #: ``ignore_index`` (every calibrator does: it is fitted on the kept rows).
    supports_dense: bool = True
    #: Whether ``fit`` takes ``sample_weight`` (every calibrator does).
    supports_sample_weight: bool = True
    #: Whether ``predict_proba`` may change the arg-max of the logits (the predicted class).
    #: False for the maps that keep the ranking (temperature) or calibrate the top label's
    #: confidence (histogram binning, top-label isotonic / Platt / beta); True for the maps
    #: whose definition changes it (vector, matrix, Dirichlet, one-vs-rest isotonic, binary
    #: Platt / beta on class 1).
    changes_argmax: bool = False

    def fit(self, logits: Any, labels: Any, *, sample_weight: Any = None,
            ignore_index: Any = IGNORE_INDEX, class_axis: Any = None) -> Calibrator:
        """Fit on validation ``logits`` and ``labels``; returns ``self``.

        Args:
            logits: (N, C) logits with (N,) labels; dense (N, C, d1, ...) logits with (N, d1,
                ...) labels (``F.cross_entropy``'s layout: segmentation); or token logits
                (N, T, C) with (N, T) labels (a language model's).  The calibrator is fitted on
                the kept rows, exactly as on those rows flattened to (M, C).
            labels: integer class indices.
            sample_weight: optional non-negative weights of the labels' shape
                (scikit-learn's convention: an integer weight k counts a row k times; weight 0
                drops it), e.g. importance weights under shift.
            ignore_index: label value whose rows are ignored (default -100; None keeps all).
            class_axis: 1 or -1 to name the class axis of 3-D or higher input when the
                labels' shape leaves it ambiguous (default: from the labels' shape).
        """
        z, y, w, axis = prepare_fit_weighted(logits, labels, ignore_index=ignore_index,
                                             sample_weight=sample_weight, class_axis=class_axis)
        self._fit(z, y, w)
        self.class_axis_ = axis
        return self

    def _fit(self, z: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None
             ) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _transform(self, z: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _predict_proba(self, z: torch.Tensor) -> torch.Tensor:
        zt = self._transform(z)
        return torch.softmax(zt.to(work_dtype(zt.dtype)), dim=1).to(zt.dtype)

    def _axis(self, z: torch.Tensor, class_axis: Any) -> int:
        return dense_axis(z, class_axis, fitted_axis=self.__dict__.get("class_axis_"),
                          n_classes=self.__dict__.get("n_classes_"))

    def transform(self, logits: Any, *, class_axis: Any = None) -> Any:
        """Calibrated logits of the input's shape ((N, C), (N, C, d1, ...) or (N, T, C)), dtype
        and device (NumPy for NumPy input)."""
        self._check_fitted()
        z = check_dense_logits(logits)
        return like_input(apply_rows(self._transform, z,
                                     self._axis(z, class_axis)), logits)

    def predict_proba(self, logits: Any, *, class_axis: Any = None) -> Any:
        """Calibrated probabilities of the input's shape ((N, C), (N, C, d1, ...) with the
        classes on axis 1, or (N, T, C)), computed in at least float32 and returned in the
        logits' floating dtype (NumPy for NumPy input); dense input is processed in chunks of
        rows."""
        self._check_fitted()
        z = check_dense_logits(logits)
        return like_input(apply_rows(self._predict_proba, z,
                                     self._axis(z, class_axis)), logits)

    def fit_transform(self, logits: Any, labels: Any, **fit_params: Any) -> Any:
        """``fit(logits, labels, **fit_params).transform(logits)``."""
        return self.fit(logits, labels, **fit_params).transform(
            logits, class_axis=fit_params.get("class_axis"))

    def score(self, logits: Any, labels: Any, *, sample_weight: Any = None,
              ignore_index: Any = IGNORE_INDEX) -> float:
        """Mean log-likelihood ``(1/N) sum_i log q_{i, y_i}`` of the labels under the calibrated
        probabilities (the negative NLL, float64; weighted by ``sample_weight``; dense layouts
        and ``ignore_index`` as :meth:`fit`): higher is better, so ``GridSearchCV`` can
        tune a calibrator's settings without a ``scoring`` argument.

        Warns (:class:`WorseThanIdentityWarning`) when this NLL is worse than the uncalibrated
        probabilities' on the same data by more than 1 % (``IDENTITY_MARGIN``): on held-out
        data, the sign that the calibrator over-fits its validation set."""
        self._check_fitted()
        rows, yr, w, _ = fit_rows(logits, labels, ignore_index=ignore_index,
                                  sample_weight=sample_weight)
        z = prepare_logits(rows)
        y = check_labels(yr, n=z.shape[0], num_classes=z.shape[1], device=z.device)
        return -self._nll_vs_identity(z, y, "scored (held-out)", w)

    def _nll_vs_identity(self, z: torch.Tensor, y: torch.Tensor, where: str,
                         w: torch.Tensor | None = None) -> float:
        """The calibrated NLL of validated ``z``/``y`` (weighted by ``w``); warns when it is
        worse than the identity map's (:func:`identity_check`).  Chunked over rows."""
        chunks = row_chunks(z.shape[0], z.shape[1])
        if len(chunks) == 1 and w is None:
            logq = torch.log_softmax(self._transform(z).to(torch.float64), dim=1)
            nll = -float(logq.gather(1, y.unsqueeze(1)).mean())
            logp = torch.log_softmax(z.to(torch.float64), dim=1)
            nll_id = -float(logp.gather(1, y.unsqueeze(1)).mean())
        else:
            tot = tot_id = 0.0
            for sl in chunks:
                yc = y[sl].unsqueeze(1)
                wc = None if w is None else w[sl]
                lq = torch.log_softmax(self._transform(z[sl]).to(torch.float64), 1).gather(1, yc)
                lp = torch.log_softmax(z[sl].to(torch.float64), 1).gather(1, yc)
                tot += float(lq.sum() if wc is None else (lq.squeeze(1) * wc).sum())
                tot_id += float(lp.sum() if wc is None else (lp.squeeze(1) * wc).sum())
            total_w = float(z.shape[0]) if w is None else float(w.sum())
            nll, nll_id = -tot / total_w, -tot_id / total_w
        identity_check(type(self).__name__, nll, nll_id, where)
        return nll

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

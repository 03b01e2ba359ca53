"""Input conversion and validation shared by metrics, losses and calibrators.

One message style everywhere (torchmetrics'): ``Expected `name` to be ..., got ...``.
Nothing here calls ``.item()`` on a large tensor except to build an error message after a
check has already failed (the checks themselves reduce to one boolean per condition).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import numpy as np
import torch

__all__ = [
    "check_scalar",
    "Interval",
    "Options",
    "SequenceOf",
    "as_tensor",
    "check_positive_int",
    "check_nonneg_finite",
    "check_finite",
    "check_labels",
    "check_logits",
    "resolve_probs",
    "METRIC_RANGES",
    "metric_value_problem",
    "with_settings",
]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def as_tensor(x: Any, name: str, *, device: torch.device | str | None = None) -> torch.Tensor:
    """Convert a NumPy array, torch tensor or (nested) sequence to a tensor, without copying
    when possible. ``device`` moves the result (default: keep the input's device)."""
    if isinstance(x, torch.Tensor):
        t = x
    elif isinstance(x, np.ndarray):
        if x.dtype == np.float16 or np.issubdtype(x.dtype, np.floating) or np.issubdtype(
            x.dtype, np.integer
        ) or x.dtype == np.bool_:
            t = torch.from_numpy(np.ascontiguousarray(x))
        else:
            raise TypeError(f"Expected `{name}` to be a numeric array, got dtype {x.dtype}")
    elif isinstance(x, (list, tuple)):
        t = torch.as_tensor(np.asarray(x))
    else:
        raise TypeError(
            f"Expected `{name}` to be a torch.Tensor or numpy.ndarray, got {type(x).__name__}"
        )
    if device is not None:
        t = t.to(device)
    return t


_BOUNDARIES = {"both": (True, True), "left": (True, False), "right": (False, True),
               "neither": (False, False)}


def _describe(target_type: type, min_val: float | None, max_val: float | None,
              closed: tuple[bool, bool]) -> str:
    """The ``expected`` text of :func:`check_scalar`: "a positive integer", "in [0, 1)", ..."""
    if min_val is not None and max_val is not None:
        return (f"{'an integer' if target_type is int else 'a number'} in "
                f"{'[' if closed[0] else '('}{min_val:g}, {max_val:g}{']' if closed[1] else ')'}")
    if target_type is int:
        if max_val is None and min_val in (0, 1) and closed[0]:
            return "a positive integer" if min_val == 1 else "a non-negative integer"
        base = "an integer"
    else:
        if max_val is None and min_val == 0:
            return "a finite non-negative number" if closed[0] else "a finite number > 0"
        base = "a finite number"
    if min_val is not None:
        return f"{base} {'>=' if closed[0] else '>'} {min_val:g}"
    if max_val is not None:
        return f"{base} {'<=' if closed[1] else '<'} {max_val:g}"
    return base


def check_scalar(value: Any, name: str, target_type: type = float, *,
                 min_val: float | None = None, max_val: float | None = None,
                 include_boundaries: str = "both", allow_none: bool = False,
                 expected: str | None = None) -> Any:
    """Validate a scalar parameter and return it as ``target_type`` (after scikit-learn's
    ``check_scalar``): the one parametrised check behind every hyperparameter of the library.

    Args:
        value: the parameter.  Booleans are never numbers here; for ``float`` a 0-d tensor that
            needs no gradient is read as its value, and NaN / Inf are refused.
        name: the argument's name, for the message.
        target_type: ``int`` (any integral number) or ``float`` (any finite real number).
        min_val, max_val: the bounds (None: unbounded).
        include_boundaries: which bounds are allowed values: ``"both"``, ``"left"``,
            ``"right"`` or ``"neither"``.
        allow_none: ``None`` passes (and is returned).
        expected: the message's description of a valid value (default: from the bounds, e.g.
            "a positive integer", "a finite non-negative number", "in [0, 1)").

    Raises:
        ValueError: ``Expected `name` to be <expected>, got <value>``.

    >>> check_scalar(3, "n_bins", int, min_val=1), check_scalar(0.5, "alpha", max_val=1.0,
    ...                                                         min_val=0.0)
    (3, 0.5)
    >>> check_scalar(0, "n_bins", int, min_val=1)
    Traceback (most recent call last):
    ...
    ValueError: Expected `n_bins` to be a positive integer, got 0
    """
    if target_type not in (int, float):
        raise TypeError(f"Expected `target_type` to be int or float, got {target_type!r}")
    if include_boundaries not in _BOUNDARIES:
        raise ValueError(f"Expected `include_boundaries` to be one of {tuple(_BOUNDARIES)}, "
                         f"got {include_boundaries!r}")
    if value is None and allow_none:
        return None
    closed = _BOUNDARIES[include_boundaries]
    v = value
    if target_type is float and isinstance(v, torch.Tensor) and v.ndim == 0 \
            and not v.requires_grad:
        v = v.item()
    kind = numbers.Integral if target_type is int else numbers.Real
    ok = not isinstance(v, bool) and isinstance(v, kind)
    if ok:
        v = target_type(v)
        ok = (math.isfinite(v)
              and (min_val is None or (v >= min_val if closed[0] else v > min_val))
              and (max_val is None or (v <= max_val if closed[1] else v < max_val)))
    if not ok:
        what = expected or _describe(target_type, min_val, max_val, closed)
        raise ValueError(f"Expected `{name}` to be {what}{' or None' if allow_none else ''}, "
                         f"got {value!r}")
    return v


class Interval:
    """A number constraint, :func:`check_scalar` with its bounds fixed (scikit-learn's
    ``Interval``): called as ``constraint(value, name)`` it returns the checked value.

    Args:
        target_type: ``int`` or ``float``.
        left, right: the bounds (None: unbounded).
        closed: which bounds are allowed values: ``"both"``, ``"left"``, ``"right"`` or
            ``"neither"``.
        allow_none: ``None`` passes.

    >>> Interval(float, 0, None, closed="left")(2, "gamma")
    2.0
    >>> Interval(int, 1, None)(0, "n_bins")
    Traceback (most recent call last):
    ...
    ValueError: Expected `n_bins` to be a positive integer, got 0
    """

    def __init__(self, target_type: type, left: float | None, right: float | None, *,
                 closed: str = "both", allow_none: bool = False) -> None:
        if target_type not in (int, float):
            raise TypeError(f"Expected `target_type` to be int or float, got {target_type!r}")
        if closed not in _BOUNDARIES:
            raise ValueError(f"Expected `closed` to be one of {tuple(_BOUNDARIES)}, "
                             f"got {closed!r}")
        self.target_type, self.left, self.right = target_type, left, right
        self.closed, self.allow_none = closed, allow_none

    def __call__(self, value: Any, name: str) -> Any:
        return check_scalar(value, name, self.target_type, min_val=self.left,
                            max_val=self.right, include_boundaries=self.closed,
                            allow_none=self.allow_none)

    def __repr__(self) -> str:
        none = ", allow_none=True" if self.allow_none else ""
        return (f"Interval({self.target_type.__name__}, {self.left!r}, {self.right!r}, "
                f"closed={self.closed!r}{none})")


class Options:
    """A choice constraint: the value must be one of ``values`` (scikit-learn's ``StrOptions``).

    >>> Options(("ece", "nll"))("nll", "criterion")
    'nll'
    >>> Options((True, False))(1, "cross_entropy")
    Traceback (most recent call last):
    ...
    ValueError: Expected `cross_entropy` to be one of (True, False), got 1
    """

    def __init__(self, values: tuple[Any, ...]) -> None:
        self.values = tuple(values)

    def __call__(self, value: Any, name: str) -> Any:
        # identity and type as well as equality: 1 is not True, 1.0 is not "1"
        if not any(value is v or (type(value) is type(v) and value == v) for v in self.values):
            raise ValueError(f"Expected `{name}` to be one of {self.values}, got {value!r}")
        return value

    def __repr__(self) -> str:
        return f"Options({self.values!r})"


class SequenceOf:
    """A sequence constraint: every item passes ``item`` (e.g. an :class:`Interval`); returns
    the checked items as a tuple.

    >>> SequenceOf(Interval(int, 0, None))([100, 250], "milestones")
    (100, 250)
    >>> SequenceOf(Interval(float, 0, None))(5, "gammas")
    Traceback (most recent call last):
    ...
    ValueError: Expected `gammas` to be a sequence, got 5
    """

    def __init__(self, item: Any) -> None:
        self.item = item

    def __call__(self, value: Any, name: str) -> tuple[Any, ...]:
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise ValueError(f"Expected `{name}` to be a sequence, got {value!r}")
        return tuple(self.item(v, name) for v in value)

    def __repr__(self) -> str:
        return f"SequenceOf({self.item!r})"


def check_positive_int(value: Any, name: str) -> int:
    """Return ``value`` as int if it is a positive integer, else raise ValueError."""
    return check_scalar(value, name, int, min_val=1)


def check_nonneg_finite(value: Any, name: str) -> float:
    """Return ``value`` as float if it is a finite number >= 0, else raise ValueError."""
    return check_scalar(value, name, float, min_val=0.0)


def check_alpha(alpha: Any, name: str = "alpha") -> float:
    """Return ``alpha`` as a float when it is a real number in the open interval (0, 1) (a
    miscoverage or risk level), else raise ValueError naming ``name``.

    >>> check_alpha(0.1)
    0.1
    """
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 < alpha < 1:
        raise ValueError(f"Expected `{name}` to be a number in (0, 1), got {alpha!r}")
    return float(alpha)


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise ValueError if ``t`` holds NaN or Inf."""
    if not t.is_floating_point() or t.numel() == 0:
        return
    # One cheap pass: NaN propagates through min/max and +-Inf shows up in them.
    lo, hi = torch.aminmax(t)
    if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
        n_bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"Expected `{name}` to be finite, found {n_bad} NaN/Inf value(s)")


def check_logits(x: Any, name: str = "logits", *, min_classes: int = 2,
                 finite: bool = True) -> torch.Tensor:
    """Validate scores of shape (N, C) (logits, or probabilities with ``finite=False``): a
    floating dtype, 2-D, non-empty, at least ``min_classes`` columns and, with ``finite``, no
    NaN/Inf.  Returns the input as a tensor (:func:`as_tensor`, no copy).

    >>> check_logits([[0.0, 1.0]]).shape
    torch.Size([1, 2])
    >>> check_logits([[0.0], [1.0]])
    Traceback (most recent call last):
    ...
    ValueError: Expected `logits` to have at least 2 classes (columns), got 1
    """
    t = as_tensor(x, name)
    if not t.is_floating_point():
        raise TypeError(f"Expected `{name}` to have a floating dtype, got {t.dtype}")
    if t.ndim != 2:
        raise ValueError(f"Expected `{name}` to be 2-D of shape (N, C), got shape {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError(f"Expected `{name}` to be non-empty, got shape {tuple(t.shape)}")
    if t.shape[1] < min_classes:
        raise ValueError(
            f"Expected `{name}` to have at least {min_classes} classes (columns), got {t.shape[1]}"
        )
    if finite:
        check_finite(t.detach(), name)
    return t


def check_labels(
    labels: Any, *, n: int | None, num_classes: int | None, name: str = "labels",
    device: torch.device | None = None,
) -> torch.Tensor:
    """Validate class-index labels: integer dtype, 1-D, length ``n``, values in [0, C).

    Returns an int64 tensor on ``device`` (default: the labels' own device).
    """
    t = as_tensor(labels, name)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"Expected `{name}` to have an integer dtype, got {t.dtype}")
    if t.ndim != 1:
        raise ValueError(f"Expected `{name}` to be 1-D of shape (N,), got shape {tuple(t.shape)}")
    if n is not None and t.shape[0] != n:
        raise ValueError(
            f"Expected `{name}` to have {n} entries (one per row of the predictions), got {t.shape[0]}"
        )
    if device is not None:
        t = t.to(device)
    t = t.long()
    if t.numel() and num_classes is not None:
        lo, hi = torch.aminmax(t)  # one pass and one host sync for both bounds
        if bool((lo < 0) | (hi >= num_classes)):
            raise ValueError(
                f"Expected `{name}` to be in [0, {num_classes - 1}], "
                f"got values in [{int(lo)}, {int(hi)}]"
            )
    return t


def resolve_probs(
    logits: Any = None,
    probs: Any = None,
    *,
    atol: float = 1e-3,
    validate_args: bool = True,
    min_classes: int = 2,
) -> torch.Tensor:
    """Return class probabilities of shape (N, C) from exactly one of ``logits`` / ``probs``.

    The value range is never used to guess which was passed.  Logits are turned into
    probabilities by ``softmax`` computed in at least float32 and returned in the logits' own
    floating dtype (so equal-width bin edges follow the caller's dtype).  Integer inputs are
    rejected.  With ``validate_args`` the probabilities are checked to lie in [0, 1] with rows
    summing to 1 within ``max(atol, eps)`` (``eps`` of the probabilities' dtype: rounding valid
    probabilities to bfloat16 moves a row sum by up to ``eps / 2``); both inputs are checked
    for NaN/Inf and emptiness.
    """
    if (logits is None) == (probs is None):
        raise ValueError(
            "Expected exactly one of `logits` or `probs`, got "
            + ("both" if logits is not None else "neither")
        )
    name = "logits" if logits is not None else "probs"
    t = check_logits(logits if logits is not None else probs, name, min_classes=min_classes,
                     finite=validate_args and logits is not None)
    if logits is not None:
        work = t if t.dtype in (torch.float32, torch.float64) else t.float()
        return torch.softmax(work, dim=1).to(t.dtype)
    if validate_args:
        lo, hi = torch.aminmax(t)  # one pass for the finite and the range checks
        if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
            check_finite(t, name)
        if bool((lo < 0) | (hi > 1)):
            raise ValueError(
                f"Expected `probs` to lie in [0, 1], got values in [{float(lo):.6g}, {float(hi):.6g}]"
                " (pass `logits=` for unnormalised scores)"
            )
        # float32 accumulation is ample for a 1e-3 tolerance and avoids a float64 copy; the
        # smallest and largest row sums (one small pass) decide, compared in float64.
        sums = t.sum(dim=1, dtype=torch.promote_types(t.dtype, torch.float32))
        s_lo, s_hi = (v.double() for v in torch.aminmax(sums))
        tol = max(atol, torch.finfo(t.dtype).eps)
        if bool(torch.maximum(1 - s_lo, s_hi - 1) > tol):
            worst = s_lo if bool(1 - s_lo >= s_hi - 1) else s_hi
            raise ValueError(
                f"Expected each row of `probs` to sum to 1 (tolerance {tol:.3g}), "
                f"found a row summing to {float(worst):.6g}"
            )
    return t


#: The possible values of each metric torchcal writes (``results.json``, ``torchcal calibrate``'s
#: output): a value outside its range cannot come from a real evaluation.  OOD scores (names
#: holding ``auroc``, ``aupr`` or ``fpr``) lie in [0, 1] too.
METRIC_RANGES: dict[str, tuple[float, float]] = {
    **dict.fromkeys(("ece", "adaptive_ece", "classwise_ece", "mce", "rmsce", "error",
                     "topk_error", "s99_share", "s99_accuracy"), (0.0, 1.0)),
    "nll": (0.0, math.inf),
    "brier": (0.0, 2.0),
}
_UNIT_PARTS = ("auroc", "aupr", "fpr")


def metric_value_problem(name: str, value: Any) -> str:
    """What is impossible about the metric value ``value`` of metric ``name`` ('' if nothing).

    ``None`` (a metric that is undefined, written as ``null``) is fine; anything else must be a
    finite number (not a bool) within the metric's range (:data:`METRIC_RANGES`).

    >>> metric_value_problem("ece", 0.02), metric_value_problem("error", 7.0)
    ('', 'expected `error` to be a number in [0, 1], got 7.0')
    """
    if value is None:
        return ""
    lo, hi = METRIC_RANGES.get(name, (0.0, 1.0) if any(
        part in name for part in _UNIT_PARTS) else (-math.inf, math.inf))
    span = f"[{lo:g}, {hi:g}]" if math.isfinite(hi) else f">= {lo:g}"
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value)):
        return f"expected `{name}` to be a finite number, got {value!r}"
    if not lo <= value <= hi:
        return f"expected `{name}` to be a number {'in ' if math.isfinite(hi) else ''}{span}, got {value!r}"
    return ""


def with_settings(options: Any, default: Any, settings: dict[str, Any], where: str) -> Any:
    """``options`` (``None``: ``default``), a frozen dataclass, with the fields that the keyword
    ``settings`` name replaced: how a function that takes an options object (``build_report(...,
    options=ReportOptions(...))``) keeps its keyword form (``build_report(..., n_bins=10)``),
    the keywords winning over ``options``.

    Raises:
        TypeError: ``options`` is not of ``default``'s type, or a keyword names no field (the
            message Python gives an unexpected keyword argument of ``where``).

    >>> import dataclasses
    >>> @dataclasses.dataclass(frozen=True)
    ... class Opts:
    ...     n: int = 1
    ...     s: str = "a"
    >>> with_settings(Opts(n=2), Opts(), {"s": "b"}, "f")
    Opts(n=2, s='b')
    >>> with_settings(None, Opts(), {"m": 3}, "f")
    Traceback (most recent call last):
    TypeError: f() got an unexpected keyword argument 'm'
    """
    kind = type(default)
    if options is None:
        options = default
    elif not isinstance(options, kind):
        raise TypeError(f"Expected `options` of {where}() to be a {kind.__name__}, got "
                        f"{type(options).__name__}")
    fields = {f.name for f in dataclasses.fields(kind)}
    unknown = [name for name in settings if name not in fields]
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")
    return dataclasses.replace(options, **settings) if settings else options

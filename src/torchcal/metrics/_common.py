"""Private helpers shared by the metric modules and the meter (one implementation each).

Every per-bin quantity is a float64 sum (``torch.bincount`` / ``index_add_``) so that the
functional metrics, the bootstrap and the streaming meter add up exactly the same numbers.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .._validation import as_tensor, check_labels, check_scalar, resolve_probs

# the per-bin sums live in binning.py (public, used by the losses); imported here for the
# metric modules that take every shared helper from this module
from .binning import binned_sums, calibration_from_sums, classwise_sums  # noqa: F401

_F = TypeVar("_F", bound=Callable[..., Any])


def keyword_inputs(fn: _F) -> _F:
    """Give a metric called with positional inputs (``ece(z, y)``) an error that says how to
    call it, instead of Python's "takes 0 positional arguments": the metrics take their inputs
    by keyword so that logits are never mistaken for probabilities."""

    name = fn.__name__
    labels = "labels" in fn.__code__.co_varnames[:fn.__code__.co_kwonlyargcount]
    example = f"{name}(logits=z, labels=y)" if labels else f"{name}(logits=z)"
    hint = (f"{name}() takes its inputs by keyword: pass `logits=` (scores) or `probs=` "
            f"(probabilities){', and `labels=`' if labels else ''}, e.g. {example}")

    @functools.wraps(fn)
    def metric(*args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError(f"{hint}; got {len(args)} positional argument(s)")
        return fn(**kwargs)

    return metric  # type: ignore[return-value]


def result_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of a metric's result: the input's float dtype, at least float32."""
    return torch.promote_types(dtype, torch.float32)


_STACK_HINT = {
    "probs": "for a binary problem with class-1 probabilities `p` of shape (N,), pass "
             "`probs=torch.stack([1 - p, p], dim=1)` of shape (N, 2)",
    "logits": "for a binary problem with one logit `z` (log-odds of class 1) per sample, pass "
              "`logits=torch.stack([torch.zeros_like(z), z], dim=1)` of shape (N, 2)",
}


def resolve(logits: Any, probs: Any, *, validate_args: bool = True) -> torch.Tensor:
    """Probabilities (N, C) from exactly one of ``logits`` / ``probs`` (the metrics' entry).

    :func:`torchcal._validation.resolve_probs` plus three rules of the metrics:

    * a 1-D float input (binary scores of shape (N,)) is refused with a hint to stack it into
      (N, 2);
    * logits may hold ``-inf`` (a masked class: probability 0), as the losses accept, as long
      as every row has a finite entry; NaN and ``+inf`` are refused;
    * logits that already look like probabilities (every entry in [0, 1] and every row summing
      to 1 within ``max(1e-3, eps)``) give a :class:`UserWarning`: softmax of probabilities is
      a much flatter distribution, so every metric would be silently wrong.  Python's warning
      filter shows it once per calling line.
    """
    name = "logits" if logits is not None else "probs"
    x = logits if logits is not None else probs
    if (logits is None) != (probs is None):  # else resolve_probs reports "both" / "neither"
        t = as_tensor(x, name)
        if t.ndim == 1 and t.is_floating_point():
            raise ValueError(
                f"Expected `{name}` to be 2-D of shape (N, C), got shape {tuple(t.shape)}; "
                + _STACK_HINT[name]
            )
        if logits is not None and validate_args:
            _check_logits(t)
            return resolve_probs(logits=t, validate_args=False)
    return resolve_probs(logits, probs, validate_args=validate_args)


def _check_logits(t: torch.Tensor) -> None:
    """NaN / +inf refused, rows of only -inf refused, probability-like logits warned about."""
    if not (t.is_floating_point() and t.ndim == 2 and t.numel()):
        return  # resolve_probs reports dtype / shape / emptiness
    lo, hi = torch.aminmax(t)
    if bool(torch.isnan(lo) | torch.isnan(hi) | (hi == float("inf"))):
        n_bad = int((torch.isnan(t) | (t == float("inf"))).sum())
        raise ValueError(
            f"Expected `logits` to be finite, found {n_bad} NaN/Inf value(s) (only -inf, a "
            "masked class, is allowed)"
        )
    if bool(lo == float("-inf")):
        dead = t.amax(dim=1) == float("-inf")
        if bool(dead.any()):
            row = int(dead.nonzero()[0, 0])
            raise ValueError(
                f"Expected every row of `logits` to have a finite entry, but every class of row "
                f"{row} is masked (-inf)"
            )
    else:
        warn_if_probabilities(t, lo=lo, hi=hi)


def warn_if_probabilities(t: torch.Tensor, *, lo: torch.Tensor | None = None,
                          hi: torch.Tensor | None = None, name: str = "logits",
                          what: str = "the metric",
                          instead: str = "Pass them as `probs=` instead.") -> None:
    """Warn (:class:`UserWarning`, pointing at the user's line) when the logits ``t`` (N, C)
    look like probabilities: every entry in [0, 1] and every row summing to 1 within
    ``max(1e-3, eps)``.  Softmax of probabilities is a much flatter distribution, so whatever
    uses them (``what``) would be silently wrong.  ``lo``/``hi``: ``t``'s extremes if known."""
    if lo is None or hi is None:
        lo, hi = torch.aminmax(t.detach())
    if not bool((lo >= 0) & (hi <= 1)):
        return
    sums = t.detach().sum(dim=1, dtype=torch.promote_types(t.dtype, torch.float32))
    tol = max(1e-3, torch.finfo(t.dtype).eps)
    if bool(((sums.double() - 1).abs() <= tol).all()):
        warnings.warn(
            f"`{name}` look like probabilities (every entry in [0, 1] and every row summing "
            f"to 1): they are passed through softmax, which flattens them and makes {what} "
            f"wrong. {instead}",
            UserWarning,
            stacklevel=_caller_stacklevel(),
        )


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _caller_stacklevel() -> int:
    """``stacklevel`` of the first frame outside torchcal, relative to the caller of this
    function's caller (so a warning points at the user's line whatever the call depth)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


def prepare(
    logits: Any, probs: Any, labels: Any, *, validate_args: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities (N, C) and int64 labels (N,) on the probabilities' device (see
    :func:`resolve` for the input rules)."""
    p = resolve(logits, probs, validate_args=validate_args)
    y = check_labels(labels, n=p.shape[0], num_classes=p.shape[1], device=p.device)
    return p, y


def top1(p: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-1 confidence (N,) in ``p``'s dtype and correctness (N,) bool."""
    conf, pred = p.max(dim=1)
    return conf, pred.eq(y)


def check_unit_interval(value: Any, name: str, *, closed_low: bool = False) -> float:
    """Return ``value`` as float if it is in (0, 1] (or [0, 1]), else raise ValueError."""
    return check_scalar(value, name, float, min_val=0.0, max_val=1.0,
                        include_boundaries="both" if closed_low else "right")

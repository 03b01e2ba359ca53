"""Input conversion and validation shared by metrics, losses and calibrators.

One message style everywhere (torchmetrics'): ``Expected `name` to be ..., got ...``.
Nothing here calls ``.item()`` on a large tensor except to build an error message after a
check has already failed (the checks themselves reduce to one boolean per condition).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

__all__ = [
    "as_tensor",
    "check_positive_int",
    "check_nonneg_finite",
    "check_finite",
    "check_labels",
    "resolve_probs",
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


def check_positive_int(value: Any, name: str) -> int:
    """Return ``value`` as int if it is a positive integer, else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"Expected `{name}` to be a positive integer, got {value!r}")
    return int(value)


def check_nonneg_finite(value: Any, name: str) -> float:
    """Return ``value`` as float if it is a finite number >= 0, else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"Expected `{name}` to be a finite non-negative number, got {value!r}")
    v = float(value)
    if not np.isfinite(v) or v < 0:
        raise ValueError(f"Expected `{name}` to be a finite non-negative number, got {value!r}")
    return v


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise ValueError if ``t`` holds NaN or Inf."""
    if not t.is_floating_point() or t.numel() == 0:
        return
    # One cheap pass: NaN propagates through min/max and +-Inf shows up in them.
    lo, hi = torch.aminmax(t)
    if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
        n_bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"Expected `{name}` to be finite, found {n_bad} NaN/Inf value(s)")


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
    t = as_tensor(logits if logits is not None else probs, name)
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
    if validate_args and logits is not None:
        check_finite(t, name)
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

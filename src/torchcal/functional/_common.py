"""Small helpers shared by torchcal's loss functions (hyperparameter checks, autocast guard,
a power with a finite gradient at 0)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from .._validation import check_scalar

__all__ = ["check_hyper", "check_alpha", "no_autocast", "as_gamma", "safe_pow"]


def check_hyper(
    value: Any, name: str, *, allow_negative: bool = False, positive: bool = False,
) -> float:
    """Return ``value`` as float if it is a finite real number (>= 0 unless ``allow_negative``;
    > 0 if ``positive``); a 0-d tensor is read as its value (:func:`check_scalar`)."""
    if allow_negative and not positive:
        return check_scalar(value, name, float)
    return check_scalar(value, name, float, min_val=0.0,
                        include_boundaries="neither" if positive else "left")


def check_alpha(value: Any, name: str = "alpha") -> float:
    """Return ``value`` as float if it is in [0, 1) (a number or a 0-d tensor)."""
    return check_scalar(value, name, float, min_val=0.0, max_val=1.0, include_boundaries="left")


def no_autocast(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """A context that disables autocast on ``t``'s device (losses compute in full precision).

    A no-op context when autocast is not enabled there (entering ``torch.autocast`` costs
    microseconds per call, which shows on small batches).
    """
    dev = t.device.type
    try:
        enabled = torch.is_autocast_enabled(dev)
    except TypeError:  # pragma: no cover - older torch without the device argument
        enabled = True
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=dev, enabled=False)


def as_gamma(
    gamma: Any, like: torch.Tensor, *, allow_negative: bool, validate_args: bool = True,
    name: str = "gamma",
) -> torch.Tensor | float:
    """Validate ``gamma``: a finite number or a tensor of ``like``'s shape (one per sample).

    Returns a float for a number (and, in eager mode, for a 0-d tensor), else a detached
    tensor in ``like``'s dtype and device (under ``torch.compile`` a 0-d tensor stays a tensor,
    so that a γ held as tensor state does not force a recompile when it changes).  Values must
    be >= 0 unless ``allow_negative``; a tensor's values are checked in eager mode only (one
    host sync), not inside a compiled region.
    """
    compiling = torch.compiler.is_compiling()
    if not isinstance(gamma, torch.Tensor) or (gamma.ndim == 0 and not compiling):
        if isinstance(gamma, torch.Tensor):
            gamma = gamma.detach().item()
        return check_hyper(gamma, name, allow_negative=allow_negative)
    if gamma.ndim and tuple(gamma.shape) != tuple(like.shape):
        raise ValueError(
            f"Expected `{name}` to be a number or a tensor of the target's shape "
            f"{tuple(like.shape)}, got shape {tuple(gamma.shape)}"
        )
    if gamma.is_complex() or gamma.dtype == torch.bool:
        raise TypeError(f"Expected `{name}` to be a real tensor, got {gamma.dtype}")
    g = gamma.detach().to(device=like.device, dtype=like.dtype)
    if validate_args and g.numel() and not compiling:
        lo, hi = torch.aminmax(g)
        ok = torch.isfinite(lo) & torch.isfinite(hi)
        if not allow_negative:
            ok = ok & (lo >= 0)
        if not bool(ok):
            kind = "finite" if allow_negative else "finite and non-negative"
            raise ValueError(
                f"Expected every value of `{name}` to be {kind}, got values in "
                f"[{float(lo)}, {float(hi)}]"
            )
    return g


def safe_pow(base: torch.Tensor, exponent: torch.Tensor | float) -> torch.Tensor:
    """``base ** exponent`` for ``base >= 0`` whose autograd gradient is finite at ``base = 0``.

    ``d/db b^e = e·b^(e-1)`` is infinite at ``b = 0`` for ``0 < e < 1``, and autograd multiplies
    it by the upstream gradient: ``∞ · 0 = NaN`` even where the loss' true derivative is 0.
    For a float exponent >= 1 (or 0) the plain power is already finite and is used as is;
    otherwise the power is taken of ``b`` with zeros replaced by 1 and the zeros get ``0^e``
    (1 for ``e = 0``, else 0) as a constant, so their gradient is 0 (the true limit for the
    losses here, whose weight multiplies ``log p_y = 0`` at ``b = 0``).

    Example:
        >>> b = torch.tensor([0.0, 0.25], requires_grad=True)
        >>> w = safe_pow(b, 0.5)
        >>> w.sum().backward()
        >>> w.detach(), b.grad
        (tensor([0.0000, 0.5000]), tensor([0., 1.]))
    """
    if not isinstance(exponent, torch.Tensor) and (exponent >= 1.0 or exponent == 0.0):
        return base.pow(exponent)
    pos = base > 0
    at_zero = (exponent == 0).to(base.dtype) if isinstance(exponent, torch.Tensor) else 0.0
    return torch.where(pos, torch.where(pos, base, 1.0).pow(exponent), at_zero)

r"""The fused forward/backward shared by torchcal's per-sample losses.

Every loss of the form ``ℓ_i = f_i(log p)`` whose logit gradient is a combination of
``d = p - onehot(y)`` (with ``d_y = expm1(log p_y) = -(1-p_y)``, exact near ``p_y = 1``),
``e_y``, one more one-hot ``e_j`` and a constant,

    ∂ℓ_i/∂z_i = α_i · d_i + β_i · e_{y_i} + δ_i · e_{j_i} + κ_i · 1,

runs through one :class:`torch.autograd.Function`: the forward takes ``log_softmax`` (through
:func:`target_log_probs`, which also validates the targets), turns it **in place** into ``d``
(one ``exp`` pass plus an N-element scatter) and asks a loss-specific ``spec`` for the
per-sample loss and the coefficients; the backward is one multiply pass over ``d`` plus
scatters.  That is the same work as cross-entropy's own backward (``p - onehot``), so focal,
FLSD, label smoothing, dual focal and the GRA family cost about what ``F.cross_entropy`` costs.
Cross-entropy's gradient is ``α = 1``; a loss ``f(log p_y)`` has ``α = -f'(log p_y)``; a
GRA loss ``-w·log p_y`` with detached ``w`` has ``α = w``.

The backward is ``once_differentiable`` (no double backward).  (N, C, d1, ...) inputs are
flattened to (M, C) rows inside and the gradient is put back in the input's layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from ._loss_utils import _compute_dtype, target_log_probs

__all__ = ["Terms", "fused_loss", "flat_log_p"]


@dataclass
class Terms:
    """What a ``spec`` returns: per-row loss and gradient coefficients (all shape (M,))."""

    loss: torch.Tensor
    alpha: torch.Tensor | float
    beta: torch.Tensor | float | None = None  # coefficient of e_y
    extra_index: torch.Tensor | None = None  # j (M,) long
    extra_coef: torch.Tensor | None = None  # δ
    const: torch.Tensor | float | None = None  # κ


#: spec(log_p (M, C), lp (M,), y (M, 1), make_d) -> Terms.  ``make_d()`` turns ``log_p`` into
#: ``d`` in place and returns it: read everything needed from ``log_p`` before calling it.
Spec = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Callable[[], torch.Tensor]], Terms]


def flat_log_p(log_p: torch.Tensor) -> torch.Tensor:
    """(N, C, d1, ...) -> (M, C) rows (no copy for 2-D input)."""
    if log_p.ndim == 2:
        return log_p
    return log_p.movedim(1, -1).reshape(-1, log_p.shape[1])


def _vec(v: torch.Tensor | float, g: torch.Tensor) -> torch.Tensor:
    return (g * v).unsqueeze(1)


class _FusedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, target: torch.Tensor, ignore_index: int,
                validate_args: bool, spec: Spec):
        log_p, lp, safe, valid = target_log_probs(x, target, ignore_index,
                                                  validate_args=validate_args)
        log_p = flat_log_p(log_p)
        lp1 = lp.reshape(-1)
        y = safe.reshape(-1, 1).long()

        def make_d() -> torch.Tensor:
            d = log_p.exp_()
            d.scatter_(1, y, torch.expm1(lp1).unsqueeze(1))
            return d

        t = spec(log_p, lp1, y, make_d)
        ctx.shape = x.shape
        ctx.coefs = (t.alpha, t.beta, t.extra_coef, t.const)
        tensors = [log_p, y] + [v for v in ctx.coefs if isinstance(v, torch.Tensor)]
        if t.extra_index is not None:
            tensors.append(t.extra_index.reshape(-1, 1))
        ctx.has_extra = t.extra_index is not None
        ctx.save_for_backward(*tensors)
        if valid is None:
            valid_out = torch.empty(0, dtype=torch.bool, device=x.device)
        else:
            valid_out = valid
        ctx.mark_non_differentiable(valid_out)
        return t.loss.reshape(target.shape), valid_out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor, _unused: torch.Tensor | None = None):
        saved = list(ctx.saved_tensors)
        d, y = saved[0], saved[1]
        j = saved.pop() if ctx.has_extra else None
        it = iter(saved[2:])
        alpha, beta, delta, const = (next(it) if isinstance(v, torch.Tensor) else v
                                     for v in ctx.coefs)
        g = grad.reshape(-1)
        if const is not None:
            gx = torch.addcmul(_vec(const, g), d, _vec(alpha, g))
        else:
            gx = d * _vec(alpha, g)
        if beta is not None:
            gx.scatter_add_(1, y, _vec(beta, g))
        if j is not None:
            gx.scatter_add_(1, j, _vec(delta, g))
        shape = ctx.shape
        if len(shape) > 2:
            gx = gx.reshape((shape[0],) + tuple(shape[2:]) + (shape[1],)).movedim(-1, 1)
        return gx, None, None, None, None


def fused_loss(
    input: torch.Tensor, target: torch.Tensor, ignore_index: int, validate_args: bool, spec: Spec,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-entry losses (target's shape) and the ``valid`` mask (None if nothing is ignored).

    ``input`` is cast to float32 (float64 stays) before the Function, so autograd casts the
    gradient back to the input's dtype.  Call with autocast disabled.
    """
    x = input.to(_compute_dtype(input))
    loss, valid = _FusedLoss.apply(x, target, ignore_index, validate_args, spec)
    return loss, (valid if valid.numel() else None)

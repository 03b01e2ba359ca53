r"""The fused forward/backward shared by torchcal's per-sample losses.

Every loss of the form ``ℓ_i = f_i(log p)`` whose logit gradient is a combination of
``d = p - onehot(y)`` (with ``d_y = expm1(log p_y) = -(1-p_y)``, exact near ``p_y = 1``),
``e_y``, one more one-hot ``e_j`` and a constant,

    ∂ℓ_i/∂z_i = α_i · d_i + β_i · e_{y_i} + δ_i · e_{j_i} + κ_i · 1,

runs through one :class:`torch.autograd.Function`: the forward takes ``log_softmax`` (through
:func:`target_log_probs`, which also validates the targets) and asks a loss-specific ``spec``
for the per-sample loss and the coefficients.  A spec that needs ``d`` itself (BSCE-GRA's
norm) turns ``log p`` **in place** into ``d`` (one ``exp`` pass plus an N-element scatter) and
the backward is one multiply pass over ``d`` plus scatters; every other spec leaves ``log p``
alone and the backward is log_softmax's own fused backward kernel on a sparse ``∂ℓ/∂log p``
(one fill and one pass, what ``F.cross_entropy`` does).  So the N×C work of focal, FLSD, label
smoothing, dual focal and the GRA family is that of ``F.cross_entropy``; what remains on top
is per-row (N-element) arithmetic and per-call overhead.
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

        made_d = []

        def make_d() -> torch.Tensor:
            d = log_p.exp_()
            d.scatter_(1, y, torch.expm1(lp1).unsqueeze(1))
            made_d.append(True)
            return d

        t = spec(log_p, lp1, y, make_d)
        ctx.shape = x.shape
        # Without ``d`` (the spec never asked for it), the backward goes through log_softmax's
        # own fused backward kernel on the saved ``log p`` (what F.cross_entropy does).
        ctx.is_d = bool(made_d)
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
        if not ctx.is_d:
            gx = _log_softmax_backward(d, y, g, alpha, beta, delta, const, j)
        elif const is not None:
            gx = torch.addcmul(_vec(const, g), d, _vec(alpha, g))
        else:
            gx = d * _vec(alpha, g)
        if ctx.is_d:
            if beta is not None:
                gx.scatter_add_(1, y, _vec(beta, g))
            if j is not None:
                gx.scatter_add_(1, j, _vec(delta, g))
        shape = ctx.shape
        if len(shape) > 2:
            gx = gx.reshape((shape[0],) + tuple(shape[2:]) + (shape[1],)).movedim(-1, 1)
        return gx, None, None, None, None


def _log_softmax_backward(log_p, y, g, alpha, beta, delta, const, j) -> torch.Tensor:
    r"""The same gradient from ``log p`` through log_softmax's backward kernel.

    A per-row loss ``f(log p)`` has ``∂f/∂z = G - p·ΣG`` with ``G = ∂f/∂log p``. The Terms
    ``α·d + β·e_y + δ·e_j + κ·1`` (``d = p - e_y``) are that with the sparse
    ``G = (β - α)·e_y + δ·e_j + κ·1``: the p-coefficient ``-ΣG = α - β - δ - Cκ`` equals α
    because a function of log_softmax has a gradient that sums to zero over classes
    (``β + δ + Cκ = 0``).  Cost: one fill and one fused pass, as ``F.cross_entropy``.
    """
    if const is not None:
        big_g = _vec(const, g).expand_as(log_p).contiguous()
    else:
        big_g = torch.zeros_like(log_p)
    coef_y = _vec(alpha, g).neg_() if beta is None else _vec(beta, g).sub_(_vec(alpha, g))
    big_g.scatter_add_(1, y, coef_y)
    if j is not None:
        big_g.scatter_add_(1, j, _vec(delta, g))
    return torch._log_softmax_backward_data(big_g, log_p, 1, log_p.dtype)


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

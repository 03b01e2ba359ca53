r"""Losses with an analytic backward (``torch.autograd.Function``) where autograd's graph is the
cost (issue 50): the temperature-weighted cross-entropies and label smoothing.

Every Function here is written in the ``setup_context`` form with ``generate_vmap_rule = True``
(the packed path evaluates the lanes' losses in one ``torch.func.vmap`` call) and returns the
intermediates its backward needs as extra, non-differentiable outputs.  Its forward is the
loss's formula, differentiable as written (a GRA weight computed from detached
log-probabilities): ``torch.compile`` under ``torch.func.grad`` (the compiled packed step)
differentiates the forward itself and never calls the analytic backward.  The forward computes
nothing in place (under ``torch.compile`` its ops are traced with the surrounding graph); the
backward works in place on the tensors it creates itself, with the in-place ops that have a
vmap batching rule (``mul_``, ``sub_``, ``scatter_add_``; not ``addcmul_`` or ``scatter_``).  Each is checked against plain
autograd and ``torch.autograd.gradcheck`` (float64) in ``tests/losses/test_losses_fused.py``.

Weighted cross-entropy ``ℓ = -w·log p_y`` (``_WeightedCEFunction``), ``p = softmax(z)``, with a
weight read from ``q = softmax(z / T)`` (``q = p`` when ``T`` is the number 1):

* ``"focal"``: ``w = (1 - q_y)^γ``;
* ``"dual"``: ``w = (1 - q_y + q_j)^γ``, ``q_j`` the largest ``q_c < q_y`` (0 if none);
* ``"bsce"``: ``w = ‖q - e_y‖₂^γ`` (the β = 2 Brier-score weight).

With ``b`` the weight's base (``1 - q_y``, ``1 - q_y + q_j`` or ``B = ‖d‖²``, ``d = q - e_y``)
and ``r = -g·log p_y·w'(b)`` (``g`` the upstream gradient, ``w'`` the derivative of the power,
taken as its limit where ``b = 0``, as :func:`~torchcal.functional._common.safe_pow` does), the
gradient is ``g·w·(p - e_y) + r·∂b/∂z`` with ``∂q_k/∂z = (q_k/T)(e_k - q)``:

* focal: ``r·∂b/∂z = (r q_y/T)(q - e_y)``;
* dual: ``(r/T)((q_y - q_j) q - q_y e_y + q_j e_j)``;
* bsce: ``(2r/T) q∘(d - m)``, ``m = <d, q> = B + d_y``, that is ``(2r/T)(d∘(d - m) + (d_y - m) e_y)``.

A GRA form (``detach=True``) keeps only the first term.  The focal and dual terms are, like
cross-entropy's, the backward of a ``log_softmax`` for a gradient at one or two columns, so
the backward is ``log_softmax``'s own fused backward (:func:`lsm_grad`) of the saved
log-probabilities: the passes of ``F.cross_entropy``'s backward, twice for ``T`` other than
the number 1 (``p`` and ``q``).  The BSCE term is two ``addcmul`` passes over the saved ``d``.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ._loss_utils import as_index, flat_rows, scatter_fresh, target_log_probs, unflat_rows

__all__ = ["WEIGHT_KINDS", "weighted_ce_apply", "label_smoothing_apply", "power_and_slope",
           "lsm_grad"]

#: The weights of :func:`weighted_ce_apply`.
WEIGHT_KINDS = ("focal", "dual", "bsce")


def power_and_slope(b: torch.Tensor, e: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(b^e, e·b^(e-1))`` for ``b >= 0``, the slope at ``b = 0`` taken as
    :func:`~torchcal.functional._common.safe_pow`'s autograd gives it (``e`` for ``e = 1``,
    else 0; also 0 for ``e > 1``, the true limit)."""
    pos = b > 0
    safe = torch.where(pos, b, torch.ones_like(b))
    if e == 0.0:
        return torch.ones_like(b), torch.zeros_like(b)
    w = b.pow(e) if e >= 1.0 else torch.where(pos, safe.pow(e), torch.zeros_like(b))
    if e == 1.0:
        return w, torch.ones_like(b)
    if e == 2.0:
        return w, 2.0 * b
    return w, torch.where(pos, e * safe.pow(e - 1.0), torch.zeros_like(b))


def _scaled(log_p: torch.Tensor, x: torch.Tensor, temperature) -> torch.Tensor:
    """``log_softmax(z / T)`` rows (``log_p`` itself when ``temperature`` is None)."""
    if temperature is None:
        return log_p
    t = temperature.to(device=x.device, dtype=x.dtype) if isinstance(
        temperature, torch.Tensor) else temperature
    return torch.log_softmax(flat_rows(x) / t, dim=1)


def _weight(kind: str, gamma: float, log_q: torch.Tensor, y: torch.Tensor):
    """``(w, slope, lq_y, q_j, j, d, m)`` of the weight ``kind`` on rows ``log_q`` (M, C)."""
    lq = log_q.gather(1, y).squeeze(1)
    # placeholders are distinct tensors: an autograd.Function output may not be returned twice
    j = y.new_empty(0)
    qj, d, m = lq.new_empty(0), lq.new_empty(0), lq.new_empty(0)
    if kind == "focal":
        w, slope = power_and_slope(torch.expm1(lq).neg(), gamma)
    elif kind == "dual":
        rmin, j = (log_q - lq.unsqueeze(1)).reciprocal_().min(dim=1)
        lj = log_q.gather(1, j.unsqueeze(1)).squeeze(1)
        qj = torch.where(rmin < 0, lj.exp(), torch.zeros_like(lj))
        w, slope = power_and_slope(torch.expm1(lq).neg() + qj, gamma)
        j = j.unsqueeze(1)
    else:  # d without its y entry (q there, 0 at y), so that the backward sets y exactly
        dy = torch.expm1(lq)
        d = scatter_fresh(log_q.exp(), 1, y, torch.zeros_like(dy).unsqueeze(1))
        bsq = torch.linalg.vector_norm(d, dim=1).square() + dy * dy
        w, slope = power_and_slope(bsq, gamma / 2.0)
        m = bsq
    return w, slope, lq, qj, j, d, m


class _WeightedCEFunction(torch.autograd.Function):
    """``-w·log p_y`` per entry with the weights of the module docstring (its gradient there)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, target, ignore_index, validate_args, kind, gamma, temperature, detach):
        log_p, lp, safe, valid = target_log_probs(x, target, ignore_index,
                                                  validate_args=validate_args)
        log_p = flat_rows(log_p)
        lp1 = lp.reshape(-1)
        y = as_index(safe).reshape(-1, 1)
        log_q = _scaled(log_p, x, temperature)
        # the forward is itself the loss's formula, differentiable as written (a GRA weight
        # detached): torch.compile under torch.func.grad differentiates the forward and does
        # not call the backward below
        w, slope, lq, qj, j, d, m = _weight(kind, gamma, log_q.detach() if detach else log_q, y)
        loss = (-w * lp1).reshape(target.shape)
        r = lp1.new_empty(0) if detach else -lp1 * slope
        if detach:
            d, m = lp1.new_empty(0), lp1.new_empty(0)
        valid_out = torch.empty(0, dtype=torch.bool, device=x.device) if valid is None else valid
        saved_q = (log_q if temperature is not None and not detach and kind != "bsce"
                   else lp1.new_empty(0))
        # 1/T as a tensor (a tensor T: saved, not held on ctx, so that vmap batches it)
        inv_t = (temperature.to(device=x.device, dtype=x.dtype).reciprocal()
                 if isinstance(temperature, torch.Tensor) else lp1.new_empty(0))
        return loss, valid_out, log_p, y, w, r, lq, qj, j, d, m, saved_q, inv_t

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, _, _, _, kind, _, temperature, detach = inputs
        _, *saved = output
        ctx.shape = x.shape
        ctx.kind = kind
        ctx.detach = detach
        ctx.inv_t = 1.0 if temperature is None else (
            None if isinstance(temperature, torch.Tensor) else 1.0 / float(temperature))
        ctx.scaled = temperature is not None
        ctx.set_materialize_grads(False)  # no (N, C) zeros for the unused outputs' gradients
        ctx.save_for_backward(*saved[1:])
        ctx.mark_non_differentiable(*saved)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor, *_unused):
        nones = (None,) * 7
        if grad is None:  # the loss itself is not differentiated (only its mask, say)
            return None, *nones
        log_p, y, w, r, lq, qj, j, d, m, log_q, inv_t_saved = ctx.saved_tensors
        g = grad.reshape(-1)
        gw = g * w
        if ctx.detach:  # g w (p - e_y)
            return unflat_rows(lsm_grad(log_p, y, -gw), ctx.shape), *nones
        if ctx.kind == "bsce":
            return _bsce_backward(ctx, g, gw, log_p, y, r, lq, d, m, inv_t_saved), *nones
        gr = g * r * (inv_t_saved if ctx.inv_t is None else ctx.inv_t)  # r / T
        qy = lq.exp()
        # the weight's term is the backward of log_softmax(z / T) (times 1/T) for a gradient
        # of -(r/T) q_y at y (and +(r/T) q_j at j): (r q_y/T)(q - e_y) - (r q_j/T)(q - e_j)
        at_j = (j, gr * qj) if ctx.kind == "dual" else None
        if not ctx.scaled:  # q = p: one log_softmax backward
            return unflat_rows(lsm_grad(log_p, y, -gw - gr * qy, at_j), ctx.shape), *nones
        gx = lsm_grad(log_p, y, -gw).add_(lsm_grad(log_q, y, -gr * qy, at_j))
        return unflat_rows(gx, ctx.shape), *nones


def lsm_grad(log_p: torch.Tensor, y: torch.Tensor, at_y: torch.Tensor,
             at_j: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The gradient through ``log_p = log_softmax(z)`` (rows) of a gradient ``G`` on ``log_p``
    that is ``at_y`` at column ``y`` (and ``at_j[1]`` at column ``at_j[0]``), 0 elsewhere:
    ``G - softmax(z)·ΣG`` by ``log_softmax``'s own fused backward (the ``exp`` of ``log_p``
    inside it, no (M, C) temporary but ``G``)."""
    grad = torch.zeros_like(log_p).scatter_add_(1, y, at_y.unsqueeze(1))
    if at_j is not None:
        grad.scatter_add_(1, at_j[0], at_j[1].unsqueeze(1))
    return torch._log_softmax_backward_data(grad, log_p, 1, log_p.dtype)


def _bsce_backward(ctx, g, gw, log_p, y, r, lq, d0, bsq, inv_t_saved):
    """The BSCE weight's backward (module docstring): ``d0`` is ``q`` with 0 at ``y``, so the
    (N, C) terms vanish there and the entry at ``y``, ``g·w·(p_y - 1) - (2r/T)·B·q_y``, is
    added exactly."""
    s = 2.0 * g * r * (inv_t_saved if ctx.inv_t is None else ctx.inv_t)
    dy = torch.expm1(lq)
    m = bsq + dy
    if not ctx.scaled:  # p = q: gx = d0 ∘ (g w + s (d0 - m)), then y
        gx = torch.addcmul((gw - s * m).unsqueeze(1), d0, s.unsqueeze(1)).mul_(d0)
        gx.scatter_add_(1, y, (gw * dy - s * bsq * lq.exp()).unsqueeze(1))
        return unflat_rows(gx, ctx.shape)
    # g w (p - e_y) + d0 ∘ s (d0 - m), then -s B q_y at y (addcmul out of place: addcmul_ has
    # no vmap batching rule)
    inner = torch.addcmul((-s * m).unsqueeze(1), d0, s.unsqueeze(1))
    gx = torch.addcmul(lsm_grad(log_p, y, -gw), inner, d0)
    gx.scatter_add_(1, y, (-s * bsq * lq.exp()).unsqueeze(1))
    return unflat_rows(gx, ctx.shape)


def weighted_ce_apply(
    x: torch.Tensor, target: torch.Tensor, *, kind: str, gamma: float,
    temperature: float | torch.Tensor | None, detach: bool, ignore_index: int,
    validate_args: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-entry ``-w·log p_y`` (module docstring) and the valid mask (None: all valid).

    ``x`` is in its computation dtype (float32/float64); ``temperature`` is a positive number, a
    one-element tensor (``T``), or None (``q = p``; a number equal to 1 is read as None);
    ``detach=True`` is the GRA form (the weight carries no gradient).
    """
    if not isinstance(temperature, torch.Tensor) and temperature is not None \
            and float(temperature) == 1.0:
        temperature = None
    loss, valid, *_ = _WeightedCEFunction.apply(x, target, ignore_index, validate_args, kind,
                                               float(gamma), temperature, detach)
    return loss, (valid if valid.numel() else None)


class _LabelSmoothingFunction(torch.autograd.Function):
    """``-(1-ε) log p_y - (ε/C) Σ_c log p_c`` per entry; gradient ``g·(p - q)``,
    ``q = (1-ε) e_y + ε/C``."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, target, ignore_index, validate_args, eps):
        log_p, lp, safe, valid = target_log_probs(x, target, ignore_index,
                                                  validate_args=validate_args)
        c = x.shape[1]
        loss = torch.sub(torch.mul(lp, eps - 1.0), log_p.sum(1), alpha=eps / c)
        valid_out = torch.empty(0, dtype=torch.bool, device=x.device) if valid is None else valid
        return loss, valid_out, flat_rows(log_p), as_index(safe).reshape(-1, 1)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, _, _, _, eps = inputs
        _, valid_out, log_p, y = output
        ctx.shape = x.shape
        ctx.eps = eps
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(log_p, y)
        ctx.mark_non_differentiable(valid_out, log_p, y)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor, *_unused):
        if grad is None:
            return None, None, None, None, None
        log_p, y = ctx.saved_tensors
        g = grad.reshape(-1, 1)
        eps = ctx.eps
        # G = -g q on log_p, then log_softmax's fused backward G - p ΣG = g (p - q)
        grad = (g * (-eps / log_p.shape[1])).expand_as(log_p).clone()
        grad.scatter_add_(1, y, g * (eps - 1.0))
        gx = torch._log_softmax_backward_data(grad, log_p, 1, log_p.dtype)
        return unflat_rows(gx, ctx.shape), None, None, None, None


def label_smoothing_apply(x: torch.Tensor, target: torch.Tensor, eps: float, ignore_index: int,
                          validate_args: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-entry label-smoothed cross-entropy (PyTorch's "uniform" convention with ``eps``, any
    ``eps >= 0``) and the valid mask (None: all valid); ``x`` in its computation dtype."""
    loss, valid, *_ = _LabelSmoothingFunction.apply(x, target, ignore_index, validate_args,
                                                   float(eps))
    return loss, (valid if valid.numel() else None)

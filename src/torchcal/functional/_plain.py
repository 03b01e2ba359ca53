"""Helpers of the losses written as plain differentiable tensor ops (no autograd.Function, no
host sync in the forward), so that they also run under ``torch.compile(fullgraph=True)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._common import check_hyper, no_autocast
from ._loss_utils import compute_dtype, reduce_loss, target_log_probs

__all__ = ["rows", "row_log_probs", "scaled_log_probs", "check_temperature", "kept_mask",
           "kept_count", "check_batch_reduction", "batch_reduce", "weighted_ce", "WeightFn"]

#: ``weight_fn(log_probs (M, C), target (M,)) -> (M,)``: a per-row weight.
WeightFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def rows(t: torch.Tensor) -> torch.Tensor:
    """(N, C, d1, ...) -> (M, C) rows; (N, C) unchanged."""
    if t.ndim == 2:
        return t
    return t.movedim(1, -1).reshape(-1, t.shape[1])


def row_log_probs(
    input: torch.Tensor, target: torch.Tensor, ignore_index: int, validate_args: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`target_log_probs` as rows: ``(log_p (M, C), lp (M,), safe (M,), valid (M,) | None)``."""
    log_p, lp, safe, valid = target_log_probs(input, target, ignore_index,
                                              validate_args=validate_args)
    return (rows(log_p), lp.reshape(-1), safe.reshape(-1).long(),
            None if valid is None else valid.reshape(-1))


def check_temperature(temperature: Any, name: str = "temperature") -> float | torch.Tensor:
    """A positive finite number, or a one-element tensor (0-d or shape (1,)) used as is (a
    module's fitted buffer)."""
    if isinstance(temperature, torch.Tensor) and temperature.ndim <= 1 and temperature.numel() == 1:
        if temperature.requires_grad or not temperature.is_floating_point():
            raise ValueError(f"Expected `{name}` to be a positive number or a 0-d float tensor "
                             f"without gradient, got {temperature!r}")
        return temperature
    return check_hyper(temperature, name, positive=True)


def scaled_log_probs(input: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """Rows of ``log_softmax(input / T)`` in the computation dtype (float32, float64 kept)."""
    x = rows(input).to(compute_dtype(input))
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.to(device=x.device, dtype=x.dtype)
    return torch.log_softmax(x / temperature, dim=1)


def kept_mask(target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Boolean mask of the entries not equal to ``ignore_index`` (target's shape)."""
    return target != ignore_index


def kept_count(lp: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """The number M of kept entries as a 0-d tensor in ``lp``'s dtype."""
    if valid is None:
        return lp.new_tensor(float(lp.numel()))
    return valid.sum().to(lp.dtype)


def check_batch_reduction(reduction: str, name: str) -> None:
    """A batch-level loss takes ``"mean"`` or ``"sum"``: reject ``"none"`` with a clear error."""
    if reduction == "none":
        raise ValueError(
            f"Expected `reduction` to be 'mean' or 'sum' for {name}: it is a batch quantity, "
            "so reduction='none' is not supported"
        )


def batch_reduce(value_mean: torch.Tensor, count: torch.Tensor, reduction: str) -> torch.Tensor:
    """A batch loss (a mean over the ``count`` kept entries) as ``"mean"`` or ``"sum"`` (= M
    times it, 0 when nothing is kept), the convention of :func:`torchcal.functional.mmce_loss`."""
    if reduction == "mean":
        return value_mean
    m = count.to(value_mean.dtype)
    return torch.where(m > 0, m * value_mean, torch.zeros_like(value_mean))


def weighted_ce(
    input: torch.Tensor, target: torch.Tensor, weight_fn: WeightFn, *, detach: bool,
    temperature: float | torch.Tensor | None = None, reduction: str, ignore_index: int,
    validate_args: bool,
) -> torch.Tensor:
    """``-w_i · log p_{y_i}`` per entry, reduced like ``F.cross_entropy``.

    ``w = weight_fn(log q, y)`` on rows, with ``log q = log_softmax(z / T)`` (``log p`` itself
    when ``temperature`` is None); ``detach=True`` computes it from detached log-probabilities
    (a GRA weight: the gradient is ``Σ_i w_i ∇CE_i``).  Arguments are validated by the caller.
    """
    with no_autocast(input):
        log_p, lp, safe, valid = row_log_probs(input, target, ignore_index, validate_args)
        log_q = log_p if temperature is None else scaled_log_probs(input, temperature)
        w = weight_fn(log_q.detach() if detach else log_q, safe)
        loss = (-w * lp).reshape(target.shape)
        return reduce_loss(loss, None if valid is None else valid.reshape(target.shape),
                           reduction)

"""Top-label probabilities: the predicted class and its log-probabilities, and probabilities
with a calibrated top-1 confidence that keep the arg-max (the top-label calibrators'
prediction).
"""

from __future__ import annotations

import math

import torch

__all__ = ["top_label_rows", "keep_top_label", "log_proba"]


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

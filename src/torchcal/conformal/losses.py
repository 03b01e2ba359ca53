"""Per-sample losses over a grid of thresholds, for conformal risk control and Learn-then-Test.

Every builder returns an ``(N, L)`` loss matrix: row ``i`` is sample ``i`` (an image, a
multi-label example, a sequence), column ``j`` the loss of the set ``{k : p_k > t_j}`` built
with the ``j``-th threshold of ``thresholds`` (in the order given).  This is MAPIE's
convention (``MultiLabelClassificationController`` keeps a label when its probability is
strictly above the threshold); in the papers' notation ``lambda = 1 - t`` and the set is
``{k : p_k >= 1 - lambda}`` up to the boundary ``p_k = t``.  A smaller threshold gives a
larger set, so the false-negative rate and the miscoverage are non-decreasing in ``t`` (what
:class:`~torchcal.conformal.ConformalRiskControl` needs, on the grid sorted by decreasing
``t``).

Each loss is computed in one vectorised pass whatever the number of thresholds: every
probability is placed among the sorted thresholds (``torch.searchsorted``), the positives of
each row are counted per bucket (one ``bincount``) and a reversed cumulative sum gives, for
every threshold at once, how many lie above it.  No Python loop over samples, pixels or
thresholds.
"""

from __future__ import annotations

from typing import Any

import torch

from .._validation import as_tensor

__all__ = ["counts_above", "false_negative_rate", "false_discovery_rate", "token_miscoverage",
           "check_thresholds"]


def check_thresholds(thresholds: Any, name: str = "thresholds") -> torch.Tensor:
    """A non-empty 1-D float64 tensor of finite thresholds (any order, no duplicates).

    >>> check_thresholds([0.5, 0.25])
    tensor([0.5000, 0.2500], dtype=torch.float64)
    """
    t = as_tensor(thresholds, name)
    if t.ndim != 1 or t.numel() == 0:
        raise ValueError(f"Expected `{name}` to be a non-empty 1-D sequence, got shape "
                         f"{tuple(t.shape)}")
    t = t.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"Expected `{name}` to be finite")
    if torch.unique(t).numel() != t.numel():
        raise ValueError(f"Expected `{name}` to hold no duplicate value")
    return t


def _probs(x: Any, name: str) -> torch.Tensor:
    t = as_tensor(x, name)
    if not t.is_floating_point():
        raise TypeError(f"Expected `{name}` to be floating probabilities, got dtype {t.dtype}")
    if t.ndim < 2:
        raise ValueError(f"Expected `{name}` to have a sample axis and at least one more axis, "
                         f"got shape {tuple(t.shape)}")
    if t.numel() and not bool(((t >= 0) & (t <= 1)).all()):
        raise ValueError(f"Expected `{name}` to hold probabilities in [0, 1] (no NaN)")
    return t


def _binary(y: Any, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    t = as_tensor(y, name)
    if tuple(t.shape) != shape:
        raise ValueError(f"Expected `{name}` to have the shape of the probabilities {shape}, "
                         f"got {tuple(t.shape)}")
    if t.numel() and not bool(((t == 0) | (t == 1)).all()):
        raise ValueError(f"Expected `{name}` to hold 0/1 (or bool) values")
    return t


def counts_above(values: torch.Tensor, thresholds: torch.Tensor,
                 weights: torch.Tensor | None = None) -> torch.Tensor:
    """``out[i, j] = sum_m weights[i, m] * [values[i, m] > thresholds[j]]`` for (N, M) values,
    in one pass (searchsorted + bincount + reversed cumsum): (N, L) float64, columns in the
    order of ``thresholds``.

    >>> counts_above(torch.tensor([[0.2, 0.6, 0.9]]), torch.tensor([0.5, 0.1, 0.95]))
    tensor([[2., 3., 0.]], dtype=torch.float64)
    """
    n, m = values.shape
    t = thresholds.to(device=values.device, dtype=torch.float64)
    ts, order = torch.sort(t)
    n_t = ts.numel()
    # idx = how many sorted thresholds lie strictly below the value: value > ts[j] iff j < idx
    idx = torch.searchsorted(ts, values.to(torch.float64).contiguous(), right=False)
    flat = (idx + (n_t + 1) * torch.arange(n, device=values.device).unsqueeze(1)).reshape(-1)
    w = None if weights is None else weights.reshape(-1).to(torch.float64)
    hist = torch.bincount(flat, weights=w, minlength=n * (n_t + 1)).to(torch.float64)
    hist = hist.reshape(n, n_t + 1)
    above = hist.flip(1).cumsum(1).flip(1)[:, 1:]  # above[:, j] = sum over idx > j
    out = torch.empty_like(above)
    out[:, order] = above
    return out


def false_negative_rate(probs: Any, labels: Any, thresholds: Any) -> torch.Tensor:
    """Per-sample false-negative rate ``1 - |S_t ∩ Y| / |Y|`` of the sets ``S_t = {k : p_k >
    t}``, for every threshold ``t``: (N, L) float64.

    Args:
        probs: (N, C) multi-label probabilities, or segmentation probabilities (N, C, H, W),
            (N, 1, H, W) or (N, H, W): every axis after the first is pooled, so the loss of an
            image is the fraction of its positive pixels (of every class) left out.
        labels: binary labels or masks of the shape of ``probs``.
        thresholds: (L,) thresholds, any order (the columns follow it).

    A row without any positive has nothing to miss: its loss is 0 (``0 / 0 := 0``).  The loss
    is non-decreasing in ``t`` and bounded by 1.

    >>> p = torch.tensor([[0.9, 0.4, 0.1]]); y = torch.tensor([[1, 1, 0]])
    >>> false_negative_rate(p, y, [0.5, 0.3])
    tensor([[0.5000, 0.0000]], dtype=torch.float64)
    """
    p = _probs(probs, "probs")
    y = _binary(labels, "labels", tuple(p.shape)).to(p.device)
    t = check_thresholds(thresholds)
    p2, y2 = p.reshape(p.shape[0], -1), y.reshape(y.shape[0], -1).to(torch.float64)
    pos = y2.sum(1, keepdim=True)
    hit = counts_above(p2, t, y2)
    return torch.where(pos > 0, 1 - hit / pos.clamp(min=1), torch.zeros_like(hit))


def false_discovery_rate(probs: Any, labels: Any, thresholds: Any) -> torch.Tensor:
    """Per-sample ``1 - precision = 1 - |S_t ∩ Y| / |S_t|`` of ``S_t = {k : p_k > t}`` for
    every threshold: (N, L) float64, 1 for an empty set (MAPIE's convention for its precision
    risk: an empty prediction is never counted as precise).  Not monotone in ``t``: control it
    with :class:`~torchcal.conformal.LearnThenTest`.

    >>> p = torch.tensor([[0.9, 0.4, 0.1]]); y = torch.tensor([[1, 0, 0]])
    >>> false_discovery_rate(p, y, [0.95, 0.5, 0.3])
    tensor([[1.0000, 0.0000, 0.5000]], dtype=torch.float64)
    """
    p = _probs(probs, "probs")
    y = _binary(labels, "labels", tuple(p.shape)).to(p.device)
    t = check_thresholds(thresholds)
    p2, y2 = p.reshape(p.shape[0], -1), y.reshape(y.shape[0], -1).to(torch.float64)
    size = counts_above(p2, t)
    hit = counts_above(p2, t, y2)
    return torch.where(size > 0, 1 - hit / size.clamp(min=1), torch.ones_like(hit))


def token_miscoverage(probs: Any, labels: Any, thresholds: Any, *,
                      ignore_index: int = -100) -> torch.Tensor:
    """Per-sequence token miscoverage: the fraction of a sequence's kept tokens whose label is
    outside its set ``{c : p_c > t}``, for every threshold: (N, L) float64.

    Args:
        probs: (N, T, C) token probabilities.
        labels: (N, T) integer labels; ``ignore_index`` (default -100) marks padding.
        thresholds: (L,) thresholds, any order.

    A sequence without kept tokens has loss 0.  Only the label's probability matters (the
    label is covered iff ``p_label > t``), so the cost is one gather and one counting pass.

    >>> p = torch.tensor([[[0.7, 0.3], [0.2, 0.8], [0.5, 0.5]]])
    >>> token_miscoverage(p, torch.tensor([[0, 0, -100]]), [0.5, 0.1])
    tensor([[0.5000, 0.0000]], dtype=torch.float64)
    """
    p = _probs(probs, "probs")
    if p.ndim != 3:
        raise ValueError(f"Expected `probs` of shape (N, T, C), got {tuple(p.shape)}")
    y = as_tensor(labels, "labels").to(p.device)
    if tuple(y.shape) != tuple(p.shape[:2]) or y.is_floating_point():
        raise ValueError(f"Expected integer `labels` of shape (N, T) = {tuple(p.shape[:2])}, "
                         f"got {tuple(y.shape)} {y.dtype}")
    keep = y != ignore_index
    bad = keep & ((y < 0) | (y >= p.shape[2]))
    if bool(bad.any()):
        raise ValueError(f"Expected `labels` in [0, {p.shape[2]}) or {ignore_index}, got "
                         f"{int(y[bad][0])}")
    t = check_thresholds(thresholds)
    p_label = p.gather(2, torch.where(keep, y, 0).long().unsqueeze(2)).squeeze(2)
    w = keep.to(torch.float64)
    kept = w.sum(1, keepdim=True)
    covered = counts_above(p_label, t, w)
    return torch.where(kept > 0, 1 - covered / kept.clamp(min=1), torch.zeros_like(covered))

"""Private helpers shared by the metric modules and the meter (one implementation each).

Every per-bin quantity is a float64 sum (``torch.bincount`` / ``index_add_``) so that the
functional metrics, the bootstrap and the streaming meter add up exactly the same numbers.
"""

from __future__ import annotations

from typing import Any

import torch

from .._validation import check_labels, resolve_probs
from .binning import equal_width_bin_index

# Number of (row, class) elements handled per chunk by the classwise sums: bounds the
# temporary int64 / float64 buffers to ~32 MiB each whatever N and C are.
_CHUNK_ELEMENTS = 1 << 22


def result_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of a metric's result: the input's float dtype, at least float32."""
    return torch.promote_types(dtype, torch.float32)


def prepare(
    logits: Any, probs: Any, labels: Any, *, validate_args: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities (N, C) and int64 labels (N,) on the probabilities' device."""
    p = resolve_probs(logits, probs, validate_args=validate_args)
    y = check_labels(labels, n=p.shape[0], num_classes=p.shape[1], device=p.device)
    return p, y


def top1(p: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-1 confidence (N,) in ``p``'s dtype and correctness (N,) bool."""
    conf, pred = p.max(dim=1)
    return conf, pred.eq(y)


def binned_sums(
    idx: torch.Tensor, conf: torch.Tensor, correct: torch.Tensor, n_bins: int
) -> torch.Tensor:
    """Per-bin (count, confidence sum, correct count) as a float64 tensor of shape (3, B)."""
    # counts and correct counts from one integer bincount over (bin, correct) pairs
    both = torch.bincount(idx * 2 + correct, minlength=2 * n_bins).view(n_bins, 2)
    conf_sum = torch.bincount(idx, weights=conf.to(torch.float64), minlength=n_bins)
    return torch.stack([both.sum(dim=1).to(torch.float64), conf_sum, both[:, 1].to(torch.float64)])


def calibration_from_sums(sums: torch.Tensor, norm: str) -> torch.Tensor:
    """ECE ("l1"), MCE ("max") or RMSCE ("l2") in float64 from per-bin sums.

    ``sums`` has shape (3, ..., B): per-bin count, confidence sum and correct count; the result
    has the middle shape (0-d for (3, B); (R,) for a batch of R bootstrap resamples).
    ``(n_b/N)|acc_b - conf_b| = |A_b - S_b|/N`` with ``A_b``/``S_b`` the per-bin sums, so ECE is
    computed without dividing by the (possibly zero) counts.  Empty bins contribute 0 to every
    norm (their gap is defined as 0 and gaps are >= 0, so the max is over non-empty bins).
    """
    counts, conf_sum, acc_sum = sums[0], sums[1], sums[2]
    n = counts.sum(dim=-1)
    diff = (acc_sum - conf_sum).abs()
    if norm == "l1":
        return diff.sum(dim=-1) / n
    gap = diff / counts.clamp(min=1)
    if norm == "max":
        return gap.amax(dim=-1)
    if norm == "l2":
        return torch.sqrt((counts * gap * gap).sum(dim=-1) / n)
    raise ValueError(f"Expected `norm` to be one of 'l1', 'max', 'l2', got {norm!r}")


def classwise_sums(p: torch.Tensor, y: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Per (class, bin) sums of ``p_ik - [y_i = k]`` in float64, shape (C * B,).

    Cell ``k * B + b`` holds ``sum_{i : bin(p_ik) = b} (p_ik - [y_i = k])``.  The indicator of the
    true class lands in the same cell as ``p_{i, y_i}``, so one float64 ``index_add_`` over the
    flattened (N * C) (class, bin) keys does everything; rows are processed in chunks to bound
    memory.
    """
    n, c = p.shape
    out = torch.zeros(c * n_bins, dtype=torch.float64, device=p.device)
    # int32 keys: half the memory traffic of int64 (C * B is far below 2**31)
    offsets = torch.arange(c, device=p.device, dtype=torch.int32) * n_bins
    rows = max(1, _CHUNK_ELEMENTS // c)
    for start in range(0, n, rows):
        pc = p[start : start + rows]
        yc = y[start : start + rows]
        key = equal_width_bin_index(pc, n_bins, out_int32=True)
        key += offsets
        w = pc.to(torch.float64, copy=True)
        w[torch.arange(pc.shape[0], device=p.device), yc] -= 1.0
        out.index_add_(0, key.view(-1), w.view(-1))
    return out


def check_unit_interval(value: Any, name: str, *, closed_low: bool = False) -> float:
    """Return ``value`` as float if it is in (0, 1] (or [0, 1]), else raise ValueError."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    ok = (0.0 <= v <= 1.0) if closed_low else (0.0 < v <= 1.0)
    if isinstance(value, bool) or not ok:
        interval = "[0, 1]" if closed_low else "(0, 1]"
        raise ValueError(f"Expected `{name}` to be a number in {interval}, got {value!r}")
    return v

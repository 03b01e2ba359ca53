"""Dense layouts: (N, C, d1, ...) predictions with (N, d1, ...) labels and ``ignore_index``.

The one home of the flattening every metric, :class:`~torchcal.metrics.CalibrationMeter` and
the integrations apply (``F.cross_entropy``'s layout, as the losses take it): the class axis
is axis 1; the predictions become (M, C) rows in the order of ``movedim(1, -1)`` and the
labels (M,), and every row whose label equals ``ignore_index`` (default -100, the label
PyTorch, ``transformers`` and torchmetrics use for padding) is dropped.  A metric of dense
predictions is then the metric of the kept rows, as if they were M separate samples.
"""

from __future__ import annotations

from typing import Any

import torch

from .._validation import as_tensor

__all__ = ["IGNORE_INDEX", "flatten_valid", "flatten_inputs", "check_ignore_index"]

#: The default ``ignore_index`` of the metrics (``F.cross_entropy``'s).
IGNORE_INDEX = -100


def check_ignore_index(ignore_index: Any) -> int | None:
    """``ignore_index`` checked: an int, or None (keep every entry)."""
    if ignore_index is None:
        return None
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(
            f"Expected `ignore_index` to be an int or None, got {type(ignore_index).__name__}"
        )
    return ignore_index


def flatten_valid(logits: Any, labels: Any, ignore_index: int | None = IGNORE_INDEX,
                  *, name: str = "logits") -> tuple[torch.Tensor, torch.Tensor]:
    """(N, C, d1, ...) scores / (N, d1, ...) labels -> (M, C) / (M,) without ``ignore_index``.

    (N, C) scores with (N,) labels come back unchanged (the same tensors) when no label is
    ``ignore_index``; ``ignore_index=None`` keeps every row.  When every label is
    ``ignore_index`` the result has M = 0 rows.  Raises ``ValueError`` naming ``name`` /
    ``labels`` when the shapes do not match.

    >>> z, y = flatten_valid(torch.zeros(2, 3, 4), torch.tensor([[0, 1, -100, 2], [1, 1, 1, 1]]))
    >>> tuple(z.shape), y.tolist()
    ((7, 3), [0, 1, 2, 1, 1, 1, 1])
    """
    ignore_index = check_ignore_index(ignore_index)
    z = as_tensor(logits, name)
    y = as_tensor(labels, "labels")
    if z.ndim < 2:
        return z, y  # the metrics' own check explains a 1-D input
    if z.ndim > 2:
        expected = (z.shape[0],) + tuple(z.shape[2:])
        if tuple(y.shape) != expected:
            raise ValueError(
                f"Expected `labels` of shape (N, d1, ...) = {expected} to match `{name}` of "
                f"shape (N, C, d1, ...) = {tuple(z.shape)}, got {tuple(y.shape)}"
            )
        z = z.movedim(1, -1).reshape(-1, z.shape[1])
        y = y.reshape(-1)
    elif y.ndim != 1 or y.shape[0] != z.shape[0]:
        return z, y  # the metrics' label check names the mismatch
    if ignore_index is not None and not (y.is_floating_point() or y.dtype == torch.bool):
        keep = y != ignore_index
        if not bool(keep.all()):
            z, y = z[keep.to(z.device)], y[keep]
    return z, y


def flatten_inputs(logits: Any, probs: Any, labels: Any,
                   ignore_index: int | None = IGNORE_INDEX, *,
                   all_ignored_ok: bool = False) -> tuple[Any, Any, Any]:
    """``(logits, probs, labels)`` with whichever of ``logits`` / ``probs`` is given flattened
    by :func:`flatten_valid` (the entry of every labelled metric); the other stays None (both
    or neither given: unchanged, for the metrics' own error).  Labels that are all
    ``ignore_index`` raise ``ValueError`` unless ``all_ignored_ok`` (then M = 0 rows)."""
    if (logits is None) == (probs is None):
        return logits, probs, labels
    name = "logits" if logits is not None else "probs"
    z, y = flatten_valid(logits if logits is not None else probs, labels, ignore_index,
                         name=name)
    if z.ndim == 2 and z.shape[0] == 0 and y.shape[0] == 0 and not all_ignored_ok:
        n = as_tensor(labels, "labels").numel()
        if n:
            raise ValueError(f"Expected at least one label not equal to "
                             f"ignore_index={ignore_index}, but all {n} are")
    return (z, None, y) if logits is not None else (None, z, y)

"""The row layout of the post-hoc calibrators' inputs: (N, C) rows, dense (N, C, d1, ...)
logits and token logits (N, T, C) as rows of (M, C), and the chunks those rows are processed in.

A calibrator is fitted on rows (:func:`fit_rows`: the kept rows of any layout, ``ignore_index``
and ``sample_weight`` applied) and applied to rows (:func:`apply_rows`: chunk by chunk, into
the input's shape); :func:`row_chunks` bounds the float64 copies of every pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._validation import as_tensor, check_finite
from ..metrics import IGNORE_INDEX
from ..metrics.layout import check_ignore_index

__all__ = [
    "CHUNK_ELEMENTS",
    "SINGLE_CHUNK_ELEMENTS",
    "row_chunks",
    "resolve_class_axis",
    "check_sample_weight",
    "fit_rows",
    "apply_rows",
    "like_input",
    "work_dtype",
]


#: Elements (rows x classes) of one chunk of the fits' float64 passes and of the dense
#: predictions (512 KiB of float64): a (8, 21, 512, 512) segmentation batch is never copied to
#: float64 as a whole, every pass over its rows holds one chunk at a time.
CHUNK_ELEMENTS = 1 << 16
#: Inputs of at most this many elements (2 MiB of float64) are one chunk: the unchunked
#: arithmetic of small inputs (and of every committed result) is unchanged.
SINGLE_CHUNK_ELEMENTS = 1 << 18


def row_chunks(n: int, c: int) -> list[slice]:
    """Slices of ``range(n)``: one when ``n * c <= SINGLE_CHUNK_ELEMENTS`` (small inputs take
    the unchunked arithmetic), else of ``CHUNK_ELEMENTS // c`` rows each."""
    if n * c <= SINGLE_CHUNK_ELEMENTS:
        return [slice(0, n)]
    step = max(1, CHUNK_ELEMENTS // max(c, 1))
    return [slice(a, min(a + step, n)) for a in range(0, n, step)]


def resolve_class_axis(shape: tuple[int, ...], class_axis: Any = None,
                       labels_shape: tuple[int, ...] | None = None,
                       fitted_axis: int | None = None, n_classes: int | None = None) -> int:
    """The class axis of scores of ``shape``: 1 (``F.cross_entropy``'s (N, C, d1, ...), the
    default) or -1 (token logits (N, T, V)).  2-D input: 1.  Otherwise, in this order: an
    explicit ``class_axis`` (1 or -1, or its non-negative spelling); labels of shape
    ``shape[:-1]`` and not ``(N, d1, ...)``: -1; the axis the calibrator was fitted on; the
    one axis of size ``n_classes``; else 1."""
    nd = len(shape)
    if nd <= 2:
        return 1
    if class_axis is not None:
        if isinstance(class_axis, bool) or class_axis not in (1, -1, nd - 1):
            raise ValueError(f"Expected `class_axis` to be 1 (N, C, d1, ...) or -1 (N, T, C), "
                             f"got {class_axis!r}")
        return 1 if class_axis == 1 else -1
    if labels_shape is not None:
        dense = (shape[0],) + tuple(shape[2:])
        if tuple(labels_shape) == dense:
            return 1
        if tuple(labels_shape) == tuple(shape[:-1]):
            return -1
        raise ValueError(
            f"Expected `labels` of shape (N, d1, ...) = {dense} for `logits` of shape (N, C, "
            f"d1, ...), or {tuple(shape[:-1])} for token logits (N, T, C), got "
            f"{tuple(labels_shape)}")
    if fitted_axis is not None:
        return fitted_axis
    if n_classes is not None and (shape[1] == n_classes) != (shape[-1] == n_classes):
        return 1 if shape[1] == n_classes else -1
    return 1


def check_sample_weight(sample_weight: Any, labels_shape: tuple[int, ...],
                         device: torch.device) -> torch.Tensor:
    """scikit-learn's convention: one finite weight >= 0 per label (the labels' shape), not
    all 0; float64 on ``device``."""
    w = as_tensor(sample_weight, "sample_weight")
    if w.is_complex() or w.dtype == torch.bool:
        raise TypeError(f"Expected `sample_weight` to be real numbers, got {w.dtype}")
    if tuple(w.shape) != tuple(labels_shape):
        raise ValueError(f"Expected `sample_weight` of the labels' shape {tuple(labels_shape)}, "
                         f"got {tuple(w.shape)}")
    w = w.detach().to(device=device, dtype=torch.float64)
    check_finite(w, "sample_weight")
    if w.numel() and bool((w < 0).any()):
        raise ValueError("Expected `sample_weight` to be >= 0, got negative weight(s)")
    if w.numel() and not bool((w > 0).any()):
        raise ValueError("Expected `sample_weight` to have a positive weight, but every "
                         "weight is zero")
    return w


def fit_rows(logits: Any, labels: Any, *, ignore_index: Any = IGNORE_INDEX,
             sample_weight: Any = None, class_axis: Any = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int | None]:
    """The rows a calibrator is fitted on: ``(z (M, C), labels (M,), weights (M,) or None,
    class axis)``.

    (N, C) logits with (N,) labels, dense (N, C, d1, ...) logits with (N, d1, ...) labels, or
    token logits (N, T, C) with (N, T) labels (:func:`resolve_class_axis`); rows whose label is
    ``ignore_index`` (default -100, None keeps all) or whose weight is 0 are dropped.  Only
    the kept rows are copied, in the logits' dtype (never a float64 copy of the whole tensor).
    The class axis is None for 2-D input."""
    ignore_index = check_ignore_index(ignore_index)
    z = as_tensor(logits, "logits")
    y = as_tensor(labels, "labels")
    if z.ndim < 3 or not z.is_floating_point():
        axis, rows, yr, shape = None, z, y, tuple(y.shape)
    else:
        axis = resolve_class_axis(tuple(z.shape), class_axis, labels_shape=tuple(y.shape))
        rows, yr, shape = z, y, tuple(y.shape)
    w = None if sample_weight is None else check_sample_weight(sample_weight, shape, z.device)
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        return rows, yr, w, axis  # check_labels names the dtype
    keep = None
    if ignore_index is not None:
        keep = y != ignore_index
    if w is not None:
        pos = w > 0
        keep = pos if keep is None else keep & pos.to(keep.device)
    if keep is not None and bool(keep.all()):
        keep = None
    if axis is None:
        if keep is not None and z.ndim == 2 and y.ndim == 1 and y.shape[0] == z.shape[0]:
            rows, yr = z[keep.to(z.device)], y[keep]
            w = None if w is None else w[keep.to(w.device)]
        return rows, yr, w, axis
    c = z.shape[1] if axis == 1 else z.shape[-1]
    zm = z.movedim(1, -1) if axis == 1 else z
    if keep is None:
        rows, yr = zm.reshape(-1, c), y.reshape(-1)
        w = None if w is None else w.reshape(-1)
    else:
        rows, yr = zm[keep.to(z.device)], y[keep]
        w = None if w is None else w[keep.to(w.device)]
    return rows, yr, w, axis


def apply_rows(fn: Any, z: torch.Tensor, axis: int, *, with_offset: bool = False
               ) -> torch.Tensor:
    """``fn`` (rows (m, C) -> (m, C)) applied to the rows of (N, C, d1, ...) (``axis=1``) or
    (..., C) (``axis=-1``) scores, chunk by chunk (``CHUNK_ELEMENTS``), into an output of the
    input's shape; 2-D input: ``fn(z)``.  The rows are visited in the order of
    ``z.movedim(axis, -1).reshape(-1, C)``; with ``with_offset`` ``fn(rows, start)`` also gets
    the index of the chunk's first row in that order."""
    call = fn if with_offset else (lambda rows, _start: fn(rows))
    if z.ndim <= 2:
        return call(z, 0)
    if axis == -1:
        c = z.shape[-1]
        rows = z.reshape(-1, c)
        parts = [call(rows[sl], sl.start) for sl in row_chunks(rows.shape[0], c)]
        return torch.cat(parts).reshape(z.shape) if len(parts) > 1 else parts[0].reshape(z.shape)
    n, c = z.shape[0], z.shape[1]
    z3 = z.reshape(n, c, -1)
    s = z3.shape[2]
    out = None
    per = max(1, CHUNK_ELEMENTS // max(s * c, 1))  # images per block
    for a in range(0, n, per):
        block = z3[a:a + per]
        nb = block.shape[0]
        for sl in (row_chunks(s, c) if nb == 1 else [slice(0, s)]):
            rows = block[:, :, sl].transpose(1, 2).reshape(-1, c)
            res = call(rows, a * s + sl.start)
            if out is None:
                out = torch.empty((n, c, s), dtype=res.dtype, device=res.device)
            out[a:a + nb, :, sl] = res.reshape(nb, -1, c).transpose(1, 2)
    assert out is not None
    return out.reshape(z.shape)


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half precision, else the dtype itself (float32 / float64)."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def like_input(out: torch.Tensor, ref: Any) -> Any:
    """``out`` as a NumPy array when the input ``ref`` was one (NumPy in, NumPy out), else the
    tensor itself."""
    if isinstance(ref, np.ndarray):
        return out.detach().cpu().numpy()
    return out

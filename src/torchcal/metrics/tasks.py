"""The three tasks of the calibration metrics: ``"multiclass"``, ``"binary"``, ``"multilabel"``.

torchmetrics' convention and numbers (``BinaryCalibrationError``, ``task=`` of
``CalibrationError``):

* ``"multiclass"`` (default): (N, C) logits (softmax) or probabilities with (N,) class
  indices, or the dense (N, C, d1, ...) layout; the top-label metrics bin the top-1
  confidence ``max_c p_c``.  A 2-column input is a binary problem measured on its top label
  (``max(p, 1 - p)``), which is not what a binary user expects: a :class:`TwoColumnWarning`
  says so, once per process.
* ``"binary"``: (N,) or (N, d1, ...) logits (log-odds of class 1, sigmoid) or probabilities
  ``p`` of class 1, with labels of the same shape in {0, 1} (or ``ignore_index``).  The binned
  metrics bin ``p`` itself and compare it with the share of positives (the reliability
  diagram of a binary classifier, ``BinaryCalibrationError``, scikit-learn's
  ``calibration_curve``).
* ``"multilabel"``: (N, L) or (N, L, d1, ...) logits (sigmoid per label) or probabilities
  with labels of the same shape in {0, 1} (or ``ignore_index``, per entry).  Each label is a
  binary problem; a metric is the mean over the labels of its binary value (labels whose
  every entry is ignored are left out of the mean).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import torch

from .._validation import as_tensor, check_finite
from ..errors import TwoColumnWarning
from .binning import equal_width_bin_index
from .layout import check_ignore_index

__all__ = ["TASKS", "TwoColumnWarning", "check_task", "binary_inputs", "multilabel_inputs",
           "warn_two_columns", "label_binned_sums", "binary_columns"]

#: The tasks every calibration metric, the meter and the torchmetrics adapter take.
TASKS = ("multiclass", "binary", "multilabel")


_warned_two_columns = False


def check_task(task: Any) -> str:
    """``task`` checked: one of :data:`TASKS`."""
    if task not in TASKS:
        raise ValueError(f"Expected `task` to be one of {TASKS}, got {task!r}")
    return task


def warn_two_columns(n_columns: int) -> None:
    """Say, once per process, that a 2-column ``"multiclass"`` input is measured on its top
    label (:class:`TwoColumnWarning`, pointing at the user's line)."""
    global _warned_two_columns
    if n_columns != 2 or _warned_two_columns:
        return
    _warned_two_columns = True
    warnings.warn(
        "A 2-column input with task='multiclass' is a binary problem measured on its top "
        "label max(p, 1 - p), not on the probability of class 1: its ECE is not that of "
        "torchmetrics' BinaryCalibrationError or netcal.  Pass task='binary' with the class-1 "
        "probabilities probs=p[:, 1] (or logits z[:, 1] - z[:, 0]) for the binary metric.  "
        "This warning is shown once.",
        TwoColumnWarning,
        stacklevel=_user_stacklevel(),
    )


_SKIPPED_DIRS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                 os.path.dirname(os.path.abspath(torch.__file__)))


def _user_stacklevel() -> int:
    """``stacklevel`` of the first frame outside torchcal and torch (``torch.no_grad``'s
    wrapper of :meth:`CalibrationMeter.update`), relative to the caller of this function's
    caller, so that the warning points at the user's line."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_SKIPPED_DIRS):
        frame = frame.f_back
        level += 1
    return level


def _pick(logits: Any, probs: Any) -> tuple[str, torch.Tensor]:
    if (logits is None) == (probs is None):
        raise ValueError("Expected exactly one of `logits` / `probs`, got "
                         + ("both" if logits is not None else "neither"))
    name = "logits" if logits is not None else "probs"
    t = as_tensor(logits if logits is not None else probs, name)
    if not t.is_floating_point():
        raise TypeError(f"Expected `{name}` to be a floating-point tensor, got {t.dtype}")
    return name, t


def _labels01(labels: Any, shape: tuple[int, ...], ignore_index: int | None, what: str
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """0/1 labels (bool) of ``shape`` and the mask of the entries kept."""
    y = as_tensor(labels, "labels")
    if y.is_floating_point() or y.is_complex():
        raise TypeError(f"Expected `labels` to be integers or bools (0/1) for {what}, "
                        f"got {y.dtype}")
    if tuple(y.shape) != shape:
        raise ValueError(f"Expected `labels` of shape {shape} like the predictions for {what}, "
                         f"got {tuple(y.shape)}")
    if y.dtype == torch.bool:
        return y, torch.ones_like(y)
    keep = (y != ignore_index) if ignore_index is not None else torch.ones_like(y, dtype=torch.bool)
    bad = keep & (y != 0) & (y != 1)
    if bool(bad.any()):
        raise ValueError(f"Expected `labels` to be 0 or 1 (or ignore_index={ignore_index}) "
                         f"for {what}, found {int(bad.sum())} other value(s) such as "
                         f"{int(y[bad][0])}")
    return y == 1, keep


def _to_probs(name: str, t: torch.Tensor, validate_args: bool) -> torch.Tensor:
    if validate_args:
        if name == "probs":
            check_finite(t, "probs")
            if t.numel() and bool((t.amin() < 0) | (t.amax() > 1)):
                raise ValueError("Expected `probs` to be probabilities in [0, 1] (pass scores "
                                 "as `logits=`, turned into probabilities with sigmoid)")
        elif bool(torch.isnan(t).any()):
            raise ValueError(f"Expected `logits` to hold no NaN, found {int(torch.isnan(t).sum())}")
        elif t.numel() > 1 and bool((t.amin() >= 0) & (t.amax() <= 1)):
            warnings.warn(
                "`logits` are all in [0, 1]: they look like probabilities.  They are passed "
                "through sigmoid, which maps [0, 1] to [0.5, 0.73] and makes the metric wrong. "
                "Pass them as `probs=` instead.", UserWarning, stacklevel=_user_stacklevel())
    return torch.sigmoid(t) if name == "logits" else t


def binary_inputs(logits: Any, probs: Any, labels: Any, ignore_index: int | None,
                  validate_args: bool = True, *, all_ignored_ok: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``task="binary"``: class-1 probabilities ``p`` (M,) in the input's dtype, labels (M,)
    bool, and the logits (M,) when given (None for probabilities), flattened from any shape
    with the entries labelled ``ignore_index`` left out."""
    ignore_index = check_ignore_index(ignore_index)
    name, t = _pick(logits, probs)
    y, keep = _labels01(labels, tuple(t.shape), ignore_index, "task='binary'")
    keep = keep.to(t.device)
    t, y = t.reshape(-1)[keep.reshape(-1)], y.to(t.device).reshape(-1)[keep.reshape(-1)]
    if t.numel() == 0 and not all_ignored_ok:
        raise ValueError("Expected at least one entry for task='binary', got none"
                         + (f" (every label is ignore_index={ignore_index})"
                            if as_tensor(labels, "labels").numel() else ""))
    return _to_probs(name, t, validate_args), y, (t if name == "logits" else None)


def multilabel_inputs(logits: Any, probs: Any, labels: Any, ignore_index: int | None,
                      validate_args: bool = True, *, num_labels: int | None = None,
                      all_ignored_ok: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``task="multilabel"``: probabilities (M, L), labels (M, L) bool, the mask (M, L) of the
    entries kept (label not ``ignore_index``) and the logits (M, L) when given, from (N, L) or
    (N, L, d1, ...) inputs (the label axis is axis 1, moved last)."""
    ignore_index = check_ignore_index(ignore_index)
    name, t = _pick(logits, probs)
    if t.ndim < 2:
        raise ValueError(f"Expected `{name}` of shape (N, L) or (N, L, d1, ...) for "
                         f"task='multilabel', got shape {tuple(t.shape)}")
    if num_labels is not None and t.shape[1] != num_labels:
        raise ValueError(f"Expected `{name}` to have num_labels={num_labels} columns, "
                         f"got {t.shape[1]}")
    y, keep = _labels01(labels, tuple(t.shape), ignore_index, "task='multilabel'")
    n_labels = t.shape[1]
    t = t.movedim(1, -1).reshape(-1, n_labels)
    y = y.to(t.device).movedim(1, -1).reshape(-1, n_labels)
    keep = keep.to(t.device).movedim(1, -1).reshape(-1, n_labels)
    if not bool(keep.any()) and not all_ignored_ok:
        raise ValueError("Expected at least one entry for task='multilabel' not equal to "
                         f"ignore_index={ignore_index}, got none")
    if validate_args and not bool(keep.all()):
        # ignored entries may hold anything (padding): validate the kept ones only
        _to_probs(name, t[keep], True)
        return _to_probs(name, t, False), y, keep, (t if name == "logits" else None)
    return _to_probs(name, t, validate_args), y, keep, (t if name == "logits" else None)


def label_binned_sums(p: torch.Tensor, y: torch.Tensor, keep: torch.Tensor, n_bins: int
                      ) -> torch.Tensor:
    """Per (label, equal-width bin) count, probability sum and positive count of the kept
    entries of (M, L) probabilities: float64 (3, L, B), one ``bincount`` pass each."""
    n_labels = p.shape[1]
    idx = equal_width_bin_index(p, n_bins) + torch.arange(n_labels, device=p.device) * n_bins
    k, w = idx[keep], p[keep].to(torch.float64)
    size = n_labels * n_bins
    if p.device.type == "cpu":
        counts = torch.bincount(k, minlength=size).to(torch.float64)
        conf = torch.bincount(k, weights=w, minlength=size)
        pos = torch.bincount(k, weights=y[keep].to(torch.float64), minlength=size)
        return torch.stack([counts, conf, pos]).view(3, n_labels, n_bins)
    rows = torch.stack([torch.ones_like(w), w, y[keep].to(torch.float64)])
    out = torch.zeros(3, size, dtype=torch.float64, device=p.device).index_add_(1, k, rows)
    return out.view(3, n_labels, n_bins)


def binary_columns(task: str, logits: Any, probs: Any, labels: Any,
                   ignore_index: int | None, validate_args: bool
                   ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.dtype]:
    """``(p, y)`` pairs, one per binary problem: one for ``task="binary"``, one per label with
    a kept entry for ``"multilabel"`` (p (M_j,) probabilities, y (M_j,) bool), and the
    result dtype (the input's, at least float32).  For the metrics that are the mean over
    the labels of a binary metric."""
    if task == "binary":
        p, y, _ = binary_inputs(logits, probs, labels, ignore_index, validate_args)
        return [(p, y)], torch.promote_types(p.dtype, torch.float32)
    p, y, keep, _ = multilabel_inputs(logits, probs, labels, ignore_index, validate_args)
    pairs = [(p[keep[:, j], j], y[keep[:, j], j]) for j in range(p.shape[1])
             if bool(keep[:, j].any())]
    return pairs, torch.promote_types(p.dtype, torch.float32)

"""torchmetrics ``Metric`` classes of torchcal's calibration metrics (the ``torchmetrics`` extra).

Each class keeps the fixed-size float64 state of :class:`torchcal.metrics.CalibrationMeter`
(``adaptive=False``) restricted to what its metric needs (``metrics=``): ``3 B + 1`` numbers
for ECE / MCE / RMSCE (368 bytes for B = 15 bins), ``C B + 1`` for Classwise-ECE, 2 for NLL
or Brier, ``(3 + C) B + 4`` for :class:`CalibrationMetrics` (1,592 bytes for C = 10 classes),
whatever the number of samples, summed across processes by torchmetrics' own sync
(``dist_reduce_fx="sum"``).  The state stays float64 under every dtype cast a module goes
through (``.to(torch.float32)``, ``set_dtype``, a parent's ``.to(torch.bfloat16)``,
Lightning's ``"bf16-true"`` / ``"16-true"`` precision); device moves apply.

``task=`` is ``"multiclass"`` (default), ``"binary"`` ((N, ...) logits or class-1
probabilities with 0/1 targets: ``CalibrationError(task="binary")`` is torchmetrics'
``BinaryCalibrationError``) or ``"multilabel"`` (``num_classes`` = the number of labels L,
(N, L, ...) inputs and 0/1 targets; the mean over labels of the binary metric), as
:mod:`torchcal.metrics.tasks` defines them.  The values are those of the functions of
:mod:`torchcal.metrics` over all the samples seen (same bins, same conventions), so a
Lightning module logs them as it logs any torchmetrics metric::

    self.val_ece = CalibrationError(num_classes=10)
    ...
    self.val_ece.update(logits, labels)           # in validation_step
    self.log("val_ece", self.val_ece)             # computed and reset at the epoch's end

``update(preds, target)`` takes logits (``input_format="logits"``, default) or probabilities
(``"probs"``) of shape (N, C) or (N, C, d1, ...) with (N, d1, ...) labels (multiclass); entries labelled
``ignore_index`` (default -100) are left out, as in torchmetrics'
``MulticlassCalibrationError(ignore_index=-100)``.  AdaECE needs every confidence (O(N)
state) and is not offered here: use :class:`~torchcal.metrics.CalibrationMeter`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..metrics import IGNORE_INDEX, CalibrationMeter
from ._common import missing_extra

try:
    from torchmetrics import Metric
except ImportError as exc:  # optional dependency
    raise missing_extra("torchmetrics", "torchmetrics", "torchmetrics") from exc

__all__ = ["CalibrationError", "MaxCalibrationError", "RMSCalibrationError",
           "ClasswiseCalibrationError", "NegativeLogLikelihood", "BrierScore",
           "CalibrationMetrics"]

_FORMATS = ("logits", "probs")


class _MeterMetric(Metric):
    """A torchmetrics ``Metric`` over :class:`CalibrationMeter`'s fixed-size state."""

    is_differentiable = False
    higher_is_better = False
    full_state_update = False
    #: the key of :meth:`CalibrationMeter.compute` this metric returns (None: all of them)
    key: str | None = None

    #: the keys of :meth:`CalibrationMeter.compute` whose state this metric keeps
    KEYS: tuple[str, ...] = ()

    def __init__(self, num_classes: int | None = None, n_bins: int = 15, *,
                 input_format: str = "logits", ignore_index: int | None = IGNORE_INDEX,
                 task: str = "multiclass", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if input_format not in _FORMATS:
            raise ValueError(f"Expected `input_format` to be one of {_FORMATS}, "
                             f"got {input_format!r}")
        self.input_format = input_format
        self.task = task
        self._meter = CalibrationMeter(num_classes, n_bins, adaptive=False, topk=1,
                                       sync_dist=False, ignore_index=ignore_index, task=task,
                                       metrics=self.KEYS or (self.key,))
        self.add_state("state", default=torch.zeros(self._meter.state_size, dtype=torch.float64),
                       dist_reduce_fx="sum")

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Move the state with the module (``.to(device)``, ``.cuda()``) but keep it float64
        under every cast: ``.to(torch.float32)``, ``set_dtype``, a parent module's
        ``.to(torch.bfloat16)`` and Lightning's ``"bf16-true"`` / ``"16-true"`` precision
        plugins.  The state holds float64 sums (a count of 2**24 samples is not exact in
        float32, and bfloat16 loses counts from 256); casting it would lose them, and the
        meter refuses a state of another dtype."""
        kwargs["exclude_state"] = ("state",)
        this = super()._apply(fn, *args, **kwargs)
        # the device ``fn`` moves tensors to, from a float64 probe (its dtype is not kept)
        device = fn(torch.zeros(1, dtype=torch.float64, device=self.state.device)).device
        this.state = self.state.to(device=device, dtype=torch.float64)
        this._defaults["state"] = this._defaults["state"].to(device=device, dtype=torch.float64)
        return this

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Add a batch: ``preds`` (N, C) or (N, C, d1, ...) logits (or probabilities with
        ``input_format="probs"``), ``target`` (N,) or (N, d1, ...) class indices."""
        self._meter.state = self.state  # updated in place
        self._meter.update(**{self.input_format: preds.detach()}, labels=target)

    def _all(self) -> dict[str, torch.Tensor]:
        self._meter.state = self.state
        return self._meter.compute()

    def compute(self) -> torch.Tensor:
        """The metric over every sample seen (synced across processes), a 0-d float64 tensor."""
        return self._all()[self.key]


class CalibrationError(_MeterMetric):
    """Expected calibration error with ``n_bins`` equal-width bins
    (:func:`torchcal.metrics.ece`).

    Example:
        >>> metric = CalibrationError(num_classes=3, n_bins=2)
        >>> metric.update(torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), torch.tensor([0, 2]))
        >>> round(float(metric.compute()), 4), metric.state.numel() * 8  # bytes of state
        (0.1816, 56)
        >>> binary = CalibrationError(task="binary", n_bins=2)  # BinaryCalibrationError
        >>> binary.update(torch.tensor([2.0, -1.0, 0.5]), torch.tensor([1, 0, 0]))
        >>> round(float(binary.compute()), 4)
        0.2574
    """

    key = "ece"


class MaxCalibrationError(_MeterMetric):
    """Maximum calibration error ``max_b |acc_b - conf_b|`` over the non-empty equal-width
    bins (:func:`torchcal.metrics.mce`): the worst bin, whatever its size."""

    key = "mce"


class RMSCalibrationError(_MeterMetric):
    """Root-mean-square calibration error ``sqrt(sum_b (n_b / N) (acc_b - conf_b)^2)``
    (:func:`torchcal.metrics.rmsce`; torchmetrics' ``norm="l2"``)."""

    key = "rmsce"


class ClasswiseCalibrationError(_MeterMetric):
    """Classwise-ECE: the mean over the C classes of the equal-width ECE of ``p_k`` against
    ``[y = k]`` (:func:`torchcal.metrics.classwise_ece`), from the (class, bin) sums of the
    state (C B of its numbers)."""

    key = "classwise_ece"


class NegativeLogLikelihood(_MeterMetric):
    """Mean negative log-likelihood ``-mean log p_y`` (:func:`torchcal.metrics.nll`), from
    ``log_softmax`` of the logits; a running float64 sum."""

    key = "nll"


class BrierScore(_MeterMetric):
    """Multiclass Brier score, summed over classes (:func:`torchcal.metrics.brier`)."""

    key = "brier"


class CalibrationMetrics(_MeterMetric):
    """Every metric of one state as a dict (``self.log_dict(metric.compute())``): ``ece``,
    ``mce``, ``rmsce``, ``classwise_ece``, ``nll``, ``brier``, ``error`` (0-d float64)."""

    KEYS = ("ece", "mce", "rmsce", "classwise_ece", "nll", "brier", "error")

    def compute(self) -> dict[str, torch.Tensor]:  # type: ignore[override]
        """Every metric over the samples seen (synced across processes)."""
        out = self._all()
        return {k: out[k] for k in self.KEYS}

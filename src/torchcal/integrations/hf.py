r"""Hugging Face ``transformers``: train with any torchcal loss, calibration metrics at every
evaluation, stateful losses (AdaFocal) fed with the evaluation logits.

Install with ``pip install "torchcal[hf]"`` (``transformers`` and ``accelerate``, which the
``Trainer`` needs).

.. code-block:: python

    from transformers import Trainer, TrainingArguments
    from torchcal.integrations.hf import CalibrationCallback, compute_loss_func, compute_metrics
    from torchcal.losses import AdaFocalLoss

    loss = AdaFocalLoss()
    trainer = Trainer(
        model=model, args=TrainingArguments(..., eval_strategy="epoch"),
        train_dataset=train, eval_dataset=val,
        compute_loss_func=compute_loss_func(loss),      # train with the torchcal loss
        compute_metrics=compute_metrics(),              # eval_ece ... logged like eval_loss
        callbacks=[CalibrationCallback(losses=[loss])],  # γ moves after every evaluation
    )
    trainer.train()
    [h["eval_ece"] for h in trainer.state.log_history if "eval_ece" in h]

With ``Trainer(compute_metrics=compute_metrics())`` the ``Trainer`` logs, over the evaluation set,

.. math::
    \mathrm{ECE} = \sum_b \frac{n_b}{N} |\mathrm{acc}_b - \mathrm{conf}_b|, \qquad
    \mathrm{AdaECE} \text{ (the same over equal-mass bins)}, \qquad
    \mathrm{NLL} = -\frac{1}{N}\sum_i \log p_{i, y_i}

as ``eval_ece``, ``eval_adaptive_ece``, ``eval_nll`` (and ``eval_error``) with its own metrics
(console, TensorBoard, W&B), with the conventions of :mod:`torchcal.metrics.calibration`; the
callback adds the same numbers to ``state.log_history`` and feeds stateful losses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from .._validation import check_positive_int
from ..metrics import flatten_valid
from ._common import (
    METRICS,
    as_loss_list,
    calibration_metrics,
    claim,
    feed_losses,
    find_losses,
    missing_extra,
    start_epoch,
    warn_missing,
    warn_unclaimed,
)

try:  # optional dependency, imported here only: this module is loaded only by its users
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as e:  # pragma: no cover - the test environment has the extra installed
    raise missing_extra("hf", "Hugging Face transformers and accelerate", "hf") from e

__all__ = ["CalibrationCallback", "compute_loss_func", "compute_metrics"]


def _logits_of(outputs: Any) -> torch.Tensor:
    """The logits of a model output: ``outputs["logits"]`` or, for tuples, ``outputs[0]``."""
    if isinstance(outputs, Mapping) and "logits" in outputs:
        return outputs["logits"]
    if isinstance(outputs, torch.Tensor):
        return outputs
    return outputs[0]


def compute_loss_func(loss: nn.Module) -> Callable[..., torch.Tensor]:
    """A ``Trainer(compute_loss_func=...)`` that trains with a torchcal loss (or any loss taking
    ``(logits, target)`` like ``F.cross_entropy``).

    The ``Trainer`` calls it with the model outputs (labels removed from the inputs), the labels
    and ``num_items_in_batch``, the number of labels different from -100 in the whole
    accumulated (and, with ``average_tokens_across_devices``, global) batch.  Logits (N, C) go
    to the loss with labels (N,); (N, T, C) logits of token classification become (N, C, T),
    the loss convention, with -100 labels ignored (torchcal's default ``ignore_index``).

    With ``num_items_in_batch`` (always given by recent ``transformers`` when this function is
    set) the value returned is the one the ``Trainer`` expects, so that gradient accumulation
    and several devices give the gradient of one big batch:

    * ``reduction="mean"``: ``mean_loss · n / num_items_in_batch`` with ``n`` the labels of
      this micro-batch that are not -100, i.e. the mean over the accumulated batch;
    * ``reduction="sum"`` (the papers' training): the sum, unnormalised;

    without it, the loss as configured.  ``reduction="none"`` is rejected.  The loss itself is
    kept as the attribute ``loss`` of the returned function; pass the same object to
    :class:`CalibrationCallback` when it is stateful: at the first training step, a loss that
    wants validation statistics (AdaFocal, the temperature-aware losses, the ECE loss) that no
    ``CalibrationCallback`` was given raises a
    :class:`~torchcal.losses.base.MissingValidationWarning` (it would never move).

    Args:
        loss: the loss module, e.g. ``torchcal.losses.AdaFocalLoss()`` or
            ``create_loss("flsd53")``.

    Returns:
        ``fn(outputs, labels, num_items_in_batch=None) -> scalar loss``.

    Example:
        >>> from torchcal.losses import FocalLoss
        >>> fn = compute_loss_func(FocalLoss(gamma=0.0))  # γ = 0: cross-entropy
        >>> z, y = torch.tensor([[0.0, 0.0], [0.0, 0.0]]), torch.tensor([0, 1])
        >>> fn({"logits": z}, y)  # log 2
        tensor(0.6931)
        >>> fn({"logits": z}, y, num_items_in_batch=4)  # half of an accumulated batch of 4
        tensor(0.3466)
    """
    if not callable(loss):
        raise TypeError(f"Expected `loss` to be a callable loss module, got {type(loss).__name__}")
    reduction = getattr(loss, "reduction", "mean")
    if reduction not in ("mean", "sum"):
        raise ValueError(
            f"Expected the loss' `reduction` to be 'mean' or 'sum' (the Trainer needs a scalar), "
            f"got {reduction!r}"
        )
    ignore_index = getattr(loss, "ignore_index", -100)
    checked = []

    def fn(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
        if not checked and torch.is_grad_enabled():  # the first training step
            checked.append(True)
            warn_unclaimed([loss], "no torchcal CalibrationCallback was given this loss",
                           "pass `callbacks=[CalibrationCallback(losses=[loss])]` to the Trainer")
        logits = _logits_of(outputs)
        if logits.ndim > 2:  # (N, T, C) -> (N, C, T), the loss' (N, C, d1, ...) convention
            logits = logits.movedim(-1, 1)
        value = loss(logits, labels)
        if num_items_in_batch is None or getattr(loss, "reduction", "mean") == "sum":
            return value
        n = (labels != ignore_index).sum()
        return value * n.to(value.dtype) / num_items_in_batch

    fn.loss = loss  # type: ignore[attr-defined]
    return fn


class CalibrationCallback(TrainerCallback):
    """Calibration metrics at every evaluation of a ``transformers.Trainer``, and the evaluation
    logits fed to stateful torchcal losses (AdaFocal).

    At each evaluation (``on_evaluate``) the callback predicts the evaluation set itself, with
    the model and the evaluation dataloader the ``Trainer`` hands to callbacks (one extra
    forward pass per batch, in eval mode and without gradients): the labels (``labels``, or the
    single name in ``args.label_names``) are taken out of each batch, the rest goes to the model
    and its ``logits`` are kept; (N, T, C) token logits are flattened and -100 labels dropped.
    Then it

    1. computes ECE (equal-width bins), AdaECE (equal-mass), NLL and error with
       :class:`torchcal.metrics.CalibrationMeter` and adds them as ``eval_ece``,
       ``eval_adaptive_ece``, ``eval_nll``, ``eval_error`` (the evaluation's own prefix, e.g.
       ``eval_val2_ece`` for a dict of evaluation sets) to the evaluation's ``metrics`` (so
       ``metric_for_best_model="ece"`` works and ``trainer.evaluate()`` returns them) and to
       its entry in ``trainer.state.log_history``.  Reporting integrations (TensorBoard, W&B)
       and the console are called before ``on_evaluate`` and do not see them: for those, pass
       :func:`compute_metrics` to the ``Trainer`` as well;
    2. during ``trainer.train()`` and after at least one optimiser step (so not for
       ``eval_on_start`` nor a standalone ``trainer.evaluate()``), calls ``on_validation`` of
       every loss in ``losses`` that wants validation outputs.

    It also calls ``set_epoch`` of the losses at the start of each epoch (scheduled focal loss).

    Missing statistics are not silent: at ``on_train_begin`` the callback warns
    (:class:`~torchcal.losses.base.MissingValidationWarning`) when it was given stateful
    losses but ``eval_strategy="no"``, and when the model holds a stateful torchcal loss as an
    attribute that it was not given; :func:`compute_loss_func` warns for a stateful loss that
    no callback was given, and the loss itself warns when an epoch starts without its
    statistics.

    Distributed.  The evaluation dataloader of a distributed ``Trainer`` gives each process its
    share: the metrics are synced over ``torch.distributed`` (every process records the same
    numbers) and each loss gets this process' share and syncs itself (AdaFocal gathers), so the
    loss state stays identical on every process.  ``accelerate`` repeats a few samples to even
    out the last batch; they count twice here (an evaluation set divisible by the global
    evaluation batch avoids it).

    Args:
        losses: a stateful loss or an iterable of them (the objects given to
            :func:`compute_loss_func`); None records the metrics only.
        n_bins: bins of ECE and AdaECE (15).

    Example:
        >>> cb = CalibrationCallback(n_bins=10)
        >>> cb.n_bins, cb.losses
        (10, [])
    """

    def __init__(self, losses: Any = None, n_bins: int = 15) -> None:
        super().__init__()
        self.n_bins = check_positive_int(n_bins, "n_bins")
        self.losses = as_loss_list(losses) or []
        claim(self.losses)
        self._in_train = False

    # ------------------------------------------------------------------ hooks
    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, model: nn.Module | None = None,
                       **kwargs: Any) -> None:
        self._in_train = True
        strategy = getattr(args, "eval_strategy", None)
        if str(getattr(strategy, "value", strategy)) == "no":
            warn_missing(self.losses, "the Trainer never evaluates (eval_strategy='no')",
                         "set `eval_strategy` and an `eval_dataset`")
        if model is not None:
            given = {id(x) for x in self.losses}
            warn_missing([x for x in find_losses(model) if id(x) not in given],
                         "the CalibrationCallback was not given them",
                         "pass `CalibrationCallback(losses=[loss])`")

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self._in_train = False

    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        # state.epoch is epoch + (step + 1) / steps_in_epoch: a whole number at epoch ends
        start_epoch(self.losses, int(state.epoch or 0))

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    model: nn.Module | None = None, eval_dataloader: Any = None,
                    metrics: dict[str, float] | None = None, **kwargs: Any) -> None:
        if model is None or eval_dataloader is None:
            return
        logits, labels = self.predict(model, eval_dataloader, _label_name(args))
        values = calibration_metrics(logits, labels, self.n_bins)
        prefix = _metric_prefix(metrics)
        named = {f"{prefix}_{k}": float(values[k]) for k in METRICS}
        if metrics is not None:
            metrics.update(named)
        for entry in reversed(state.log_history):  # this evaluation's entry, logged just before
            if f"{prefix}_runtime" in entry or f"{prefix}_loss" in entry:
                entry.update(named)
                break
        else:
            state.log_history.append({**named, "epoch": state.epoch, "step": state.global_step})
        if self._in_train and state.global_step > 0:
            feed_losses(self.losses, logits, labels)

    # ------------------------------------------------------------- prediction
    @staticmethod
    @torch.no_grad()
    def predict(model: nn.Module, dataloader: Any,
                label_name: str = "labels") -> tuple[torch.Tensor, torch.Tensor]:
        """(M, C) logits and (M,) labels of every batch of ``dataloader`` (mappings of tensors
        with a ``label_name`` entry), -100 labels dropped; the model's mode is restored.
        Token logits (N, T, C) with (N, T) labels (a causal LM's) are flattened by position,
        as :func:`compute_metrics` does (before issue 39 they raised a shape error)."""
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        zs, ys = [], []
        try:
            for batch in dataloader:
                if not isinstance(batch, Mapping) or label_name not in batch:
                    raise ValueError(
                        f"Expected evaluation batches to be mappings with a {label_name!r} entry, "
                        f"got {type(batch).__name__}"
                        + (f" with keys {sorted(batch)}" if isinstance(batch, Mapping) else "")
                    )
                inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                          for k, v in batch.items() if k != label_name}
                z = _logits_of(model(**inputs)).detach()
                y = batch[label_name].to(z.device)
                if z.ndim > 2 and tuple(y.shape) == tuple(z.shape[:-1]):
                    z = z.movedim(-1, 1)  # (N, T, C) -> (N, C, T), flatten_valid's convention
                z, y = flatten_valid(z, y)
                zs.append(z.float() if z.dtype != torch.float64 else z)
                ys.append(y)
        finally:
            model.train(was_training)
        if not zs:
            raise ValueError("Expected at least one evaluation batch, got an empty dataloader")
        return torch.cat(zs), torch.cat(ys)


def _label_name(args: TrainingArguments) -> str:
    names = getattr(args, "label_names", None)
    if not names:
        return "labels"
    if len(names) != 1:
        raise ValueError(f"Expected one entry in `label_names` for calibration, got {names!r}")
    return names[0]


def _metric_prefix(metrics: Mapping[str, Any] | None) -> str:
    """The evaluation's metric prefix ("eval", "eval_<name>", "test"), from its runtime key."""
    for key in metrics or ():
        if key.endswith("_runtime"):
            return key[: -len("_runtime")]
    return "eval"


def compute_metrics(n_bins: int = 15) -> Callable[[Any], dict[str, float]]:
    """A ``Trainer(compute_metrics=...)`` giving ECE, AdaECE, NLL and error of every evaluation,
    which the ``Trainer`` then logs as it logs ``eval_loss``: on the console, in TensorBoard
    (``eval/ece``), W&B and every other ``report_to`` integration, in ``state.log_history``
    and in what ``trainer.evaluate()`` returns (``eval_ece``, ``eval_adaptive_ece``,
    ``eval_nll``, ``eval_error``; ``metric_for_best_model="ece"`` with
    ``greater_is_better=False`` selects by ECE).

    The ``Trainer`` gathers the evaluation logits over all processes and batches before it
    calls this (memory O(N·C)); (N, T, C) token logits are flattened and -100 labels dropped,
    as :class:`CalibrationCallback` does.  Use both together when a loss is stateful: this
    function for the logged metrics, the callback to feed the loss.

    Args:
        n_bins: bins of ECE and AdaECE (15).

    Returns:
        ``fn(eval_prediction) -> {"ece": ..., "adaptive_ece": ..., "nll": ..., "error": ...}``
        (floats; the ``Trainer`` adds the ``eval_`` prefix).

    Example:
        >>> import numpy as np
        >>> from transformers import EvalPrediction
        >>> fn = compute_metrics(n_bins=2)
        >>> out = fn(EvalPrediction(predictions=np.array([[2.0, 0.0], [0.0, 1.0]]),
        ...                         label_ids=np.array([0, 0])))
        >>> {k: round(v, 4) for k, v in out.items()}
        {'ece': 0.3059, 'adaptive_ece': 0.4251, 'nll': 0.7201, 'error': 0.5}
    """
    check_positive_int(n_bins, "n_bins")

    def fn(eval_prediction: Any) -> dict[str, float]:
        predictions = eval_prediction.predictions
        if isinstance(predictions, (tuple, list)):  # (logits, hidden states, ...)
            predictions = predictions[0]
        logits = torch.as_tensor(np.asarray(predictions))
        labels = torch.as_tensor(np.asarray(eval_prediction.label_ids)).long()
        if logits.ndim > 2:  # (N, T, C) -> (N, C, T), flatten_valid's convention
            logits = logits.movedim(-1, 1)
        logits, labels = flatten_valid(logits, labels)
        values = calibration_metrics(logits, labels, n_bins)
        return {k: float(values[k]) for k in METRICS}

    return fn

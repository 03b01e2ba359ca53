r"""PyTorch Lightning: calibration metrics and stateful torchcal losses in any Lightning fit.

Install with ``pip install "torchcal[lightning]"`` (the maintained ``lightning`` package; this
module uses ``lightning.pytorch``).

.. code-block:: python

    from torchcal.integrations.lightning import CalibrationCallback
    from torchcal.losses import AdaFocalLoss

    class Net(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = ...
            self.criterion = AdaFocalLoss()          # found by the callback

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return self.criterion(self(x), y)

    trainer = lightning.Trainer(callbacks=[CalibrationCallback()])
    trainer.fit(Net(), train_loader, val_loader)
    trainer.callback_metrics["val_ece"]

After every validation epoch the callback logs (keys ``val_ece``, ``val_adaptive_ece``,
``val_nll``, ``val_error``), over the whole validation set,

.. math::
    \mathrm{ECE} = \sum_b \frac{n_b}{N} |\mathrm{acc}_b - \mathrm{conf}_b|, \qquad
    \mathrm{NLL} = -\frac{1}{N}\sum_i \log p_{i, y_i}, \qquad
    \mathrm{error} = 1 - \frac{1}{N}\sum_i [\hat y_i = y_i]

with equal-width bins for ECE and equal-mass bins for AdaECE (the conventions of
:mod:`torchcal.metrics.calibration`), then hands the validation logits to the stateful losses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

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
)

try:  # optional dependency, imported here only: this module is loaded only by its users
    from lightning.pytorch import Callback, LightningModule, Trainer
except ImportError as e:  # pragma: no cover - the test environment has the extra installed
    raise missing_extra("lightning", "PyTorch Lightning (the `lightning` package)",
                        "lightning") from e

__all__ = ["CalibrationCallback"]


def _default_logits(pl_module: LightningModule, batch: Any) -> torch.Tensor:
    return pl_module(batch[0])


def _default_labels(batch: Any) -> torch.Tensor:
    return batch[1]


class CalibrationCallback(Callback):
    """Log calibration metrics and drive stateful torchcal losses (AdaFocal) in a Lightning fit.

    The callback needs no change to the user's ``validation_step``: after each validation batch
    it computes the logits itself, ``logits_fn(pl_module, batch)`` (one extra forward pass, in
    the validation loop's no-grad mode), with the labels ``labels_fn(batch)``; the defaults are
    ``pl_module(batch[0])`` and ``batch[1]``.  Logits of shape (N, C, d1, ...) are flattened
    and labels equal to -100 dropped.  Only the first validation dataloader is used.

    At the end of each validation epoch (the sanity check excepted) it

    1. computes ECE, AdaECE, NLL and error over the validation set with
       :class:`torchcal.metrics.CalibrationMeter` and logs them through ``pl_module.log`` as
       ``{prefix}ece``, ``{prefix}adaptive_ece``, ``{prefix}nll``, ``{prefix}error`` (so they
       are in ``trainer.callback_metrics`` and usable by ``ModelCheckpoint(monitor=...)``);
    2. during ``trainer.fit`` only (not ``trainer.validate``), calls ``on_validation`` of every
       stateful loss: those in ``losses``, or when ``losses`` is None the objects with an
       ``on_validation`` method among the module's sub-modules and attributes (the protocol of
       :mod:`torchcal.losses.base`; ``nn.CrossEntropyLoss`` and friends are ignored).

    It also calls ``set_epoch(trainer.current_epoch)`` of those losses at the start of each
    training epoch, so scheduled focal loss (FLSD-53) follows its schedule.

    Missing statistics are not silent (:class:`~torchcal.losses.base.MissingValidationWarning`):
    the callback warns when ``losses`` is given and the module holds another stateful torchcal
    loss as an attribute, and when a training epoch starts after the first and no validation
    epoch fed the stateful losses since (no validation dataloader, no ``validation_step``,
    ``limit_val_batches=0`` or ``check_val_every_n_epoch > 1``).

    Distributed (DDP).  Every rank collects the logits of its own validation share.  The
    metrics are synced (the meter all-reduces its per-bin sums and gathers the confidences),
    so every rank logs the same numbers; each loss gets this rank's share as the protocol asks
    and syncs itself (AdaFocal gathers all ranks' confidences), so the loss state stays
    identical on every rank.  Lightning's distributed sampler repeats up to ``world_size - 1``
    validation samples to even out the shares; they count twice here as in any metric logged
    by Lightning (a validation set divisible by the world size avoids it).

    Args:
        n_bins: bins of ECE and AdaECE (15).
        losses: a stateful loss or an iterable of them; None (default) finds them on the module.
        logits_fn: ``(pl_module, batch) -> logits`` (N, C) or (N, C, d1, ...); default
            ``pl_module(batch[0])``.
        labels_fn: ``batch -> labels`` (N,) or (N, d1, ...); default ``batch[1]``.
        prefix: prefix of the logged names ("val_").

    Example:
        >>> cb = CalibrationCallback(n_bins=10)
        >>> cb.n_bins, cb.metric_names
        (10, ('val_ece', 'val_adaptive_ece', 'val_nll', 'val_error'))
    """

    def __init__(
        self,
        n_bins: int = 15,
        losses: Any = None,
        logits_fn: Callable[[LightningModule, Any], torch.Tensor] | None = None,
        *,
        labels_fn: Callable[[Any], torch.Tensor] | None = None,
        prefix: str = "val_",
    ) -> None:
        super().__init__()
        self.n_bins = check_positive_int(n_bins, "n_bins")
        self.losses = as_loss_list(losses)
        claim(self.losses or [])
        for name, fn in (("logits_fn", logits_fn), ("labels_fn", labels_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"Expected `{name}` to be None or callable, got {type(fn).__name__}")
        self.logits_fn = logits_fn if logits_fn is not None else _default_logits
        self.labels_fn = labels_fn if labels_fn is not None else _default_labels
        if not isinstance(prefix, str):
            raise TypeError(f"Expected `prefix` to be a string, got {type(prefix).__name__}")
        self.prefix = prefix
        self._logits: list[torch.Tensor] = []
        self._labels: list[torch.Tensor] = []
        self._fed: bool | None = None  # None before the first training epoch of a fit
        self._warned = False

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The names logged after each validation epoch."""
        return tuple(self.prefix + k for k in METRICS)

    def _losses(self, pl_module: LightningModule) -> list[Any]:
        return self.losses if self.losses is not None else find_losses(pl_module)

    # ------------------------------------------------------------------ hooks
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._fed = None
        if self.losses is not None:
            given = {id(x) for x in self.losses}
            warn_missing([x for x in find_losses(pl_module) if id(x) not in given],
                         "the CalibrationCallback was given other `losses`",
                         "add them to `CalibrationCallback(losses=...)`")

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        losses = self._losses(pl_module)
        claim(losses)
        if self._fed is False and not self._warned:
            self._warned = True
            warn_missing(losses, f"training epoch {trainer.current_epoch} started and no "
                         "validation epoch ran since the previous one (no validation "
                         "dataloader, no `validation_step`, `limit_val_batches=0` or "
                         "`check_val_every_n_epoch` > 1)",
                         "pass `val_dataloaders` to `trainer.fit` and validate every epoch")
        self._fed = False
        start_epoch(losses, trainer.current_epoch)

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._logits, self._labels = [], []

    def on_validation_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
        batch_idx: int, dataloader_idx: int = 0,
    ) -> None:
        if trainer.sanity_checking or dataloader_idx != 0:
            return
        with torch.no_grad():
            logits = self.logits_fn(pl_module, batch)
        labels = self.labels_fn(batch)
        z, y = flatten_valid(logits.detach(), torch.as_tensor(labels, device=logits.device))
        if not z.is_floating_point() or z.dtype in (torch.float16, torch.bfloat16):
            z = z.float()
        self._logits.append(z)
        self._labels.append(y)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or not self._logits:
            return
        # Lightning validates in inference mode; the losses' state must stay ordinary tensors.
        with torch.inference_mode(False):
            z = torch.cat(self._logits).clone()
            y = torch.cat(self._labels).clone()
            self._logits, self._labels = [], []
            metrics = calibration_metrics(z, y, self.n_bins)
            # The values are already identical on every rank; syncing with max keeps them
            # exact and spares Lightning's "use sync_dist=True" warning under DDP.
            for key, value in metrics.items():
                pl_module.log(self.prefix + key, value.float(), on_step=False, on_epoch=True,
                              sync_dist=True, reduce_fx="max")
            if trainer.state.fn == "fit":
                feed_losses(self._losses(pl_module), z, y)
                self._fed = True

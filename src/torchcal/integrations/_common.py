"""What the Lightning and ``transformers`` callbacks share (no optional dependency here).

* :func:`as_loss_list` / :func:`find_losses`: the stateful losses a callback drives, given or
  found among a module's attributes (the protocol of :mod:`torchcal.losses.base`: an object
  with an ``on_validation`` method);
* :func:`~torchcal.metrics.flatten_valid` (from :mod:`torchcal.metrics`, where every metric applies it):
  (N, C, d1, ...) logits and (N, d1, ...) labels to (M, C) and (M,), dropping
  ``ignore_index`` entries (token classification, segmentation);
* :func:`calibration_metrics`: ECE, AdaECE, NLL and error through
  :class:`torchcal.metrics.CalibrationMeter`, synced over ``torch.distributed`` when it is
  initialised (every rank gets the numbers over all ranks' samples);
* :func:`feed_losses` / :func:`start_epoch`: the two hooks of the loss protocol;
* :func:`claim` / :func:`warn_unclaimed`: a callback claims the losses it drives, so that a
  stateful loss trained without one (it would never get validation statistics) is named in a
  :class:`~torchcal.losses.base.MissingValidationWarning`.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..errors import MissingValidationWarning
from ..losses.base import loss_on_validation, loss_set_epoch, loss_wants_validation
from ..metrics import CalibrationMeter

__all__ = ["METRICS", "missing_extra", "as_loss_list", "find_losses", "calibration_metrics",
           "feed_losses", "start_epoch", "claim", "warn_unclaimed", "warn_missing"]

#: The metric keys every callback reports (the keys of :class:`~torchcal.metrics.CalibrationMeter`).
METRICS = ("ece", "adaptive_ece", "nll", "error")


def missing_extra(module: str, what: str, extra: str) -> ImportError:
    """The error an integration module raises when its optional dependency is missing.

    >>> missing_extra("hf", "transformers", "hf")
    ImportError('torchcal.integrations.hf needs transformers: pip install "torchcal[hf]"')
    """
    return ImportError(f'torchcal.integrations.{module} needs {what}: pip install "torchcal[{extra}]"')


def _follows_protocol(obj: Any) -> bool:
    return callable(getattr(obj, "on_validation", None))


def as_loss_list(losses: Any) -> list[Any] | None:
    """``None``, one loss or an iterable of losses -> ``None`` or a list, each checked.

    >>> from torchcal.losses import AdaFocalLoss
    >>> len(as_loss_list(AdaFocalLoss())), as_loss_list(None)
    (1, None)
    >>> as_loss_list([nn.CrossEntropyLoss()])
    Traceback (most recent call last):
    ...
    TypeError: Expected `losses` to hold objects with an `on_validation` method (the protocol of torchcal.losses.base), got CrossEntropyLoss at position 0
    """
    if losses is None:
        return None
    if isinstance(losses, nn.Module) or _follows_protocol(losses):
        losses = [losses]
    elif isinstance(losses, Iterable) and not isinstance(losses, (str, bytes)):
        losses = list(losses)
    else:
        raise TypeError(
            f"Expected `losses` to be None, a loss or an iterable of losses, got "
            f"{type(losses).__name__}"
        )
    for i, loss in enumerate(losses):
        if not _follows_protocol(loss):
            raise TypeError(
                "Expected `losses` to hold objects with an `on_validation` method (the protocol "
                f"of torchcal.losses.base), got {type(loss).__name__} at position {i}"
            )
    return losses


def find_losses(module: nn.Module) -> list[Any]:
    """The objects with an ``on_validation`` method among ``module``'s sub-modules and public
    attributes (``module`` itself excluded), each once, in registration order.

    >>> from torchcal.losses import AdaFocalLoss
    >>> net = nn.Module()
    >>> net.body, net.criterion = nn.Linear(2, 2), AdaFocalLoss()
    >>> [type(x).__name__ for x in find_losses(net)]
    ['AdaFocalLoss']
    """
    candidates = [m for m in module.modules() if m is not module]
    candidates += [v for k, v in vars(module).items()
                   if not k.startswith("_") and not isinstance(v, nn.Module)]
    found: list[Any] = []
    seen: set[int] = set()
    for c in candidates:
        if _follows_protocol(c) and id(c) not in seen:
            seen.add(id(c))
            found.append(c)
    return found


@torch.no_grad()
def calibration_metrics(logits: torch.Tensor, labels: torch.Tensor,
                        n_bins: int) -> dict[str, torch.Tensor]:
    """ECE (equal-width), AdaECE (equal-mass), NLL and error of (N, C) logits, keyed as
    :data:`METRICS`, as 0-d float64 tensors.

    Computed by :class:`torchcal.metrics.CalibrationMeter`, so under an initialised
    ``torch.distributed`` group every rank must call this with its own share and every rank
    gets the figures over all shares (one all-reduce and one all-gather).

    >>> out = calibration_metrics(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]),
    ...                           n_bins=2)
    >>> {k: round(float(v), 4) for k, v in out.items()}  # confidences σ(2) (right), σ(1) (wrong)
    {'ece': 0.3059, 'adaptive_ece': 0.4251, 'nll': 0.7201, 'error': 0.5}
    """
    meter = CalibrationMeter(num_classes=logits.shape[1], n_bins=n_bins, topk=1,
                             device=logits.device)
    meter.update(logits=logits, labels=labels)
    out = meter.compute()
    return {k: out[k] for k in METRICS}


def feed_losses(losses: Iterable[Any], logits: torch.Tensor, labels: torch.Tensor) -> None:
    """``on_validation`` of every loss that wants validation outputs, with this rank's share
    (a distributed loss such as AdaFocal gathers the shares itself)."""
    for loss in losses:
        loss_on_validation(loss, logits=logits, labels=labels)


def start_epoch(losses: Iterable[Any], epoch: int) -> None:
    """``set_epoch(epoch)`` of every loss that has one (scheduled focal loss picks its γ)."""
    for loss in losses:
        loss_set_epoch(loss, epoch)


#: The stateful losses some callback drives (weakly held: a loss does not outlive its user).
_CLAIMED: weakref.WeakSet[Any] = weakref.WeakSet()


def claim(losses: Iterable[Any]) -> None:
    """Record that a callback feeds these losses their validation statistics."""
    for loss in losses:
        try:
            _CLAIMED.add(loss)
        except TypeError:  # not weak-referenceable: nothing to check it against later
            pass


def warn_missing(losses: Iterable[Any], why: str, fix: str) -> None:
    """One :class:`MissingValidationWarning` naming the stateful ``losses`` (if any)."""
    names = [type(x).__name__ for x in losses if loss_wants_validation(x)]
    if names:
        warnings.warn(f"{', '.join(names)} need validation statistics, but {why}: {fix}; "
                      "otherwise the loss keeps its initial state (AdaFocal stays focal loss "
                      "with γ = gamma_init)", MissingValidationWarning, stacklevel=3)


def warn_unclaimed(losses: Iterable[Any], why: str, fix: str) -> None:
    """:func:`warn_missing` for those of ``losses`` that no callback has claimed."""
    unclaimed = []
    for x in losses:
        try:
            if x not in _CLAIMED:
                unclaimed.append(x)
        except TypeError:
            pass
    warn_missing(unclaimed, why, fix)

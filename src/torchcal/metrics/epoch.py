"""The numbers a training loop logs per epoch: the metrics of a whole split
(:func:`epoch_metrics`, and :func:`stacked_epoch_metrics` for M packed lanes) and the binned
sums of M lanes at once (:func:`stacked_binned_sums`, which the trainer's streaming training
statistics, :class:`torchcal.train.engine.PackedStats`, accumulate).

The binned calibration sums and the ECE are those of :mod:`torchcal.metrics` (the same bins and
formula as :func:`torchcal.metrics.ece`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .binning import binned_sums, calibration_from_sums, equal_width_bin_index
from .calibration import ece
from .scoring import entropy

__all__ = ["epoch_metrics", "stacked_epoch_metrics", "stacked_binned_sums",
           "EPOCH_KEYS", "DIAGNOSTIC_KEYS"]


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1 (NaN when the mask is empty), on the device."""
    n = mask.sum()
    nan = torch.tensor(float("nan"), device=values.device)
    return torch.where(n > 0, (values * mask).sum() / n.clamp_min(1), nan)


def epoch_metrics(logits: torch.Tensor, labels: torch.Tensor, *, n_bins: int = 15,
                  diagnostics: bool = False) -> dict[str, float]:
    """NLL, ECE, error (and with ``diagnostics`` the NLL / entropy of correct vs incorrect
    samples) of a logged split, as floats (one host transfer).

    Example:
        >>> z, y = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0])
        >>> {k: round(v, 4) for k, v in epoch_metrics(z, y).items()}
        {'nll': 0.7201, 'error': 0.5, 'ece': 0.4251}
    """
    z = logits.float()
    nll_i = F.cross_entropy(z, labels, reduction="none")
    correct = z.argmax(1) == labels
    vals = [nll_i.mean(), 1.0 - correct.float().mean(),
            ece(logits=z, labels=labels, n_bins=n_bins, validate_args=False)]
    keys = ["nll", "error", "ece"]
    if diagnostics:
        ent = entropy(logits=z, validate_args=False)
        c = correct.float()
        vals += [_masked_mean(nll_i, c), _masked_mean(nll_i, 1 - c),
                 _masked_mean(ent, c), _masked_mean(ent, 1 - c)]
        keys += ["nll_correct", "nll_incorrect", "entropy_correct", "entropy_incorrect"]
    host = torch.stack([v.float().reshape(()) for v in vals]).cpu().tolist()
    return dict(zip(keys, host, strict=True))


#: The keys of :func:`epoch_metrics` (and the columns of :func:`stacked_epoch_metrics`), and the
#: keys ``diagnostics=True`` adds.
EPOCH_KEYS = ("nll", "error", "ece")
DIAGNOSTIC_KEYS = ("nll_correct", "nll_incorrect", "entropy_correct", "entropy_incorrect")


def stacked_binned_sums(conf: torch.Tensor, correct: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Per-bin (count, confidence sum, correct count) of M rows of confidences at once: ``conf``
    and ``correct`` of shape (M, N) give float64 sums (3, M, B), each row binned as
    :func:`~torchcal.metrics.binning.binned_sums` bins it (one pass, lane-offset bin keys)."""
    m, n = conf.shape
    offset = torch.arange(m, device=conf.device).repeat_interleave(n) * n_bins
    idx = equal_width_bin_index(conf.reshape(-1), n_bins) + offset
    return binned_sums(idx, conf.reshape(-1), correct.reshape(-1), m * n_bins).reshape(
        3, m, n_bins)


def _stacked_masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    n = mask.sum(1)
    return torch.where(n > 0, (values * mask).sum(1) / n.clamp_min(1),
                       torch.full_like(n, float("nan")))


def stacked_epoch_metrics(logits: torch.Tensor, labels: torch.Tensor, *, n_bins: int = 15,
                          diagnostics: bool = False) -> torch.Tensor:
    """:func:`epoch_metrics` of M models on one split at once, on the device (no host copy).

    Args:
        logits: (M, N, C), model ``m``'s logits in row ``m``.
        labels: (N,) shared labels or (M, N).
        n_bins: equal-width bins of the ECE.
        diagnostics: add the columns :data:`DIAGNOSTIC_KEYS`.

    Returns:
        float64 (M, K): the columns :data:`EPOCH_KEYS` (then :data:`DIAGNOSTIC_KEYS`), row
        ``m`` equal to ``epoch_metrics(logits[m], labels)`` to float rounding.

    Example:
        >>> z = torch.tensor([[[2.0, 0.0], [0.0, 1.0]], [[0.0, 2.0], [1.0, 0.0]]])
        >>> stacked_epoch_metrics(z, torch.tensor([0, 0]))[:, 1].tolist()  # the errors
        [0.5, 0.5]
    """
    if logits.ndim != 3:
        raise ValueError(f"Expected `logits` of shape (M, N, C), got {tuple(logits.shape)}")
    m, n, c = logits.shape
    y = labels.expand(m, n) if labels.ndim == 1 else labels
    z = logits.float()
    logp = torch.log_softmax(z, 2)
    nll_i = -logp.gather(2, y.unsqueeze(2)).squeeze(2)
    conf, pred = logp.max(dim=2)
    correct = pred.eq(y)
    sums = stacked_binned_sums(conf.exp(), correct, n_bins)
    cols = [nll_i.double().mean(1), 1.0 - correct.double().mean(1),
            calibration_from_sums(sums, "l1")]
    if diagnostics:
        ent = -(logp.exp() * logp).nan_to_num().sum(2)
        cf = correct.double()
        cols += [_stacked_masked_mean(nll_i.double(), cf),
                 _stacked_masked_mean(nll_i.double(), 1 - cf),
                 _stacked_masked_mean(ent.double(), cf), _stacked_masked_mean(ent.double(), 1 - cf)]
    return torch.stack([col.double() for col in cols], 1)

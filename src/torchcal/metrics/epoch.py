"""The numbers a training loop logs per epoch: the streaming training statistics
(:class:`EpochStats`, fixed-size state accumulated on the device, no host syncs) and the metrics
of a whole split (:func:`epoch_metrics`).

The binned calibration sums and the ECE are those of :mod:`torchcal.metrics` (the same bins and
formula as :func:`torchcal.metrics.ece`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .binning import binned_sums, calibration_from_sums, equal_width_bin_index
from .calibration import ece
from .distributed import world_size
from .scoring import entropy

__all__ = ["EpochStats", "epoch_metrics", "stacked_epoch_metrics", "stacked_binned_sums",
           "EPOCH_KEYS", "DIAGNOSTIC_KEYS"]


class EpochStats:
    """Fixed-size per-epoch training statistics accumulated on the device (no host syncs): the
    loss, NLL, error and equal-width ECE of the training batches seen.

    Args:
        n_bins: equal-width bins of the ECE.
        device: where the sums live (the training device).

    Example:
        >>> stats = EpochStats(15, torch.device("cpu"))
        >>> z, y = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0])
        >>> stats.update(z, y, torch.tensor(1.5))
        >>> {k: round(v, 4) for k, v in stats.compute().items()}
        {'loss': 0.75, 'nll': 0.7201, 'error': 0.5, 'ece': 0.4251}
    """

    def __init__(self, n_bins: int, device: torch.device) -> None:
        self.n_bins = n_bins
        # loss_sum, nll_sum, correct, count
        self.scalars = torch.zeros(4, dtype=torch.float64, device=device)
        # per bin: count, conf sum, correct sum (torchcal.metrics' binned sums)
        self.bins = torch.zeros(3, n_bins, dtype=torch.float64, device=device)

    @torch.no_grad()
    def update(self, logits: torch.Tensor, y: torch.Tensor, loss_sum: torch.Tensor) -> None:
        """Add a batch: logits (N, C), labels (N,) and the batch's summed loss."""
        z = logits.detach().float()
        logp = torch.log_softmax(z, 1)
        conf, pred = logp.max(dim=1)
        correct = pred.eq(y)
        conf = conf.exp()
        nll = -logp.gather(1, y[:, None]).sum()
        self.scalars += torch.stack([loss_sum.detach().double(), nll.double(),
                                     correct.sum().double(),
                                     torch.tensor(float(y.shape[0]), dtype=torch.float64,
                                                  device=z.device)])
        self.bins += binned_sums(equal_width_bin_index(conf, self.n_bins), conf, correct,
                                 self.n_bins)

    def compute(self, sync_dist: bool = False) -> dict[str, float]:
        """``loss``, ``nll`` (per sample), ``error`` and ``ece`` as floats (NaN before any
        batch); ``sync_dist`` sums every rank's state first under ``torch.distributed``."""
        flat = torch.cat([self.scalars, self.bins.reshape(-1)])
        if sync_dist and world_size() > 1:
            dist.all_reduce(flat)
        flat = flat.cpu()
        s, b = flat[:4], flat[4:].reshape(3, self.n_bins)
        n = float(s[3]) if float(s[3]) > 0 else float("nan")
        e = float(calibration_from_sums(b, "l1")) if n == n else float("nan")
        return {"loss": float(s[0]) / n, "nll": float(s[1]) / n, "error": 1.0 - float(s[2]) / n,
                "ece": e}


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
    :func:`~torchcal.metrics.binning.binned_sums` bins it (one pass, member-offset bin keys)."""
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

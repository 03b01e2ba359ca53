r"""The calibration-error training losses the BSCE-GRA repository compares against, as modules:
DECE, ECE-KDE and its ECE-loss (see :mod:`torchcal.functional.ece_losses`)."""

from __future__ import annotations

from typing import Any

import torch

from .._validation import Options, check_labels, check_scalar
from ..functional.blocks import check_batch_reduction, no_autocast
from ..functional.ece_losses import ECE_KDE_TYPES, dece_loss, ece_gap_loss, ece_kde_loss
from ..metrics.binning import binned_sums, classwise_sums, equal_width_bin_index
from ._registry import LIN_2025_CODE, register_loss
from .adafocal import published_equal_mass_bins
from .base import HYPERPARAMETER_CHECKS, NON_NEGATIVE, POSITIVE, POSITIVE_INT, CalibrationLoss
from .temperature import gather_validation

__all__ = ["DECELoss", "ECEKDELoss", "ECEGapLoss"]


@register_loss("dece", display="DECE", order=33,
               paper="Bohdal et al. 2021, *Meta-Calibration: Learning of Model Calibration Using "
                     "Differentiable Expected Calibration Error* (arXiv)", tags={"variant"})
class DECELoss(CalibrationLoss):
    r"""``λ·DECE`` (+ ``CE_mean`` with ``cross_entropy=True``): the differentiable ECE of
    Bohdal et al. as a training loss (see :func:`torchcal.functional.dece_loss`).

    The BSCE-GRA repository trains with the DECE value alone (the default here) and does not
    scale it by the batch size: ``published_reduction = "mean"``.  ``"sum"`` gives N times the
    value, ``"none"`` is rejected.

    Args:
        lam: λ >= 0 (default 1).
        n_bins: soft bins (15).
        t_a: soft-rank temperature (100).
        t_b: soft-binning temperature (0.01).
        cross_entropy: add the mean cross-entropy (Bohdal et al.'s use).

    Example:
        >>> x = torch.log(torch.tensor([[0.9, 0.1], [0.6, 0.4]]))
        >>> DECELoss()(x, torch.tensor([0, 1]))
        tensor(0.3500)
    """

    published_reduction = "mean"

    _parameter_constraints = {"lam": NON_NEGATIVE, "n_bins": POSITIVE_INT, "t_a": POSITIVE,
                              "t_b": POSITIVE, "cross_entropy": Options((False, True))}

    def __init__(self, lam: float = 1.0, n_bins: int = 15, t_a: float = 100.0,
                 t_b: float = 0.01, cross_entropy: bool = False, *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(lam=lam, n_bins=n_bins, t_a=t_a, t_b=t_b, cross_entropy=cross_entropy,
                         reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)
        check_batch_reduction(reduction, type(self).__name__)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return dece_loss(input, target, lam=self.lam, n_bins=self.n_bins, t_a=self.t_a,
                         t_b=self.t_b, cross_entropy=self.cross_entropy,
                         reduction=self.reduction, ignore_index=self.ignore_index,
                         validate_args=self.validate_args)


@register_loss("ece_kde", display="ECE-KDE", order=34,
               paper="Popordanoska et al. 2022, *A Consistent and Differentiable Lp Canonical "
                     "Calibration Error Estimator* (NeurIPS)", tags={"variant"})
class ECEKDELoss(CalibrationLoss):
    r"""``CE_mean + λ·ECE_KDE``, the calibration-regularised objective of Popordanoska et al.
    (see :func:`torchcal.functional.ece_kde_loss`).  ``"sum"`` gives N times it.

    Args:
        lam: λ >= 0 (default 1; the paper chooses it by cross-validation).
        bandwidth: kernel bandwidth h > 0 (0.001, the bandwidth of the published example;
            :func:`torchcal.functional.kde_bandwidth` picks one by leave-one-out likelihood,
            ``rule="original"`` as the original code does).  At such small h the canonical
            value differs from the published code's, which exponentiates raw log-kernels and
            clamps underflowed rows where torchcal normalises in log space (N = 64, C = 10,
            h = 0.001: 1.078 published, 1.844 torchcal; see
            :mod:`torchcal.functional.ece_losses`).
        p: the order p > 0 of the Lp error (1).
        mc_type: ``"canonical"`` (default), ``"marginal"`` or ``"top_label"``.

    Example:
        >>> x = torch.log(torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.2, 0.8], [0.2, 0.8]]))
        >>> ECEKDELoss(lam=0.5, bandwidth=0.01)(x, torch.tensor([0, 1, 1, 1]))
        tensor(1.0636)
    """

    published_reduction = "mean"

    _parameter_constraints = {"lam": NON_NEGATIVE, "bandwidth": POSITIVE,
                              "p": HYPERPARAMETER_CHECKS["p"], "mc_type": Options(ECE_KDE_TYPES)}

    def __init__(self, lam: float = 1.0, bandwidth: float = 0.001, p: float = 1.0,
                 mc_type: str = "canonical", *, reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(lam=lam, bandwidth=bandwidth, p=p, mc_type=mc_type,
                         reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)
        check_batch_reduction(reduction, type(self).__name__)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ece_kde_loss(input, target, lam=self.lam, bandwidth=self.bandwidth, p=self.p,
                            mc_type=self.mc_type, reduction=self.reduction,
                            ignore_index=self.ignore_index, validate_args=self.validate_args)


@register_loss("ece_gap", display="ECE loss", order=35,
               paper=LIN_2025_CODE, tags={"variant"})
class ECEGapLoss(CalibrationLoss):
    r"""The BSCE-GRA repository's ECE-loss: cross-entropy weighted per sample by detached
    validation calibration gaps (see :func:`torchcal.functional.ece_gap_loss`).

    State, set by :meth:`update` after every validation pass (the trainer's ``on_validation``):
    the signed gaps ``conf_b - acc_b`` of the validation top-1 confidence in ``n_bins``
    equal-width bins (torchcal's bins) and in the published equal-mass bins
    (:func:`~torchcal.losses.adafocal.published_equal_mass_bins`; empty bins 0), and the
    classwise ECE of every one of the C classes (the published code counts ``max(label) + 1``
    classes).  ``set_epoch`` sets ``progress = epoch / total_epochs`` (clipped to [0, 1]): the
    weight is ``(1 - progress) + progress·u`` (epoch 0 is plain cross-entropy).  Before the
    first update every gap is 0 (the published code needs the statistics before its first
    batch, which it gets from CE warm-up epochs).  The published code also refreshes the
    statistics from the training set each epoch and then overwrites them with the
    validation's; torchcal keeps the validation's.  Everything is saved in ``state_dict``.

    Args:
        n_bins: bins of both binnings (15).
        total_epochs: the length of the blend from CE to the gap weight (350).
        classwise_weight: factor of the classwise term (2).

    Example:
        >>> loss = ECEGapLoss(n_bins=2, total_epochs=10)
        >>> x = torch.tensor([[0.0, 0.0]])
        >>> loss(x, torch.tensor([0]))  # epoch 0: plain CE
        tensor(0.6931)
    """

    wants_validation = True
    validation_call = "update"
    missing_validation_effect = "every gap stays 0, so the weight fades to 0 over the epochs"

    repr_state = ("epoch",)

    _parameter_constraints = {"n_bins": POSITIVE_INT, "total_epochs": POSITIVE_INT,
                              "classwise_weight": NON_NEGATIVE}

    def __init__(self, n_bins: int = 15, total_epochs: int = 350, classwise_weight: float = 2.0,
                 *, reduction: str = "mean", ignore_index: int = -100,
                 validate_args: bool = True) -> None:
        super().__init__(n_bins=n_bins, total_epochs=total_epochs,
                         classwise_weight=classwise_weight,
                         reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)
        self.epoch = 0
        self.register_buffer("width_gaps", torch.zeros(self.n_bins, dtype=torch.float64))
        self.register_buffer("mass_gaps", torch.zeros(self.n_bins, dtype=torch.float64))
        # a (non-persistent) buffer: packed training stacks it per lane; the checkpoint keeps
        # it in the extra state (None until the first validation pass)
        self.register_buffer("classwise", None, persistent=False)

    @property
    def progress(self) -> float:
        return min(self.epoch / self.total_epochs, 1.0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = check_scalar(epoch, "epoch", int, min_val=0)
        super().set_epoch(self.epoch)

    @torch.no_grad()
    def update(self, *, logits: Any, labels: Any) -> None:
        """Set the three gap statistics from validation logits (N, C) and labels (N,)."""
        z, y = gather_validation(logits, labels)
        if not z.is_floating_point() or z.ndim != 2 or z.shape[0] == 0 or z.shape[1] < 2:
            raise ValueError("Expected `logits` to be a non-empty floating-point tensor of shape "
                             f"(N, C) with C >= 2, got {z.dtype} {tuple(z.shape)}")
        y = check_labels(y, n=z.shape[0], num_classes=z.shape[1], device=z.device)
        with no_autocast(z):
            p = torch.softmax(z.to(torch.float64 if z.dtype == torch.float64
                                   else torch.float32), dim=1)
        conf, pred = p.max(dim=1)
        correct = pred == y
        b, n = self.n_bins, float(z.shape[0])
        count, conf_sum, acc_sum = binned_sums(equal_width_bin_index(conf, b), conf,
                                               correct.long(), b)
        self.width_gaps.copy_((conf_sum - acc_sum) / count.clamp_min(1.0))
        _, idx, kept = published_equal_mass_bins(conf, b)
        k = kept.to(torch.float64)
        cnt = torch.zeros(b, dtype=torch.float64, device=z.device).index_add_(0, idx, k)
        gap = torch.zeros(b, dtype=torch.float64, device=z.device).index_add_(
            0, idx, k * (conf.double() - correct.double()))
        self.mass_gaps.copy_((gap / cnt.clamp_min(1.0)).to(self.mass_gaps.device))
        self.classwise = (classwise_sums(p, y, b).view(z.shape[1], b).abs().sum(dim=1) / n)
        self._validation_received()

    def on_validation(self, *, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Trainer hook: :meth:`update` with this rank's validation outputs."""
        self.update(logits=logits, labels=labels)

    def get_extra_state(self) -> dict[str, Any]:
        # a copy on the state's device (no host copy per checkpoint: the save moves it)
        cw = None if self.classwise is None else self.classwise.detach().clone()
        return {"epoch": self.epoch, "classwise": cw}

    def set_extra_state(self, state: Any) -> None:
        if not isinstance(state, dict) or "epoch" not in state:
            raise ValueError("Expected the ECE-loss extra state to be a dict with 'epoch'")
        self.epoch = check_scalar(int(state["epoch"]), "epoch", int, min_val=0)
        cw = state.get("classwise")
        self.classwise = None if cw is None else torch.as_tensor(
            cw, dtype=torch.float64, device=self.width_gaps.device)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        c = input.shape[1]
        cw = self.classwise
        if cw is None or cw.shape[0] != c:
            if cw is not None:
                raise ValueError(f"Expected {cw.shape[0]} classes (the validation's), got {c}")
            cw = torch.zeros(c, dtype=torch.float64, device=input.device)
        return ece_gap_loss(input, target, self.width_gaps, self.mass_gaps, cw,
                            progress=self.progress, classwise_weight=self.classwise_weight,
                            reduction=self.reduction, ignore_index=self.ignore_index,
                            validate_args=self.validate_args)

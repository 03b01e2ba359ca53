r"""Temperature-aware losses of the BSCE-GRA repository and its consistency loss, as modules.

The weight of each loss reads ``q = softmax(z / T)`` (see
:mod:`torchcal.functional.temperature`); ``T`` is a float64 buffer (``temperature``, 1 before
the first fit, saved in ``state_dict``) that ``fit_temperature`` re-fits on the validation
outputs after every epoch, as the published training does (``update_temperature``): the
``T`` of the grid 0.01, 0.02, ..., 10.00 (:data:`PUBLISHED_TEMPERATURE_GRID`) with the lowest
validation ECE (15 equal-width bins, ``criterion="ece"``, the published default) or NLL
(``criterion="nll"``); on ties the smallest ``T``.  The trainer calls it through
``on_validation`` (``wants_validation = True``).  Under ``torch.distributed`` every rank's
validation share is gathered first, so all ranks fit the same ``T``.

(The published grid accumulates ``T += 0.01`` in floating point; torchcal uses the exact
decimals ``k / 100``; the published ECE bins ``(k/B, (k+1)/B]`` are torchcal's.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._validation import Options, as_tensor
from ..functional.blocks import no_autocast
from ..functional.gra_variants import consistency_loss
from ..functional.temperature import (
    temperature_bsce_gra_loss,
    temperature_bsce_loss,
    temperature_dual_focal_gra_loss,
    temperature_dual_focal_loss,
    temperature_focal_gra_loss,
    temperature_focal_loss,
)
from ..metrics.distributed import all_gather_uneven, world_size
from ..posthoc.temperature import TemperatureScaling
from ._registry import LIN_2025_CODE, register_loss
from .base import NON_NEGATIVE, POSITIVE, CalibrationLoss
from .gradient_weighted import GradientWeightedLoss

__all__ = [
    "PUBLISHED_TEMPERATURE_GRID",
    "TEMPERATURE_CRITERIA",
    "TemperatureFocalLoss",
    "TemperatureFocalGRALoss",
    "TemperatureDualFocalLoss",
    "TemperatureDualFocalGRALoss",
    "TemperatureBSCELoss",
    "TemperatureBSCEGRALoss",
    "ConsistencyLoss",
]

#: The published temperature grid 0.01, 0.02, ..., 10.00 (exact decimals).
PUBLISHED_TEMPERATURE_GRID = tuple(k / 100 for k in range(1, 1001))
#: Validation criteria of the temperature fit.
TEMPERATURE_CRITERIA = ("ece", "nll")


def gather_validation(logits: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's validation logits (N_r, C) and labels concatenated in rank order (the
    inputs themselves without an initialised process group of size > 1)."""
    z = as_tensor(logits, "logits")
    y = as_tensor(labels, "labels")
    if world_size() <= 1:
        return z, y
    c = z.shape[-1]
    zg = all_gather_uneven(z.detach().to(torch.float64).reshape(-1)).reshape(-1, c)
    yg = all_gather_uneven(y.detach().to(torch.int64).reshape(-1))
    return zg.to(z.dtype), yg


_GAMMA_CRITERION = {"gamma": NON_NEGATIVE, "criterion": Options(TEMPERATURE_CRITERIA)}
_BETA_GAMMA_CRITERION = {"beta": POSITIVE, **_GAMMA_CRITERION}


class _ValidationTemperature:
    """Mixin: the ``temperature`` buffer, its validation fit (module docstring), and a forward
    calling ``_loss_fn(input, target, **hyperparameters, temperature=T, ...)`` (every
    hyperparameter but ``criterion``, by name)."""

    wants_validation = True
    validation_call = "fit_temperature"
    missing_validation_effect = "the weight's temperature stays T = 1"
    temperature: torch.Tensor
    criterion: str
    hyperparameters: dict[str, Any]
    _loss_fn: Callable[..., torch.Tensor]

    def _init_temperature(self) -> None:
        # shape (1,), not 0-d: Dynamo reads a 0-d float buffer of an unspecialised module as a
        # Python scalar and restarts its analysis to turn it back into a tensor
        self.register_buffer("temperature", torch.ones(1, dtype=torch.float64))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, temperature={float(self.temperature):g}"  # type: ignore[misc]

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        hyper = {k: v for k, v in self.hyperparameters.items() if k != "criterion"}
        return self._loss_fn(input, target, **hyper, temperature=self.temperature,
                             reduction=self.reduction, ignore_index=self.ignore_index,
                             validate_args=self.validate_args)

    @torch.no_grad()
    def fit_temperature(self, *, logits: Any, labels: Any) -> float:
        """Re-fit ``temperature`` on validation logits (N, C) and labels (N,); returns it."""
        z, y = gather_validation(logits, labels)
        method = "grid_ece" if self.criterion == "ece" else "grid_nll"
        t = TemperatureScaling(method=method, grid=PUBLISHED_TEMPERATURE_GRID).fit(z, y)
        self.temperature.fill_(t.temperature_)
        self._validation_received()
        return t.temperature_

    def on_validation(self, *, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Trainer hook: :meth:`fit_temperature` with this rank's validation outputs."""
        self.fit_temperature(logits=logits, labels=labels)

    def log_state(self) -> dict[str, Any]:
        """The temperature of the last validation fit, for the run's log."""
        return {"temperature": float(self.temperature)}


@register_loss("temperature_focal", display="Temperature focal", order=26,
               paper=LIN_2025_CODE, tags={"variant"})
class TemperatureFocalLoss(_ValidationTemperature, CalibrationLoss):
    r"""Temperature focal loss ``-(1 - q_y)^γ log p_y``, ``q = softmax(z / T)``, T fitted
    on validation (see :func:`torchcal.functional.temperature_focal_loss`).

    Args:
        gamma: γ >= 0 (default 3).
        criterion: ``"ece"`` (default) or ``"nll"``: what the validation fit of T minimises.
        reduction: ``"mean"``, ``"sum"`` (the published training) or ``"none"``.
        ignore_index: target value to ignore.

    Example:
        >>> loss = TemperatureFocalLoss(gamma=1.0)
        >>> loss(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))  # T = 1 before a fit
        tensor(0.3466)
        >>> loss.fit_temperature(logits=torch.tensor([[2.0, 0.0], [0.0, 2.0]]),
        ...                      labels=torch.tensor([0, 1]))  # all correct: sharpest T
        0.01
    """

    _loss_fn = staticmethod(temperature_focal_loss)
    _parameter_constraints = _GAMMA_CRITERION

    def __init__(self, gamma: float = 3.0, *, criterion: str = "ece", reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(gamma=gamma, criterion=criterion,
                         reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)
        self._init_temperature()


@register_loss("temperature_focal_gra", display="Temperature focal-GRA", order=27,
               paper=LIN_2025_CODE, tags={"variant"})
class TemperatureFocalGRALoss(_ValidationTemperature, GradientWeightedLoss):
    r"""Temperature focal GRA: ``(1 - q_y)^γ`` detached times ``-log p_y``
    (see :func:`torchcal.functional.temperature_focal_gra_loss`).

    Args:
        gamma: γ >= 0 (default 3).
        criterion: ``"ece"`` (default) or ``"nll"``: what the validation fit of T minimises.
        reduction: ``"mean"``, ``"sum"`` (the published training) or ``"none"``.
        ignore_index: target value to ignore.

    Example:
        >>> TemperatureFocalGRALoss(gamma=1.0)(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(0.3466)
    """

    _loss_fn = staticmethod(temperature_focal_gra_loss)
    _parameter_constraints = _GAMMA_CRITERION

    def __init__(self, gamma: float = 3.0, *, criterion: str = "ece", reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(gamma=gamma, criterion=criterion,
                         reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)
        self._init_temperature()


@register_loss("temperature_dual_focal", display="Temperature dual focal", order=28,
               paper=LIN_2025_CODE, tags={"variant"})
class TemperatureDualFocalLoss(_ValidationTemperature, CalibrationLoss):
    r"""Temperature dual focal loss ``-(1 - q_y + q_j)^γ log p_y`` (see
    :func:`torchcal.functional.temperature_dual_focal_loss`).

    Args:
        gamma: γ >= 0 (default 5).
        criterion: ``"ece"`` (default) or ``"nll"``: what the validation fit of T minimises.
        reduction: ``"mean"``, ``"sum"`` (the published training) or ``"none"``.
        ignore_index: target value to ignore.

    Example:
        >>> x = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
        >>> TemperatureDualFocalLoss(gamma=1.0)(x, torch.tensor([1]))
        tensor(1.0836)
    """

    _loss_fn = staticmethod(temperature_dual_focal_loss)
    _parameter_constraints = _GAMMA_CRITERION

    def __init__(self, gamma: float = 5.0, *, criterion: str = "ece", reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(gamma=gamma, criterion=criterion,
                         reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)
        self._init_temperature()


@register_loss("temperature_dual_focal_gra", display="Temperature dual focal-GRA", order=29,
               paper=LIN_2025_CODE, tags={"variant"})
class TemperatureDualFocalGRALoss(_ValidationTemperature, GradientWeightedLoss):
    r"""Temperature dual focal GRA: ``(1 - q_y + q_j)^γ`` detached times ``-log p_y``
    (see :func:`torchcal.functional.temperature_dual_focal_gra_loss`).

    Args:
        gamma: γ >= 0 (default 5).
        criterion: ``"ece"`` (default) or ``"nll"``: what the validation fit of T minimises.
        reduction: ``"mean"``, ``"sum"`` (the published training) or ``"none"``.
        ignore_index: target value to ignore.

    Example:
        >>> x = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
        >>> TemperatureDualFocalGRALoss(gamma=1.0)(x, torch.tensor([1]))
        tensor(1.0836)
    """

    _loss_fn = staticmethod(temperature_dual_focal_gra_loss)
    _parameter_constraints = _GAMMA_CRITERION

    def __init__(self, gamma: float = 5.0, *, criterion: str = "ece", reduction: str = "mean",
                 ignore_index: int = -100, validate_args: bool = True) -> None:
        super().__init__(gamma=gamma, criterion=criterion,
                         reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)
        self._init_temperature()


@register_loss("temperature_bsce", display="Temperature BSCE", order=30,
               paper=LIN_2025_CODE, tags={"variant"})
class TemperatureBSCELoss(_ValidationTemperature, CalibrationLoss):
    r"""Temperature BSCE ``-‖onehot(y) - q‖_β^γ log p_y`` (see
    :func:`torchcal.functional.temperature_bsce_loss`).

    Args:
        beta: norm order β > 0 (default 2; the published ``--bsce-norm``).
        gamma: exponent γ >= 0 (default 2).  The published class defaults to norm 1 and
            γ = 0 (plain cross-entropy unless the command line sets them); torchcal's
            defaults are those of ``bsce_gra`` (β = 2, γ = 2, the Brier score weight).
        criterion: ``"ece"`` (default) or ``"nll"``: what the validation fit of T minimises.
        reduction: ``"mean"``, ``"sum"`` (the published training) or ``"none"``.
        ignore_index: target value to ignore.

    Example:
        >>> TemperatureBSCELoss()(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))  # 0.5 · log 2
        tensor(0.3466)
    """

    _loss_fn = staticmethod(temperature_bsce_loss)
    _parameter_constraints = _BETA_GAMMA_CRITERION

    def __init__(self, beta: float = 2.0, gamma: float = 2.0, *, criterion: str = "ece",
                 reduction: str = "mean", ignore_index: int = -100,
                 validate_args: bool = True) -> None:
        super().__init__(beta=beta, gamma=gamma, criterion=criterion,
                         reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)
        self._init_temperature()


@register_loss("temperature_bsce_gra", display="Temperature BSCE-GRA", order=31,
               paper=LIN_2025_CODE, tags={"variant"})
class TemperatureBSCEGRALoss(_ValidationTemperature, GradientWeightedLoss):
    r"""Temperature BSCE-GRA: ``‖onehot(y) - q‖_β^γ`` detached times ``-log p_y`` (see
    :func:`torchcal.functional.temperature_bsce_gra_loss`).

    Args:
        beta: norm order β > 0 (default 2; the published ``--bsce-norm``).
        gamma: exponent γ >= 0 (default 2).  The published class defaults to norm 1 and
            γ = 0 (plain cross-entropy unless the command line sets them); torchcal's
            defaults are those of ``bsce_gra`` (β = 2, γ = 2, the Brier score weight).
        criterion: ``"ece"`` (default) or ``"nll"``: what the validation fit of T minimises.
        reduction: ``"mean"``, ``"sum"`` (the published training) or ``"none"``.
        ignore_index: target value to ignore.

    Example:
        >>> TemperatureBSCEGRALoss()(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
        tensor(0.3466)
    """

    _loss_fn = staticmethod(temperature_bsce_gra_loss)
    _parameter_constraints = _BETA_GAMMA_CRITERION

    def __init__(self, beta: float = 2.0, gamma: float = 2.0, *, criterion: str = "ece",
                 reduction: str = "mean", ignore_index: int = -100,
                 validate_args: bool = True) -> None:
        super().__init__(beta=beta, gamma=gamma, criterion=criterion,
                         reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)
        self._init_temperature()


@register_loss("consistency", display="Consistency", order=32,
               paper=LIN_2025_CODE, tags={"variant"})
class ConsistencyLoss(_ValidationTemperature, GradientWeightedLoss):
    r"""The BSCE-GRA repository's consistency loss: ``(1 - q_y)^γ`` detached times ``-log p_y``,
    ``q`` the probabilities of a calibrator re-fitted on every validation pass (see
    :func:`torchcal.functional.consistency_loss`).

    Where ``q`` comes from, in order: the ``calibrated_probs`` passed to ``forward``; else
    ``calibrator.predict_proba(logits)`` of a ``calibrator`` given to the constructor (any
    object with ``fit(logits, labels)`` and ``predict_proba(logits)``, e.g. a
    :mod:`torchcal.posthoc` calibrator; ``fit`` is called on every validation pass; before the
    first fit ``q = softmax(z)``); else ``softmax(z / T)`` with T fitted like the
    temperature-aware losses, which makes the default ``temperature_focal_gra`` with γ = 3.
    (The published training uses a perturbation-consistency calibrator that is not part of
    the repository; pass it as ``calibrator`` or its output as ``calibrated_probs``.)

    Args:
        gamma: γ >= 0 (default 3, the published default).
        calibrator: optional calibrator (see above).  Its state is not part of ``state_dict``.
        criterion: the temperature fit's criterion without a calibrator (``"ece"``/``"nll"``).
        reduction: ``"mean"``, ``"sum"`` (the published training) or ``"none"``.
        ignore_index: target value to ignore.

    Example:
        >>> loss = ConsistencyLoss(gamma=1.0)
        >>> x = torch.tensor([[0.0, 0.0]])
        >>> loss(x, torch.tensor([0]), calibrated_probs=torch.tensor([[0.8, 0.2]]))  # 0.2·log 2
        tensor(0.1386)
    """

    _parameter_constraints = _GAMMA_CRITERION

    def __init__(self, gamma: float = 3.0, calibrator: Any = None, *, criterion: str = "ece",
                 reduction: str = "mean", ignore_index: int = -100,
                 validate_args: bool = True) -> None:
        if calibrator is not None and not (callable(getattr(calibrator, "fit", None))
                                           and callable(getattr(calibrator, "predict_proba",
                                                                None))):
            raise TypeError("Expected `calibrator` to have fit(logits, labels) and "
                            f"predict_proba(logits) methods, got {type(calibrator).__name__}")
        super().__init__(gamma=gamma, criterion=criterion,
                         reduction=reduction, ignore_index=ignore_index,
                         validate_args=validate_args)
        self.calibrator = calibrator
        self._calibrator_fitted = False
        self._init_temperature()

    def extra_repr(self) -> str:
        cal = "None" if self.calibrator is None else type(self.calibrator).__name__
        return f"{super().extra_repr()}, calibrator={cal}"

    @torch.no_grad()
    def fit_temperature(self, *, logits: Any, labels: Any) -> float:
        """Fit the calibrator (if any; returns nan) or the temperature on validation outputs."""
        if self.calibrator is None:
            return super().fit_temperature(logits=logits, labels=labels)
        z, y = gather_validation(logits, labels)
        self.calibrator.fit(z, y)
        self._calibrator_fitted = True
        self._validation_received()
        return float("nan")

    def vmap_problem(self) -> str | None:
        if self.calibrator is not None:
            return ("ConsistencyLoss with a calibrator: the calibrator's fitted state is a Python "
                    "object, not a buffer")
        return super().vmap_problem()

    def log_state(self) -> dict[str, Any]:
        """The fitted temperature when it is what ``q`` comes from (no calibrator)."""
        return super().log_state() if self.calibrator is None else {}

    @torch.no_grad()
    def calibrated_probs(self, input: torch.Tensor) -> torch.Tensor:
        """``q`` of ``input`` logits (N, C) or (N, C, d1, ...) from the calibrator or T."""
        with no_autocast(input):
            z = input.detach().to(torch.float64 if input.dtype == torch.float64 else
                                  torch.float32)
            if self.calibrator is None or not self._calibrator_fitted:
                t = 1.0 if self.calibrator is not None else self.temperature.to(z.dtype)
                return torch.softmax(z / t, dim=1)
            if z.ndim != 2:
                raise ValueError("Expected 2-D logits (N, C) with a calibrator, got shape "
                                 f"{tuple(z.shape)}")
            return torch.as_tensor(self.calibrator.predict_proba(z)).to(z)

    def forward(self, input: torch.Tensor, target: torch.Tensor,
                calibrated_probs: torch.Tensor | None = None) -> torch.Tensor:
        if calibrated_probs is None:
            calibrated_probs = self.calibrated_probs(input)
        return consistency_loss(input, target, calibrated_probs, gamma=self.gamma,
                                reduction=self.reduction, ignore_index=self.ignore_index,
                                validate_args=self.validate_args)


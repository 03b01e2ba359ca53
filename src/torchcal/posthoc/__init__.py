"""Post-hoc calibration of saved logits.

Every calibrator follows scikit-learn's estimator contract: the constructor stores settings,
``fit(logits, labels)`` learns attributes ending in ``_`` and returns ``self``,
``transform(logits)`` gives calibrated logits, ``predict_proba(logits)`` calibrated
probabilities, ``to_dict()`` / ``from_dict(d)`` round-trip through JSON, and use before ``fit``
raises :class:`torchcal.errors.NotFittedError`.  Inputs are torch tensors (any device; results
stay there) or NumPy arrays (results are NumPy arrays).

* :class:`TemperatureScaling` (``method="nll" | "grid_ece" | "grid_adaece" | "grid_nll"``) and
  :func:`fit_temperatures` (all four temperatures at once, as the evaluation records them);
  :func:`temperature_grid_scores` (the vectorised grid search itself).
* :class:`VectorScaling`: per-class scale and bias fitted by NLL.
* :class:`HistogramBinning`: top-label histogram binning.
* :class:`MatrixScaling` and :class:`DirichletCalibration` (``reg="odir"``): full linear maps of
  the logits / log-probabilities.
* :class:`IsotonicCalibration`: one-vs-rest isotonic regression, renormalised.
* :class:`PlattScaling` and :class:`BetaCalibration`: binary problems.
* :class:`ConformalClassifier` (``method="lac" | "aps" | "raps"``): prediction sets with a
  coverage guarantee.
* :func:`calibrator_from_dict`: rebuild any of them from ``to_dict()`` output.
* :func:`cv_folds`: the fixed folds of their cross-validation; :func:`identity_check`: the
  warning when calibrated probabilities are worse than none.

Every calibrator's ``fit`` also takes dense ``(N, C, d1, ...)`` logits with ``(N, d1, ...)``
labels and token logits ``(N, T, C)`` with ``(N, T)`` labels, ``ignore_index`` (default -100)
and ``sample_weight`` (scikit-learn's convention); the fit equals the fit on the flattened kept
rows, and ``predict_proba`` / ``transform`` return the input's shape (the conformal predictor's
sets are per position).  ``changes_argmax`` says whether a calibrator may change the predicted
class: the top-label ones (temperature, histogram binning, ``top_label=True`` isotonic, Platt
and beta) never do.

Every calibrator is a scikit-learn estimator (``get_params`` / ``set_params``, so ``clone``,
``Pipeline`` and ``GridSearchCV`` work; :meth:`Calibrator.score` is the mean log-likelihood).
A failed fit raises :class:`CalibrationFitError` (a :class:`torchcal.errors.TorchcalError`) with
the reason.
"""

from __future__ import annotations

from typing import Any

from ..errors import CalibrationFitError, MemorizedValidationWarning, WorseThanIdentityWarning
from ._checks import default_grid
from ._fitting import cv_folds
from .base import Calibrator, Estimator, identity_check
from .binary import BetaCalibration, PlattScaling
from .conformal import ConformalClassifier
from .histogram import HistogramBinning
from .isotonic import IsotonicCalibration
from .linear import DirichletCalibration, MatrixScaling
from .temperature import (
    CRITERIA,
    METHODS,
    TemperatureScaling,
    fit_temperatures,
    temperature_grid_scores,
)
from .vector import VectorScaling

__all__ = [
    "Calibrator",
    "CalibrationFitError",
    "MemorizedValidationWarning",
    "WorseThanIdentityWarning",
    "TemperatureScaling",
    "VectorScaling",
    "MatrixScaling",
    "DirichletCalibration",
    "HistogramBinning",
    "IsotonicCalibration",
    "PlattScaling",
    "BetaCalibration",
    "ConformalClassifier",
    "fit_temperatures",
    "temperature_grid_scores",
    "default_grid",
    "cv_folds",
    "identity_check",
    "calibrator_from_dict",
    "METHODS",
    "CRITERIA",
]

_TYPES = {c.__name__: c for c in (
    TemperatureScaling, VectorScaling, MatrixScaling, DirichletCalibration, HistogramBinning,
    IsotonicCalibration, PlattScaling, BetaCalibration, ConformalClassifier,
)}


def calibrator_from_dict(d: dict[str, Any]) -> Estimator:
    """Rebuild a fitted calibrator (or conformal predictor) of any type from its ``to_dict()``
    output.

    >>> import torch
    >>> ts = TemperatureScaling(method="grid_nll").fit(torch.eye(3) * 4, torch.tensor([0, 1, 1]))
    >>> calibrator_from_dict(ts.to_dict()).temperature_ == ts.temperature_
    True
    """
    if not isinstance(d, dict):
        raise TypeError(f"Expected `d` to be a dict from to_dict(), got {type(d).__name__}")
    kind = d.get("type")
    if kind not in _TYPES:
        raise ValueError(f"Expected `d['type']` to be one of {sorted(_TYPES)}, got {kind!r}")
    return _TYPES[kind].from_dict(d)

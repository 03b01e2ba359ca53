"""Post-hoc calibration of saved logits.

Every calibrator follows scikit-learn's estimator contract: the constructor stores settings,
``fit(logits, labels)`` learns attributes ending in ``_`` and returns ``self``,
``transform(logits)`` gives calibrated logits, ``predict_proba(logits)`` calibrated
probabilities, ``to_dict()`` / ``from_dict(d)`` round-trip through JSON, and use before ``fit``
raises :class:`torchcal.errors.NotFittedError`.  Inputs are torch tensors (any device; results
stay there) or NumPy arrays (results are CPU tensors).

* :class:`TemperatureScaling` (``method="nll" | "grid_ece" | "grid_adaece" | "grid_nll"``) and
  :func:`fit_temperatures` (all four temperatures at once, as the evaluation records them);
  :func:`temperature_grid_scores` (the vectorised grid search itself).
* :class:`VectorScaling`: per-class scale and bias fitted by NLL.
* :class:`HistogramBinning`: top-label histogram binning.
* :func:`calibrator_from_dict`: rebuild any of them from ``to_dict()`` output.
"""

from __future__ import annotations

from typing import Any

from ._common import Calibrator, default_grid
from .histogram import HistogramBinning
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
    "TemperatureScaling",
    "VectorScaling",
    "HistogramBinning",
    "fit_temperatures",
    "temperature_grid_scores",
    "default_grid",
    "calibrator_from_dict",
    "METHODS",
    "CRITERIA",
]

_TYPES = {c.__name__: c for c in (TemperatureScaling, VectorScaling, HistogramBinning)}


def calibrator_from_dict(d: dict[str, Any]) -> Calibrator:
    """Rebuild a fitted calibrator of any type from its ``to_dict()`` output.

    >>> import torch
    >>> ts = TemperatureScaling(method="grid_nll").fit(torch.eye(3) * 4, torch.arange(3))
    >>> calibrator_from_dict(ts.to_dict()).temperature_ == ts.temperature_
    True
    """
    if not isinstance(d, dict):
        raise TypeError(f"Expected `d` to be a dict from to_dict(), got {type(d).__name__}")
    kind = d.get("type")
    if kind not in _TYPES:
        raise ValueError(f"Expected `d['type']` to be one of {sorted(_TYPES)}, got {kind!r}")
    return _TYPES[kind].from_dict(d)

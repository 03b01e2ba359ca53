"""Regression: predictions as users have them, their metrics and their calibration.

* :mod:`~torchcal.regression.predictive`: a point prediction (a tensor), :class:`Gaussian`
  (mean and variance, log-variance or std), :class:`Quantiles` and an ensemble's
  :class:`Samples`, per target element of a (N,), (N, d1, ...) or (N, T) target, with missing
  targets dropped by ``mask`` or ``ignore_value`` (:func:`kept_rows`).
* :mod:`~torchcal.regression.metrics`: Gaussian NLL, CRPS (closed form, ensemble, quantile),
  pinball loss, interval coverage / width / score, ENCE, UCE, the calibration curve and
  quantile calibration error, sharpness; :class:`RegressionMeter` streams them with fixed-size
  state synced under DDP; :mod:`~torchcal.regression.plot` draws the reliability diagrams.
* :mod:`~torchcal.regression.calibration`: :class:`SigmaScaling` (Levi et al. 2022),
  :class:`IsotonicRecalibration` (Kuleshov et al. 2018) and :class:`QuantileRecalibration`
  (per-level conformal shifts), with the calibrators' estimator contract.

Conformal intervals and risk control live in :mod:`torchcal.conformal`.
"""

from .calibration import IsotonicRecalibration, QuantileRecalibration, SigmaScaling
from .meter import REGRESSION_METER_KEYS, RegressionMeter
from .metrics import (
    calibration_curve,
    crps,
    ence,
    gaussian_nll,
    interval_coverage,
    interval_score,
    interval_width,
    pinball_loss,
    quantile_calibration_error,
    sharpness,
    uce,
)
from .plot import regression_reliability_diagram, sigma_reliability_diagram
from .predictive import Gaussian, Prediction, Quantiles, Samples, kept_rows

__all__ = [
    # predictions
    "Gaussian", "Quantiles", "Samples", "Prediction", "kept_rows",
    # metrics
    "gaussian_nll", "crps", "pinball_loss", "interval_coverage", "interval_width",
    "interval_score", "ence", "uce", "calibration_curve", "quantile_calibration_error",
    "sharpness", "RegressionMeter", "REGRESSION_METER_KEYS", "regression_reliability_diagram",
    "sigma_reliability_diagram",
    # calibrators
    "SigmaScaling", "IsotonicRecalibration", "QuantileRecalibration",
]

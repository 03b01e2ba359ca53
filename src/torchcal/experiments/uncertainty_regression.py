"""The uncertainty suite's regression section: Kendall's MNIST-1D model's translation predictions,
their variance calibrated and their conformal intervals.

Each multi-task run of the suite (:func:`torchcal.experiments.uncertainty.kendall_unit`) returns
its validation and test regression predictions (standardised units).  The validation split is the
calibration set, the test split is held out:

* the predictive Gaussian: the predicted mean with Kendall et al.'s learned task variance
  ``exp(s_2)`` (one per run: ``regression_variance="task"``) or the head's per-sample variance
  (``"sample"``, Kendall & Gal 2017);
* its calibration: ENCE (Levi et al. 2022) and Gaussian NLL on test before and after σ scaling
  (:class:`~torchcal.regression.SigmaScaling` fitted on validation);
* conformal intervals at miscoverage :data:`ALPHA` (:class:`~torchcal.conformal.ConformalRegressor`
  fitted on validation): split (absolute residual of the mean), normalised (residual / σ) and
  CQR on the Gaussian's ``ALPHA / 2`` and ``1 - ALPHA / 2`` quantiles; their test coverage and
  mean width in the parameter's own units.

The claim ``regression_normalized`` (:mod:`torchcal.experiments.uncertainty_report`) reads the
``"learned variance"`` arm: normalised intervals are narrower than split intervals while both
keep their coverage.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from ..conformal import ConformalRegressor
from ..regression import Gaussian, SigmaScaling, ence, gaussian_nll

__all__ = ["ALPHA", "ENCE_BINS", "INTERVAL_METHODS", "LEARNED_VARIANCE", "regression_section"]

#: The suite's arm whose regression head predicts a variance per sample (the claim's arm).
LEARNED_VARIANCE = "learned variance"
#: The intervals' miscoverage (90% intervals).
ALPHA = 0.1
#: ENCE's equal-mass bins by predicted σ.
ENCE_BINS = 10
#: The conformal scores compared, with their report names.
INTERVAL_METHODS = (("absolute", "split"), ("normalized", "normalized"), ("cqr", "CQR"))


def _gaussians(block: dict[str, Any]) -> tuple[dict[str, Gaussian], dict[str, torch.Tensor]]:
    """Per split the predictive Gaussian and the target (standardised units, float64)."""
    preds = block["predictions"]
    out, targets = {}, {}
    for split in ("val", "test"):
        p = preds[split]
        mean = torch.tensor(p["mean"], dtype=torch.float64)
        if "log_var" in p:
            log_var = torch.tensor(p["log_var"], dtype=torch.float64)
        else:
            s = block.get("log_vars")
            if s is None:
                return {}, {}
            log_var = torch.full_like(mean, float(s[1]))
        out[split] = Gaussian(mean, log_var=log_var)
        targets[split] = torch.tensor(p["target"], dtype=torch.float64)
    return out, targets


def regression_section(block: dict[str, Any]) -> dict[str, Any] | None:
    """The section's numbers of one run's ``multitask`` results block (None when the block has
    no predictions, or no variance: a fixed weighting with ``regression_variance="task"``)."""
    if "predictions" not in block:
        return None
    g, y = _gaussians(block)
    if not g:
        return None
    unit = float(block["target_std"])  # standardised -> the parameter's own units
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a worse-than-none scaling is reported as numbers
        scaler = SigmaScaling().fit(g["val"], y["val"])
    scaled = scaler.transform(g["test"])
    out: dict[str, Any] = {
        "variance": "sample" if "log_var" in block["predictions"]["val"] else "task",
        "alpha": ALPHA, "n_calibration": int(y["val"].numel()), "n_test": int(y["test"].numel()),
        "sigma_scale": float(scaler.scale_),
        "ence_before": float(ence(g["test"], y["test"], n_bins=ENCE_BINS)),
        "ence_after": float(ence(scaled, y["test"], n_bins=ENCE_BINS)),
        "nll_before": float(gaussian_nll(g["test"], y["test"])) + math.log(unit),
        "nll_after": float(gaussian_nll(scaled, y["test"])) + math.log(unit),
    }
    for score, name in INTERVAL_METHODS:
        pv, pt = (g["val"], g["test"]) if score != "cqr" else (
            g["val"].quantiles([ALPHA / 2, 1 - ALPHA / 2]),
            g["test"].quantiles([ALPHA / 2, 1 - ALPHA / 2]))
        if score == "absolute":
            pv, pt = pv.mean, pt.mean
        cr = ConformalRegressor(alpha=ALPHA, score=score).fit(pv, y["val"])
        lo, hi = cr.predict_interval(pt)
        out[f"{name} coverage"] = float(((y["test"] >= lo) & (y["test"] <= hi)).double().mean())
        out[f"{name} width"] = float((hi - lo).double().mean()) * unit
    return out

"""torchcal's split, CQR, CV+ and jackknife+ intervals against MAPIE's saved ones
(tests/data/peers/conformal_regression.json, written by
benchmarks/bench_conformal_regression_peers.py with identical predictions / prefit models)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from torchcal.conformal import ConformalRegressor, cv_plus
from torchcal.regression import Quantiles

FIXTURE = Path(__file__).resolve().parents[1] / "data/peers/conformal_regression.json"


def _fit_predict(Xt, yt, Xe):
    A = np.c_[np.ones(len(Xt)), Xt]
    coef, *_ = np.linalg.lstsq(A, yt, rcond=None)
    return np.c_[np.ones(len(Xe)), Xe] @ coef


@pytest.fixture(scope="module")
def saved():
    return json.loads(FIXTURE.read_text())


def _ours(d, method):
    n, a = d["n_cal"], d["alpha"]
    mu, y = np.array(d["mu"]), np.array(d["y"])
    if method == "split":
        return ConformalRegressor(a).fit(mu[:n], y[:n]).predict_interval(mu[n:])
    if method == "cqr":
        lv = [a / 2, 1 - a / 2]
        q = np.stack([d["q_lo"], d["q_hi"]], 1)
        cr = ConformalRegressor(a, score="cqr").fit(Quantiles(q[:n], lv), y[:n])
        return cr.predict_interval(Quantiles(q[n:], lv))
    X, ycv, nt = np.array(d["X_cv"]), np.array(d["y_cv"]), d["n_train_cv"]
    folds = d["k"] if method == "cv_plus" else "jackknife"
    return cv_plus(_fit_predict, X[:nt], ycv[:nt], X[nt:], alpha=a, n_folds=folds)


@pytest.mark.parametrize("method", ["split", "cqr", "cv_plus", "jackknife_plus"])
def test_intervals_equal_mapie(saved, method):
    lo, hi = _ours(saved, method)
    ref_lo, ref_hi = (np.array(v) for v in saved["mapie"][method])
    assert lo.shape == ref_lo.shape and ref_lo.size > 0
    np.testing.assert_allclose(lo, ref_lo, rtol=0, atol=1e-6)
    np.testing.assert_allclose(hi, ref_hi, rtol=0, atol=1e-6)

"""cv_plus (CV+ / jackknife+) against a loop written from Barber et al.'s formula; ACI's
recursion and its long-run bound on a shifting sequence."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchcal.conformal import AdaptiveConformal, cv_plus
from torchcal.conformal.cv import kfold_labels
from torchcal.errors import InfiniteIntervalWarning


def _lstsq_fit_predict(Xt, yt, Xe):
    A = np.c_[np.ones(len(Xt)), Xt]
    coef, *_ = np.linalg.lstsq(A, yt, rcond=None)
    return np.c_[np.ones(len(Xe)), Xe] @ coef


def _reference(X, y, X_test, folds, alpha):
    """CV+ from the definition, one test point and one training point at a time."""
    n = len(y)
    k = math.ceil((n + 1) * (1 - alpha))
    models = {}
    for f in set(folds.tolist()):
        tr = folds != f
        models[f] = (X[tr], y[tr])
    lows, highs = [], []
    for x in X_test:
        lo_vals, hi_vals = [], []
        for i in range(n):
            Xt, yt = models[int(folds[i])]
            r = abs(y[i] - _lstsq_fit_predict(Xt, yt, X[i:i + 1])[0])
            mu = _lstsq_fit_predict(Xt, yt, x[None])[0]
            lo_vals.append(mu - r)
            hi_vals.append(mu + r)
        lows.append(sorted(lo_vals, reverse=True)[k - 1])
        highs.append(sorted(hi_vals)[k - 1])
    return np.array(lows), np.array(highs)


@pytest.mark.parametrize("n_folds", [5, "jackknife"])
def test_cv_plus_matches_reference(n_folds):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 2))
    y = X @ [1.0, -2.0] + rng.normal(size=30) * (1 + np.abs(X[:, 0]))
    X_test = rng.normal(size=(4, 2))
    lo, hi = cv_plus(_lstsq_fit_predict, X, y, X_test, alpha=0.2, n_folds=n_folds)
    folds = np.arange(30) if n_folds == "jackknife" else kfold_labels(30, 5).numpy()
    ref_lo, ref_hi = _reference(X, y, X_test, folds, 0.2)
    assert isinstance(lo, np.ndarray)
    np.testing.assert_allclose(lo, ref_lo, atol=1e-10)
    np.testing.assert_allclose(hi, ref_hi, atol=1e-10)


def test_kfold_labels_are_sklearns():
    from sklearn.model_selection import KFold

    for n, k in ((10, 3), (17, 5), (6, 6)):
        ref = np.empty(n, dtype=int)
        for f, (_, held) in enumerate(KFold(k).split(np.zeros(n))):
            ref[held] = f
        assert kfold_labels(n, k).tolist() == ref.tolist()
    perm = kfold_labels(20, 4, random_state=0)
    assert sorted(perm.tolist()) == kfold_labels(20, 4).tolist()


def test_cv_plus_torch_and_too_few_and_bad_input():
    X = torch.arange(8.0).reshape(-1, 1)
    y = X[:, 0] * 2

    def fp(Xt, yt, Xe):
        return torch.full((Xe.shape[0],), float(yt.mean()))

    with pytest.warns(InfiniteIntervalWarning, match="n = 8"):
        lo, hi = cv_plus(fp, X, y, X[:2], alpha=0.1, n_folds=4)
    assert torch.isinf(lo).all() and (lo < 0).all() and torch.isinf(hi).all()
    with pytest.raises(ValueError, match="n_folds"):
        cv_plus(fp, X, y, X[:2], alpha=0.5, n_folds=1)
    with pytest.raises(ValueError, match="one target per row"):
        cv_plus(fp, X, y[:5], X[:2], alpha=0.5)
    with pytest.raises(ValueError, match="fit_predict"):
        cv_plus(lambda a, b, c: torch.zeros(1), X, y, X[:2], alpha=0.5, n_folds=2)


def test_aci_recursion_and_long_run_bound_on_a_shift():
    g = torch.Generator().manual_seed(0)
    t = 3000
    scale = torch.where(torch.arange(t) < 1500, 1.0, 3.0)  # the noise triples halfway
    scores = (torch.randn(t, generator=g, dtype=torch.float64) * scale).abs()
    calib = torch.randn(100, generator=g, dtype=torch.float64).abs()
    gamma, alpha = 0.01, 0.1
    res = AdaptiveConformal(alpha, gamma).run(scores, calib_scores=calib)
    # the recursion, replayed from the errors
    a = alpha
    for i in range(t):
        assert res.alphas[i] == pytest.approx(a, abs=1e-12)
        a += gamma * (alpha - float(res.errors[i]))
    # the step thresholds: conformal quantile of the history at alpha_t
    hist = calib.tolist() + scores.tolist()
    for i in (0, 10, 1600, t - 1):
        h = sorted(hist[:100 + i])
        k = math.ceil((len(h) + 1) * (1 - float(res.alphas[i])))
        assert float(res.thresholds[i]) == (h[k - 1] if k <= len(h) else math.inf)
        assert bool(res.errors[i]) == (scores[i] > res.thresholds[i])
    assert res.bound == pytest.approx((0.9 + gamma) / (gamma * t))
    assert abs(res.miscoverage - alpha) <= res.bound
    # a fixed threshold (no adaptation) misses the bound after the shift
    fixed = float(torch.kthvalue(calib, math.ceil(101 * 0.9)).values)
    assert abs(float((scores > fixed).double().mean()) - alpha) > res.bound


def test_aci_window_and_intervals():
    g = torch.Generator().manual_seed(1)
    y = torch.randn(400, generator=g)
    mu = torch.zeros(400)
    aci = AdaptiveConformal(0.2, 0.05, window=50)
    lo, hi, res = aci.run_intervals(mu, y)
    assert torch.equal(hi - mu, res.thresholds)
    h = sorted((y - mu).abs()[300 - 50:300].tolist())
    k = math.ceil(51 * (1 - float(res.alphas[300])))
    assert float(res.thresholds[300]) == (h[k - 1] if 1 <= k <= 50 else math.inf)
    assert abs(res.miscoverage - 0.2) <= res.bound
    with pytest.raises(ValueError, match="gamma"):
        AdaptiveConformal(0.1, gamma=0.0)

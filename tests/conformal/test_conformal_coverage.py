"""Coverage over 1,000 random calibration/test splits, batched as a tensor dimension.

With n exchangeable calibration scores (no ties) the expected coverage of a split-conformal
interval is exactly ``k / (n + 1)``, ``k = ceil((n + 1)(1 - alpha))``.  n = 98 and alpha = 0.1
put it at 90 / 99 = 0.909, so the mean over 1,000 splits (standard error about 0.001) must lie
in ``[1 - alpha, 1 - alpha + 1 / (n + 1) + 0.01]``: a threshold one rank too low (k - 1) gives
0.899 and fails, one too high stays inside only by less than 0.01.
"""

from __future__ import annotations

import math

import pytest
import torch

from torchcal.conformal import ConformalRegressor, conformal_quantile
from torchcal.conformal.regression import (
    IntervalParts,
    conformity_scores,
    interval_bounds,
    interval_parts,
    mondrian_thresholds,
)
from torchcal.regression import Gaussian, Quantiles

ALPHA = 0.1
B = 1000
N_CAL = 98
N_DATA = 500


def _bounds(n: int) -> tuple[float, float]:
    return 1 - ALPHA, 1 - ALPHA + 1 / (n + 1) + 0.01


def _data(seed: int = 0):
    """A fixed heteroscedastic data set and a model fitted on separate training data: a cubic
    ridge fit for the mean, sigma(x) estimated by a ridge fit of |residual|, Gaussian quantiles
    from both (a deliberately imperfect model)."""
    g = torch.Generator().manual_seed(seed)

    def draw(n):
        x = torch.rand(n, generator=g, dtype=torch.float64)
        sd = 0.2 + 1.5 * x ** 2
        return x, torch.sin(4 * x) + sd * torch.randn(n, generator=g, dtype=torch.float64)

    def feats(x):
        return torch.stack([torch.ones_like(x), x, x ** 2, x ** 3], 1)

    def ridge(f, t, lam=1e-3):
        return torch.linalg.solve(f.T @ f + lam * torch.eye(f.shape[1], dtype=f.dtype), f.T @ t)

    x_tr, y_tr = draw(400)
    beta = ridge(feats(x_tr), y_tr)
    gamma = ridge(feats(x_tr), (y_tr - feats(x_tr) @ beta).abs())
    x, y = draw(N_DATA)
    mu = feats(x) @ beta
    sigma = (feats(x) @ gamma).clamp(min=0.05) * math.sqrt(math.pi / 2)
    return x, y, mu, sigma


def _splits(n_total: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(B, n_total, generator=g).argsort(1)


def _take(parts: IntervalParts, idx: torch.Tensor) -> IntervalParts:
    return IntervalParts(parts.lo[idx], parts.hi[idx],
                         None if parts.scale is None else parts.scale[idx])


def _split_coverage(pred, y, score: str, seed: int) -> torch.Tensor:
    """(B,) test coverage of each split: scores of the (B, n) calibration rows, one threshold
    per split from conformal_quantile(dim=1), intervals of the (B, m) test rows."""
    parts = interval_parts(pred, score, ALPHA)
    perm = _splits(y.numel(), seed)
    cal, test = perm[:, :N_CAL], perm[:, N_CAL:]
    s = conformity_scores(_take(parts, cal), y[cal])
    q = conformal_quantile(s, ALPHA, dim=1)
    lo, hi = interval_bounds(_take(parts, test), q.unsqueeze(1))
    yt = y[test]
    # the class on the first split gives the same threshold
    first = ConformalRegressor(ALPHA, score=score).fit(_select(pred, cal[0]), y[cal[0]])
    assert float(first.threshold_) == float(q[0])
    return ((lo <= yt) & (yt <= hi)).double().mean(1)


def _select(pred, idx):
    if isinstance(pred, Gaussian):
        return Gaussian(pred.mean[idx], var=pred.var[idx])
    if isinstance(pred, Quantiles):
        return Quantiles(pred.values[idx], pred.levels)
    return pred[idx]


@pytest.mark.parametrize("score", ["absolute", "normalized", "cqr"])
def test_split_coverage_over_1000_splits(score):
    _, y, mu, sigma = _data()
    if score == "absolute":
        pred = mu
    elif score == "normalized":
        pred = Gaussian(mu, std=sigma)
    else:
        pred = Gaussian(mu, std=sigma).quantiles([ALPHA / 2, 1 - ALPHA / 2])
    cov = _split_coverage(pred, y, score, seed=11)
    lo, hi = _bounds(N_CAL)
    assert lo <= float(cov.mean()) <= hi, float(cov.mean())


def test_mondrian_coverage_per_group_over_1000_splits():
    x, y, mu, _ = _data()
    group = (x > 0.4).long() + 2 * (x > 0.7).long()  # labels 0, 1, 3: unequal noise
    s_all = (y - mu).abs()
    g = torch.Generator().manual_seed(12)
    cal_idx, test_idx = [], []
    for lab in group.unique().tolist():  # stratified: N_CAL calibration points per group
        idx = (group == lab).nonzero().flatten()
        perm = torch.rand(B, idx.numel(), generator=g).argsort(1)
        cal_idx.append(idx[perm[:, :N_CAL]])
        test_idx.append(idx[perm[:, N_CAL:]])
    cal = torch.cat(cal_idx, 1)  # (B, G * N_CAL)
    batch_group = torch.arange(B).unsqueeze(1) * 10 + group[cal]  # one Mondrian group per split
    labels, q, counts = mondrian_thresholds(s_all[cal].reshape(-1), batch_group.reshape(-1),
                                            ALPHA)
    assert bool((counts == N_CAL).all())
    q = q.reshape(B, -1)  # (B, G), groups in label order
    lo, hi = _bounds(N_CAL)
    for j, test in enumerate(test_idx):
        covered = (s_all[test] <= q[:, j:j + 1]).double().mean(1)
        assert lo <= float(covered.mean()) <= hi, (j, float(covered.mean()))
    # the class on split 0 gives the same per-group thresholds
    cr = ConformalRegressor(ALPHA).fit(mu[cal[0]], y[cal[0]], groups=group[cal[0]])
    assert torch.equal(cr.threshold_, q[0])


def test_weighted_coverage_under_known_shift_over_1000_splits():
    """Calibration points drawn uniformly (with replacement) from the data set, test points
    drawn with probability proportional to w(x) = exp(2.5 x): the covariate shift with the
    known likelihood ratio w.  Unweighted intervals under-cover there; weighted ones do not."""
    x, y, mu, _ = _data()
    w = torch.exp(2.5 * x)
    g = torch.Generator().manual_seed(13)
    n_test = 50
    cal = torch.randint(0, N_DATA, (B, N_CAL), generator=g)
    test = torch.multinomial(w / w.sum(), B * n_test, replacement=True, generator=g).reshape(
        B, n_test)
    cov_w, cov_plain = torch.empty(B, dtype=torch.float64), torch.empty(B, dtype=torch.float64)
    for b in range(B):  # the weighted threshold is per test point: one fit per split
        cr = ConformalRegressor(ALPHA).fit(mu[cal[b]], y[cal[b]], weights=w[cal[b]])
        lo_b, hi_b = cr.predict_interval(mu[test[b]], test_weights=w[test[b]])
        yt = y[test[b]]
        cov_w[b] = ((lo_b <= yt) & (yt <= hi_b)).double().mean()
    q_plain = conformal_quantile((y - mu).abs()[cal], ALPHA, dim=1)
    cov_plain = ((y - mu).abs()[test] <= q_plain.unsqueeze(1)).double().mean(1)
    lo, hi = _bounds(N_CAL)
    assert lo <= float(cov_w.mean()) <= hi, float(cov_w.mean())
    assert float(cov_plain.mean()) < lo - 0.01  # the shift matters: the test can fail


def test_dense_per_pixel_coverage_over_1000_splits():
    """(N, 4, 4) per-pixel Gaussian predictions with per-pixel sigma, normalised score: the
    pixel scores are i.i.d., so the pooled threshold of 13 images x 16 pixels = 208 scores has
    expected coverage k / 209 = 189 / 209 = 0.904.  A fresh data set per split (batched)."""
    g = torch.Generator().manual_seed(14)
    n_img, m_img = 13, 20
    sigma = 0.5 + torch.rand(4, 4, generator=g, dtype=torch.float64)
    mu = torch.randn(B, n_img + m_img, 4, 4, generator=g, dtype=torch.float64)
    y = mu + sigma * torch.randn(B, n_img + m_img, 4, 4, generator=g, dtype=torch.float64)
    parts = interval_parts(Gaussian(mu, std=sigma.expand_as(mu)), "normalized", ALPHA)
    s = conformity_scores(parts, y)
    q = conformal_quantile(s[:, :n_img].reshape(B, -1), ALPHA, dim=1)
    lo, hi = interval_bounds(_take(parts, (slice(None), slice(n_img, None))),
                             q.reshape(B, 1, 1, 1))
    yt = y[:, n_img:]
    cov = ((lo <= yt) & (yt <= hi)).double().mean((1, 2, 3))
    m = n_img * 16
    assert conformal_quantile(torch.arange(float(m)), ALPHA) == 188.0  # k = 189
    lo_b, hi_b = _bounds(m)
    assert lo_b <= float(cov.mean()) <= hi_b, float(cov.mean())
    # the class's dense fit on split 0 pools the same scores
    cr = ConformalRegressor(ALPHA, score="normalized").fit(
        Gaussian(mu[0, :n_img], std=sigma.expand(n_img, 4, 4)), y[0, :n_img])
    assert float(cr.threshold_) == float(q[0])

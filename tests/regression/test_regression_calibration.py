"""Regression calibrators against independent computations: sigma scaling's closed form against
the numerically minimised NLL, the isotonic map against scikit-learn, the conformal shifts
against the order statistic written from the formula, and held-out calibration after each."""

from __future__ import annotations

import contextlib
import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from torchcal.errors import InfiniteIntervalWarning, WorseThanIdentityWarning
from torchcal.regression import (
    Gaussian,
    IsotonicRecalibration,
    QuantileRecalibration,
    Quantiles,
    Samples,
    SigmaScaling,
    gaussian_nll,
)

LEVELS = [0.05, 0.25, 0.5, 0.75, 0.95]


def make_data(n: int, seed: int, var_factor: float = 0.25, dtype=torch.float64):
    """Heteroscedastic Gaussian data and a prediction whose variance is ``var_factor`` times the
    true one (0.25: too small by 4x)."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(n, generator=g, dtype=torch.float64)
    sd = torch.exp(0.3 * torch.randn(n, generator=g, dtype=torch.float64))
    y = mu + sd * torch.randn(n, generator=g, dtype=torch.float64)
    return Gaussian(mu.to(dtype), (var_factor * sd ** 2).to(dtype)), y.to(dtype)


def coverage(lo, hi, y):
    return float(((y >= lo) & (y <= hi)).double().mean())


@contextlib.contextmanager
def no_warning(cat=WorseThanIdentityWarning):
    """Turn ``cat`` into an error inside the block (the test fails if it is raised)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", cat)
        yield


# ----------------------------------------------------------------------------- sigma scaling


def test_sigma_scaling_closed_form_is_the_numerical_nll_minimiser():
    pred, y = make_data(400, 0)
    w = torch.rand(400, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    mu, var = pred.mean.numpy(), pred.var.numpy()
    yn, wn = y.numpy(), w.numpy()

    def nll(log_s):  # the weighted Gaussian NLL at var * s^2, from the formula
        v = var * math.exp(2 * log_s)
        return float(np.sum(wn * 0.5 * (np.log(2 * np.pi * v) + (yn - mu) ** 2 / v)) / wn.sum())

    res = optimize.minimize_scalar(nll, bracket=(-2.0, 2.0), tol=1e-12)
    ss = SigmaScaling().fit(pred, y, sample_weight=w)
    assert ss.scale_ == pytest.approx(math.exp(res.x), rel=1e-6)
    assert ss.nll_after_ == pytest.approx(res.fun, rel=1e-10)
    assert ss.nll_after_ < ss.nll_before_ == pytest.approx(nll(0.0), rel=1e-12)
    # unweighted: the transform's NLL is gaussian_nll's and the fitted minimum
    ss = SigmaScaling().fit(pred, y)
    assert float(gaussian_nll(ss.transform(pred), y)) == pytest.approx(ss.nll_after_, rel=1e-12)
    assert ss.scale_ == pytest.approx(math.sqrt(float(((y - pred.mean) ** 2 / pred.var).mean())))


def test_sigma_scaling_fixes_a_4x_too_small_variance_on_held_out_data():
    val, y_val = make_data(20_000, 10)
    test, y_test = make_data(20_000, 11)
    ss = SigmaScaling().fit(val, y_val)
    assert ss.scale_ == pytest.approx(2.0, abs=0.04)
    assert coverage(*test.interval(0.1), y_test) < 0.65  # before: P(|Z| < 1.645 / 2) = 0.59
    cov = coverage(*ss.transform(test).interval(0.1), y_test)
    assert cov == pytest.approx(0.90, abs=0.02)
    assert ss.score(test, y_test) > -float(gaussian_nll(test, y_test))


def test_sigma_scaling_samples_are_moment_matched():
    g = torch.Generator().manual_seed(3)
    s = Samples(torch.randn(8, 300, generator=g, dtype=torch.float64))
    y = 3 * torch.randn(300, generator=g, dtype=torch.float64)
    a = SigmaScaling().fit(s, y)
    b = SigmaScaling().fit(s.to_gaussian(), y)
    assert a.scale_ == b.scale_
    assert torch.equal(a.transform(s).var, b.transform(s.to_gaussian()).var)


def test_sigma_scaling_worse_than_identity_warns_on_calibrated_data_and_not_after_a_good_fit():
    mis, y_mis = make_data(5000, 20)
    cal, y_cal = make_data(5000, 21, var_factor=1.0)
    ss = SigmaScaling().fit(mis, y_mis)
    with pytest.warns(WorseThanIdentityWarning) as rec:
        ss.score(cal, y_cal)
    msg = str(rec[0].message)
    nll_cal = float(gaussian_nll(ss.transform(cal), y_cal))
    nll_id = float(gaussian_nll(cal, y_cal))
    assert f"{nll_cal:.6g}" in msg and f"{nll_id:.6g}" in msg and "SigmaScaling" in msg
    held, y_held = make_data(5000, 22, var_factor=1.0)
    with no_warning():
        good = SigmaScaling().fit(cal, y_cal)
        good.score(held, y_held)


# ----------------------------------------------------------------------------- isotonic


def _reference_ecdf(p: np.ndarray, w: np.ndarray) -> np.ndarray:
    """P_hat(p_i) = sum_{j: p_j <= p_i} w_j / W, O(n^2) from the definition."""
    return (w[None, :] * (p[None, :] <= p[:, None])).sum(1) / w.sum()


@pytest.mark.parametrize("weighted", [False, True])
def test_isotonic_map_equals_sklearn_isotonic_regression(weighted):
    from sklearn.isotonic import IsotonicRegression

    pred, y = make_data(500, 30)
    y = torch.where(torch.arange(500) % 7 == 0, pred.mean, y)  # ties: p = 0.5 several times
    w = (torch.rand(500, generator=torch.Generator().manual_seed(31), dtype=torch.float64) + 0.1
         if weighted else torch.ones(500, dtype=torch.float64))
    iso = IsotonicRecalibration().fit(pred, y, sample_weight=w if weighted else None)
    p = stats.norm.cdf(y.numpy(), pred.mean.numpy(), pred.std.numpy())
    ref = IsotonicRegression(out_of_bounds="clip").fit(p, _reference_ecdf(p, w.numpy()),
                                                       sample_weight=w.numpy())
    grid = np.concatenate([np.linspace(1e-6, 1 - 1e-6, 2001), p])
    std_normal = Gaussian(torch.zeros(grid.size, dtype=torch.float64),
                          torch.ones(grid.size, dtype=torch.float64))
    got = iso.cdf(std_normal, stats.norm.ppf(grid))  # F(y) = grid, so this is R(grid)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, ref.predict(grid), rtol=0, atol=1e-12)


def test_isotonic_quantiles_invert_the_recalibrated_cdf():
    pred, y = make_data(2000, 40)
    iso = IsotonicRecalibration().fit(pred, y)
    test, _ = make_data(50, 41)
    q = iso.quantiles(test, [0.01, 0.1, 0.5, 0.9, 0.99])
    assert q.values.shape == (50, 5)
    back = iso.cdf(Gaussian(test.mean[:, None].expand(-1, 5), test.var[:, None].expand(-1, 5)),
                   q.values)
    torch.testing.assert_close(back, q.levels.expand(50, -1).double(), atol=1e-9, rtol=0)


def test_isotonic_recalibration_improves_held_out_calibration():
    val, y_val = make_data(5000, 50)
    test, y_test = make_data(20_000, 51)
    iso = IsotonicRecalibration().fit(val, y_val)
    assert iso.calibration_error_after_ < 0.005 < 0.1 < iso.calibration_error_before_
    lv = torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95], dtype=torch.float64)
    q = iso.quantiles(test, lv).values
    freq = (y_test[:, None] <= q).double().mean(0)
    assert float((freq - lv).abs().max()) < 0.015
    before = (y_test[:, None] <= test.quantiles(lv).values).double().mean(0)
    assert float((before - lv).abs().max()) > 0.15
    lo, hi = iso.quantiles(test, [0.05, 0.95]).interval(0.1)
    assert coverage(lo, hi, y_test) == pytest.approx(0.90, abs=0.02)
    assert iso.score(test, y_test) > iso.score(test, y_test) - 1  # a float, no warning
    samples = Samples(test.mean + test.std * torch.randn(
        4, 20_000, generator=torch.Generator().manual_seed(5), dtype=torch.float64))
    torch.testing.assert_close(iso.quantiles(samples).values,
                               iso.quantiles(samples.to_gaussian()).values)


def test_isotonic_worse_than_identity_warns():
    mis, y_mis = make_data(3000, 60)
    cal, y_cal = make_data(3000, 61, var_factor=1.0)
    iso = IsotonicRecalibration().fit(mis, y_mis)
    with pytest.warns(WorseThanIdentityWarning, match="pinball loss on the scored"):
        iso.score(cal, y_cal)
    held, y_held = make_data(3000, 62, var_factor=1.0)
    with no_warning():
        IsotonicRecalibration().fit(cal, y_cal).score(held, y_held)


# ----------------------------------------------------------------------------- quantiles


def _reference_shifts(values: np.ndarray, y: np.ndarray, levels) -> list[float]:
    """c_tau = the ceil((n + 1) tau)-th smallest of y - q_tau, from the formula."""
    n = y.size
    out = []
    for j, tau in enumerate(levels):
        k = math.ceil((n + 1) * Fraction(str(tau)))
        out.append(math.inf if k > n else float(np.sort(y - values[:, j])[k - 1]))
    return out


def test_quantile_shifts_are_the_conformal_order_statistics():
    pred, y = make_data(99, 70)
    q = pred.quantiles(LEVELS)
    qr = QuantileRecalibration().fit(q, y)
    ref = _reference_shifts(q.values.numpy(), y.numpy(), LEVELS)
    assert qr.shifts_.tolist() == ref
    # n = 99, tau = 0.95: k = 95 exactly; with float32 levels too (no off-by-one from rounding)
    q32 = Quantiles(q.values.float(), torch.tensor(LEVELS, dtype=torch.float32))
    qr32 = QuantileRecalibration().fit(q32, y.float())
    ref32 = _reference_shifts(q32.values.double().numpy(), y.float().double().numpy(), LEVELS)
    np.testing.assert_allclose(qr32.shifts_.numpy(), ref32, rtol=1e-6)
    # a Gaussian with the `levels` setting is the Gaussian's quantiles
    qg = QuantileRecalibration(levels=LEVELS).fit(pred, y)
    assert qg.shifts_.tolist() == ref
    torch.testing.assert_close(qg.transform(pred).values, qr.transform(q).values)


def test_quantile_recalibration_held_out_coverage_per_level():
    val, y_val = make_data(20_000, 80)
    test, y_test = make_data(20_000, 81)
    qr = QuantileRecalibration(levels=[0.05, 0.1, 0.5, 0.9, 0.95]).fit(val, y_val)
    out = qr.transform(test)
    freq = (y_test[:, None] <= out.values).double().mean(0)
    torch.testing.assert_close(freq, out.levels.double(), atol=0.012, rtol=0)
    assert coverage(*out.interval(0.1), y_test) == pytest.approx(0.90, abs=0.02)
    assert qr.calibration_error_after_ < 0.002 < 0.1 < qr.calibration_error_before_
    assert qr.pinball_after_ < qr.pinball_before_


def test_quantile_recalibration_too_few_points_gives_infinite_shift_with_warning():
    q = Quantiles(torch.tensor([[0.0, 1.0]] * 5), [0.5, 0.9])
    with pytest.warns(InfiniteIntervalWarning, match=r"n = 5 .*\[0\.9\]"), no_warning():
        qr = QuantileRecalibration().fit(q, torch.arange(5.0))
    # scores y - q: 0..4 and -1..3; k = ceil(6 * 0.5) = 3 (score 2), ceil(6 * 0.9) = 6 > 5
    assert qr.shifts_[0] == 2.0 and math.isinf(qr.shifts_[1])
    out = qr.transform(q)
    assert torch.isinf(out.values[:, 1]).all() and torch.equal(out.values[:, 0], torch.full((5,), 2.0))
    assert math.isfinite(qr.pinball_after_)  # the criteria on the finite level only


def test_quantile_recalibration_rearranges_crossing_columns():
    # column 0.4 shifted up by 2, column 0.6 by 0: rows whose columns are closer than 2 cross
    vals = torch.tensor([[0.0, 0.5], [0.0, 5.0]], dtype=torch.float64)
    qr = QuantileRecalibration.from_dict({
        "type": "QuantileRecalibration", "version": 1, "levels": None,
        "fitted_levels": [0.4, 0.6], "shifts": [2.0, 0.0]})
    out = qr.transform(Quantiles(vals, [0.4, 0.6])).values
    assert out.tolist() == [[0.5, 2.0], [2.0, 5.0]]  # row 0 sorted, row 1 = q + c unchanged


def test_quantile_worse_than_identity_warns():
    mis, y_mis = make_data(3000, 90)
    cal, y_cal = make_data(3000, 91, var_factor=1.0)
    qr = QuantileRecalibration(levels=LEVELS).fit(mis, y_mis)
    with pytest.warns(WorseThanIdentityWarning, match=r"QuantileRecalibration: .*\(\d"):
        qr.score(cal, y_cal)
    held, y_held = make_data(3000, 92, var_factor=1.0)
    with no_warning():
        QuantileRecalibration(levels=LEVELS).fit(cal, y_cal).score(held, y_held)

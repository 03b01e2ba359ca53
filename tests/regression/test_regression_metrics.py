"""Regression metrics against hand-worked numbers and slow references written from the formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from torchcal.regression import (
    Gaussian,
    Quantiles,
    Samples,
    calibration_curve,
    crps,
    ence,
    interval_coverage,
    interval_score,
    interval_width,
    pinball_loss,
    quantile_calibration_error,
    sharpness,
    uce,
)


def _data(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(n, generator=g, dtype=torch.float64)
    sd = 0.3 + torch.rand(n, generator=g, dtype=torch.float64) * 2
    y = mu + 1.3 * sd * torch.randn(n, generator=g, dtype=torch.float64)
    return mu, sd, y


# ----------------------------------------------------------------------------- CRPS
def _crps_quad(cdf, y, lo, hi):
    """CRPS by numerical integration of (F(x) - 1{x >= y})^2, split at y."""
    left = integrate.quad(lambda x: cdf(x) ** 2, lo, y, limit=200)[0]
    right = integrate.quad(lambda x: (1 - cdf(x)) ** 2, y, hi, limit=200)[0]
    return left + right


@pytest.mark.parametrize(("mu", "sd", "y"), [(0.0, 1.0, 0.0), (1.0, 0.5, 2.3), (-2.0, 3.0, 1.0)])
def test_crps_gaussian_equals_numerical_integral(mu, sd, y):
    ref = _crps_quad(lambda x: stats.norm.cdf(x, mu, sd), y, mu - 40 * sd, mu + 40 * sd)
    got = crps(Gaussian([mu], std=[sd]), [y])
    assert got.dtype == torch.float64 and got.ndim == 0
    assert float(got) == pytest.approx(ref, rel=1e-7)


def test_crps_gaussian_zero_variance_is_absolute_error():
    assert float(crps(Gaussian([1.0, 0.0], [0.0, 0.0]), [3.0, -0.5])) == pytest.approx(1.25)


def test_crps_samples_equals_integral_of_empirical_cdf():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(7, 5))
    y = rng.normal(size=5)
    ref = []
    for j in range(5):
        # exact integral of the squared step difference between the sorted breakpoints
        pts = np.sort(np.append(x[:, j], y[j]))
        total = 0.0
        for a, b in zip(pts[:-1], pts[1:], strict=True):
            f = np.mean(x[:, j] <= a)
            total += (b - a) * (f - float(a >= y[j])) ** 2
        ref.append(total)
    got = crps(Samples(torch.from_numpy(x)), torch.from_numpy(y))
    assert float(got) == pytest.approx(np.mean(ref), rel=1e-12)


def test_crps_samples_fair_equals_brute_force_pairs():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(6, 4)), rng.normal(size=4)
    s = x.shape[0]
    pair = np.abs(x[:, None, :] - x[None, :, :]).sum((0, 1))
    first = np.abs(x - y).mean(0)
    nrg = np.mean(first - 0.5 * pair / s**2)
    fair = np.mean(first - 0.5 * pair / (s * (s - 1)))
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    assert float(crps(Samples(xs), ys)) == pytest.approx(nrg, rel=1e-12)
    assert float(crps(Samples(xs), ys, fair=True)) == pytest.approx(fair, rel=1e-12)


def test_crps_quantiles_is_twice_mean_pinball_and_point_is_absolute_error():
    q = Quantiles([[0.0, 1.0, 2.0]], levels=[0.25, 0.5, 0.75])
    # y = 3: pinball 0.25*3, 0.5*2, 0.75*1 -> mean 2.5/3; CRPS ~ 5/3
    assert float(crps(q, [3.0])) == pytest.approx(5 / 3)
    assert float(crps(torch.tensor([1.0, -1.0]), torch.tensor([0.5, 1.0]))) == 1.25


def test_crps_quantiles_approaches_gaussian_crps_with_many_levels():
    mu, sd, y = _data(50)
    g = Gaussian(mu, std=sd)
    levels = (torch.arange(999, dtype=torch.float64) + 1) / 1000
    approx = crps(g.quantiles(levels), y)
    assert float(approx) == pytest.approx(float(crps(g, y)), rel=2e-3)


# ------------------------------------------------------------------ pinball, intervals
def test_pinball_hand_worked():
    q = Quantiles([[1.0, 2.0], [0.0, 4.0]], levels=[0.1, 0.9])
    # row 1, y = 3: 0.1*2, 0.9*1; row 2, y = -1: 0.9*1, 0.1*5
    per = pinball_loss(q, [3.0, -1.0], per_level=True)
    assert per.tolist() == pytest.approx([(0.2 + 0.9) / 2, (0.9 + 0.5) / 2])
    assert float(pinball_loss(q, [3.0, -1.0])) == pytest.approx(2.5 / 4)


def test_interval_metrics_hand_worked():
    pair = (torch.tensor([0.0, 0.0, 1.0, -1.0]), torch.tensor([1.0, 2.0, 3.0, 1.0]))
    y = torch.tensor([0.5, 3.0, 0.0, 1.0])
    assert float(interval_coverage(pair, y)) == 0.5
    assert float(interval_width(pair, y)) == pytest.approx(7 / 4)  # widths 1, 2, 2, 2
    # widths 1, 2, 2, 2; penalties (2/0.2) * (1 above; 1 below) -> 10 + 10
    assert float(interval_score(pair, y, alpha=0.2)) == pytest.approx((7 + 20) / 4)


def test_interval_of_a_gaussian_quantiles_and_samples():
    g = Gaussian([0.0], std=[2.0])
    z = stats.norm.ppf(0.95)
    assert float(interval_width(g, [0.0], alpha=0.1)) == pytest.approx(4 * z, rel=1e-6)
    assert float(interval_coverage(g, [3.2], alpha=0.1)) == 1.0
    assert float(interval_coverage(g, [3.4], alpha=0.1)) == 0.0
    q = Quantiles([[-1.0, 0.0, 2.0]], levels=[0.05, 0.5, 0.95])
    assert float(interval_score(q, [3.0], alpha=0.1)) == pytest.approx(3 + 20)
    s = Samples(torch.arange(11.0).reshape(11, 1))  # quantiles 0.5, 9.5 at alpha 0.1
    assert float(interval_width(s, [0.0], alpha=0.1)) == pytest.approx(9.0)


# ----------------------------------------------------------------------- ENCE, UCE
def _ence_reference(mu, sd, y, b):
    order = np.argsort(sd, kind="stable")
    n = len(sd)
    out = []
    for k in range(b):
        idx = order[(k * n) // b:((k + 1) * n) // b]
        rmv = math.sqrt(np.mean(sd[idx] ** 2))
        rmse = math.sqrt(np.mean((y[idx] - mu[idx]) ** 2))
        out.append(abs(rmv - rmse) / rmv)
    return np.mean(out)


def _uce_reference(mu, sd, y, b):
    var, err = sd**2, (y - mu) ** 2
    edges = np.linspace(var.min(), var.max(), b + 1)
    total = 0.0
    for k in range(b):
        inb = (var > edges[k]) & (var <= edges[k + 1])
        if k == 0:
            inb |= var == edges[0]
        if inb.any():
            total += inb.mean() * abs(var[inb].mean() - err[inb].mean())
    return total


@pytest.mark.parametrize(("n", "b"), [(200, 10), (203, 7), (50, 1)])
def test_ence_and_uce_equal_slow_references(n, b):
    mu, sd, y = _data(n, seed=n)
    g = Gaussian(mu, std=sd)
    args = (mu.numpy(), sd.numpy(), y.numpy(), b)
    assert float(ence(g, y, n_bins=b)) == pytest.approx(_ence_reference(*args), rel=1e-12)
    assert float(uce(g, y, n_bins=b)) == pytest.approx(_uce_reference(*args), rel=1e-12)


def test_ence_fixed_log_std_bins_reference():
    mu, sd, y = _data(300, seed=3)
    lo, hi, b = 0.1, 10.0, 8
    edges = np.exp(np.linspace(np.log(lo), np.log(hi), b + 1))
    s, m, t = sd.numpy(), mu.numpy(), y.numpy()
    vals = []
    for k in range(b):
        inb = (s > edges[k]) & (s <= edges[k + 1])
        if inb.any():
            rmv = math.sqrt(np.mean(s[inb] ** 2))
            vals.append(abs(rmv - math.sqrt(np.mean((t[inb] - m[inb]) ** 2))) / rmv)
    got = ence(Gaussian(mu, std=sd), y, n_bins=b, std_range=(lo, hi))
    assert float(got) == pytest.approx(np.mean(vals), rel=1e-12)


def test_ence_is_small_for_a_calibrated_gaussian():
    g = torch.Generator().manual_seed(0)
    sd = torch.rand(200_000, generator=g, dtype=torch.float64) + 0.5
    y = sd * torch.randn(200_000, generator=g, dtype=torch.float64)
    assert float(ence(Gaussian(torch.zeros_like(sd), std=sd), y)) < 0.01


# -------------------------------------------------------------- calibration curve
def test_calibration_curve_gaussian_matches_scipy_reference():
    mu, sd, y = _data(300, seed=4)
    m, s, t = mu.numpy(), sd.numpy(), y.numpy()
    levels = np.linspace(0, 1, 100)
    z = (t - m) / s
    ref_int = [np.mean(np.abs(z) <= stats.norm.ppf(0.5 + p / 2)) for p in levels]
    ref_q = [np.mean(t <= m + s * stats.norm.ppf(p)) for p in levels]
    g = Gaussian(mu, std=sd)
    exp, obs = calibration_curve(g, y)
    assert exp.tolist() == pytest.approx(levels.tolist())
    assert obs.tolist() == pytest.approx(ref_int, abs=1e-12)
    assert calibration_curve(g, y, kind="quantile")[1].tolist() == pytest.approx(ref_q)
    mace = np.mean(np.abs(np.array(ref_int) - levels))
    assert float(quantile_calibration_error(g, y)) == pytest.approx(mace, rel=1e-12)
    rms = math.sqrt(np.mean((np.array(ref_int) - levels) ** 2))
    assert float(quantile_calibration_error(g, y, norm="l2")) == pytest.approx(rms, rel=1e-12)
    # the area, by dense integration of the piecewise-linear curve
    grid = np.linspace(0, 1, 400_001)
    area = np.trapezoid(np.abs(np.interp(grid, levels, ref_int) - grid), grid)
    got = quantile_calibration_error(g, y, norm="area")
    assert float(got) == pytest.approx(area, rel=1e-6)


def test_calibration_curve_samples_and_quantiles():
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(20, 60)), rng.normal(size=60) * 1.5
    levels = np.array([0.1, 0.5, 0.8])
    s = Samples(torch.from_numpy(x))
    obs = calibration_curve(s, torch.from_numpy(y), levels, kind="quantile")[1]
    ref = [np.mean(y <= np.quantile(x, p, axis=0)) for p in levels]
    assert obs.tolist() == pytest.approx(ref)
    obs_i = calibration_curve(s, torch.from_numpy(y), levels)[1]
    ref_i = [np.mean((np.quantile(x, 0.5 - p / 2, axis=0) <= y)
                     & (y <= np.quantile(x, 0.5 + p / 2, axis=0))) for p in levels]
    assert obs_i.tolist() == pytest.approx(ref_i)
    q = Quantiles([[0.0, 1.0, 2.0, 3.0]] * 4, levels=[0.1, 0.3, 0.7, 0.9])
    yq = torch.tensor([-1.0, 0.5, 1.5, 2.5])
    exp, obs = calibration_curve(q, yq)  # central 0.4 [1, 2] and 0.8 [0, 3]
    assert exp.tolist() == pytest.approx([0.4, 0.8]) and obs.tolist() == [0.25, 0.75]
    assert calibration_curve(q, yq, kind="quantile")[1].tolist() == [0.25, 0.5, 0.75, 1.0]


def test_sharpness():
    assert float(sharpness(Gaussian([0.0, 0.0], std=[1.0, 7.0]))) == pytest.approx(5.0)
    s = Samples(torch.tensor([[0.0, 0.0], [2.0, 4.0]]))  # variances 1 and 4
    assert float(sharpness(s)) == pytest.approx(math.sqrt(2.5))
    assert float(sharpness(s, mask=torch.tensor([False, True]))) == pytest.approx(2.0)


# ------------------------------------------------------------------ dense layouts
def _dense(seed=6):
    g = torch.Generator().manual_seed(seed)
    shape = (4, 3, 5)
    mu = torch.randn(shape, generator=g, dtype=torch.float64)
    sd = 0.5 + torch.rand(shape, generator=g, dtype=torch.float64)
    y = mu + sd * torch.randn(shape, generator=g, dtype=torch.float64)
    mask = torch.rand(shape, generator=g) > 0.3
    return mu, sd, y, mask


def test_dense_layout_with_mask_equals_flattened_kept_elements():
    mu, sd, y, mask = _dense()
    dense = Gaussian(mu, std=sd)
    flat = Gaussian(mu[mask], std=sd[mask])
    yk = y[mask]
    draws = mu + sd * torch.randn((8, *mu.shape), generator=torch.Generator().manual_seed(1),
                                  dtype=torch.float64)
    levels = torch.tensor([0.05, 0.5, 0.95])
    cases = [
        (lambda p, t, **k: crps(p, t, **k), dense, flat),
        (lambda p, t, **k: crps(p, t, fair=True, **k), Samples(draws), Samples(draws[:, mask])),
        (lambda p, t, **k: pinball_loss(p, t, **k), dense.quantiles(levels),
         flat.quantiles(levels)),
        (lambda p, t, **k: interval_score(p, t, alpha=0.1, **k), dense, flat),
        (lambda p, t, **k: interval_coverage(p, t, alpha=0.1, **k), dense, flat),
        (lambda p, t, **k: ence(p, t, n_bins=4, **k), dense, flat),
        (lambda p, t, **k: uce(p, t, n_bins=4, **k), dense, flat),
        (lambda p, t, **k: quantile_calibration_error(p, t, **k), dense, flat),
    ]
    for fn, p_dense, p_flat in cases:
        want = fn(p_flat, yk)
        assert float(fn(p_dense, y, mask=mask)) == pytest.approx(float(want), rel=1e-12)
        y_ign = torch.where(mask, y, torch.full_like(y, -999.0))
        assert float(fn(p_dense, y_ign, ignore_value=-999.0)) == pytest.approx(float(want),
                                                                               rel=1e-12)
    pair = (mu - sd, mu + sd)
    assert float(interval_width(pair, y, mask=mask)) == pytest.approx(float((2 * sd[mask]).mean()))
    assert float(sharpness(dense, mask=mask)) == pytest.approx(float(sharpness(flat)))


def test_sequence_layout_and_numpy_inputs():
    mu, sd, y, mask = _dense(7)
    mu2, sd2, y2, m2 = mu.reshape(4, 15), sd.reshape(4, 15), y.reshape(4, 15), mask.reshape(4, 15)
    a = crps(Gaussian(mu2.numpy(), std=sd2.numpy()), y2.numpy(), mask=m2.numpy())
    assert isinstance(a, torch.Tensor)
    assert float(a) == pytest.approx(float(crps(Gaussian(mu[mask], std=sd[mask]), y[mask])))


# -------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(("call", "exc", "match"), [
    (lambda: pinball_loss(Gaussian([0.0], [1.0]), [0.0]), TypeError, "Quantiles"),
    (lambda: crps(Gaussian([0.0], [1.0]), [0.0], fair=True), ValueError, "fair"),
    (lambda: crps(Gaussian([0.0], [1.0]), [float("nan")]), ValueError, "finite"),
    (lambda: crps(Gaussian([0.0], [1.0]), [0.0, 1.0]), ValueError, "shape"),
    (lambda: Gaussian([0.0], [-1.0]), ValueError, ">= 0"),
    (lambda: Quantiles([[1.0, 0.0]], [0.1, 0.9]), ValueError, "cross"),
    (lambda: interval_score(([0.0], [1.0]), [0.0], alpha=1.5), ValueError, "alpha"),
    (lambda: interval_coverage(([1.0], [0.0]), [0.0]), ValueError, "lower"),
    (lambda: interval_coverage(([0.0, 0.0], [1.0]), [0.0, 0.0]), ValueError, "upper"),
    (lambda: interval_coverage(Gaussian([0.0], [1.0]), [0.0]), ValueError, "alpha"),
    (lambda: interval_coverage(torch.tensor([0.0]), [0.0]), TypeError, "lower, upper"),
    (lambda: ence(Gaussian([0.0], [0.0]), [0.0]), ValueError, "var"),
    (lambda: ence(torch.tensor([0.0]), [0.0]), TypeError, "Gaussian"),
    (lambda: ence(Gaussian([0.0], [1.0]), [0.0], n_bins=0), ValueError, "n_bins"),
    (lambda: ence(Gaussian([0.0], [1.0]), [0.0], std_range=(2, 1)), ValueError, "std_range"),
    (lambda: calibration_curve(Gaussian([0.0], [1.0]), [0.0], [0.5, 1.2]), ValueError,
     "levels"),
    (lambda: calibration_curve(Gaussian([0.0], [1.0]), [0.0], kind="x"), ValueError, "kind"),
    (lambda: calibration_curve(torch.tensor([0.0]), [0.0]), TypeError, "Gaussian"),
    (lambda: quantile_calibration_error(Gaussian([0.0], [1.0]), [0.0], norm="l3"),
     ValueError, "norm"),
    (lambda: calibration_curve(Quantiles([[0.0, 1.0]], [0.2, 0.6]), [0.0]), ValueError,
     "symmetric"),
    (lambda: sharpness(Quantiles([[0.0, 1.0]], [0.2, 0.6])), TypeError, "Gaussian"),
    (lambda: crps(Gaussian([0.0, 1.0], [1.0, 1.0]), [0.0, 1.0],
                  mask=torch.tensor([False, False])), ValueError, "observed"),
])
def test_bad_input_one_clear_line(call, exc, match):
    with pytest.raises(exc, match=match) as info:
        call()
    assert "\n" not in str(info.value)

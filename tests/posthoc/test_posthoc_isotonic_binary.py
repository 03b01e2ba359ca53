"""Isotonic calibration against scikit-learn's CalibratedClassifierCV; Platt scaling and beta
calibration against netcal (and properties of the fits)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from posthoc_reference import draw, sklearn_isotonic

from torchcal.posthoc import (
    BetaCalibration,
    CalibrationFitError,
    IsotonicCalibration,
    PlattScaling,
    TemperatureScaling,
    calibrator_from_dict,
)

# ------------------------------------------------------------------------------- isotonic


@pytest.mark.parametrize(("n", "c", "seed"), [(500, 2, 0), (800, 3, 1), (2000, 10, 2)])
def test_isotonic_matches_sklearn_calibrated_classifier(n, c, seed):
    z, y = draw(n, c, seed)
    zt, _ = draw(700, c, seed + 100, scale=4.0)  # wider: some test values beyond the fit range
    iso = IsotonicCalibration().fit(z, y)
    p, pt = torch.softmax(z, 1).numpy(), torch.softmax(zt, 1).numpy()
    expected = sklearn_isotonic(p, y.numpy(), pt)
    np.testing.assert_allclose(iso.predict_proba(zt.numpy()), expected, atol=1e-12, rtol=0)
    np.testing.assert_allclose(iso.predict_proba(z.numpy()), sklearn_isotonic(p, y.numpy(), p),
                               atol=1e-12, rtol=0)


def test_isotonic_maps_are_monotone_and_rows_sum_to_one():
    z, y = draw(1000, 4, 3)
    iso = IsotonicCalibration().fit(z, y)
    for kx, ky in zip(iso.knots_x_, iso.knots_y_, strict=True):
        assert (kx.diff() > 0).all() and (ky.diff() >= 0).all()
    q = iso.predict_proba(draw(500, 4, 4)[0])
    assert torch.allclose(q.sum(1), torch.ones(500, dtype=torch.float64), atol=1e-12)
    # the calibrated probability of each class is non-decreasing in its input probability
    # before renormalisation: check the one-vs-rest map directly on a sorted grid
    grid = torch.linspace(0, 1, 101, dtype=torch.float64)
    for kx, ky in zip(iso.knots_x_, iso.knots_y_, strict=True):
        v = np.interp(grid.numpy(), kx.numpy(), ky.numpy())
        assert (np.diff(v) >= 0).all()


def test_isotonic_lowers_validation_nll_versus_uncalibrated_on_a_large_set():
    z, y = draw(20000, 3, 5)
    iso = IsotonicCalibration().fit(z, y)
    zt, yt = draw(20000, 3, 6)
    assert F.nll_loss(torch.log(iso.predict_proba(zt).clamp(min=1e-12)), yt) < F.cross_entropy(
        zt, yt)


def test_isotonic_round_trip_and_bad_dicts():
    z, y = draw(300, 3, 7)
    iso = IsotonicCalibration().fit(z.float(), y)
    d = json.loads(json.dumps(iso.to_dict()))
    back = calibrator_from_dict(d)
    assert torch.equal(back.predict_proba(z.float()), iso.predict_proba(z.float()))
    assert iso.predict_proba(z.float()).dtype == torch.float32
    with pytest.raises(ValueError, match="sorted"):
        IsotonicCalibration.from_dict({**d, "knots_x": [d["knots_x"][0][::-1]] + d["knots_x"][1:]})
    with pytest.raises(ValueError, match="knots"):
        IsotonicCalibration.from_dict({**d, "knots_x": d["knots_x"][:1], "knots_y": d["knots_y"][:1]})


# ----------------------------------------------------------------------------- Platt / beta


@pytest.fixture(scope="module")
def netcal():
    return pytest.importorskip("netcal.scaling")


def binary_draw(n, seed, power=2.0):
    """Scores s in (0, 1) whose true class-1 frequency is s ** power (miscalibrated)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.rand(n, generator=g, dtype=torch.float64) * 0.96 + 0.02
    y = (torch.rand(n, generator=g, dtype=torch.float64) < s ** power).long()
    z = torch.stack([torch.zeros_like(s), torch.log(s) - torch.log1p(-s)], dim=1)
    return z, y, s


@pytest.mark.parametrize(("ours", "theirs", "power"), [
    (PlattScaling, "LogisticCalibration", 0.5), (PlattScaling, "LogisticCalibration", 2.0),
    (BetaCalibration, "BetaCalibration", 0.5), (BetaCalibration, "BetaCalibration", 2.0),
    (BetaCalibration, "BetaCalibration", 4.0)])
def test_platt_and_beta_match_netcal(netcal, ours, theirs, power):
    z, y, s = binary_draw(2000, 10, power)
    cal = ours().fit(z, y)
    ref = getattr(netcal, theirs)(method="mle")  # SciPy on finite-difference gradients
    ref.fit(s.numpy(), y.numpy())
    q, q_ref = cal.predict_proba(z.numpy())[:, 1], ref.transform(s.numpy())
    np.testing.assert_allclose(q, q_ref, atol=5e-4, rtol=0)
    # the differences are netcal stopping short of the optimum: our NLL is never higher
    yn = y.numpy()

    def nll(p):
        return -np.mean(yn * np.log(p) + (1 - yn) * np.log1p(-p))

    assert nll(q) <= nll(q_ref) + 1e-12


def test_platt_and_beta_are_stationary_points_of_the_nll():
    z, y, s = binary_draw(1500, 12, 2.0)
    for cal, feats in ((PlattScaling().fit(z, y), lambda: torch.stack(
            [torch.log(s) - torch.log1p(-s), torch.ones_like(s)], 1)),
                       (BetaCalibration().fit(z, y), lambda: torch.stack(
            [torch.log(s), -torch.log1p(-s), torch.ones_like(s)], 1))):
        theta = cal.coef_.clone().requires_grad_(True)
        loss = F.binary_cross_entropy_with_logits(feats() @ theta, y.double())
        (g,) = torch.autograd.grad(loss, theta)
        assert g.abs().max() < 1e-8


def test_beta_calibration_respects_its_constraints_and_contains_the_identity():
    # labels drawn from the scores themselves: the identity a = b = 1, c = 0 is right
    g = torch.Generator().manual_seed(13)
    s = torch.rand(40000, generator=g, dtype=torch.float64) * 0.98 + 0.01
    y = (torch.rand(40000, generator=g, dtype=torch.float64) < s).long()
    z = torch.stack([torch.zeros_like(s), torch.log(s) - torch.log1p(-s)], dim=1)
    a, b, c = BetaCalibration().fit(z, y).coef_.tolist()
    assert a == pytest.approx(1, abs=0.05) and b == pytest.approx(1, abs=0.05)
    assert c == pytest.approx(0, abs=0.05)
    # a decreasing relation would need a < 0: the fit stays on the boundary a = 0
    y_flip = 1 - y
    a, b, _ = BetaCalibration().fit(z, y_flip).coef_.tolist()
    assert a >= 0 and b >= 0 and min(a, b) == 0


def test_platt_equals_temperature_scaling_family_and_beats_it():
    z, y, _ = binary_draw(3000, 14, 2.0)
    ps = PlattScaling().fit(z, y)
    ts = TemperatureScaling().fit(z, y)
    nll = F.cross_entropy(ps.transform(z), y).item()
    assert nll <= F.cross_entropy(ts.transform(z), y).item() + 1e-12


def test_binary_calibrators_reject_more_classes_and_separable_data():
    z3 = torch.randn(10, 3)
    for cls in (PlattScaling, BetaCalibration):
        with pytest.raises(ValueError, match="2 columns \\(a binary problem\\)"):
            cls().fit(z3, torch.tensor([0, 1] * 5))
    z = torch.tensor([[0.0, -2.0], [0.0, -1.0], [0.0, 1.0], [0.0, 2.0]])
    with pytest.raises(CalibrationFitError, match=r"at most 1 Newton steps.*separate the two "
                                               "classes perfectly"):
        PlattScaling(max_iter=1).fit(z, torch.tensor([0, 0, 1, 1]))
    with pytest.warns(RuntimeWarning, match="separate the two classes perfectly"):
        ps = PlattScaling().fit(z, torch.tensor([0, 0, 1, 1]))
    assert ps.coef_[0] > 10


@pytest.mark.parametrize("cls", [PlattScaling, BetaCalibration])
def test_binary_round_trip(cls):
    z, y, _ = binary_draw(500, 15)
    cal = cls().fit(z, y)
    back = calibrator_from_dict(json.loads(json.dumps(cal.to_dict())))
    assert torch.equal(back.predict_proba(z), cal.predict_proba(z))
    with pytest.raises(ValueError, match="coef"):
        cls.from_dict({**cal.to_dict(), "coef": [1.0]})

"""Matrix scaling and Dirichlet calibration (ODIR): fits against a SciPy minimisation of the
objective written here from the authors' dirichletcal code, and properties."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from posthoc_reference import draw
from scipy.optimize import minimize
from scipy.special import log_softmax as np_log_softmax

from torchcal.posthoc import (
    CalibrationFitError,
    DirichletCalibration,
    MatrixScaling,
    TemperatureScaling,
    VectorScaling,
    calibrator_from_dict,
    linear,
)


def _reference_fit(z, y, lam, mu, *, log_probs):
    """minimise mean NLL + lam / (k (k - 1)) sum_{i != j} W_ij^2 + mu / k sum_j b_j^2 over
    (W, b), q = softmax(W x + b): dirichletcal's `_objective` with `reg_norm=True` and
    `ref_row=False` (x = log(clip(p, tiny)) for Dirichlet, the logits for matrix scaling),
    by SciPy's L-BFGS-B with the analytic gradient, to a 1e-12 gradient."""
    zn = z.numpy()
    if log_probs:
        p = np.exp(np_log_softmax(zn, axis=1))
        x = np.log(np.clip(p, np.finfo(np.float64).tiny, 1.0))
    else:
        x = zn
    n, k = x.shape
    xt = np.hstack([x, np.ones((n, 1))])
    onehot = np.eye(k)[y.numpy()]
    off = 1.0 - np.eye(k)
    lam_n, mu_n = lam / (k * (k - 1)), mu / k

    def fun(theta):
        t = theta.reshape(k, k + 1)
        ls = np_log_softmax(xt @ t.T, axis=1)
        w, b = t[:, :k], t[:, k]
        f = -(onehot * ls).sum() / n + lam_n * ((w * off) ** 2).sum() + mu_n * (b * b).sum()
        g = (np.exp(ls) - onehot).T @ xt / n
        g[:, :k] += 2 * lam_n * w * off
        g[:, k] += 2 * mu_n * b
        return f, g.ravel()

    t0 = np.hstack([np.eye(k), np.zeros((k, 1))]).ravel()
    res = minimize(fun, t0, jac=True, method="L-BFGS-B",
                   options={"maxiter": 20000, "gtol": 1e-12, "ftol": 1e-16, "maxcor": 30})
    return res.x.reshape(k, k + 1), xt, res.fun


def dirichletcal_reference_theta(z, y, lam, mu, *, log_probs):
    """(theta (C, C + 1), optimum) of :func:`dirichletcal_reference`'s SciPy fit."""
    t, _, f = _reference_fit(z, y, lam, mu, log_probs=log_probs)
    return t, f


def dirichletcal_reference(z, y, lam, mu, *, log_probs):
    """(probabilities of the fitted map on ``z``, optimum) of the SciPy fit below."""
    t, xt, f = _reference_fit(z, y, lam, mu, log_probs=log_probs)
    return np.exp(np_log_softmax(xt @ t.T, axis=1)), f


@pytest.mark.parametrize("cls", [DirichletCalibration, MatrixScaling])
@pytest.mark.parametrize(("lam", "mu"), [(0.01, 0.01), (1.0, 10.0), (100.0, 0.1)])
def test_odir_matches_a_scipy_fit_of_the_dirichletcal_objective(cls, lam, mu):
    z, y = draw(600, 4, seed=1)
    cal = cls(reg="odir", lam=lam, mu=mu).fit(z, y)
    q_ref, f_ref = dirichletcal_reference(z, y, lam, mu, log_probs=cls is DirichletCalibration)
    np.testing.assert_allclose(cal.predict_proba(z.numpy()), q_ref, atol=1e-6, rtol=0)
    w, b = cal.weight_, cal.bias_
    off = 1 - torch.eye(4, dtype=torch.float64)
    f = (F.cross_entropy(cal.transform(z), y) + lam / 12 * ((w * off) ** 2).sum()
         + mu / 4 * (b * b).sum())
    assert float(f) <= f_ref + 1e-10  # at least as low as SciPy's optimum


@pytest.mark.parametrize("cls", [DirichletCalibration, MatrixScaling])
def test_unregularised_fit_matches_scipy_and_beats_vector_and_temperature(cls):
    z, y = draw(800, 5, seed=2)
    cal = cls(reg="none").fit(z, y)
    q_ref, _ = dirichletcal_reference(z, y, 0.0, 0.0, log_probs=cls is DirichletCalibration)
    np.testing.assert_allclose(cal.predict_proba(z.numpy()), q_ref, atol=1e-6, rtol=0)
    nll = F.cross_entropy(cal.transform(z), y).item()
    assert nll <= F.cross_entropy(VectorScaling().fit(z, y).transform(z), y).item() + 1e-9
    assert nll <= F.cross_entropy(TemperatureScaling().fit(z, y).transform(z), y).item() - 1e-3


def test_odir_nll_is_never_above_temperature_scaling():
    z, y = draw(500, 6, seed=3)
    ts_nll = F.cross_entropy(TemperatureScaling().fit(z, y).transform(z), y).item()
    for lam, mu in ((1e-3, 1e-3), (1.0, 1.0), (1e4, 1e4)):
        dc = DirichletCalibration(lam=lam, mu=mu).fit(z, y)
        assert F.cross_entropy(dc.transform(z), y).item() <= ts_nll + 1e-12


def test_heavy_odir_keeps_w_diagonal_and_b_zero():
    z, y = draw(500, 4, seed=4)
    dc = DirichletCalibration(lam=1e7, mu=1e7).fit(z, y)
    off = dc.weight_ - torch.diag(dc.weight_.diagonal())
    assert off.abs().max() < 1e-4 and dc.bias_.abs().max() < 1e-4
    # ... and then it is vector scaling of log p without bias (a per-class temperature):
    # the diagonal is free, so it differs from one shared 1 / T
    assert dc.weight_.diagonal().std() > 1e-3


def test_dirichlet_is_a_map_of_the_log_probabilities():
    # adding a constant to a row of logits changes nothing for Dirichlet (it sees log p) but
    # does for matrix scaling (it sees z)
    z, y = draw(400, 3, seed=5)
    shift = torch.randn(400, 1, dtype=torch.float64) * 5
    dc = DirichletCalibration().fit(z, y)
    assert torch.allclose(dc.predict_proba(z + shift), dc.predict_proba(z), atol=1e-10)
    ms = MatrixScaling().fit(z, y)
    assert not torch.allclose(ms.predict_proba(z + shift), ms.predict_proba(z), atol=1e-3)


@pytest.mark.parametrize("block", [True, False])
def test_newton_cg_path_for_many_classes_agrees_with_newton(monkeypatch, block):
    z, y = draw(600, 4, seed=6)
    newton = DirichletCalibration(lam=0.1, mu=0.1).fit(z, y)
    monkeypatch.setattr(linear, "NEWTON_MAX_CLASSES", 2)
    if not block:  # the diagonal preconditioner of very many classes
        monkeypatch.setattr(linear, "BLOCK_PRECONDITIONER_MAX", 0)
    cg = DirichletCalibration(lam=0.1, mu=0.1).fit(z, y)
    assert torch.allclose(cg.predict_proba(z), newton.predict_proba(z), atol=1e-9)
    assert torch.allclose(cg.weight_, newton.weight_, atol=1e-8)


def test_out_of_budget_raises_calibration_error_with_the_reason(monkeypatch):
    z, y = draw(300, 4, seed=7)
    with pytest.raises(CalibrationFitError, match=r"DirichletCalibration failed: Newton's method "
                                               r"stopped after at most 1 steps .*max_iter"):
        DirichletCalibration(max_iter=1).fit(z, y)
    monkeypatch.setattr(linear, "NEWTON_MAX_CLASSES", 2)
    with pytest.raises(CalibrationFitError, match=r"MatrixScaling failed: Newton's method "
                                               r"stopped after at most 2 steps"):
        MatrixScaling(max_iter=2).fit(z, y)


def test_absent_classes_are_named_when_the_fit_cannot_converge():
    z, y = draw(300, 4, seed=8)
    keep = y != 2
    with pytest.raises(CalibrationFitError, match=r"class\(es\) never occur.*\(2\)"):
        MatrixScaling(reg="none", max_iter=3).fit(z[keep], y[keep])


@pytest.mark.parametrize("cls", [DirichletCalibration, MatrixScaling])
def test_round_trip_and_transform_dtypes(cls):
    z, y = draw(300, 3, seed=9)
    cal = cls().fit(z.float(), y)
    d = json.loads(json.dumps(cal.to_dict()))
    back = calibrator_from_dict(d)
    assert type(back) is cls and back.get_params() == cal.get_params()
    assert torch.equal(back.transform(z.float()), cal.transform(z.float()))
    assert cal.transform(z.float()).dtype == torch.float32
    assert cal.transform(z).dtype == torch.float64
    with pytest.raises(ValueError, match="3 classes"):
        cal.transform(torch.randn(2, 4))
    with pytest.raises(ValueError, match="weight"):
        cls.from_dict({**d, "weight": d["weight"][:-1]})


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"reg": "l2"}, "`reg` to be one of"),
    ({"lam": -1.0}, "`lam` to be a finite non-negative"),
    ({"mu": float("nan")}, "`mu` to be a finite non-negative"),
    ({"max_iter": 0}, "`max_iter` to be a positive integer"),
])
@pytest.mark.parametrize("cls", [DirichletCalibration, MatrixScaling])
def test_bad_settings(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


@pytest.mark.parametrize("cls", [DirichletCalibration, MatrixScaling])
def test_memorised_validation_labels_warn_at_fit(cls):
    """Issue 24 (3, 4): with more parameters than validation samples a small fixed ODIR penalty
    (the former default lam = mu = 0.01: lam / (C (C - 1)) per off-diagonal weight) lets the
    map memorise the labels; the fit says so, and held-out data confirm it is worse than no
    calibration."""
    from torchcal.posthoc import MemorizedValidationWarning, WorseThanIdentityWarning

    z, y = draw(600, 30, seed=30)  # 930 parameters, 300 validation samples
    kwargs = {"lam": 0.01, "mu": 0.01}
    with pytest.warns(MemorizedValidationWarning, match=r"930 parameters fitted on 300 "
                                                        r"validation samples.*memorised"):
        cal = cls(**kwargs).fit(z[:300], y[:300])
    with pytest.warns(WorseThanIdentityWarning, match="scored"):
        cal.score(z[300:], y[300:])
    # enough samples for the parameters: no warning
    z, y = draw(1000, 21, seed=21)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemorizedValidationWarning)
        cls(**kwargs).fit(z, y)

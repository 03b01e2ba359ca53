"""Matrix and Dirichlet scaling choose ``lam`` and ``mu`` by cross-validation by default
(issue 33, 1): never worse than no calibration on held-out data where a fixed small penalty
memorised the labels; the cross-validated scores equal an independent SciPy computation; fixed
values are still accepted; a calibrator file's values are checked when read back."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.special import log_softmax as np_log_softmax
from test_posthoc_linear import _reference_fit

from torchcal.posthoc import (
    DirichletCalibration,
    HistogramBinning,
    IsotonicCalibration,
    MatrixScaling,
    TemperatureScaling,
    VectorScaling,
    WorseThanIdentityWarning,
    calibrator_from_dict,
    cv_folds,
    linear,
)


def issue_draw(c: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The issue's data: logits 3·N(0, 1), labels drawn from softmax(z / 2)."""
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(n, c, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g).squeeze(1)
    return z, y


@pytest.mark.parametrize("cls", [DirichletCalibration, MatrixScaling])
def test_defaults_are_odir_with_cross_validated_penalties(cls):
    p = cls().get_params()
    assert (p["reg"], p["lam"], p["mu"], p["cv"]) == ("odir", "cv", "cv", 5)


@pytest.mark.parametrize("cls", [DirichletCalibration, MatrixScaling])
def test_default_is_never_worse_than_no_calibration_at_many_classes(cls):
    """C (C + 1) parameters, 1,500 samples: the former defaults (lam = mu = 0.01; matrix
    scaling unregularised) are worse than no calibration on held-out data, the default is
    better, within 2% of temperature scaling.  C = 50 here (5 s a fit); C = 100 and the 5
    seeds of both (30-70 s a fit) are benchmarks/bench_linear_cv.py's, printed in
    benchmarks/results/linear_cv.md."""
    c = 50
    z, y = issue_draw(c, 1500, seed=c)
    zt, yt = issue_draw(c, 5000, seed=c + 1000)
    none = float(F.cross_entropy(zt, yt))
    cal = cls().fit(z, y)
    nll = -cal.score(zt, yt)
    assert nll < none
    ts = -TemperatureScaling(method="nll").fit(z, y).score(zt, yt)
    assert nll < 1.02 * ts
    assert max(cal.cv_scores_.values()) > min(cal.cv_scores_.values())  # a real choice
    assert cal.cv_scores_[(cal.lam_, cal.mu_)] == min(cal.cv_scores_.values())
    # the former default, for contrast
    former = dict(lam=0.01, mu=0.01) if cls is DirichletCalibration else dict(reg="none")
    with pytest.warns(WorseThanIdentityWarning):
        assert -cls(**former).fit(z, y).score(zt, yt) > none


@pytest.mark.parametrize("cls", [DirichletCalibration, MatrixScaling])
def test_cross_validated_scores_equal_an_independent_computation(cls):
    """Every cv_scores_ entry is the mean held-out NLL over cv_folds of a fit on the other
    folds: recomputed here with SciPy's L-BFGS-B fit of the same objective; the chosen pair
    is the smallest score."""
    z, y = issue_draw(3, 120, seed=7)
    cal = cls(cv=3).fit(z, y)
    assert len(cal.cv_scores_) >= 4
    folds = cv_folds(len(y), 3)
    for (lam, mu), score in cal.cv_scores_.items():
        if max(lam, mu) > 1e4:  # L-BFGS-B is ill-conditioned there; the rest suffices
            continue
        total = 0.0
        for i, test in enumerate(folds):
            train = torch.cat(folds[:i] + folds[i + 1:])
            theta, _, _ = _reference_fit(z[train], y[train], lam, mu,
                                         log_probs=cls is DirichletCalibration)
            x = z[test].numpy()
            if cls is DirichletCalibration:
                x = np_log_softmax(x, axis=1)
            ls = np_log_softmax(np.hstack([x, np.ones((len(test), 1))]) @ theta.T, axis=1)
            total -= ls[np.arange(len(test)), y[test].numpy()].sum()
        assert score == pytest.approx(total / len(y), rel=1e-6), (lam, mu)
    best = min(cal.cv_scores_, key=cal.cv_scores_.__getitem__)
    assert (cal.lam_, cal.mu_) == best
    # the final map is the fit on all samples at the chosen values
    fixed = cls(lam=cal.lam_, mu=cal.mu_).fit(z, y)
    assert torch.allclose(fixed.weight_, cal.weight_, atol=1e-9)


def test_the_grid_reaches_beyond_where_the_best_lam_was_found():
    assert min(linear.CV_GRID) <= 1e-2 and max(linear.CV_GRID) >= 1e8
    ratios = np.diff(np.log10(linear.CV_GRID))
    assert np.allclose(ratios, 1.0)  # one value per decade


def test_one_penalty_cross_validated_the_other_fixed():
    z, y = issue_draw(4, 200, seed=3)
    cal = DirichletCalibration(lam="cv", mu=0.5).fit(z, y)
    assert cal.mu_ == 0.5 and {mu for _, mu in cal.cv_scores_} == {0.5}
    cal = MatrixScaling(lam=2.0, mu="cv").fit(z, y)
    assert cal.lam_ == 2.0 and {lam for lam, _ in cal.cv_scores_} == {2.0}


def test_fixed_values_fit_once_as_before():
    z, y = issue_draw(4, 200, seed=4)
    cal = DirichletCalibration(lam=0.01, mu=0.01).fit(z, y)
    assert cal.cv_scores_ is None and (cal.lam_, cal.mu_) == (0.01, 0.01)
    assert MatrixScaling(reg="none").fit(z, y).lam_ == 0.0


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"lam": "auto"}, "`lam` to be a finite non-negative"),
    ({"mu": "CV"}, "`mu` to be a finite non-negative"),
    ({"cv": 1}, r"`cv` \(cross-validation folds\) to be >= 2"),
    ({"cv": 2.5}, "`cv` to be a positive integer"),
])
def test_bad_cross_validation_settings(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        DirichletCalibration(**kwargs)


def test_too_few_samples_to_cross_validate_is_an_error_naming_the_way_out():
    z, y = issue_draw(3, 9, seed=1)
    with pytest.raises(ValueError, match=r"at least 2 \* cv = 10 .*got 9.*lam=0.01"):
        DirichletCalibration().fit(z, y)


@pytest.mark.parametrize("cls", [DirichletCalibration, MatrixScaling])
def test_round_trip_keeps_the_chosen_penalties(cls):
    z, y = issue_draw(3, 100, seed=2)
    cal = cls().fit(z, y)
    back = calibrator_from_dict(json.loads(json.dumps(cal.to_dict())))
    assert (back.lam_, back.mu_) == (cal.lam_, cal.mu_) and back.lam == "cv"
    assert torch.equal(back.predict_proba(z), cal.predict_proba(z))


# ------------------------------------------------------------------- values read back (part 2)
def _fitted(kind):
    z, y = issue_draw(3, 100, seed=5)
    cal = {"T": TemperatureScaling(method="nll"), "vector": VectorScaling(),
           "dirichlet": DirichletCalibration(lam=1.0, mu=1.0), "isotonic": IsotonicCalibration(),
           "histogram": HistogramBinning()}[kind]
    return cal.fit(z, y).to_dict()


@pytest.mark.parametrize(("kind", "edit", "match"), [
    ("T", lambda d: d.update(temperature=1e-300), r"temperature.*\[1e-06, 1e\+06\]"),
    ("T", lambda d: d.update(temperature=1e300), r"temperature.*\[1e-06, 1e\+06\]"),
    ("dirichlet", lambda d: d["weight"][0].__setitem__(1, 1e38), r"weight'\]\[0\]\[1\]"),
    ("dirichlet", lambda d: d["bias"].__setitem__(0, -1e38), r"bias'\]\[0\]"),
    ("vector", lambda d: d["weight"].__setitem__(0, 1e38), r"weight'\]\[0\]"),
    ("isotonic", lambda d: d["knots_y"][1].__setitem__(0, 7.0), r"knots_y'\]\[1\]\[0\].*\[0, 1\]"),
    ("isotonic", lambda d: d["knots_x"][1].__setitem__(0, -3.0), r"knots_x'\]\[1\]\[0\]"),
    ("histogram", lambda d: d["values"].__setitem__(0, 1e9), r"values'\]\[0\]"),
    ("histogram", lambda d: d["edges"].__setitem__(0, -1.0), r"edges'\]\[0\]"),
])
def test_impossible_values_are_refused_when_read_back(kind, edit, match):
    """A calibration edited by hand (T = 1e-300, weights of 1e38) used to load and give NaN
    probabilities: every parameter is checked against the range a fit can produce."""
    d = _fitted(kind)
    z = torch.randn(4, 3, dtype=torch.float32) * 3
    assert torch.isfinite(torch.as_tensor(calibrator_from_dict(d).predict_proba(z))).all()
    edit(d)
    with pytest.raises(ValueError, match=match):
        calibrator_from_dict(d)


def test_the_parameter_bound_leaves_fitted_maps_far_inside():
    """The bound (1e6) is not a fit's limit: sharply separated data reach weights of a few
    dozen at most."""
    z, y = issue_draw(5, 400, seed=9)
    cal = DirichletCalibration(lam=0.0, mu=0.0).fit(z * 10, y)
    assert float(cal.weight_.abs().max()) < 1e3
    assert math.isfinite(float(cal.bias_.abs().max()))

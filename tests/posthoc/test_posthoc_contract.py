"""The scikit-learn contract of every calibrator (issue 14, item 10): get_params/set_params,
clone, Pipeline, GridSearchCV, NumPy in gives NumPy out; a grid temperature at the grid's edge
warns; an optimiser out of budget is a one-line TorchcalError (issue 14, item 6)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline

from torchcal.cli import main as cli_main
from torchcal.errors import NotFittedError, TorchcalError
from torchcal.logits_file import save_logits
from torchcal.posthoc import (
    BetaCalibration,
    CalibrationFitError,
    ConformalClassifier,
    DirichletCalibration,
    HistogramBinning,
    IsotonicCalibration,
    MatrixScaling,
    PlattScaling,
    TemperatureScaling,
    VectorScaling,
    calibrator_from_dict,
    fit_temperatures,
)

MULTICLASS = [TemperatureScaling, VectorScaling, MatrixScaling, DirichletCalibration,
              HistogramBinning, IsotonicCalibration]
BINARY = [PlattScaling, BetaCalibration]
ALL = MULTICLASS + BINARY




def data(cls, n=600, seed=0):
    c = 2 if cls in BINARY else 4
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g) * 3
    y = torch.multinomial(torch.softmax(z / 2, dim=1), 1, generator=g).squeeze(1)
    return z, y


@pytest.mark.parametrize("cls", ALL + [ConformalClassifier])
def test_get_params_set_params_and_clone(cls):
    est = cls()
    params = est.get_params()
    assert params == cls().get_params()
    copy = clone(est)
    assert type(copy) is cls and copy.get_params() == params and copy is not est
    z, y = data(cls)
    fitted = cls().fit(z, y)
    fresh = clone(fitted)  # clone drops what was learned
    assert not fresh.is_fitted and fitted.is_fitted
    if params:
        name = next(iter(params))
        assert est.set_params(**{name: params[name]}) is est


def test_clone_keeps_non_default_settings():
    ts = TemperatureScaling(method="grid_ece", grid=[0.5, 1.0, 2.0], n_bins=10)
    assert clone(ts).get_params() == {"method": "grid_ece", "grid": [0.5, 1.0, 2.0],
                                      "n_bins": 10}
    dc = clone(DirichletCalibration(lam=0.5, mu=2.0))
    assert (dc.lam, dc.mu, dc.reg) == (0.5, 2.0, "odir")


def test_set_params_is_checked_at_once_and_at_fit():
    z, y = data(TemperatureScaling)
    ts = TemperatureScaling()
    with pytest.raises(ValueError, match="`method` to be one of"):
        ts.set_params(method="bogus")
    assert ts.method == TemperatureScaling().method  # nothing changed
    ts.method = "bogus"  # an attribute set directly is checked by fit
    with pytest.raises(ValueError, match="`method` to be one of"):
        ts.fit(z, y)


@pytest.mark.parametrize("cls", ALL)
def test_set_params_after_fit_drops_the_fit(cls):
    z, y = data(cls)
    cal = cls().fit(z, y)
    cal.set_params(**cal.get_params())  # unchanged: still fitted
    assert cal.is_fitted
    other = {"method": "grid_nll", "reg": "none", "n_bins": 7, "max_iter": 999,
             "out_of_bounds": "clip", "y_min": 0.0, "interpolation": "linear"}
    changed = {k: v for k, v in other.items() if k in cal.get_params() and
               cal.get_params()[k] != v}
    if not changed:
        pytest.skip(f"no second value known for {cls.__name__}'s settings")
    k, v = next(iter(changed.items()))
    cal.set_params(**{k: v})
    with pytest.raises(NotFittedError, match="changed by `set_params` after `fit`"):
        cal.predict_proba(z)


@pytest.mark.parametrize("cls", ALL)
def test_numpy_in_numpy_out(cls):
    z, y = data(cls)
    cal = cls().fit(z.numpy(), y.numpy())
    for out in (cal.transform(z.numpy()), cal.predict_proba(z.numpy()),
                cls().fit_transform(z.numpy(), y.numpy())):
        assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == z.shape
    q = cal.predict_proba(z)
    assert isinstance(q, torch.Tensor)
    np.testing.assert_array_equal(cal.predict_proba(z.numpy()), q.numpy())
    np.testing.assert_allclose(q.sum(1).numpy(), 1.0, atol=1e-5)
    back = calibrator_from_dict(json.loads(json.dumps(cal.to_dict())))
    np.testing.assert_array_equal(back.predict_proba(z.numpy()), cal.predict_proba(z.numpy()))


@pytest.mark.parametrize("cls", ALL)
def test_score_is_the_mean_log_likelihood(cls):
    z, y = data(cls)
    cal = cls().fit(z, y)
    logq = torch.log_softmax(cal.transform(z).double(), 1)
    assert cal.score(z.numpy(), y.numpy()) == pytest.approx(
        float(logq[torch.arange(len(y)), y].mean()), abs=1e-12)


def test_pipeline_of_calibrators():
    z, y = data(DirichletCalibration, n=800)
    pipe = Pipeline([("ts", TemperatureScaling()), ("dir", DirichletCalibration())])
    pipe.fit(z.numpy(), y.numpy())
    ts = TemperatureScaling().fit(z, y)
    dc = DirichletCalibration().fit(ts.transform(z), y)
    np.testing.assert_allclose(pipe.predict_proba(z.numpy()),
                               dc.predict_proba(ts.transform(z)).numpy(), atol=1e-6)


def test_grid_search_tunes_the_odir_strengths():
    z, y = data(DirichletCalibration, n=900, seed=1)
    search = GridSearchCV(DirichletCalibration(), {"lam": [1e-3, 1.0, 1e3], "mu": [1e-3, 1.0]},
                          cv=3)
    search.fit(z.numpy(), y.numpy())
    assert set(search.best_params_) == {"lam", "mu"}
    assert isinstance(search.best_estimator_, DirichletCalibration)
    assert np.isfinite(search.cv_results_["mean_test_score"]).all()


# -------------------------------------------------------------- temperature at the grid edge


def test_a_grid_temperature_at_the_edge_of_the_grid_warns():
    g = torch.Generator().manual_seed(2)
    z = torch.randn(1000, 5, generator=g) * 3
    y = torch.multinomial(torch.softmax(z / 4, dim=1), 1, generator=g).squeeze(1)  # T* ~ 4
    with pytest.warns(RuntimeWarning, match=r"T = 2 is the largest entry of the grid "
                                            r"\[0.5, 2\].*wider `grid`") as rec:
        ts = TemperatureScaling(method="grid_nll", grid=[0.5, 1.0, 2.0]).fit(z, y)
    assert ts.temperature_ == 2.0 and rec[0].filename == __file__
    with pytest.warns(RuntimeWarning, match="largest entry of the grid"):
        fit_temperatures(z, y, grid=[0.5, 1.0, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TemperatureScaling(method="grid_nll").fit(z, y)  # default grid: T ~ 4 is inside
        TemperatureScaling(method="grid_nll", grid=[3.0]).fit(z, y)  # a one-point grid


# ------------------------------------------------------- an optimiser out of budget (#14.6)


def absent_class_logits():
    """100 samples of 50 classes: 10 classes never occur, so vector scaling's biases for them
    fall without bound and L-BFGS cannot reach a 1e-6 gradient."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 50, (100,), generator=g)
    z = torch.randn(100, 50, generator=g) * 2
    z[torch.arange(100), y] += 3
    return z, y


def test_vector_scaling_out_of_budget_is_a_torchcal_error_naming_the_reason():
    z, y = absent_class_logits()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(CalibrationFitError, match=r"L-BFGS used its budget.*10 class\(es\) "
                                                   r"never occur in the validation labels") as e:
            VectorScaling().fit(z, y)
    assert isinstance(e.value, TorchcalError) and isinstance(e.value, RuntimeError)


def test_calibrate_vector_reports_one_line_not_a_traceback(tmp_path, capsys):
    z, y = absent_class_logits()
    path = save_logits(tmp_path / "val.npz", z, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        code = cli_main(["calibrate", str(path), "--method", "vector"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("torchcal calibrate: error: VectorScaling failed: L-BFGS used its "
                          "budget") and "never occur" in err and "\n" not in err

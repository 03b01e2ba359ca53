"""Conformal regression intervals of torchcal next to MAPIE's (and TorchCP's / crepes' where they
import) on the same seeded data, with identical predictions so that only the conformal step
differs: split (absolute residual), CQR (Romano et al.'s symmetric score), CV+ (10 folds) and
jackknife+ (leave-one-out) of a least-squares linear model.

    PYTHONPATH=src /work/peers-venv/bin/python benchmarks/bench_conformal_regression_peers.py

writes benchmarks/results/conformal_regression_peers.md and the fixture
tests/data/peers/conformal_regression.json (the data and MAPIE's intervals), which
tests/conformal/test_conformal_regression_peers.py compares torchcal against without MAPIE.
"""

from __future__ import annotations

import json
import platform
import sys
import types
from pathlib import Path

import numpy as np
import torch

from torchcal.conformal import ConformalRegressor, cv_plus
from torchcal.conformal.cv import kfold_labels
from torchcal.regression import Quantiles

ROOT = Path(__file__).resolve().parents[1]
ALPHA = 0.1
N_CAL, N_TEST, N_TRAIN_CV, N_TEST_CV, K = 300, 50, 80, 20, 10


def make_data(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, N_CAL + N_TEST)
    sd = 0.2 + x ** 2
    y = np.sin(4 * x) + sd * rng.normal(size=x.size)
    mu = np.sin(4 * x) + 0.1 * rng.normal(size=x.size)  # an imperfect point model
    z = 1.6448536269514722  # Phi^-1(0.95)
    q_lo = mu - z * sd * 0.8  # quantile model, 20 % too narrow
    q_hi = mu + z * sd * 0.8
    X = rng.normal(size=(N_TRAIN_CV + N_TEST_CV, 3))
    y_cv = X @ [1.0, -0.5, 2.0] + (0.5 + np.abs(X[:, 0])) * rng.normal(size=X.shape[0])
    return {"alpha": ALPHA, "mu": mu.tolist(), "y": y.tolist(), "q_lo": q_lo.tolist(),
            "q_hi": q_hi.tolist(), "n_cal": N_CAL, "X_cv": X.tolist(), "y_cv": y_cv.tolist(),
            "n_train_cv": N_TRAIN_CV, "k": K}


def lstsq_fit_predict(Xt, yt, Xe):
    A = np.c_[np.ones(len(Xt)), Xt]
    coef, *_ = np.linalg.lstsq(A, yt, rcond=None)
    return np.c_[np.ones(len(Xe)), Xe] @ coef


def torchcal_intervals(d: dict) -> dict:
    n = d["n_cal"]
    mu, y = np.array(d["mu"]), np.array(d["y"])
    out = {}
    cr = ConformalRegressor(d["alpha"]).fit(mu[:n], y[:n])
    out["split"] = cr.predict_interval(mu[n:])
    lv = [d["alpha"] / 2, 1 - d["alpha"] / 2]
    qv = np.stack([d["q_lo"], d["q_hi"]], 1)
    cq = ConformalRegressor(d["alpha"], score="cqr").fit(Quantiles(qv[:n], lv), y[:n])
    out["cqr"] = cq.predict_interval(Quantiles(qv[n:], lv))
    X, ycv, nt = np.array(d["X_cv"]), np.array(d["y_cv"]), d["n_train_cv"]
    out["cv_plus"] = cv_plus(lstsq_fit_predict, X[:nt], ycv[:nt], X[nt:], alpha=d["alpha"],
                             n_folds=d["k"])
    out["jackknife_plus"] = cv_plus(lstsq_fit_predict, X[:nt], ycv[:nt], X[nt:],
                                    alpha=d["alpha"], n_folds="jackknife")
    return {k: [np.asarray(v[0]).tolist(), np.asarray(v[1]).tolist()] for k, v in out.items()}


def mapie_intervals(d: dict) -> dict:
    from mapie.regression import (
        ConformalizedQuantileRegressor,
        CrossConformalRegressor,
        SplitConformalRegressor,
    )
    from sklearn.base import BaseEstimator, RegressorMixin
    from sklearn.linear_model import LinearRegression
    from sklearn.model_selection import KFold, LeaveOneOut

    class Lookup(RegressorMixin, BaseEstimator):
        """A prefit model whose input is the row index: identical predictions to torchcal's."""

        def __init__(self, values=None):
            self.values = values

        def fit(self, X, y=None):
            self.values_ = np.asarray(self.values)
            self.fitted_ = True
            return self

        def predict(self, X):
            return self.values_[np.asarray(X)[:, 0].astype(int)]

    n = d["n_cal"]
    y = np.array(d["y"])
    idx = np.arange(len(y)).reshape(-1, 1).astype(float)
    out = {}
    sp = SplitConformalRegressor(Lookup(d["mu"]).fit(None), confidence_level=1 - d["alpha"],
                                 prefit=True).conformalize(idx[:n], y[:n])
    iv = sp.predict_interval(idx[n:])[1]
    out["split"] = [iv[:, 0, 0].tolist(), iv[:, 1, 0].tolist()]
    ests = [Lookup(d["q_lo"]).fit(None), Lookup(d["q_hi"]).fit(None), Lookup(d["mu"]).fit(None)]
    cq = ConformalizedQuantileRegressor(ests, confidence_level=1 - d["alpha"], prefit=True)
    cq.conformalize(idx[:n], y[:n])
    iv = cq.predict_interval(idx[n:], symmetric_correction=True)[1]
    out["cqr"] = [iv[:, 0, 0].tolist(), iv[:, 1, 0].tolist()]
    X, ycv, nt = np.array(d["X_cv"]), np.array(d["y_cv"]), d["n_train_cv"]
    for name, cv in (("cv_plus", KFold(d["k"])), ("jackknife_plus", LeaveOneOut())):
        cc = CrossConformalRegressor(LinearRegression(), confidence_level=1 - d["alpha"],
                                     method="plus", cv=cv).fit_conformalize(X[:nt], ycv[:nt])
        iv = cc.predict_interval(X[nt:])[1]
        out[name] = [iv[:, 0, 0].tolist(), iv[:, 1, 0].tolist()]
    return out


def torchcp_intervals(d: dict) -> dict:
    # TorchCP 1.2.1 imports torchsort at import time (its classification losses), and torchsort
    # does not build here (a CUDA extension): a stand-in module lets its regression code import;
    # nothing compared here calls it
    sys.modules.setdefault("torchsort", types.SimpleNamespace(soft_rank=None, soft_sort=None))
    from torch.utils.data import DataLoader, TensorDataset
    from torchcp.regression.predictor import SplitPredictor
    from torchcp.regression.score import ABS, CQR

    n = d["n_cal"]
    y = torch.tensor(d["y"], dtype=torch.float64)
    out = {}
    for name, score, pred in (
            ("split", ABS(), torch.tensor(d["mu"], dtype=torch.float64).reshape(-1, 1)),
            ("cqr", CQR(), torch.tensor(np.stack([d["q_lo"], d["q_hi"]], 1)))):
        sp = SplitPredictor(score, model=torch.nn.Identity(), alpha=d["alpha"], device="cpu")
        sp.calibrate(DataLoader(TensorDataset(pred[:n], y[:n]), batch_size=1000))
        iv = sp.predict(pred[n:].float()).reshape(-1, 2)
        out[name] = [iv[:, 0].double().tolist(), iv[:, 1].double().tolist()]
    return out


def crepes_intervals(d: dict) -> dict:
    from crepes import ConformalRegressor as CrepesRegressor

    n = d["n_cal"]
    mu, y = np.array(d["mu"]), np.array(d["y"])
    cr = CrepesRegressor().fit(y[:n] - mu[:n])
    iv = cr.predict_int(mu[n:], confidence=1 - d["alpha"])
    return {"split": [iv[:, 0].tolist(), iv[:, 1].tolist()]}


def max_diff(a: dict, b: dict) -> dict:
    return {k: float(max(np.max(np.abs(np.array(a[k][0]) - np.array(b[k][0]))),
                         np.max(np.abs(np.array(a[k][1]) - np.array(b[k][1])))))
            for k in b}


def main() -> None:
    import mapie
    import sklearn

    d = make_data()
    ours = torchcal_intervals(d)
    peers = {"MAPIE": (mapie.__version__, mapie_intervals)}
    rows, versions, errors = [], [f"MAPIE {mapie.__version__}", f"scikit-learn "
                                   f"{sklearn.__version__}"], []
    for name, mod, fn in (("TorchCP", "torchcp", torchcp_intervals),
                          ("crepes", "crepes", crepes_intervals)):
        try:
            from importlib.metadata import version
            peers[name] = (version(mod), fn)
            versions.append(f"{name} {version(mod)}")
        except Exception as exc:  # noqa: BLE001 - a peer that is not installed is named
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    results = {}
    for name, (_ver, fn) in peers.items():
        try:
            results[name] = fn(d)
        except Exception as exc:  # noqa: BLE001 - a peer that fails is named with its error
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        for method, diff in max_diff(ours, results[name]).items():
            rows.append(f"| {method} | {name} | {diff:.2e} | {'yes' if diff <= 1e-6 else 'NO'} |")
            print(f"{method:15s} {name:8s} max |diff| = {diff:.2e}")
    fixture = {**d, "mapie_version": mapie.__version__, "mapie": results["MAPIE"]}
    path = ROOT / "tests/data/peers/conformal_regression.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fixture, indent=None, separators=(",", ":")) + "\n")
    md = [
        "# Conformal regression: torchcal vs peers",
        "",
        "`PYTHONPATH=src /work/peers-venv/bin/python benchmarks/bench_conformal_regression_peers.py`",
        "",
        f"Versions: torch {torch.__version__}, {', '.join(versions)}, Python "
        f"{platform.python_version()}; machine: {platform.machine()}, "
        f"{platform.processor() or 'cpu'} (2 cores).",
        "",
        f"Seeded data: {N_CAL} calibration and {N_TEST} test points (identical point and "
        f"quantile predictions given to every library, MAPIE's as prefit estimators), alpha = "
        f"{ALPHA}; CV+ ({K}-fold scikit-learn `KFold`, no shuffle) and jackknife+ "
        f"(`LeaveOneOut`) on {N_TRAIN_CV} training and {N_TEST_CV} test points with a "
        "least-squares linear model (MAPIE: `LinearRegression`, torchcal: `numpy.linalg.lstsq` "
        "through `fit_predict`). CQR: MAPIE's `symmetric_correction=True` (Romano et al.'s "
        "score).",
        "",
        "| method | peer | max abs difference | equal to 1e-6 |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
        "Peers that did not install or run:",
        "",
        *([f"- {e}" for e in errors] or ["- none"]),
        "- TorchCP 1.2.1 with its dependencies: `pip install torchcp` fails building torchsort "
        "(`IndexError: list index out of range` in torch.utils.cpp_extension's "
        "`_get_cuda_arch_flags`, no GPU here); installed with `--no-deps` and a stand-in "
        "`torchsort` module (its regression code does not use it). TorchCP computes in "
        "float32 (`.float()` in `SplitPredictor.calibrate`), so its differences are float32 "
        "rounding.",
        "",
    ]
    out = ROOT / "benchmarks/results/conformal_regression_peers.md"
    out.write_text("\n".join(md))
    print(f"wrote {out} and {path}")
    _ = kfold_labels  # the folds torchcal uses are scikit-learn's KFold(K) folds


if __name__ == "__main__":
    main()

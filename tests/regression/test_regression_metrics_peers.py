"""torchcal's regression metrics equal the peers' numbers saved by
benchmarks/bench_regression_metrics_peers.py (properscoring, scoringrules,
uncertainty-toolbox) on the same seeded data, to 1e-6 relative; no peer is imported here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from torchcal.regression import (
    Gaussian,
    Samples,
    calibration_curve,
    crps,
    quantile_calibration_error,
    sharpness,
)

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "peers" / "regression_metrics.json"


def _data(seed, n, s):
    """The benchmark's make_data: same generator, same order of draws."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(size=n)
    sd = 0.2 + 2.0 * rng.random(n)
    y = mu + 0.2 + 1.3 * sd * rng.normal(size=n)
    ens = mu[:, None] + sd[:, None] * rng.normal(size=(n, s))
    return mu, sd, y, ens


@pytest.fixture(scope="module")
def saved():
    fx = json.loads(FIXTURE.read_text())
    mu, sd, y, ens = _data(fx["seed"], fx["n"], fx["members"])
    g = Gaussian(torch.from_numpy(mu), std=torch.from_numpy(sd))
    return fx["values"], g, Samples(torch.from_numpy(ens.T.copy())), torch.from_numpy(y)


def _close(got, want):
    assert np.asarray(got, dtype=float) == pytest.approx(np.asarray(want, dtype=float),
                                                         rel=1e-6, abs=1e-12)


def test_crps_equals_properscoring_and_scoringrules(saved):
    values, g, samples, y = saved
    _close(crps(g, y), values["properscoring.crps_gaussian"])
    _close(crps(g, y), values["scoringrules.crps_normal"])
    for key in ("properscoring.crps_ensemble", "scoringrules.crps_ensemble_nrg",
                "scoringrules.crps_ensemble_default"):
        _close(crps(samples, y), values[key])
    _close(crps(samples, y, fair=True), values["scoringrules.crps_ensemble_fair"])


def test_calibration_curve_and_errors_equal_uncertainty_toolbox(saved):
    values, g, _, y = saved
    _close(sharpness(g), values["uct.sharpness"])
    for prop in ("interval", "quantile"):
        exp, obs = calibration_curve(g, y, kind=prop)
        if prop == "quantile":  # uct counts y >= q_{1-p}: the curve reflected
            obs = 1 - obs.flip(0)
        _close(exp.tolist(), values[f"uct.expected_{prop}"])
        _close(obs.tolist(), values[f"uct.observed_{prop}"])
        for key, norm in (("mace", "l1"), ("rmsce", "l2"), ("miscalibration_area", "area")):
            got = quantile_calibration_error(g, y, kind=prop, norm=norm)
            _close(got, values[f"uct.{key}_{prop}"])

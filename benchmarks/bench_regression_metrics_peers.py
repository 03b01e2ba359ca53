"""Regression metrics against their peers (issue 47, item 2) on seeded generated data.

* CRPS of a Gaussian: properscoring's ``crps_gaussian``, scoringrules' ``crps_normal``;
* CRPS of an ensemble: properscoring's ``crps_ensemble`` (the energy form), scoringrules'
  ``crps_ensemble`` with ``estimator="nrg"``, ``"fair"`` and its default (``"qd"``);
* uncertainty-toolbox: ``get_proportion_lists_vectorized`` (interval and quantile curves),
  ``mean_absolute_calibration_error``, ``root_mean_squared_calibration_error``,
  ``miscalibration_area`` and ``sharpness``.  uncertainty-toolbox has no ENCE or UCE (they are
  checked against slow references written from Levi et al.'s and Laves et al.'s formulas in
  tests/regression/test_regression_metrics.py).

Writes benchmarks/results/regression_metrics_peers.md (versions, max abs differences) and
tests/data/peers/regression_metrics.json (the seed, sizes and the peers' numbers), which
tests/regression/test_regression_metrics_peers.py checks torchcal against without the peers.

Usage (the peers live in a separate venv)::

    PYTHONPATH=src /work/peers-venv/bin/python benchmarks/bench_regression_metrics_peers.py
"""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
from pathlib import Path

import numpy as np
import properscoring as ps
import scoringrules as sr
import torch
import uncertainty_toolbox as uct

from torchcal.regression import (
    Gaussian,
    Samples,
    calibration_curve,
    crps,
    quantile_calibration_error,
    sharpness,
)

ROOT = Path(__file__).resolve().parents[1]
SEED, N, S = 47, 400, 25


def make_data(seed: int = SEED, n: int = N, s: int = S):
    """Means, stds, targets (a miscalibrated model: errors 1.3 x the std, shifted 0.2) and an
    ensemble of ``s`` members, as float64 NumPy arrays (the test regenerates them)."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(size=n)
    sd = 0.2 + 2.0 * rng.random(n)
    y = mu + 0.2 + 1.3 * sd * rng.normal(size=n)
    ens = mu[:, None] + sd[:, None] * rng.normal(size=(n, s))
    return mu, sd, y, ens


def peer_values(mu, sd, y, ens) -> dict:
    out = {
        "properscoring.crps_gaussian": float(ps.crps_gaussian(y, mu, sd).mean()),
        "properscoring.crps_ensemble": float(ps.crps_ensemble(y, ens).mean()),
        "scoringrules.crps_normal": float(np.mean(sr.crps_normal(y, mu, sd))),
        "scoringrules.crps_ensemble_nrg": float(np.mean(sr.crps_ensemble(y, ens,
                                                                         estimator="nrg"))),
        "scoringrules.crps_ensemble_fair": float(np.mean(sr.crps_ensemble(y, ens,
                                                                          estimator="fair"))),
        "scoringrules.crps_ensemble_default": float(np.mean(sr.crps_ensemble(y, ens))),
        "uct.sharpness": float(uct.sharpness(sd)),
    }
    for prop in ("interval", "quantile"):
        exp, obs = uct.metrics_calibration.get_proportion_lists_vectorized(
            mu, sd, y, prop_type=prop)
        out[f"uct.expected_{prop}"] = exp.tolist()
        out[f"uct.observed_{prop}"] = obs.tolist()
        out[f"uct.mace_{prop}"] = float(uct.mean_absolute_calibration_error(
            mu, sd, y, vectorized=True, prop_type=prop))
        out[f"uct.rmsce_{prop}"] = float(uct.root_mean_squared_calibration_error(
            mu, sd, y, vectorized=True, prop_type=prop))
        out[f"uct.miscalibration_area_{prop}"] = float(uct.miscalibration_area(
            mu, sd, y, vectorized=True, prop_type=prop))
    return out


def torchcal_values(mu, sd, y, ens) -> dict:
    """torchcal's number for every peer key (the test has its own copy of this mapping)."""
    t = {k: torch.from_numpy(v) for k, v in (("mu", mu), ("sd", sd), ("y", y))}
    g, samples = Gaussian(t["mu"], std=t["sd"]), Samples(torch.from_numpy(ens.T.copy()))
    out = {
        "properscoring.crps_gaussian": float(crps(g, t["y"])),
        "properscoring.crps_ensemble": float(crps(samples, t["y"])),
        "scoringrules.crps_normal": float(crps(g, t["y"])),
        "scoringrules.crps_ensemble_nrg": float(crps(samples, t["y"])),
        "scoringrules.crps_ensemble_fair": float(crps(samples, t["y"], fair=True)),
        "scoringrules.crps_ensemble_default": float(crps(samples, t["y"])),
        "uct.sharpness": float(sharpness(g)),
    }
    for prop in ("interval", "quantile"):
        exp, obs = calibration_curve(g, t["y"], kind=prop)
        if prop == "quantile":  # uct counts y >= q_{1-p}: this curve reflected
            obs = 1 - obs.flip(0)
        out[f"uct.expected_{prop}"] = exp.tolist()
        out[f"uct.observed_{prop}"] = obs.tolist()
        for key, norm in (("mace", "l1"), ("rmsce", "l2"), ("miscalibration_area", "area")):
            out[f"uct.{key}_{prop}"] = float(quantile_calibration_error(g, t["y"], kind=prop,
                                                                        norm=norm))
    return out


def main() -> None:
    mu, sd, y, ens = make_data()
    peers, ours = peer_values(mu, sd, y, ens), torchcal_values(mu, sd, y, ens)
    versions = {p: md.version(p) for p in ("properscoring", "scoringrules",
                                           "uncertainty-toolbox", "numpy", "scipy")}
    versions["torch"] = torch.__version__
    fixture = {"seed": SEED, "n": N, "members": S, "generator": "numpy.random.default_rng",
               "versions": versions, "values": peers}
    out_json = ROOT / "tests" / "data" / "peers" / "regression_metrics.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(fixture, indent=1) + "\n")
    rows = []
    for key, peer in peers.items():
        a, b = np.asarray(peer, dtype=float), np.asarray(ours[key], dtype=float)
        diff = float(np.max(np.abs(a - b)))
        shown = f"{float(a):.10g}" if a.ndim == 0 else f"curve of {a.size} points"
        rows.append(f"| `{key}` | {shown} | {diff:.2e} |")
    lines = [
        "# Regression metrics against their peers (issue 47, item 2)",
        "",
        f"Data: `numpy.random.default_rng({SEED})`, n = {N} Gaussian predictions (errors 1.3 x",
        f"the predicted std, shifted 0.2) and an ensemble of {S} members.  Produced by",
        "`PYTHONPATH=src /work/peers-venv/bin/python benchmarks/bench_regression_metrics_peers.py`.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items())
        + f"; Python {platform.python_version()} on {platform.platform()} "
        f"({platform.machine()}, CPU).",
        "",
        "| quantity | peer's value | max abs difference to torchcal |",
        "|---|---|---|",
        *rows,
        "",
        "Conventions: uncertainty-toolbox's `prop_type=\"quantile\"` counts",
        "`(mu - y) / sigma <= Phi^-1(p)`, i.e. `y >= q_{1-p}`; torchcal's",
        "`calibration_curve(kind=\"quantile\")` counts `y <= q_p`, so the curve is compared",
        "reflected (`1 - observed` at `1 - p`); the calibration errors, on uncertainty-toolbox's",
        "grid `linspace(0, 1, 100)` (symmetric about 1/2), are the same numbers either way.",
        "scoringrules' default ensemble estimator (`\"qd\"`) and `\"nrg\"` equal properscoring's",
        "energy form, torchcal's `crps(Samples)`; `\"fair\"` is `crps(Samples, fair=True)`.",
        "uncertainty-toolbox has no ENCE or UCE: they are tested against slow references",
        "written from Levi et al. (2022) and Laves et al. (2020) in",
        "`tests/regression/test_regression_metrics.py`.",
        "",
    ]
    out_md = ROOT / "benchmarks" / "results" / "regression_metrics_peers.md"
    out_md.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

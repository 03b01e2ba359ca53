"""torchcal's multi-label risk control against MAPIE's ``MultiLabelClassificationController``
on the same seeded data: recall by conformal risk control (CRC), precision by Learn-then-Test
(Hoeffding-Bentkus p-values, Bonferroni-Holm, MAPIE's defaults).

Run (peer venv, torch pinned):
    PYTHONPATH=src /work/peers-venv/bin/python benchmarks/bench_risk_control_peers.py

Writes benchmarks/results/risk_control_peers.md and tests/data/peers/risk_control.json (MAPIE's
thresholds on the data that tests/conformal/test_risk_peers.py regenerates).
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from torchcal.conformal import MultiLabelRiskControl

ROOT = Path(__file__).resolve().parents[1]
CASES = [  # (risk, target_level, confidence_level)
    ("recall", 0.8, None), ("recall", 0.9, None), ("recall", 0.95, None),
    ("precision", 0.5, 0.9), ("precision", 0.6, 0.9), ("precision", 0.6, 0.8),
]
SEEDS = (0, 1, 2)


def make_data(seed: int, n: int = 1000, c: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Seeded multi-label probabilities (n, c) and labels with at least one label per row
    (MAPIE refuses rows without one).  Same code in tests/conformal/test_risk_peers.py."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, c)) * 2 - 1
    y = (rng.uniform(size=(n, c)) < 1 / (1 + np.exp(-z))).astype(np.int64)
    y[np.arange(n), rng.integers(0, c, n)] = 1
    p = 1 / (1 + np.exp(-(z + 0.5 * rng.normal(size=(n, c)))))
    return p, y


def mapie_threshold(p, y, risk, target, conf):
    from mapie.risk_control import MultiLabelClassificationController

    ctrl = MultiLabelClassificationController(
        predict_function=lambda x: p[x.ravel()], risk=risk, target_level=target,
        confidence_level=conf)
    t0 = time.perf_counter()
    ctrl.calibrate(np.arange(len(p)).reshape(-1, 1), y)
    return float(np.asarray(ctrl.best_predict_param).ravel()[0]), time.perf_counter() - t0


def torchcal_threshold(p, y, risk, target, conf):
    t0 = time.perf_counter()
    m = MultiLabelRiskControl(1 - target, risk=risk,
                              delta=None if conf is None else 1 - conf)
    m.fit(torch.from_numpy(p), torch.from_numpy(y))
    return m.threshold_, time.perf_counter() - t0


def main() -> None:
    import warnings

    import mapie

    assert np.array_equal(np.arange(0, 1, 0.01), (torch.arange(100, dtype=torch.float64)
                                                   * 0.01).numpy()), "grids differ"
    rows, fixture = [], []
    for seed in SEEDS:
        p, y = make_data(seed)
        for risk, target, conf in CASES:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t_m, s_m = mapie_threshold(p, y, risk, target, conf)
                t_t, s_t = torchcal_threshold(p, y, risk, target, conf)
            t_m_out = None if np.isnan(t_m) else t_m
            t_t_out = None if not np.isfinite(t_t) else t_t
            rows.append((seed, risk, target, conf, t_m_out, t_t_out, t_m_out == t_t_out,
                         s_m, s_t))
            fixture.append({"seed": seed, "risk": risk, "target_level": target,
                            "confidence_level": conf, "mapie_threshold": t_m_out,
                            "data_checksum": float(p.sum() + y.sum())})
    out = ROOT / "tests" / "data" / "peers" / "risk_control.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"mapie": mapie.__version__, "cases": fixture}, indent=1) + "\n")
    lines = [
        "# Multi-label risk control: torchcal vs MAPIE",
        "",
        f"MAPIE {mapie.__version__}, torch {torch.__version__}, numpy {np.__version__}, "
        f"Python {platform.python_version()}, {platform.machine()} "
        f"({platform.processor() or 'cpu'}).",
        "Data: `make_data(seed)` (n = 1000, 10 labels), MAPIE's grid 0.00..0.99; recall by "
        "CRC, precision by LTT (HB p-values, Bonferroni-Holm). Command: "
        "`PYTHONPATH=src /work/peers-venv/bin/python benchmarks/bench_risk_control_peers.py`.",
        "",
        "| seed | risk | target | confidence | MAPIE threshold | torchcal threshold | equal "
        "| MAPIE s | torchcal s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for seed, risk, target, conf, tm, tt, eq, sm, st in rows:
        lines.append(f"| {seed} | {risk} | {target} | {conf} | {tm} | {tt} | {eq} | "
                     f"{sm:.3f} | {st:.4f} |")
    n_eq = sum(r[6] for r in rows)
    lines += ["", f"Equal in {n_eq} of {len(rows)} cases."]
    res = ROOT / "benchmarks" / "results" / "risk_control_peers.md"
    res.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

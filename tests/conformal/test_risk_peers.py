"""torchcal's multi-label risk control thresholds equal MAPIE's saved ones (MAPIE's
``MultiLabelClassificationController``: recall by CRC, precision by LTT with HB p-values and
Bonferroni-Holm), written by benchmarks/bench_risk_control_peers.py; MAPIE is not imported."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from torchcal.conformal import MultiLabelRiskControl

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "peers" / "risk_control.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


def make_data(seed: int, n: int = 1000, c: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """As benchmarks/bench_risk_control_peers.py's ``make_data``."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, c)) * 2 - 1
    y = (rng.uniform(size=(n, c)) < 1 / (1 + np.exp(-z))).astype(np.int64)
    y[np.arange(n), rng.integers(0, c, n)] = 1
    p = 1 / (1 + np.exp(-(z + 0.5 * rng.normal(size=(n, c)))))
    return p, y


def test_fixture_covers_both_risks():
    assert {c["risk"] for c in CASES} == {"recall", "precision"} and len(CASES) >= 6


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['risk']}-{c['target_level']}-"
                         f"{c['confidence_level']}-seed{c['seed']}")
def test_thresholds_equal_mapie(case):
    p, y = make_data(case["seed"])
    assert float(p.sum() + y.sum()) == pytest.approx(case["data_checksum"], rel=1e-12)
    conf = case["confidence_level"]
    m = MultiLabelRiskControl(1 - case["target_level"], risk=case["risk"],
                              delta=None if conf is None else 1 - conf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.fit(torch.from_numpy(p), torch.from_numpy(y))
    expected = case["mapie_threshold"]
    assert (m.threshold_ if np.isfinite(m.threshold_) else None) == expected

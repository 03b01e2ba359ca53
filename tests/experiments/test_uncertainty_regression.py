"""The uncertainty suite's regression section: numbers from a multitask block, checked against
independent computations, and the claim's verdict both ways (it fails on an uninformative
variance)."""

from __future__ import annotations

import math

import pytest
import torch

from torchcal.experiments import uncertainty_report as rep
from torchcal.experiments.uncertainty_regression import (
    ALPHA,
    LEARNED_VARIANCE,
    regression_section,
)


def _block(seed: int, informative: bool, n_val: int = 1000, n_test: int = 4000,
           sample: bool = True) -> dict:
    """A multitask block of a heteroscedastic regression: the noise's std varies 10x over the
    samples; the predicted log-variance is the true one (informative) or drawn independently of
    it (uninformative: it does not rank the errors)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for split, n in (("val", n_val), ("test", n_test)):
        sd = 0.1 + torch.rand(n, generator=g, dtype=torch.float64)
        mean = torch.randn(n, generator=g, dtype=torch.float64)
        target = mean + sd * torch.randn(n, generator=g, dtype=torch.float64)
        shuffled = sd[torch.randperm(n, generator=g)]
        log_var = 2 * (sd if informative else shuffled).log()
        out[split] = {"mean": mean.tolist(), "target": target.tolist()}
        if sample:
            out[split]["log_var"] = log_var.tolist()
    return {"predictions": out, "target_std": 2.0, "log_vars": None if sample else [0.1, -1.0],
            "test": {"accuracy": 0.9, "rmse": 1.0}}


def test_section_numbers_by_hand():
    b = _block(0, True)
    r = regression_section(b)
    assert r["variance"] == "sample" and (r["n_calibration"], r["n_test"]) == (1000, 4000)
    val, test = (b["predictions"][k] for k in ("val", "test"))
    mu, y, lv = (torch.tensor(val[k], dtype=torch.float64) for k in ("mean", "target", "log_var"))
    # σ scaling's closed form s^2 = mean((y - mu)^2 / var) on validation
    assert r["sigma_scale"] == pytest.approx(math.sqrt(float(((y - mu) ** 2 / lv.exp()).mean())))
    # split interval: the k-th smallest absolute residual, k = ceil(1001 * 0.9) = 901
    q = float(torch.sort((y - mu).abs()).values[900])
    mt, yt = (torch.tensor(test[k], dtype=torch.float64) for k in ("mean", "target"))
    cov = float(((yt - mt).abs() <= q).double().mean())
    assert r["split coverage"] == pytest.approx(cov)
    assert r["split width"] == pytest.approx(2 * q * 2.0)  # the block's target_std: 2
    # NLL in the parameter's units: standardised NLL + log(std)
    lvt = torch.tensor(test["log_var"], dtype=torch.float64)
    nll = float((0.5 * (math.log(2 * math.pi) + lvt + (yt - mt) ** 2 / lvt.exp())).mean())
    assert r["nll_before"] == pytest.approx(nll + math.log(2.0))
    for name in ("split", "normalized", "CQR"):
        assert r[f"{name} coverage"] >= 1 - ALPHA - 0.025


def test_task_variance_and_no_variance():
    r = regression_section(_block(1, True, sample=False))
    assert r["variance"] == "task"
    # a constant σ: normalised intervals are the split ones (same ranks, same width)
    assert r["normalized width"] == pytest.approx(r["split width"], rel=1e-9)
    none = _block(1, True, sample=False)
    none["log_vars"] = None  # a fixed weighting: no learned variance, no section
    assert regression_section(none) is None
    assert regression_section({"target_std": 1.0}) is None


def _unit(seed: int, informative: bool) -> dict:
    return {"kind": "kendall", "seed": seed, "arm": LEARNED_VARIANCE, "error": None,
            "weights": [1.0, 1.0], "test": {"accuracy": 0.9, "rmse": 1.0},
            "regression": regression_section(_block(seed, informative))}


def test_claim_holds_on_an_informative_variance_and_fails_on_an_uninformative_one():
    v = {c["key"]: c for c in rep.claim_verdicts([_unit(0, True), _unit(1, True)])}
    assert (v["regression_normalized"]["holds"], v["regression_normalized"]["n"]) == (2, 2)
    nums = v["regression_normalized"]["numbers"]
    assert nums["normalized width"] < nums["split width"]
    v = {c["key"]: c for c in rep.claim_verdicts([_unit(0, False), _unit(1, False)])}
    assert (v["regression_normalized"]["holds"], v["regression_normalized"]["n"]) == (0, 2)


def test_claim_fails_when_an_interval_misses_its_coverage():
    u = _unit(0, True)
    u["regression"] = {**u["regression"], "normalized coverage": 1 - ALPHA - 0.03}
    v = {c["key"]: c for c in rep.claim_verdicts([u])}
    assert v["regression_normalized"]["holds"] == 0


def test_regression_table_lists_each_arm_with_a_section():
    units = [_unit(0, True), _unit(1, True),
             {**_unit(0, False), "arm": "kendall"}, {"kind": "kendall", "seed": 0,
                                                       "arm": "fixed 1:1", "error": None,
                                                       "regression": None}]
    table = rep.regression_table(units).splitlines()
    assert len(table) == 4 and table[2].startswith(f"| {LEARNED_VARIANCE} | sample |")
    assert "fixed 1:1" not in "\n".join(table)
    assert rep.regression_table([]) == ""

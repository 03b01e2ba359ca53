"""Abstention: the curve against a loop over thresholds and the metrics' risk-coverage curve,
the batched split check against SelectiveRiskControl fitted split by split, the guarantee
over 200 seeded splits against the *population* error (known in closed form here), and the
conformal answer sets against the LAC rule computed by hand."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import torchcal.metrics as M
from torchcal.conformal import SelectiveRiskControl, conformal_rank
from torchcal.llm import (
    abstention_curve,
    abstention_split_check,
    abstention_threshold,
    conformal_answer_sets,
    option_probs,
)


def _calibrated(n: int, seed: int):
    """conf ~ U(0, 1), right with probability conf: P(wrong | conf >= t) = (1 - t) / 2."""
    g = torch.Generator().manual_seed(seed)
    conf = torch.rand(n, generator=g, dtype=torch.float64)
    return conf, torch.rand(n, generator=g, dtype=torch.float64) < conf


def test_curve_against_loop_and_risk_coverage_curve():
    conf, right = _calibrated(300, 0)
    conf = (conf * 20).round() / 20  # ties
    curve = abstention_curve(conf, right)
    for t, cov, err, k in zip(curve.threshold.tolist(), curve.coverage.tolist(),
                              curve.selective_error.tolist(), curve.n_answered.tolist(),
                              strict=True):
        ans = [i for i in range(300) if float(conf[i]) >= t]
        assert k == len(ans) and cov == pytest.approx(len(ans) / 300)
        assert err == pytest.approx(sum(1 - int(right[i]) for i in ans) / len(ans), abs=1e-12)
    rc = M.risk_coverage_curve(uncertainty=-conf, correct=right)
    ends = curve.n_answered - 1  # the ends of the tied groups
    assert torch.allclose(rc.risk[ends], curve.selective_error, atol=1e-12)
    fixed = abstention_curve(conf, right, thresholds=[0.5, 2.0])
    assert fixed.n_answered.tolist()[0] == 0 and math.isnan(float(fixed.selective_error[0]))


def test_split_check_equals_selective_risk_control_per_split():
    conf, right = _calibrated(900, 1)
    chk = abstention_split_check(conf, right, 0.25, 0.1, n_cal=400, n_splits=4, seed=7)
    perm = torch.rand(4, 900, generator=torch.Generator().manual_seed(7)).argsort(dim=1)
    for b in range(4):
        cal, test = perm[b, :400], perm[b, 400:]
        sel = SelectiveRiskControl(eps=0.25, delta=0.1, method="bonferroni").fit(conf[cal],
                                                                                  right[cal])
        assert float(chk.threshold[b]) == sel.threshold_
        ans = conf[test] >= sel.threshold_
        err = float((~right[test][ans]).double().mean())
        assert float(chk.test_error[b]) == pytest.approx(err, abs=1e-12)
        assert abstention_threshold(conf[cal], right[cal], 0.25, 0.1).threshold_ == \
            sel.threshold_


def test_guarantee_over_200_seeded_splits():
    eps, delta = 0.2, 0.1
    conf, right = _calibrated(5000, 2)
    chk = abstention_split_check(conf, right, eps, delta, n_cal=1000, n_splits=200, seed=3)
    assert float(torch.isfinite(chk.threshold).double().mean()) > 0.9  # most certify one
    population_error = (1 - chk.threshold) / 2  # closed form for this data
    assert float((population_error > eps).double().mean()) <= delta
    assert float(chk.test_error.mean()) <= eps
    assert float(chk.violation.double().mean()) <= delta
    # not vacuous: it answers a good share (the best threshold is 0.6, 40 % answered)
    assert float(chk.coverage.mean()) > 0.2


def test_no_certificate_abstains_with_a_warning():
    conf = torch.rand(30, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        sel = abstention_threshold(conf, torch.zeros(30, dtype=torch.bool), 0.05, 0.1)
    assert sel.threshold_ == math.inf and any("abstain" in str(w.message) for w in rec)


def test_conformal_answer_sets_lac_by_hand():
    g = torch.Generator().manual_seed(5)
    z = torch.randn(1200, 4, generator=g, dtype=torch.float64) * 2
    ans = torch.distributions.Categorical(logits=z).sample()
    cp = conformal_answer_sets(z[:400], ans[:400], alpha=0.1)
    p = option_probs(z)
    scores = sorted((1 - p[i, int(ans[i])]).item() for i in range(400))
    q = scores[conformal_rank(400, 0.1) - 1]
    sets = cp.predict_sets(z[400:])
    assert torch.equal(sets, (1 - p[400:]) <= q + 1e-12)
    cover = float(sets[torch.arange(800), ans[400:]].double().mean())
    assert cover >= 0.9 - 0.03
    aps = conformal_answer_sets(z[:400], ans[:400], alpha=0.1, method="aps", random_state=0)
    assert aps.predict_sets(z[400:]).shape == (800, 4)


def test_bad_input_one_clear_line():
    with pytest.raises(ValueError, match="pass `thresholds`"):
        abstention_threshold(torch.tensor([-3.0, -1.0]), torch.tensor([1, 0]), 0.1, 0.1)
    with pytest.raises(ValueError, match="`n_cal` to be an integer"):
        abstention_split_check(torch.rand(10), torch.ones(10, dtype=torch.bool), 0.1, 0.1,
                               n_cal=10)
    with pytest.raises(ValueError, match="'lac' or 'aps'"):
        conformal_answer_sets(torch.zeros(3, 2), torch.zeros(3, dtype=torch.long),
                              method="raps")

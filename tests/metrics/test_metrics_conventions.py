"""Issue 39 item 6: the OOD and selective-prediction conventions.

* ``max_prob`` ranks in float64 from the logits (``logsumexp(z - max z)``), so a float32
  input gives the float64 AUROC on saturated logits (a float32 softmax ties them at 1.0);
* ``fpr_at_tpr`` defaults to the literature's FPR on OOD at 95% TPR of in-distribution,
  checked against scikit-learn's ROC curve with ID as the positive class;
* ``e_aurc(optimum="closed_form")`` and ``augrc(rule="trapezoid")`` against the papers'
  closed forms.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score, roc_curve

import torchcal.metrics as M


def _saturated(n=2000, c=10, seed=0):
    """2,000 ID rows with margins 20-30 and 2,000 OOD rows with margins 5-25 (float64)."""
    g = torch.Generator().manual_seed(seed)
    zi = torch.randn(n, c, generator=g, dtype=torch.float64)
    zi[:, 0] += 20 + 10 * torch.rand(n, generator=g, dtype=torch.float64)
    zo = torch.randn(n, c, generator=g, dtype=torch.float64)
    zo[:, 0] += 5 + 20 * torch.rand(n, generator=g, dtype=torch.float64)
    return zi, zo


def test_max_prob_float32_equals_float64_on_saturated_logits():
    zi, zo = _saturated()
    # the float32 softmax is exactly 1.0 for most rows: the old score tied them
    assert int((torch.softmax(zi.float(), 1).amax(1) == 1.0).sum()) > 1000
    a32 = M.ood_auroc(id_logits=zi.float(), ood_logits=zo.float(), score="max_prob")
    a64 = M.ood_auroc(id_logits=zi, ood_logits=zo, score="max_prob")
    assert abs(float(a32) - float(a64)) <= 1e-6
    # the float64 AUROC is that of -max p from an exact reference (mpmath-free: the log-odds
    # log(sum_{c != top} exp(z_c - z_top)) rank as -max p and never round)
    z = torch.cat([zi, zo])
    top = z.argmax(1, keepdim=True)
    d = z - z.gather(1, top)
    d = d.scatter(1, top, float("-inf"))
    ref = torch.logsumexp(d, 1).numpy()
    y = np.r_[np.zeros(len(zi)), np.ones(len(zo))]
    assert float(a64) == pytest.approx(roc_auc_score(y, ref), abs=1e-12)
    s32, y32 = M.ood_scores(id_logits=zi.float(), ood_logits=zo.float(), score="max_prob")
    assert float(M.fpr_at_tpr(scores=s32, labels=y32)) < 0.5  # the old float32 score gave FPR@95 = 1.0 here


def test_max_prob_value_is_minus_log_max_prob():
    g = torch.Generator().manual_seed(1)
    z = 3 * torch.randn(50, 7, generator=g, dtype=torch.float64)
    z[0] = torch.tensor([2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)  # tied top
    s, _ = M.ood_scores(id_logits=z, ood_logits=z, score="max_prob")
    ref = -torch.log_softmax(z, 1).amax(1)
    torch.testing.assert_close(s[:50], ref, rtol=1e-13, atol=1e-15)
    # margin 40: -log max p = log1p(e^-40) ~ 4.2e-18, not 0
    s, _ = M.ood_scores(id_logits=torch.tensor([[40.0, 0.0]]), ood_logits=torch.zeros(1, 2),
                        score="max_prob")
    assert float(s[0]) == pytest.approx(math.exp(-40), rel=1e-12)
    # a masked class (-inf) is fine
    s, _ = M.ood_scores(id_logits=torch.tensor([[1.0, float("-inf")]]),
                        ood_logits=torch.zeros(1, 2), score="max_prob")
    assert float(s[0]) == 0.0 and float(s[1]) == pytest.approx(math.log(2))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fpr_at_tpr_default_is_fpr_on_ood_at_tpr_of_id(seed):
    g = np.random.default_rng(seed)
    s = np.r_[g.normal(0, 1, 300), g.normal(1.5, 1, 200)]
    s = np.round(s * 4) / 4  # ties
    y = np.r_[np.zeros(300, int), np.ones(200, int)]  # 1 = OOD, higher = more OOD
    # literature: ID positive, confidence = -score
    fpr, tpr, _ = roc_curve(1 - y, -s, drop_intermediate=False)
    expected = fpr[np.argmax(tpr >= 0.95)]
    got = M.fpr_at_tpr(scores=torch.from_numpy(s), labels=torch.from_numpy(y))
    assert float(got) == pytest.approx(expected, abs=1e-15)
    # the same by hand: the threshold accepts >= 95% of ID (score <= t), FPR = OOD accepted
    ts = np.unique(s)
    t = ts[np.argmax([(s[y == 0] <= v).mean() >= 0.95 for v in ts])]
    assert float(got) == pytest.approx((s[y == 1] <= t).mean(), abs=1e-15)
    # the other convention by name
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    assert float(M.fpr_at_tpr(scores=s, labels=y, convention="ood_positive")) == pytest.approx(
        fpr[np.argmax(tpr >= 0.95)], abs=1e-15)
    assert float(got) != float(M.fpr_at_tpr(scores=s, labels=y, convention="ood_positive"))


def test_fpr_at_tpr_integer_scores_and_bad_convention():
    s = torch.tensor([0, 3, 2, 255], dtype=torch.uint8)  # -s must not wrap
    y = torch.tensor([0, 0, 1, 1])
    assert float(M.fpr_at_tpr(scores=s, labels=y)) == float(
        M.fpr_at_tpr(scores=s.double(), labels=y))
    with pytest.raises(ValueError, match="`convention` to be one of"):
        M.fpr_at_tpr(scores=s, labels=y, convention="ood")


def test_e_aurc_closed_form_of_geifman():
    g = np.random.default_rng(0)
    u = g.normal(size=400)
    c = g.random(400) < 0.8
    r = 1 - c.mean()
    aurc = float(M.aurc(uncertainty=u, correct=c))
    closed = float(M.e_aurc(uncertainty=u, correct=c, optimum="closed_form"))
    assert closed == pytest.approx(aurc - (r + (1 - r) * math.log(1 - r)), abs=1e-14)
    # the finite optimum converges to the closed form: a perfect ranking of N = 100,000
    n, e = 100_000, 20_000
    perfect_u = np.r_[np.zeros(n - e), np.ones(e)]
    perfect_c = np.r_[np.ones(n - e, bool), np.zeros(e, bool)]
    assert float(M.e_aurc(uncertainty=perfect_u, correct=perfect_c)) == 0.0
    gap = float(M.e_aurc(uncertainty=perfect_u, correct=perfect_c, optimum="closed_form"))
    assert 0 < gap < 1 / n  # finite optimum - closed form: a right Riemann sum above the integral
    # every sample wrong: r = 1 and the closed form is 1
    assert float(M.e_aurc(uncertainty=[0.1, 0.2], correct=[0, 0], optimum="closed_form")) == 0.0
    with pytest.raises(ValueError, match="`optimum` to be one of"):
        M.e_aurc(uncertainty=u, correct=c, optimum="paper")


def test_augrc_trapezoid_of_traub():
    g = np.random.default_rng(1)
    u = np.round(g.normal(size=300), 1)
    c = g.random(300) < 0.7
    curve = M.risk_coverage_curve(uncertainty=u, correct=c)
    gen_risk = np.r_[0.0, (curve.risk * curve.coverage).numpy()]
    cov = np.r_[0.0, curve.coverage.numpy()]
    trap = float(M.augrc(uncertainty=u, correct=c, rule="trapezoid"))
    assert trap == pytest.approx(np.trapezoid(gen_risk, cov), abs=1e-14)
    assert float(M.augrc(uncertainty=u, correct=c)) == pytest.approx(gen_risk[1:].mean(),
                                                                     abs=1e-14)
    # a random ranking (every uncertainty tied): the generalized risk is r c, area r / 2
    r = 1 - c.mean()
    tied = float(M.augrc(uncertainty=np.zeros(300), correct=c, rule="trapezoid"))
    assert tied == pytest.approx(r / 2, abs=1e-15)
    with pytest.raises(ValueError, match="`rule` to be one of"):
        M.augrc(uncertainty=u, correct=c, rule="simpson")

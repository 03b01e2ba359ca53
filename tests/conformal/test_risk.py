"""Conformal risk control and Learn-then-Test: hand-worked choices, references written from
the formulas, and guarantees over 1,000 random calibration/test splits (batched)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import binom

from torchcal.conformal import (
    ConformalRiskControl,
    LearnThenTest,
    MultiLabelRiskControl,
    SelectiveRiskControl,
    conformal_quantile,
    crc_index,
    false_discovery_rate,
    false_negative_rate,
    fwer_reject,
    hb_p_values,
    hoeffding_p_values,
    ltt_valid,
    token_miscoverage,
)
from torchcal.errors import InfiniteIntervalWarning

SPLITS = 1000


def multilabel_data(n: int, c: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g, dtype=torch.float64) * 2 - 1
    y = (torch.rand(n, c, generator=g, dtype=torch.float64) < torch.sigmoid(z)).long()
    p = torch.sigmoid(z + 0.7 * torch.randn(n, c, generator=g, dtype=torch.float64))
    return p, y


def segmentation_data(n: int, size: int = 12, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    field = torch.randn(n, 1, size, size, generator=g, dtype=torch.float64)
    field = torch.nn.functional.avg_pool2d(field, 3, 1, 1) * 3 - 0.5
    y = (torch.rand(field.shape, generator=g, dtype=torch.float64) < torch.sigmoid(field)).long()
    p = torch.sigmoid(field + 0.5 * torch.randn(field.shape, generator=g, dtype=torch.float64))
    return p, y


def token_data(n: int, t: int = 10, c: int = 5, seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, t, c, generator=g, dtype=torch.float64) * 2
    p = torch.softmax(logits, -1)
    y = torch.multinomial(torch.softmax(logits * 0.8, -1).reshape(-1, c), 1,
                          generator=g).reshape(n, t)
    lengths = torch.randint(3, t + 1, (n,), generator=g)
    y[torch.arange(t).unsqueeze(0) >= lengths.unsqueeze(1)] = -100
    return p, y


# ---------------------------------------------------------------- hand-worked examples


def test_crc_hand_worked():
    # sums per column 4, 2, 1, 0; bounds (sum + 1) / 5 = 1.0, 0.6, 0.4, 0.2
    losses = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]])
    assert int(crc_index(losses, 0.5)) == 2
    assert int(crc_index(losses, 0.6)) == 1  # 0.6 reached exactly counts
    assert int(crc_index(losses, 0.25)) == 3
    crc = ConformalRiskControl(0.5, lambdas=[0.0, 0.1, 0.2, 0.3]).fit(losses)
    assert crc.lambda_hat_ == 0.2 and crc.index_ == 2
    assert crc.risk_bound_ == pytest.approx(0.4)
    # B = 2 (losses scaled by 2): bounds (2 sum + 2) / 5 = 2.0, 1.2, 0.8, 0.4
    assert int(crc_index(2 * losses, 0.5, B=2.0)) == 3


def test_crc_with_the_01_loss_is_split_conformal():
    g = torch.Generator().manual_seed(3)
    for n, alpha in [(9, 0.2), (99, 0.1), (50, 0.05), (1000, 0.1)]:
        s = torch.rand(n, generator=g, dtype=torch.float64)
        grid = torch.sort(s).values
        losses = (s.unsqueeze(1) > grid).double()  # 1{s_i > lambda}, non-increasing
        lam = float(grid[crc_index(losses, alpha)])
        assert lam == float(conformal_quantile(s, alpha))


def test_crc_no_lambda_qualifies_warns_and_returns_the_last():
    losses = torch.zeros(5, 3)
    with pytest.warns(InfiniteIntervalWarning, match="n = 5"):
        assert int(crc_index(losses, 0.1)) == 2  # (0 + 1) / 6 > 0.1: too few samples
    with pytest.warns(InfiniteIntervalWarning):
        crc = ConformalRiskControl(0.1, lambdas=[1.0, 2.0, 3.0]).fit(losses)
    assert crc.lambda_hat_ == 3.0


def test_crc_monotonicity_refused_or_monotonized():
    losses = torch.tensor([[1.0, 0.0, 1.0, 0.0]] * 20)
    with pytest.raises(ValueError, match="non-increasing"):
        crc_index(losses, 0.2)
    # running max from the right: [1, 1, 1, 0] -> column 3
    assert int(crc_index(losses, 0.2, monotonize=True)) == 3
    crc = ConformalRiskControl(0.2, monotonize=True).fit(losses)
    assert crc.index_ == 3 and crc.risk_bound_ == pytest.approx(1 / 21)


@pytest.mark.parametrize("bad,match", [
    (dict(losses=torch.full((3, 2), 2.0)), "at most B"),
    (dict(losses=torch.tensor([[float("nan"), 0.0]])), "finite"),
    (dict(losses=torch.zeros(4)), "shape"),
    (dict(alpha=1.5), "alpha"),
    (dict(B=-1.0), "B"),
])
def test_crc_bad_input(bad, match):
    kw = dict(losses=torch.zeros(3, 2), alpha=0.1, B=1.0)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        crc_index(kw["losses"], kw["alpha"], B=kw["B"])


def test_crc_batched_equals_one_by_one():
    g = torch.Generator().manual_seed(4)
    x = torch.rand(6, 30, 8, generator=g, dtype=torch.float64).sort(-1, descending=True).values
    batched = crc_index(x, 0.4)
    assert batched.tolist() == [int(crc_index(x[b], 0.4)) for b in range(6)]


# ---------------------------------------------------------------- p-values and FWER


def slow_hb(r: float, n: int, a: float, binary: bool = False) -> float:
    """Angelopoulos et al. 2021, Prop. 3, from the formula with scipy's binomial."""
    if n == 0:
        return 1.0
    rr = min(r, a)
    h1 = (rr * math.log(rr / a) if rr > 0 else 0.0) + (1 - rr) * math.log((1 - rr) / (1 - a))
    hoeff = math.exp(-n * h1)
    bentkus = (1 if binary else math.e) * binom.cdf(math.ceil(n * r - 1e-9), n, a)
    return min(hoeff, bentkus, 1.0)


def test_hb_p_values_match_the_formula():
    rng = np.random.default_rng(5)
    rs, ns, alphas = rng.uniform(0, 0.4, 200), rng.integers(0, 400, 200), [0.05, 0.1, 0.3]
    rs[:20] = 0.0
    for a in alphas:
        ours = hb_p_values(torch.tensor(rs), torch.tensor(ns), a)
        ref = [slow_hb(r, int(n), a) for r, n in zip(rs, ns, strict=True)]
        np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-9, atol=1e-300)
        k = rng.integers(0, 50, 200)
        nb = k + rng.integers(1, 300, 200)
        ours_b = hb_p_values(torch.tensor(k / nb), torch.tensor(nb), a, binary=True,
                             loss_sum=torch.tensor(k, dtype=torch.float64))
        ref_b = [slow_hb(kk / n, int(n), a, binary=True) for kk, n in zip(k, nb, strict=True)]
        np.testing.assert_allclose(ours_b.numpy(), ref_b, rtol=1e-9, atol=1e-300)


def test_hoeffding_p_value_formula():
    r, n, a = 0.02, 300, 0.1
    h1 = r * math.log(r / a) + (1 - r) * math.log((1 - r) / (1 - a))
    assert float(hoeffding_p_values(torch.tensor(r), n, a)) == pytest.approx(math.exp(-n * h1))
    assert float(hoeffding_p_values(torch.tensor(0.2), n, a)) == 1.0


def test_fwer_procedures_hand_worked():
    p = torch.tensor([0.001, 0.04, 0.02, 0.5])
    # fixed sequence at 0.05: 0.001, 0.04, 0.02 pass, 0.5 stops
    assert fwer_reject(p, 0.05, "fixed_sequence").tolist() == [True, True, True, False]
    # Bonferroni at 0.05 / 4 = 0.0125
    assert fwer_reject(p, 0.05, "bonferroni").tolist() == [True, False, False, False]
    # Holm: 0.001 <= .0125, 0.02 <= .05/3, no -> stop
    assert fwer_reject(p, 0.05, "holm").tolist() == [True, False, False, False]
    p2 = torch.tensor([0.001, 0.04, 0.012, 0.5])  # 0.012 <= .0167, 0.04 <= .025? no
    assert fwer_reject(p2, 0.05, "holm").tolist() == [True, False, True, False]
    assert fwer_reject(torch.tensor([0.3, 0.01]), 0.05).tolist() == [False, False]


def test_ltt_hand_worked_and_non_monotone():
    # column risks 0, 0.5, 0, 1 with n = 40; fixed sequence stops at column 1
    x = torch.zeros(40, 4)
    x[:20, 1] = 1
    x[:, 3] = 1
    ltt = LearnThenTest(0.2, 0.1, lambdas=[10.0, 20.0, 30.0, 40.0]).fit(x)
    assert ltt.valid_.tolist() == [True, False, False, False] and ltt.lambda_hat_ == 10.0
    ltt = LearnThenTest(0.2, 0.1, lambdas=[10.0, 20.0, 30.0, 40.0], method="holm").fit(x)
    assert ltt.valid_.tolist() == [True, False, True, False] and ltt.lambda_hat_ == 30.0
    assert ltt.p_values_[0] == pytest.approx(slow_hb(0.0, 40, 0.2))
    with pytest.warns(InfiniteIntervalWarning, match="no lambda"):
        bad = LearnThenTest(0.2, 0.1).fit(torch.ones(40, 3))
    assert math.isnan(bad.lambda_hat_) and bad.index_ == -1


def test_ltt_conditional_mask():
    # 100 samples, lambda 1 counts only the first 30 (all correct), lambda 0 all (half wrong)
    x = torch.zeros(100, 2)
    x[50:, 0] = 1
    x[50:, 1] = 1
    mask = torch.ones(100, 2, dtype=torch.bool)
    mask[30:, 1] = False
    ltt = LearnThenTest(0.1, 0.1, method="bonferroni", binary=True).fit(x, mask)
    assert ltt.n_effective_.tolist() == [100.0, 30.0]
    assert ltt.risk_hat_.tolist() == [0.5, 0.0]
    assert ltt.p_values_[1] == pytest.approx(0.9 ** 30)
    assert ltt.valid_.tolist() == [False, True]


# ---------------------------------------------------------------- loss builders


def test_loss_builders_match_slow_references():
    p, y = multilabel_data(30, 6)
    t = torch.tensor([0.8, 0.1, 0.5, 0.3])
    fnr, fdr = false_negative_rate(p, y, t), false_discovery_rate(p, y, t)
    for j, tj in enumerate(t.tolist()):
        for i in range(30):
            s = p[i] > tj
            pos, hit = int(y[i].sum()), int((s & (y[i] == 1)).sum())
            assert fnr[i, j] == pytest.approx(1 - hit / pos if pos else 0.0)
            assert fdr[i, j] == pytest.approx(1 - hit / int(s.sum()) if s.any() else 1.0)
    pt, yt = token_data(12)
    mis = token_miscoverage(pt, yt, t)
    for j, tj in enumerate(t.tolist()):
        for i in range(12):
            kept = [k for k in range(yt.shape[1]) if yt[i, k] != -100]
            miss = sum(float(pt[i, k, yt[i, k]]) <= tj for k in kept)
            assert mis[i, j] == pytest.approx(miss / len(kept))
    ps, ys = segmentation_data(3)
    seg = false_negative_rate(ps, ys, t)
    assert torch.equal(seg, false_negative_rate(ps[:, 0], ys[:, 0], t))  # (N, H, W) too
    assert torch.allclose(seg, false_negative_rate(ps.reshape(3, -1), ys.reshape(3, -1), t))


def test_loss_builders_bad_input():
    p, y = multilabel_data(4, 3)
    with pytest.raises(ValueError, match="labels"):
        false_negative_rate(p, y[:, :2], [0.5])
    with pytest.raises(ValueError, match="probabilities"):
        false_negative_rate(p * 3, y, [0.5])
    with pytest.raises(ValueError, match="duplicate"):
        false_negative_rate(p, y, [0.5, 0.5])
    with pytest.raises(ValueError, match="labels"):
        token_miscoverage(torch.full((1, 2, 3), 1 / 3), torch.tensor([[0, 7]]), [0.5])


# ---------------------------------------------------------------- guarantees over 1,000 splits


def crc_split_risks(losses: torch.Tensor, n_cal: int, alpha: float, seed: int):
    """Mean test loss at CRC's lambda for SPLITS random permutations of the pool's rows
    (columns of ``losses`` by increasing lambda)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.rand(SPLITS, losses.shape[0], generator=g).argsort(1)
    cal, test = perm[:, :n_cal], perm[:, n_cal:]
    idx = crc_index(losses[cal], alpha)  # (SPLITS,)
    test_losses = losses[test, idx.unsqueeze(1).expand_as(test)]
    return test_losses.mean(1)


def thresholds_desc():
    return torch.arange(99, -1, -1, dtype=torch.float64) / 100 * 0.99  # 0.99 ... 0


@pytest.mark.parametrize("kind", ["multilabel", "segmentation", "tokens"])
def test_crc_mean_test_risk_over_1000_splits(kind):
    t = thresholds_desc()[::2]
    if kind == "multilabel":
        p, y = multilabel_data(400)
        losses = false_negative_rate(p, y, t)
    elif kind == "segmentation":
        p, y = segmentation_data(400)
        losses = false_negative_rate(p, y, t)
    else:
        p, y = token_data(400)
        losses = token_miscoverage(p, y, t)
    alpha = 0.1
    risks = crc_split_risks(losses, 200, alpha, seed=7)
    mean = float(risks.mean())
    assert mean <= alpha
    assert mean >= alpha - 0.02  # not trivially conservative


def test_ltt_violation_rate_over_1000_splits():
    """Calibration sets drawn with replacement from a fixed pool (i.i.d. from the pool's
    law), the population risk is the pool's mean loss: violation = pool risk > alpha."""
    p, y = multilabel_data(3000, seed=8)
    t = thresholds_desc()[::3]
    delta, n = 0.1, 300
    g = torch.Generator().manual_seed(9)
    draws = torch.randint(0, 3000, (SPLITS, n), generator=g)
    for loss, method, alpha in [(false_discovery_rate, "holm", 0.45),
                                (false_negative_rate, "bonferroni", 0.2),
                                (false_negative_rate, "fixed_sequence", 0.2)]:
        losses = loss(p, y, t)
        if loss is false_negative_rate:
            losses = losses.flip(1)  # fixed sequence from the safest (smallest t) up
        pool_risk = losses.mean(0)
        valid, _ = ltt_valid(losses[draws], alpha, delta, method=method)
        violated = (valid & (pool_risk > alpha)).any(1)
        assert float(violated.double().mean()) <= delta
        assert float(valid.any(1).double().mean()) > 0.9  # it does certify something


def test_selective_violation_rate_over_1000_splits():
    """conf ~ U(0, 1), P(wrong | c) = 0.6 (1 - c): the selective risk of threshold t is
    R(t) = 0.3 (1 - t) exactly; eps = 0.1 is met for t >= 2/3."""
    eps, delta, n = 0.1, 0.1, 1500
    grid = torch.arange(86, 39, -2, dtype=torch.float64) / 100  # 0.86 ... 0.40
    g = torch.Generator().manual_seed(10)
    chosen = []
    for _ in range(4):  # four chunks of 250 splits (memory), each batched
        conf = torch.rand(SPLITS // 4, n, generator=g, dtype=torch.float64)
        wrong = (torch.rand(conf.shape, generator=g, dtype=torch.float64) < 0.6 * (1 - conf))
        answered = conf.unsqueeze(2) >= grid
        valid, _ = ltt_valid(wrong.double().unsqueeze(2), eps, delta, binary=True,
                             mask=answered)
        last = valid.sum(-1) - 1  # fixed sequence: valid is a prefix
        chosen.append(torch.where(last >= 0, grid[last.clamp(min=0)],
                                  torch.full_like(last, math.inf, dtype=torch.float64)))
    t_hat = torch.cat(chosen)
    true_risk = torch.where(torch.isinf(t_hat), torch.zeros_like(t_hat), 0.3 * (1 - t_hat))
    assert float((true_risk > eps).double().mean()) <= delta
    assert float(torch.isfinite(t_hat).double().mean()) > 0.95
    # the class gives the batched answer on one split
    sel = SelectiveRiskControl(eps, delta, thresholds=grid, method="fixed_sequence").fit(
        conf[-1], ~wrong[-1])
    assert sel.threshold_ == float(t_hat[-1])
    assert sel.answered_fraction_ == pytest.approx(float((conf[-1] >= sel.threshold_).double()
                                                         .mean()))
    assert sel.predict(conf[-1].numpy()).dtype == np.bool_


def test_selective_default_certifies_on_the_default_grid():
    """The default grid starts at 1.00, where almost nothing is answered: a fixed sequence stops
    there and certifies nothing, Holm (the default) tests every threshold and certifies one
    whose true selective risk 0.3 (1 - t) is <= eps."""
    g = torch.Generator().manual_seed(3)
    conf = torch.rand(4000, generator=g, dtype=torch.float64)
    correct = torch.rand(4000, generator=g, dtype=torch.float64) >= 0.6 * (1 - conf)
    with pytest.warns(InfiniteIntervalWarning):
        fixed = SelectiveRiskControl(0.1, 0.1, method="fixed_sequence").fit(conf, correct)
    assert fixed.threshold_ == math.inf
    sel = SelectiveRiskControl(0.1, 0.1).fit(conf, correct)
    assert sel.method == "holm" and 2 / 3 <= sel.threshold_ < 0.9
    assert 0.1 < sel.answered_fraction_ < 1 / 3


# ---------------------------------------------------------------- estimators


def test_multilabel_risk_control_recall_dense_and_roundtrip():
    p, y = segmentation_data(40)
    m = MultiLabelRiskControl(0.1).fit(p, y)
    t = torch.sort(torch.arange(100, dtype=torch.float64) * 0.01, descending=True).values
    losses = false_negative_rate(p, y, t)
    # reference: the largest threshold whose CRC bound is <= alpha, by a loop
    ref = max(float(tj) for j, tj in enumerate(t) if (losses[:, j].sum() + 1) / 41 <= 0.1)
    assert m.threshold_ == ref
    masks = m.predict(p.numpy())
    assert masks.shape == p.shape and masks.dtype == np.bool_
    back = MultiLabelRiskControl.from_dict(json.loads(json.dumps(m.to_dict())))
    assert back.threshold_ == m.threshold_
    assert torch.equal(back.predict(p), p > m.threshold_)


def test_multilabel_risk_control_precision_and_settings():
    p, y = multilabel_data(500)
    m = MultiLabelRiskControl(0.4, risk="precision", delta=0.1).fit(p, y)
    assert math.isfinite(m.threshold_) and m.threshold_ in m.valid_thresholds_.tolist()
    assert m.threshold_ == min(m.valid_thresholds_.tolist())
    with pytest.raises(ValueError, match="delta"):
        MultiLabelRiskControl(0.3, risk="precision")
    with pytest.raises(ValueError, match="None"):
        MultiLabelRiskControl(0.3, delta=0.1)
    with pytest.raises(ValueError, match="risk"):
        MultiLabelRiskControl(0.3, risk="f1")


def test_crc_and_selective_roundtrip():
    crc = ConformalRiskControl(0.3, lambdas=[0.0, 1.0]).fit(torch.tensor([[1.0, 0.0]] * 9))
    back = ConformalRiskControl.from_dict(json.loads(json.dumps(crc.to_dict())))
    assert back.lambda_hat_ == crc.lambda_hat_ == 1.0
    with pytest.warns(InfiniteIntervalWarning, match="abstain"):
        sel = SelectiveRiskControl(0.01, 0.1).fit(torch.rand(20), torch.ones(20, dtype=bool))
    assert sel.threshold_ == math.inf and sel.answered_fraction_ == 0.0
    back = SelectiveRiskControl.from_dict(json.loads(json.dumps(sel.to_dict())))
    assert back.threshold_ == math.inf and not back.predict(torch.rand(5)).any()

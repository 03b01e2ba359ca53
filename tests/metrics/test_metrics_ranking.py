"""AUROC, AUPR, FPR@TPR, AURC, R-AUROC and OOD AUROC: hand-worked values, brute-force
references and scikit-learn as the independent reference (ties included)."""

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

import torchcal.metrics as M


def _data(n, seed, n_levels=None):
    g = np.random.default_rng(seed)
    s = g.normal(size=n)
    if n_levels is not None:  # heavy ties
        s = np.round(s * n_levels) / n_levels
    y = (g.uniform(size=n) < 1 / (1 + np.exp(-2 * s))).astype(np.int64)
    y[0], y[1] = 0, 1
    return s, y


def _pairs_auc(s, y):
    pos = [a for a, t in zip(s, y, strict=True) if t == 1]
    neg = [a for a, t in zip(s, y, strict=True) if t == 0]
    tot = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    return tot / (len(pos) * len(neg))


def test_hand_worked():
    s = torch.tensor([0.1, 0.4, 0.35, 0.8])
    y = torch.tensor([0, 0, 1, 1])
    assert M.auroc(scores=s, labels=y).item() == 0.75
    # thresholds .8 (P=1, R=.5), .4 (P=.5), .35 (P=2/3, R=1): AP = .5*1 + .5*2/3
    assert M.aupr(scores=s, labels=y).item() == pytest.approx(0.5 + 1 / 3, abs=1e-15)
    # TPR >= .95 first at threshold .35, where 1 of 2 negatives is above: FPR = .5
    assert M.fpr_at_tpr(scores=s, labels=y, convention="ood_positive").item() == 0.5
    assert M.fpr_at_tpr(scores=s, labels=y, tpr=0.5, convention="ood_positive").item() == 0.0
    # the default (ID positive): accepting half the ID (score <= 0.1) accepts no OOD
    assert M.fpr_at_tpr(scores=s, labels=y).item() == 0.5
    assert M.fpr_at_tpr(scores=s, labels=y, tpr=0.5).item() == 0.0
    # all tied: AUROC 1/2
    assert M.auroc(scores=torch.zeros(5), labels=torch.tensor([0, 1, 1, 0, 1])).item() == 0.5


@pytest.mark.parametrize("n_levels", [None, 2, 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_sklearn(n_levels, seed):
    s, y = _data(500, seed, n_levels)
    st_, yt = torch.from_numpy(s), torch.from_numpy(y)
    assert M.auroc(scores=st_, labels=yt).item() == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert M.aupr(scores=st_, labels=yt).item() == pytest.approx(
        average_precision_score(y, s), abs=1e-12)
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    for target in (0.5, 0.9, 0.95, 1.0):
        expected = fpr[np.argmax(tpr >= target)]
        assert M.fpr_at_tpr(scores=st_, labels=yt, tpr=target,
                            convention="ood_positive").item() == pytest.approx(expected, abs=1e-15)
    # the default convention: label 0 positive, lower score more positive
    fpr, tpr, _ = roc_curve(1 - y, -s, drop_intermediate=False)
    for target in (0.5, 0.9, 0.95, 1.0):
        expected = fpr[np.argmax(tpr >= target)]
        assert M.fpr_at_tpr(scores=st_, labels=yt, tpr=target).item() == pytest.approx(
            expected, abs=1e-15)


def test_auroc_brute_force_pairs_and_bool_labels():
    s, y = _data(80, 4, n_levels=3)
    expected = _pairs_auc(s.tolist(), y.tolist())
    assert M.auroc(scores=s, labels=y.astype(bool)).item() == pytest.approx(expected, abs=1e-15)
    # float32 and integer scores work too
    assert M.auroc(scores=s.astype(np.float32), labels=y).item() == pytest.approx(
        _pairs_auc(s.astype(np.float32).tolist(), y.tolist()), abs=1e-15)
    assert M.auroc(scores=torch.tensor([1, 2, 3, 3]), labels=torch.tensor([0, 0, 1, 0])).item() \
        == pytest.approx(2.5 / 3, abs=1e-15)


def _aurc_all_orders(u, correct):
    """Mean over every tie-breaking order of the mean risk over coverages k/N (brute force)."""
    n = len(u)
    groups = sorted(set(u))
    members = [[i for i in range(n) if u[i] == g] for g in groups]
    totals = []
    for orders in itertools.product(*[itertools.permutations(m) for m in members]):
        seq = [i for grp in orders for i in grp]
        errs = 0
        risks = []
        for k, i in enumerate(seq, 1):
            errs += 0 if correct[i] else 1
            risks.append(errs / k)
        totals.append(sum(risks) / n)
    return sum(totals) / len(totals)


def test_aurc_hand_worked_and_ties():
    # no ties: risks 0, 0, 1/3, 1/4 -> mean 7/48
    u = torch.tensor([0.1, 0.2, 0.3, 0.4])
    c = torch.tensor([1, 1, 0, 1])
    assert M.aurc(uncertainty=u, correct=c).item() == pytest.approx(7 / 48, abs=1e-15)
    # ties, against the average over every order of the tied samples
    g = np.random.default_rng(0)
    for _ in range(5):
        u = g.integers(0, 3, 7).astype(np.float64)
        c = g.integers(0, 2, 7)
        expected = _aurc_all_orders(u.tolist(), c.tolist())
        got = M.aurc(uncertainty=u, correct=c).item()
        assert got == pytest.approx(expected, abs=1e-12)
        perm = g.permutation(7)
        assert M.aurc(uncertainty=u[perm], correct=c[perm]).item() == pytest.approx(got, abs=1e-15)


def test_aurc_extremes():
    # a perfect ranking (errors most uncertain) vs its reverse
    c = torch.tensor([1] * 8 + [0] * 2)
    u_good = torch.arange(10.0)
    good = M.aurc(uncertainty=u_good, correct=c).item()
    bad = M.aurc(uncertainty=-u_good, correct=c).item()
    assert good < bad
    assert good == pytest.approx(sum(max(0, k - 8) / k for k in range(1, 11)) / 10, abs=1e-15)
    assert M.aurc(uncertainty=torch.ones(4), correct=torch.ones(4, dtype=torch.long)).item() == 0


def test_r_auroc():
    g = np.random.default_rng(1)
    u = g.uniform(size=300)
    c = (g.uniform(size=300) > u).astype(np.int64)
    assert M.r_auroc(uncertainty=u, correct=c).item() == pytest.approx(
        roc_auc_score(c, -u), abs=1e-12)


def test_ood_auroc_and_scores():
    g = torch.Generator().manual_seed(0)
    id_logits = 4 * torch.randn(200, 10, generator=g, dtype=torch.float64)
    ood_logits = torch.randn(150, 10, generator=g, dtype=torch.float64)
    s, y = M.ood_scores(id_logits=id_logits, ood_logits=ood_logits, score="entropy")
    p = torch.softmax(torch.cat([id_logits, ood_logits]), 1)
    entropy = -(p * p.log()).sum(1)
    assert torch.allclose(s, entropy, atol=1e-12)
    assert y.tolist() == [False] * 200 + [True] * 150
    expected = roc_auc_score(y.numpy(), entropy.numpy())
    assert M.ood_auroc(id_logits=id_logits, ood_logits=ood_logits).item() == pytest.approx(
        expected, abs=1e-12)
    expected_mp = roc_auc_score(y.numpy(), -p.max(1).values.numpy())
    got = M.ood_auroc(id_logits=id_logits.numpy(), ood_logits=ood_logits.numpy(),
                      score="max_prob").item()
    assert got == pytest.approx(expected_mp, abs=1e-12)
    assert got > 0.5  # confident in-distribution logits are separable
    # entropy is finite even when a probability underflows to 0
    s, _ = M.ood_scores(id_logits=torch.tensor([[0.0, -1e4]]), ood_logits=torch.zeros(1, 2))
    assert bool(torch.isfinite(s).all()) and s[1].item() == pytest.approx(math.log(2))


@settings(max_examples=40, deadline=None, database=None)
@given(st.integers(2, 40), st.integers(0, 2**31 - 1), st.integers(1, 4))
def test_properties(n, seed, levels):
    g = np.random.default_rng(seed)
    s = np.round(g.normal(size=n) * levels) / levels
    y = g.integers(0, 2, n)
    y[0], y[-1] = 0, 1
    a = M.auroc(scores=s, labels=y).item()
    assert a == pytest.approx(_pairs_auc(s.tolist(), y.tolist()), abs=1e-12)
    # symmetry: flipping the scores and labels
    assert M.auroc(scores=-s, labels=1 - y).item() == pytest.approx(a, abs=1e-12)
    ap = M.aupr(scores=s, labels=y).item()
    assert 0.0 < ap <= 1.0
    assert ap == pytest.approx(average_precision_score(y, s), abs=1e-12)
    f = M.fpr_at_tpr(scores=s, labels=y).item()
    assert 0.0 <= f <= 1.0


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int64])
def test_r_auroc_integer_uncertainty(dtype):
    # -u must not wrap around: uint8 0 (the most confident) would become 0 again, int8 -128
    # would stay -128
    lo = -128 if dtype == torch.int8 else 0
    u = torch.tensor([lo, 5, 7, 9], dtype=dtype)
    c = torch.tensor([1, 1, 0, 0])
    assert M.r_auroc(uncertainty=u, correct=c).item() == 1.0
    assert M.r_auroc(uncertainty=u, correct=1 - c).item() == 0.0

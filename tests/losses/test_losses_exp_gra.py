"""Exponentially weighted losses, TLBS, the sample-dependent focal GRA presets, the adaptive
BSCE-GRA and MMCE_m / MMCE-GRA: slow references written here from the formulas, gradients
(Σ w ∇b for detached weights, finite differences otherwise), registry defaults, bad input."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from loss_data import logits_targets

import torchcal.functional as TF
from torchcal.losses import (
    BSCEAdaptiveGRALoss,
    FocalExpLoss,
    MMCEGRALoss,
    MMCEUnweightedLoss,
    SampleDependentFocalGRALoss,
    TLBSLoss,
    create_loss,
)
from torchcal.losses.base import published_reduction

_data = partial(logits_targets, n=10, c=5)


def _probs(z):
    out = []
    for row in z.tolist():
        m = max(row)
        e = [math.exp(v - m) for v in row]
        out.append([v / sum(e) for v in e])
    return out


def _base_ref(kind, p, y, gamma):
    py = p[y]
    if kind == "ce":
        return -math.log(py)
    if kind == "focal":
        return -((1 - py) ** gamma) * math.log(py)
    if kind == "dual":
        below = [v for v in p if v < py]
        return -((1 - py + (max(below) if below else 0.0)) ** gamma) * math.log(py)
    return sum(((1.0 if c == y else 0.0) - v) ** 2 for c, v in enumerate(p))


# --------------------------------------------------------------- exponentially weighted losses
EXP = [("ce", TF.ce_exp_loss, ()), ("focal", TF.focal_exp_loss, (2.0,)),
       ("dual", TF.dual_focal_exp_loss, (2.0,)), ("brier", TF.brier_exp_loss, ())]


@pytest.mark.parametrize("kind, fn, args", EXP)
@pytest.mark.parametrize("temp", [0.5, 1.0, 4.0])
def test_exp_weighted_against_the_published_formula(kind, fn, args, temp):
    z, t = _data(seed=int(temp * 3))
    z[0, 1] = z[0, 2]
    p = _probs(z)
    want = []
    for i in range(len(p)):
        b = _base_ref(kind, p[i], int(t[i]), 2.0)
        # published: weight = exp(clamp(loss, min=0, max=T) / (T + 1)) - 1, no gradient
        w = math.exp(min(max(b, 0.0), temp) / (temp + 1)) - 1
        want.append(w * b)
    want = torch.tensor(want, dtype=torch.float64)
    torch.testing.assert_close(fn(z, t, *args, temp, reduction="none"), want)
    torch.testing.assert_close(fn(z, t, *args, temp, reduction="sum"), want.sum())


@pytest.mark.parametrize("name, base", [
    ("ce_exp", lambda x, t: F.cross_entropy(x, t, reduction="none")),
    ("focal_exp", lambda x, t: TF.focal_loss(x, t, 3.0, reduction="none")),
    ("dual_focal_exp", lambda x, t: TF.dual_focal_loss(x, t, 5.0, reduction="none")),
    ("brier_exp", lambda x, t: TF.brier_loss(x, t, reduction="none")),
])
def test_exp_weighted_gradient_is_weight_times_base_gradient(name, base):
    z, t = _data(n=8, c=4, seed=1)
    loss = create_loss(name, temperature=2.0, reduction="sum")
    assert published_reduction(loss) == "sum"
    b = base(z, t)
    w = torch.expm1(b.clamp(0, 2.0) / 3.0)
    x1 = z.clone().requires_grad_(True)
    loss(x1, t).backward()
    x2 = z.clone().requires_grad_(True)
    (w * base(x2, t)).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(loss(z, t), (w * b).sum())


def test_exp_weight_and_bad_temperature():
    b = torch.tensor([-1.0, 0.0, 0.5, 1.0, 7.0], dtype=torch.float64, requires_grad=True)
    w = TF.exp_weight(b, 1.0)
    assert not w.requires_grad
    torch.testing.assert_close(w, torch.tensor([0.0, 0.0, math.exp(0.25) - 1, math.exp(0.5) - 1,
                                                math.exp(0.5) - 1], dtype=torch.float64))
    z, t = _data(n=4, c=3)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="`temperature`"):
            TF.ce_exp_loss(z, t, bad)
        with pytest.raises(ValueError, match="`temperature`"):
            create_loss("brier_exp", temperature=bad)
    with pytest.raises(ValueError, match="`gamma`"):
        FocalExpLoss(gamma=-1.0)
    with pytest.raises(ValueError, match="`gamma`"):
        TF.dual_focal_exp_loss(z, t, gamma=float("nan"))


# -------------------------------------------------------------------------- GRA variants
def _gra_check(fn, z, t, w):
    """Values ``w · CE`` and the gradient ``Σ w ∇CE`` of a GRA function."""
    ce = F.cross_entropy(z, t, reduction="none")
    torch.testing.assert_close(fn(z, t, reduction="none"), w * ce)
    x1 = z.clone().requires_grad_(True)
    fn(x1, t, reduction="sum").backward()
    x2 = z.clone().requires_grad_(True)
    (w * F.cross_entropy(x2, t, reduction="none")).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)


@pytest.mark.parametrize("gamma", [1.0, 2.0, 0.5])
def test_tlbs_against_the_formula(gamma):
    z, t = _data(n=12, seed=2)
    t[:4] = z[:4].argmax(1)  # some correct predictions
    w = []
    for row, y in zip(_probs(z), t.tolist(), strict=True):
        r = max(row)
        c = 1.0 if row.index(r) == y else 0.0
        w.append(abs(c - r) ** gamma)
    _gra_check(lambda x, y, **kw: TF.tlbs_loss(x, y, gamma, **kw), z, t,
               torch.tensor(w, dtype=torch.float64))
    assert create_loss("tlbs").gamma == 2.0
    torch.testing.assert_close(TLBSLoss(gamma)(z, t), TF.tlbs_loss(z, t, gamma))


def _schedule(py, gammas):
    return gammas[0] if py < 0.2 else (gammas[1] if py < 0.5 else gammas[2])


@pytest.mark.parametrize("name, gammas", [("focal_gra_flsd53", (5.0, 3.0, 3.0)),
                                          ("focal_gra_flsd532", (5.0, 3.0, 2.0))])
def test_sample_dependent_focal_gra_presets(name, gammas):
    z, t = _data(n=30, seed=3, scale=1.5)
    p = _probs(z)
    py = [p[i][int(t[i])] for i in range(30)]
    assert min(abs(v - c) for v in py for c in (0.2, 0.5)) > 1e-6
    assert {_schedule(v, gammas) for v in py} == set(gammas)  # every tier is exercised
    w = torch.tensor([(1 - v) ** _schedule(v, gammas) for v in py], dtype=torch.float64)
    loss = create_loss(name)
    assert isinstance(loss, SampleDependentFocalGRALoss) and loss.gammas == gammas
    _gra_check(lambda x, y, reduction="mean": create_loss(name, reduction=reduction)(x, y),
               z, t, w)


@pytest.mark.parametrize("beta", [1.0, 2.0, 3.0])
def test_bsce_adaptive_gra_against_the_formula(beta):
    z, t = _data(n=30, seed=4, scale=1.5)
    w = []
    for row, y in zip(_probs(z), t.tolist(), strict=True):
        norm = sum(abs((1.0 if c == y else 0.0) - v) ** beta for c, v in enumerate(row)) ** (1 / beta)
        w.append(norm ** _schedule(row[y], (5.0, 3.0, 3.0)))
    _gra_check(lambda x, y, **kw: TF.bsce_adaptive_gra_loss(x, y, beta, **kw), z, t,
               torch.tensor(w, dtype=torch.float64))
    m = BSCEAdaptiveGRALoss(beta=beta, gammas=(5.0, 3.0, 1.0))
    assert m.gammas == (5.0, 3.0, 1.0)


def test_gra_variants_bad_arguments():
    z, t = _data(n=4, c=3)
    for call, match in [
        (lambda: TF.tlbs_loss(z, t, gamma=-1.0), "`gamma`"),
        (lambda: TF.sample_dependent_focal_gra_loss(z, t, (0.5, 0.2), (5, 3, 3)), "`thresholds`"),
        (lambda: TF.sample_dependent_focal_gra_loss(z, t, (0.2,), (5, 3, 3)), "`gammas`"),
        (lambda: TF.bsce_adaptive_gra_loss(z, t, beta=0.0), "`beta`"),
        (lambda: BSCEAdaptiveGRALoss(gammas=(5, -3, 3)), "`gammas`"),
        (lambda: TLBSLoss(gamma=float("inf")), "`gamma`"),
    ]:
        with pytest.raises(ValueError, match=match):
            call()


# ----------------------------------------------------------------------------- MMCE_m
def _mmce_m_ref(z, t, width=0.4):
    p = _probs(z)
    r = [max(row) for row in p]
    c = [1.0 if row.index(max(row)) == y else 0.0 for row, y in zip(p, t.tolist(), strict=True)]
    n = len(r)
    total = sum((c[i] - r[i]) * (c[j] - r[j]) * math.exp(-abs(r[i] - r[j]) / width)
                for i in range(n) for j in range(n))
    return total / n ** 2


@pytest.mark.parametrize("width", [0.4, 0.1])
def test_mmce_m_against_the_double_sum(width):
    z, t = _data(n=14, seed=5)
    t[:5] = z[:5].argmax(1)
    pen = _mmce_m_ref(z, t, width)
    ce = float(F.cross_entropy(z, t))
    assert TF.mmce_unweighted_loss(z, t, 2.0, width=width).item() == pytest.approx(ce + 2.0 * pen, abs=1e-12)
    assert TF.mmce_unweighted_loss(z, t, 2.0, width=width, reduction="sum").item() == pytest.approx(
        14 * (ce + 2.0 * pen), abs=1e-10)
    assert TF.mmce_gra_loss(z, t, width=width).item() == pytest.approx(pen * ce, abs=1e-12)
    p = torch.softmax(z, 1)
    conf, pred = p.max(1)
    assert TF.mmce_unweighted_penalty(conf, pred == t, width=width).item() == pytest.approx(pen, abs=1e-14)


def test_mmce_m_gradients_and_mmce_gra_gradient():
    z, t = _data(n=8, c=4, seed=6)
    t[:3] = z[:3].argmax(1)
    assert torch.autograd.gradcheck(lambda x: TF.mmce_unweighted_loss(x, t, 2.0),
                                    (z.clone().requires_grad_(),))
    # MMCE-GRA: the gradient is MMCE_m · ∇CE_mean (the penalty is detached)
    pen = _mmce_m_ref(z, t)
    x1 = z.clone().requires_grad_(True)
    TF.mmce_gra_loss(x1, t).backward()
    x2 = z.clone().requires_grad_(True)
    (pen * F.cross_entropy(x2, t)).backward()
    torch.testing.assert_close(x1.grad, x2.grad)


def test_mmce_m_ignore_index_and_edge_cases():
    z, t = _data(n=10, seed=7)
    t2 = t.clone()
    t2[[2, 5]] = -100
    keep = t2 != -100
    torch.testing.assert_close(TF.mmce_unweighted_loss(z, t2), TF.mmce_unweighted_loss(z[keep], t[keep]))
    torch.testing.assert_close(TF.mmce_gra_loss(z, t2, reduction="sum"),
                               TF.mmce_gra_loss(z[keep], t[keep], reduction="sum"))
    # all ignored: mean NaN (as F.cross_entropy), sum 0
    tall = torch.full_like(t, -100)
    assert torch.isnan(TF.mmce_unweighted_loss(z, tall)) and TF.mmce_unweighted_loss(z, tall, reduction="sum") == 0
    assert TF.mmce_unweighted_penalty(torch.tensor([0.5]), torch.tensor([True]), weight=torch.zeros(1)) == 0


def test_mmce_modules_registry_and_bad_input():
    z, t = _data(n=6, c=3)
    a, b = create_loss("mmce_unweighted"), create_loss("mmce_gra")
    assert isinstance(a, MMCEUnweightedLoss) and isinstance(b, MMCEGRALoss)
    assert a.lam == 1.0 and a.width == 0.4 and published_reduction(a) == published_reduction(b) == "sum"
    torch.testing.assert_close(a(z, t), TF.mmce_unweighted_loss(z, t, 1.0))
    torch.testing.assert_close(b(z, t), TF.mmce_gra_loss(z, t))
    for ctor, match in [(lambda: MMCEUnweightedLoss(reduction="none"), "reduction='none'"),
                        (lambda: MMCEGRALoss(reduction="none"), "reduction='none'"),
                        (lambda: MMCEUnweightedLoss(lam=-1.0), "`lam`"),
                        (lambda: MMCEGRALoss(width=0.0), "`width`")]:
        with pytest.raises(ValueError, match=match):
            ctor()
    for call, match in [(lambda: TF.mmce_unweighted_loss(z, t, reduction="none"), "reduction='none'"),
                        (lambda: TF.mmce_gra_loss(z, t, reduction="none"), "reduction='none'"),
                        (lambda: TF.mmce_unweighted_loss(z, t, lam=float("nan")), "`lam`"),
                        (lambda: TF.mmce_unweighted_loss(z, t, width=-0.4), "`width`")]:
        with pytest.raises(ValueError, match=match):
            call()

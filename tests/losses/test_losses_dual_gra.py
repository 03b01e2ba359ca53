"""Dual focal, the gradient-weighted (GRA) family and BSCE: references, ties, gradients."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from loss_data import logits_targets

import torchcal.functional as TF
from torchcal.losses import (
    BSCEGRALoss,
    BSCELoss,
    DualFocalGRALoss,
    DualFocalLoss,
    FocalGRALoss,
    GradientWeightedLoss,
    create_loss,
)

_data = partial(logits_targets, n=10, c=5)


def _probs(row):
    e = [math.exp(v) for v in row]
    s = sum(e)
    return [v / s for v in e]


def ref_pj(p, y):
    below = [v for v in p if v < p[y]]
    return max(below) if below else 0.0


def ref_dual(x, t, gamma):
    out = []
    for row, y in zip(x.tolist(), t.tolist(), strict=True):
        p = _probs(row)
        out.append(-((1 - p[y] + ref_pj(p, y)) ** gamma) * math.log(p[y]))
    return torch.tensor(out, dtype=torch.float64)


def ref_u(x, t, beta, gamma):
    out = []
    for row, y in zip(x.tolist(), t.tolist(), strict=True):
        p = _probs(row)
        s = sum(abs((1.0 if c == y else 0.0) - pc) ** beta for c, pc in enumerate(p))
        out.append(s ** (gamma / beta))
    return torch.tensor(out, dtype=torch.float64)


def ref_ce(x, t):
    return torch.tensor([-math.log(_probs(r)[y]) for r, y in zip(x.tolist(), t.tolist(),
                                                                 strict=True)],
                        dtype=torch.float64)


# ---------------------------------------------------------------------------- dual focal
@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.6, 5.0])
def test_dual_focal_matches_reference(gamma):
    x, t = _data()
    torch.testing.assert_close(TF.dual_focal_loss(x, t, gamma, reduction="none"),
                               ref_dual(x, t, gamma))
    torch.testing.assert_close(DualFocalLoss(gamma)(x, t), ref_dual(x, t, gamma).mean())


def test_dual_focal_ties_and_smallest():
    # p = softmax of these logits; the target's probability is tied / smallest / largest
    x = torch.log(torch.tensor([
        [0.4, 0.4, 0.1, 0.1],    # y=0 tied with class 1 -> p_j = 0.1 (strictly below)
        [0.1, 0.2, 0.3, 0.4],    # y=0 smallest -> p_j = 0
        [0.25, 0.25, 0.25, 0.25],  # all tied -> p_j = 0
        [0.1, 0.2, 0.3, 0.4],    # y=3 largest -> p_j = 0.3 (not the largest non-target... same here)
        [0.5, 0.3, 0.15, 0.05],  # y=2 -> p_j = 0.05 (the largest below, not the largest other 0.5)
        [0.3, 0.3, 0.2, 0.2],    # y=2 tied with class 3 -> p_j = 0
    ], dtype=torch.float64))
    t = torch.tensor([0, 0, 0, 3, 2, 2])
    pj = torch.tensor([0.1, 0.0, 0.0, 0.3, 0.05, 0.0], dtype=torch.float64)
    py = torch.softmax(x, 1).gather(1, t[:, None]).squeeze(1)
    expected = -((1 - py + pj) ** 1.5) * torch.log(py)
    torch.testing.assert_close(TF.dual_focal_loss(x, t, 1.5, reduction="none"), expected)
    torch.testing.assert_close(ref_dual(x, t, 1.5), expected)
    log_p = torch.log_softmax(x, 1)
    lj, _ = TF.dual_focal.log_p_below(log_p, log_p.gather(1, t[:, None]).squeeze(1))
    torch.testing.assert_close(lj.exp(), pj)
    # DFL-GRA's weight (value-only masked max) has the same tie semantics
    torch.testing.assert_close(TF.dual_focal_gra_loss(x, t, 1.5, reduction="none"), expected)


def test_dual_focal_gradient_and_gradcheck():
    x, t = _data(n=6, c=4)
    for gamma in (0.5, 2.0, 5.0):
        xr = x.clone().requires_grad_(True)
        assert torch.autograd.gradcheck(lambda z, g=gamma: TF.dual_focal_loss(z, t, g,
                                                                               reduction="sum"),
                                        (xr,))
    # gradient equals autograd through an independent (masked-max) formulation; nothing detached
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    TF.dual_focal_loss(x1, t, 5.0, reduction="sum").backward()
    p = torch.softmax(x2, 1)
    py = p.gather(1, t[:, None])
    pj = torch.where(p < py, p, torch.zeros_like(p)).amax(1, keepdim=True)
    (-((1 - py + pj) ** 5.0) * torch.log(py)).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)


# ---------------------------------------------------------------------------- GRA family
def _hook_gradient(x, t, u):
    """Σ_i u_i ∇CE_i via a backward hook that scales each sample's gradient by u_i."""
    xr = x.clone().requires_grad_(True)
    ce = F.cross_entropy(xr, t, reduction="none")
    ce.register_hook(lambda g: g * u)
    ce.sum().backward()
    return xr.grad


@pytest.mark.parametrize("beta, gamma", [(2.0, 2.0), (1.0, 1.0), (3.0, 0.5), (1.5, 2.0)])
def test_bsce_gra_value_and_gradient_is_weighted_ce_gradient(beta, gamma):
    x, t = _data()
    u = ref_u(x, t, beta, gamma)
    torch.testing.assert_close(TF.bsce_gra_loss(x, t, beta, gamma, reduction="none"),
                               u * ref_ce(x, t))
    xr = x.clone().requires_grad_(True)
    BSCEGRALoss(beta, gamma, reduction="sum")(xr, t).backward()
    torch.testing.assert_close(xr.grad, _hook_gradient(x, t, u))
    # the non-detached BSCE has the same value but a different gradient
    torch.testing.assert_close(TF.bsce_loss(x, t, beta, gamma, reduction="none"), u * ref_ce(x, t))
    xb = x.clone().requires_grad_(True)
    BSCELoss(beta, gamma, reduction="sum")(xb, t).backward()
    assert not torch.allclose(xb.grad, xr.grad)


def test_bsce_default_weight_is_brier_and_published_default_is_scaled_focal_weight():
    x, t = _data()
    torch.testing.assert_close(ref_u(x, t, 2.0, 2.0), TF.brier_loss(x, t, reduction="none"))
    py = torch.softmax(x, 1).gather(1, t[:, None]).squeeze(1)
    torch.testing.assert_close(ref_u(x, t, 1.0, 1.0), 2 * (1 - py))


def test_focal_gra_and_dual_focal_gra():
    x, t = _data()
    py = torch.softmax(x, 1).gather(1, t[:, None]).squeeze(1)
    w = (1 - py) ** 3
    torch.testing.assert_close(TF.focal_gra_loss(x, t, reduction="none"), w * ref_ce(x, t))
    xr = x.clone().requires_grad_(True)
    FocalGRALoss(reduction="sum")(xr, t).backward()
    torch.testing.assert_close(xr.grad, _hook_gradient(x, t, w))
    # DFL-GRA: value equals dual focal, gradient is the detached-weight gradient
    pj = torch.tensor([ref_pj(_probs(r), y) for r, y in zip(x.tolist(), t.tolist(), strict=True)],
                      dtype=torch.float64)
    wd = (1 - py + pj) ** 5
    torch.testing.assert_close(TF.dual_focal_gra_loss(x, t, reduction="none"),
                               ref_dual(x, t, 5.0))
    xr = x.clone().requires_grad_(True)
    DualFocalGRALoss(reduction="sum")(xr, t).backward()
    torch.testing.assert_close(xr.grad, _hook_gradient(x, t, wd))


def test_gradient_weighted_combinator():
    x, t = _data()
    w = torch.linspace(0.1, 3.0, 10, dtype=torch.float64, requires_grad=True)
    xr = x.clone().requires_grad_(True)
    out = TF.gradient_weighted_loss(xr, t, w, reduction="sum")
    torch.testing.assert_close(out, (w.detach() * ref_ce(x, t)).sum())
    out.backward()
    assert w.grad is None  # detached
    torch.testing.assert_close(xr.grad, _hook_gradient(x, t, w.detach()))
    # module with a weight function and with an explicit weight
    mod = GradientWeightedLoss(lambda z, y: 1 - torch.softmax(z, 1).gather(1, y[:, None])[:, 0],
                               reduction="none")
    py = torch.softmax(x, 1).gather(1, t[:, None]).squeeze(1)
    torch.testing.assert_close(mod(x, t), (1 - py) * ref_ce(x, t))
    torch.testing.assert_close(mod(x, t, weight=w.detach()), w.detach() * ref_ce(x, t))
    with pytest.raises(ValueError, match="`weight`"):
        GradientWeightedLoss()(x, t)
    # a number is a constant weight
    torch.testing.assert_close(TF.gradient_weighted_loss(x, t, 2.0), 2 * F.cross_entropy(x, t))


def test_gradcheck_bsce():
    x, t = _data(n=5, c=3)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z: TF.bsce_loss(z, t, reduction="none"), (x,))
    assert torch.autograd.gradcheck(lambda z: TF.bsce_loss(z, t, 3.0, 1.0), (x,))
    # β = 2 with γ != 2 runs through the closed-form Brier backward with its k-term
    for gamma in (0.5, 1.0, 3.0):
        assert torch.autograd.gradcheck(lambda z, g=gamma: TF.bsce_loss(z, t, 2.0, g), (x,))


@pytest.mark.parametrize("beta, gamma", [(2.0, 0.0), (2.0, 0.5), (2.0, 1.0), (2.0, 2.0),
                                         (2.0, 3.0), (1.0, 1.0), (1.5, 2.0), (3.0, 0.5)])
def test_bsce_gradient_equals_autograd_of_the_formula(beta, gamma):
    # BSCE's weight is not detached: its gradient is autograd's through u_i · (-log p_y)
    x, t = _data()
    x1 = x.clone().requires_grad_(True)
    TF.bsce_loss(x1, t, beta, gamma, reduction="sum").backward()
    x2 = x.clone().requires_grad_(True)
    p = torch.softmax(x2, 1)
    u = (F.one_hot(t, 5) - p).abs().pow(beta).sum(1).pow(gamma / beta)
    (-u * torch.log_softmax(x2, 1).gather(1, t[:, None]).squeeze(1)).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)


def test_registry_gra_entries():
    for name, cls in (("bsce_gra", BSCEGRALoss), ("focal_gra", FocalGRALoss),
                      ("dual_focal_gra", DualFocalGRALoss)):
        assert isinstance(create_loss(name), cls)
        assert isinstance(create_loss(name), GradientWeightedLoss)
    assert isinstance(create_loss("bsce"), BSCELoss)

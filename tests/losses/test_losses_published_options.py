"""Options for the published forms where torchcal departs from the published code (issue 24,
8): DFL-GRA's gradient (``detach="p_j"``, the published ``DualFocalLossGra``) and the KDE
bandwidth rule (``rule="original"``, ECE-KDE's ``get_bandwidth``), each against a hand
computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import dirichlet

from torchcal.functional import dual_focal_gra_loss, kde_bandwidth
from torchcal.functional.ece_losses import KDE_BANDWIDTHS
from torchcal.losses import DualFocalGRALoss, create_loss


def published_dfl_gra(x, y, gamma):
    """-(1 - p_y + sg(p_j))^γ log p_y summed, p_j the largest probability below p_y (a
    masked top-k as the published code), written from the formula with plain softmax."""
    p = torch.softmax(x, dim=1)
    p_y = p.gather(1, y.unsqueeze(1)).squeeze(1)
    below = torch.where(p < p_y.unsqueeze(1), p, torch.zeros_like(p))
    p_j = below.max(dim=1).values.detach()
    return (-(1 - p_y + p_j) ** gamma * torch.log(p_y)).sum()


@pytest.mark.parametrize("gamma", [1.0, 3.0, 5.0])
def test_dfl_gra_published_gradient_against_hand_computation(gamma):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 5, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 5, (16,), generator=g)
    ref = published_dfl_gra(x, y, gamma)
    (g_ref,) = torch.autograd.grad(ref, x)
    ours = dual_focal_gra_loss(x, y, gamma, detach="p_j", reduction="sum")
    (g_ours,) = torch.autograd.grad(ours, x)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-10, atol=1e-12)
    # the default (whole weight detached) has the same value and a different gradient
    module = DualFocalGRALoss(gamma=gamma, reduction="sum")
    default = module(x, y)
    (g_default,) = torch.autograd.grad(default, x)
    torch.testing.assert_close(default, ref, rtol=1e-12, atol=1e-12)
    assert float((g_default - g_ref).norm() / g_ref.norm()) > 0.1
    # and the module option is the functional one
    published = create_loss("dual_focal_gra", gamma=gamma, detach="p_j", reduction="sum")
    (g_mod,) = torch.autograd.grad(published(x, y), x)
    torch.testing.assert_close(g_mod, g_ref, rtol=1e-10, atol=1e-12)


def test_dfl_gra_bad_detach():
    with pytest.raises(ValueError, match="`detach` to be one of"):
        DualFocalGRALoss(detach="all")


def hand_bandwidth(p, rule):
    """Arg-max over the published grid of Σ_i log(Σ_{j≠i} Dir(p_i; p_j / h + 1)) - N log(N-1)
    (- N log h for the original rule), with SciPy's Dirichlet density."""
    n = len(p)
    best, best_h = -math.inf, None
    for h in KDE_BANDWIDTHS:
        ll = 0.0
        for i in range(n):
            logs = [dirichlet.logpdf(p[i], p[j] / h + 1) for j in range(n) if j != i]
            ll += np.logaddexp.reduce(logs) - math.log(n - 1) - (
                math.log(h) if rule == "original" else 0.0)
        if ll > best:
            best, best_h = ll, h
    return best_h


@pytest.mark.parametrize("rule", ["loo", "original"])
def test_kde_bandwidth_rules_against_hand_computation(rule):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(24, 3, generator=g, dtype=torch.float64) * 2
    p = torch.softmax(z, 1)
    p = (p / p.sum(1, keepdim=True)).numpy()
    assert kde_bandwidth(logits=z, rule=rule) == pytest.approx(hand_bandwidth(p, rule))


def test_the_two_bandwidth_rules_differ_and_bad_rule():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 3, generator=g, dtype=torch.float64) * 2
    # -N log h favours small bandwidths
    assert kde_bandwidth(logits=z, rule="original") < kde_bandwidth(logits=z) / 2
    with pytest.raises(ValueError, match="`rule` to be one of"):
        kde_bandwidth(logits=z, rule="scott")

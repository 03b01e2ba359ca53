"""The url code's other head objectives: the ranking loss' leeway ρ, the loss-prediction MSE and
the log-uncertainty regulariser, against references written here from the published logic."""

from __future__ import annotations

import math

import pytest
import torch

from torchcal.uncertainty import (
    fit_head,
    head_loss,
    log_uncertainty_regularizer,
    loss_prediction_mse,
    ranking_loss,
)


def _published_order_loss(pred, true, leeway_rho=0.0, gap=0.1):
    """LossOrderLoss as the url code computes it: pairs (0,1), (2,3), ...; sign +1/-1 by
    ``true_a > true_b``, zeroed where ``|true_a - true_b| < rho``; the hinge per pair, repeated
    for both members, then the mean."""
    pairs_p = pred.reshape(-1, 2)
    pairs_t = true.reshape(-1, 2)
    bigger = (pairs_t[:, 0] > pairs_t[:, 1]).double() * 2 - 1
    bigger = bigger * ((pairs_t[:, 0] - pairs_t[:, 1]).abs() >= leeway_rho).double()
    per_pair = torch.maximum(torch.zeros(1, dtype=pred.dtype),
                             -bigger * (pairs_p[:, 0] - pairs_p[:, 1]) + gap)
    return per_pair.repeat_interleave(2).mean()


# Issue #16's example: the same input gives 0.136 without and 0.197 with a leeway.  Ten pairs,
# margin 0.1, ρ = 0.2.  Seven pairs have near-equal losses (|Δℓ| = 0.05 < ρ): six are ordered
# with room to spare (hinge 0) and one by 0.01 (hinge 0.09); with ρ each costs the constant
# margin 0.1.  Three pairs differ clearly and are wrongly ordered: hinges 0.5, 0.47, 0.3.
#   without ρ: (6·0 + 0.09 + 0.5 + 0.47 + 0.3) / 10 = 0.136
#   with ρ:    (7·0.1      + 0.5 + 0.47 + 0.3) / 10 = 0.197
_U = [0.5, 0.3] * 6 + [0.31, 0.30] + [0.2, 0.6, 0.67, 0.3, 0.4, 0.6]
_L = [1.05, 1.0] * 7 + [2.0, 0.5, 0.5, 2.0, 3.0, 1.0]


def test_leeway_example_of_the_issue():
    u = torch.tensor(_U, dtype=torch.float64)
    t = torch.tensor(_L, dtype=torch.float64)
    plain = ranking_loss(u, t)
    with_rho = ranking_loss(u, t, leeway=0.2)
    assert plain.item() == pytest.approx(0.136, abs=1e-12)
    assert with_rho.item() == pytest.approx(0.197, abs=1e-12)
    torch.testing.assert_close(plain, _published_order_loss(u, t))
    torch.testing.assert_close(with_rho, _published_order_loss(u, t, 0.2))
    assert round(plain.item(), 3) == 0.136 and round(with_rho.item(), 3) == 0.197


@pytest.mark.parametrize("rho", [0.0, 0.05, 0.3, 1.0, 10.0])
def test_leeway_matches_published_logic(rho):
    g = torch.Generator().manual_seed(int(rho * 100))
    u = torch.rand(64, generator=g, dtype=torch.float64)
    t = torch.rand(64, generator=g, dtype=torch.float64)
    t[:8] = torch.round(t[:8], decimals=1)  # some exact ties too
    torch.testing.assert_close(ranking_loss(u, t, margin=0.1, leeway=rho),
                               _published_order_loss(u, t, rho))
    torch.testing.assert_close(ranking_loss(u, t, margin=0.25, leeway=rho),
                               _published_order_loss(u, t, rho, gap=0.25))


def test_leeway_pairs_give_no_gradient_and_zero_is_the_default():
    u = torch.tensor(_U, dtype=torch.float64, requires_grad=True)
    t = torch.tensor(_L, dtype=torch.float64)
    ranking_loss(u, t, leeway=0.2).backward()
    assert torch.all(u.grad[:14] == 0)  # the seven near-tie pairs
    assert torch.all(u.grad[14:] != 0)  # the three wrongly ordered ones
    assert ranking_loss(u, t, leeway=0.0) == ranking_loss(u, t)
    assert torch.autograd.gradcheck(lambda z: ranking_loss(z, t, leeway=0.2), (u.detach().clone()
                                                                              .requires_grad_(),))


def test_bad_leeway():
    u, t = torch.rand(4), torch.rand(4)
    for bad in (-0.1, float("nan"), float("inf"), "0.1"):
        with pytest.raises(ValueError, match="`leeway`"):
            ranking_loss(u, t, leeway=bad)


def test_loss_prediction_mse_formula_and_gradient():
    g = torch.Generator().manual_seed(0)
    u = torch.rand(10, generator=g, dtype=torch.float64, requires_grad=True)
    t = (3 * torch.rand(10, generator=g, dtype=torch.float64)).requires_grad_(True)
    ref = sum((a - b) ** 2 for a, b in zip(u.tolist(), t.tolist(), strict=True)) / 10
    out = loss_prediction_mse(u, t)
    assert out.item() == pytest.approx(ref, abs=1e-14)
    out.backward()
    torch.testing.assert_close(u.grad, 2 * (u - t).detach() / 10)
    assert t.grad is None  # the target is detached, as the published detach=True
    assert torch.autograd.gradcheck(lambda z: loss_prediction_mse(z, t), (u.detach().clone()
                                                                         .requires_grad_(),))
    # nn.MSELoss, the published unc_loss, on the same input
    torch.testing.assert_close(loss_prediction_mse(u, t), torch.nn.MSELoss()(u, t.detach()))
    torch.testing.assert_close(loss_prediction_mse(u[:, None], t[:, None]), out)
    with pytest.raises(ValueError, match="`target_loss` to have 10 entries"):
        loss_prediction_mse(u, t[:4])


def test_log_uncertainty_regularizer():
    u = torch.tensor([0.5, 1.5, 4.0], dtype=torch.float64, requires_grad=True)
    out = log_uncertainty_regularizer(u, 0.3)
    assert out.item() == pytest.approx(-0.3 * math.log(2.0), abs=1e-15)
    out.backward()
    torch.testing.assert_close(u.grad, torch.full_like(u, -0.3 / (3 * 2.0)))
    assert torch.autograd.gradcheck(lambda z: log_uncertainty_regularizer(z, 0.3),
                                    (u.detach().clone().requires_grad_(),))
    assert log_uncertainty_regularizer(u, 0.0).item() == 0
    with pytest.raises(ValueError, match="`lam`"):
        log_uncertainty_regularizer(u, -1.0)


def test_head_loss_combines_as_the_published_training():
    g = torch.Generator().manual_seed(1)
    u = torch.rand(8, generator=g, dtype=torch.float64) + 0.1
    t = torch.rand(8, generator=g, dtype=torch.float64)
    # published: loss = λ_obj·unc_loss, then loss -= unc_reg_lambda·log(unc.mean())
    want = _published_order_loss(u, t, 0.05) - 0.7 * u.mean().log()
    torch.testing.assert_close(head_loss(u, t, leeway=0.05, unc_reg_lambda=0.7), want)
    torch.testing.assert_close(head_loss(u, t, objective="mse"), ((u - t) ** 2).mean())
    with pytest.raises(ValueError, match="`objective`"):
        head_loss(u, t, objective="hinge")


def _synthetic(n=256, d=8, c=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(n, d, generator=g)
    w = torch.randn(d, c, generator=g)
    logits = emb @ w + 0.5 * torch.randn(n, c, generator=g)
    labels = torch.randint(0, c, (n,), generator=g)
    return emb, logits, labels


def test_fit_head_with_the_mse_objective_and_regulariser():
    data = _synthetic()
    mse = fit_head(data, epochs=15, batch_size=64, width=16, lr=1e-2, objective="mse",
                   progress=False)
    assert mse.epoch_losses[-1] < 0.5 * mse.epoch_losses[0]
    reg = fit_head(data, epochs=3, batch_size=64, width=16, unc_reg_lambda=1.0, leeway=0.05,
                   progress=False)
    plain = fit_head(data, epochs=3, batch_size=64, width=16, progress=False)
    # same seed and batches: the regulariser is what changes the loss (by -log mean u)
    assert all(math.isfinite(v) for v in reg.epoch_losses)
    assert reg.epoch_losses != plain.epoch_losses
    for kw, match in [({"objective": "l1"}, "`objective`"), ({"leeway": -1.0}, "`leeway`"),
                      ({"unc_reg_lambda": float("nan")}, "`unc_reg_lambda`")]:
        with pytest.raises(ValueError, match=match):
            fit_head(data, epochs=1, progress=False, **kw)

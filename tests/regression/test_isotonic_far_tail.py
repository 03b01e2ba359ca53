"""IsotonicRecalibration with a validation target far in a Gaussian's tail (a PIT value below
1e-16, where ``2p - 1`` rounds to -1): its quantiles stay finite and exact."""

import torch

from torchcal.regression import Gaussian, IsotonicRecalibration


def test_far_lower_tail_target_gives_finite_quantiles():
    g = Gaussian(torch.zeros(5, dtype=torch.float64), torch.ones(5, dtype=torch.float64))
    y = torch.tensor([-12.0, -1.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    iso = IsotonicRecalibration(levels=[0.05, 0.2, 0.5]).fit(g, y)
    q = iso.quantiles(g).values
    assert bool(torch.isfinite(q).all())
    # knots (F(y_i), i / 5): levels <= 0.2 map to the first knot F(-12), so the quantile is
    # Phi^-1(Phi(-12)) = -12; level 0.5 lies halfway between the knots at 0.4 and 0.6, i.e.
    # between F(-1) and F(0): Phi^-1 of their mean
    assert torch.allclose(q[:, 0], torch.full((5,), -12.0, dtype=torch.float64), atol=1e-9)
    assert torch.allclose(q[:, 1], torch.full((5,), -12.0, dtype=torch.float64), atol=1e-9)
    mid = torch.distributions.Normal(0.0, 1.0).icdf(
        (g.cdf(torch.tensor(-1.0)) + 0.5) / 2)
    assert torch.allclose(q[:, 2], mid.expand(5).double(), atol=1e-12)

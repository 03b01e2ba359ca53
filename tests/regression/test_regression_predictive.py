"""The prediction types' quantile functions against scipy, far in the tails too."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm

from torchcal.regression import Gaussian


def test_gaussian_quantiles_equal_scipy_far_in_the_tails():
    levels = torch.tensor([1e-300, 1e-20, 1e-16, 0.05, 0.5, 0.95, 1 - 1e-12], dtype=torch.float64)
    g = Gaussian(torch.tensor([1.0, -2.0], dtype=torch.float64), std=torch.tensor([2.0, 0.5],
                                                                                 dtype=torch.float64))
    q = g.quantiles(levels).values
    want = norm.ppf(levels.numpy()[None, :], loc=[[1.0], [-2.0]], scale=[[2.0], [0.5]])
    assert torch.isfinite(q).all()  # erfinv(2 q - 1) gave -inf below about 1e-16
    np.testing.assert_allclose(q.numpy(), want, rtol=1e-9)
    np.testing.assert_allclose(g.ppf(torch.tensor([1e-20, 0.95], dtype=torch.float64)).numpy(),
                               norm.ppf([1e-20, 0.95], loc=[1.0, -2.0], scale=[2.0, 0.5]),
                               rtol=1e-9)
    lo, hi = g.interval(0.1)
    np.testing.assert_allclose(hi.numpy(), norm.ppf(0.95, loc=[1.0, -2.0], scale=[2.0, 0.5]),
                               rtol=1e-12)
    with pytest.raises(ValueError, match="`q`"):
        g.ppf(1.0)

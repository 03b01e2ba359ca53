"""The prediction types' quantile functions against scipy, far in the tails too."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm

from torchcal.regression import Gaussian, Quantiles


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


@pytest.mark.parametrize("values,message", [
    ([[0.0, 1.0], [2.0, 1.0]], "1 element\\(s\\) whose quantiles cross"),
    ([[0.0, float("nan")]], "finite, found 1 NaN"),
    ([[float("inf"), float("inf")]], "finite, found 2 NaN"),
    ([[0.0, 1.0, float("inf")]], "finite, found 1 NaN"),
    ([[float("-inf"), 0.0, 1.0]], "finite, found 1 NaN"),
    ([[1e308, -1e308]], "1 element\\(s\\) whose quantiles cross"),  # the gap overflows
])
def test_quantiles_refuse_non_finite_and_crossing_columns(values, message):
    levels = [0.1, 0.9] if len(values[0]) == 2 else [0.1, 0.5, 0.9]
    with pytest.raises(ValueError, match=message):
        Quantiles(values, levels)


def test_quantiles_accept_an_overflowing_but_ordered_gap_and_no_rows():
    from torchcal.regression import Quantiles as Q

    assert Q([[-1e308, 1e308]], [0.1, 0.9]).values.shape == (1, 2)
    assert Q(torch.zeros(0, 2), [0.1, 0.9]).shape == (0,)


def test_the_metrics_normal_quantile_is_finite_in_the_far_tail():
    """The same erfinv defect on the metrics' path (regression._scores.normal_ppf)."""
    from torchcal.regression._scores import normal_ppf

    p = torch.tensor([1e-300, 1e-20, 0.5, 1 - 1e-12], dtype=torch.float64)
    np.testing.assert_allclose(normal_ppf(p).numpy(), norm.ppf(p.numpy()), rtol=1e-9)

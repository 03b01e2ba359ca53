"""ConformalRegressor: hand-worked thresholds, layouts, Mondrian, weighted, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from torchcal.conformal import ConformalRegressor
from torchcal.conformal.regression import mondrian_thresholds
from torchcal.errors import InfiniteIntervalWarning, NotFittedError
from torchcal.regression import Gaussian, Quantiles, Samples


def _kth(values, k):
    """The k-th smallest of a Python list (the reference, independent of torch)."""
    return sorted(values)[k - 1]


def test_absolute_hand_worked():
    # n = 9 residuals 1..9, alpha = 0.2: k = ceil(10 * 0.8) = 8 -> q = 8
    y = torch.arange(1.0, 10.0)
    cr = ConformalRegressor(alpha=0.2).fit(torch.zeros(9), y)
    assert float(cr.threshold_) == 8.0
    lo, hi = cr.predict_interval(torch.tensor([1.0, -2.0]))
    assert lo.tolist() == [-7.0, -10.0] and hi.tolist() == [9.0, 6.0]


def test_absolute_from_gaussian_and_samples_uses_mean():
    g = torch.Generator().manual_seed(0)
    mu, y = torch.randn(50, generator=g, dtype=torch.float64), torch.randn(
        50, generator=g, dtype=torch.float64)
    k = math.ceil(51 * 0.9)
    ref = _kth((y - mu).abs().tolist(), k)
    a = ConformalRegressor(0.1).fit(mu, y)
    b = ConformalRegressor(0.1).fit(Gaussian(mu, std=torch.ones(50)), y)
    s = Samples(torch.stack([mu - 1, mu + 1]))
    c = ConformalRegressor(0.1).fit(s, y)
    for cr in (a, b, c):
        assert float(cr.threshold_) == pytest.approx(ref, abs=1e-12)


def test_normalized_hand_worked():
    mu = torch.zeros(4, dtype=torch.float64)
    std = torch.tensor([1.0, 2.0, 4.0, 0.5], dtype=torch.float64)
    y = torch.tensor([1.0, 1.0, 8.0, 0.25], dtype=torch.float64)
    # scores |y - mu| / std = [1, 0.5, 2, 0.5]; alpha = 0.5: k = ceil(5 * 0.5) = 3 -> 1.0
    cr = ConformalRegressor(0.5, score="normalized").fit(Gaussian(mu, std=std), y)
    assert float(cr.threshold_) == 1.0
    lo, hi = cr.predict_interval(Gaussian(torch.tensor([10.0]), std=torch.tensor([3.0])))
    assert lo.tolist() == [7.0] and hi.tolist() == [13.0]


def test_normalized_refuses_zero_sigma_and_point():
    with pytest.raises(ValueError, match="sigma > 0"):
        ConformalRegressor(0.1, "normalized").fit(Gaussian([0.0, 1.0], var=[1.0, 0.0]),
                                                  [0.0, 1.0])
    with pytest.raises(TypeError, match="Gaussian or Samples"):
        ConformalRegressor(0.1, "normalized").fit(torch.zeros(3), torch.zeros(3))


def test_cqr_hand_worked_romano_score():
    q = Quantiles([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]], levels=[0.25, 0.75])
    y = torch.tensor([-1.0, 0.5, 3.0, 1.5])
    # scores max(q_lo - y, y - q_hi) = [1, -0.5, 2, 0.5]; alpha = 0.5: k = 3 -> 1.0
    cr = ConformalRegressor(0.5, score="cqr").fit(q, y)
    assert float(cr.threshold_) == 1.0
    lo, hi = cr.predict_interval(Quantiles([[2.0, 3.0]], levels=[0.25, 0.75]))
    assert lo.tolist() == [1.0] and hi.tolist() == [4.0]


def test_cqr_needs_the_alpha_levels():
    q = Quantiles([[0.0, 1.0]] * 3, levels=[0.1, 0.9])
    with pytest.raises(ValueError, match="alpha / 2"):
        ConformalRegressor(0.1, score="cqr").fit(q, torch.zeros(3))
    with pytest.raises(TypeError, match="Quantiles"):
        ConformalRegressor(0.1, score="cqr").fit(torch.zeros(3), torch.zeros(3))


def test_numpy_in_numpy_out_and_dtype():
    rng = np.random.default_rng(0)
    mu, y = rng.normal(size=30), rng.normal(size=30)
    cr = ConformalRegressor(0.2).fit(mu, y)
    lo, hi = cr.predict_interval(mu)
    assert isinstance(lo, np.ndarray) and lo.dtype == np.float64
    lo2, _ = cr.predict_interval(Gaussian(mu, var=np.ones(30)))
    assert isinstance(lo2, np.ndarray)
    lo3, _ = cr.predict_interval(torch.tensor(mu))
    assert isinstance(lo3, torch.Tensor)


def test_dense_pooled_threshold_equals_flat_fit_and_mask():
    g = torch.Generator().manual_seed(1)
    mu = torch.randn(6, 1, 5, 5, generator=g)
    y = mu + torch.randn(6, 1, 5, 5, generator=g)
    mask = torch.rand(6, 1, 5, 5, generator=g) > 0.3
    dense = ConformalRegressor(0.1).fit(mu, y, mask=mask)
    flat = ConformalRegressor(0.1).fit(mu[mask], y[mask])
    assert float(dense.threshold_) == float(flat.threshold_)
    assert dense.n_calib_ == int(mask.sum())
    lo, hi = dense.predict_interval(mu)
    assert lo.shape == mu.shape and torch.allclose(hi - lo, 2 * dense.threshold_.expand_as(lo))
    # ignore_value drops the same elements as the mask
    y0 = torch.where(mask, y, torch.zeros(()))
    again = ConformalRegressor(0.1).fit(mu, y0, ignore_value=0.0)
    assert float(again.threshold_) == float(dense.threshold_)


def test_too_few_points_gives_infinite_interval_with_warning():
    with pytest.warns(InfiniteIntervalWarning, match=r"n = 5 .*alpha = 0.1"):
        cr = ConformalRegressor(0.1).fit(torch.zeros(5), torch.ones(5))
    lo, hi = cr.predict_interval(torch.zeros(2))
    assert torch.isinf(lo).all() and torch.isinf(hi).all()


def test_mondrian_matches_per_group_reference():
    g = torch.Generator().manual_seed(2)
    n = 300
    groups = torch.randint(0, 4, (n,), generator=g) * 10  # labels 0, 10, 20, 30
    scale = 1.0 + groups.double() / 10
    mu = torch.zeros(n, dtype=torch.float64)
    y = torch.randn(n, generator=g, dtype=torch.float64) * scale
    cr = ConformalRegressor(0.1).fit(mu, y, groups=groups)
    for i, lab in enumerate(cr.groups_.tolist()):
        r = y[groups == lab].abs().tolist()
        ref = _kth(r, math.ceil((len(r) + 1) * 0.9))
        assert float(cr.threshold_[i]) == ref
    lo, hi = cr.predict_interval(torch.zeros(4, dtype=torch.float64),
                                 groups=torch.tensor([30, 0, 10, 20]))
    assert hi[0] == cr.threshold_[3] and hi[1] == cr.threshold_[0]
    with pytest.raises(ValueError, match=r"unseen group label\(s\) \[5\]"):
        cr.predict_interval(torch.zeros(2), groups=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="Expected `groups` at predict"):
        cr.predict_interval(torch.zeros(2))


def test_mondrian_small_group_warns_naming_it():
    s = torch.arange(1.0, 31.0)
    groups = torch.tensor([0] * 27 + [7] * 3)
    with pytest.warns(InfiniteIntervalWarning, match=r"alpha = 0.1.*\(group, n\) = \[\(7, 3\)\]"):
        labels, q, counts = mondrian_thresholds(s, groups, 0.1)
    assert labels.tolist() == [0, 7] and counts.tolist() == [27, 3]
    assert q[0] == _kth(list(range(1, 28)), math.ceil(28 * 0.9)) and math.isinf(q[1])


def test_mondrian_per_sample_groups_on_dense_target():
    mu = torch.zeros(40, 3)
    y = torch.arange(120.0).reshape(40, 3)
    groups = torch.arange(40) % 2
    cr = ConformalRegressor(0.2).fit(mu, y, groups=groups)
    even = y[0::2].reshape(-1).tolist()
    assert float(cr.threshold_[0]) == _kth(even, math.ceil(61 * 0.8))
    lo, _ = cr.predict_interval(torch.zeros(2, 3), groups=torch.tensor([1, 0]))
    assert lo.shape == (2, 3)


def test_weighted_equal_weights_is_unweighted_and_shift_reference():
    g = torch.Generator().manual_seed(3)
    mu = torch.zeros(40, dtype=torch.float64)
    y = torch.randn(40, generator=g, dtype=torch.float64)
    plain = ConformalRegressor(0.1).fit(mu, y)
    w = ConformalRegressor(0.1).fit(mu, y, weights=torch.ones(40))
    lo, hi = w.predict_interval(torch.zeros(3, dtype=torch.float64), test_weights=torch.ones(3))
    assert torch.equal(hi, plain.threshold_.expand(3))
    # reference from the definition: smallest score whose weighted CDF (test mass on +inf)
    # reaches 0.9
    wts = torch.rand(40, generator=g, dtype=torch.float64) + 0.5
    tw = 2.0
    cr = ConformalRegressor(0.1).fit(mu, y, weights=wts)
    s = y.abs().tolist()
    pairs = sorted(zip(s, wts.tolist(), strict=True))
    total = sum(wts.tolist()) + tw
    cum, ref = 0.0, math.inf
    for v, wi in pairs:
        cum += wi
        if cum / total >= 0.9 - 1e-12:
            ref = v
            break
    _, hi = cr.predict_interval(torch.zeros(1, dtype=torch.float64),
                                test_weights=torch.tensor([tw]))
    assert float(hi) == ref
    with pytest.raises(ValueError, match="test_weights"):
        cr.predict_interval(torch.zeros(1))


def test_bad_input_one_line():
    with pytest.raises(ValueError, match="alpha"):
        ConformalRegressor(alpha=1.5)
    with pytest.raises(ValueError, match="score"):
        ConformalRegressor(score="bogus")
    with pytest.raises(ValueError, match="target"):
        ConformalRegressor().fit(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="finite"):
        ConformalRegressor().fit(torch.zeros(3), torch.tensor([0.0, math.nan, 1.0]))
    with pytest.raises(ValueError, match="both"):
        ConformalRegressor().fit(torch.zeros(3), torch.zeros(3), groups=torch.zeros(3,
                                 dtype=torch.int64), weights=torch.ones(3))
    with pytest.raises(TypeError, match="integer"):
        ConformalRegressor().fit(torch.zeros(3), torch.zeros(3), groups=torch.zeros(3))
    with pytest.raises(NotFittedError):
        ConformalRegressor().predict_interval(torch.zeros(3))


def test_round_trip_and_clone():
    g = torch.Generator().manual_seed(4)
    mu, y = torch.zeros(50, dtype=torch.float64), torch.randn(50, generator=g,
                                                              dtype=torch.float64)
    groups = torch.arange(50) % 3
    for kw in ({}, {"groups": groups}, {"weights": torch.rand(50, generator=g) + 0.1}):
        cr = ConformalRegressor(0.2).fit(mu, y, **kw)
        back = ConformalRegressor.from_dict(json.loads(json.dumps(cr.to_dict())))
        pk = {"groups": torch.tensor([0, 2])} if "groups" in kw else (
            {"test_weights": torch.ones(2)} if "weights" in kw else {})
        a = cr.predict_interval(torch.zeros(2, dtype=torch.float64), **pk)
        b = back.predict_interval(torch.zeros(2, dtype=torch.float64), **pk)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    cr.set_params(alpha=0.3)
    with pytest.raises(NotFittedError):
        cr.predict_interval(torch.zeros(2))
    assert cr.get_params() == {"alpha": 0.3, "score": "absolute"}


def test_coverage_method():
    mu = torch.zeros(99)
    y = torch.arange(99.0) - 49
    cr = ConformalRegressor(0.1).fit(mu, y)
    # q = 90th smallest |y| (pairs +-k): |y| sorted 0,1,1,2,2,...: index 89 -> 45
    assert float(cr.threshold_) == 45.0
    assert cr.coverage(mu, y) == pytest.approx(91 / 99)


def test_kth_smallest_equals_kthvalue_on_every_path():
    """The CPU path (np.partition) gives torch.kthvalue's values, any dim, float32/float64; a
    tensor needing grad and an integer tensor take kthvalue itself."""
    from torchcal.conformal.core import kth_smallest

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(7, 31, 5, generator=g).to(dtype)
        for dim in (0, 1, 2, -1):
            for k in (1, 4, x.shape[dim]):
                got = kth_smallest(x, k, dim)
                assert got.dtype == dtype
                assert torch.equal(got, torch.kthvalue(x, k, dim=dim).values)
    x = torch.randn(9, requires_grad=True)
    assert torch.equal(kth_smallest(x, 3), torch.kthvalue(x, 3).values)
    assert kth_smallest(torch.arange(5), 2).item() == 1
    assert kth_smallest(torch.tensor([3.0, 1.0, 2.0]), 2).shape == ()


@pytest.mark.parametrize("order", ["random", "sorted", "reversed", "ties", "mostly_inf"])
def test_sampled_selection_is_exact(order):
    """The Floyd-Rivest path of kth_smallest (1-D, >= SAMPLED_SELECTION_MIN elements) equals a
    full sort's order statistic at every rank tried, on inputs that defeat a strided sample
    (sorted, reversed, heavy ties, a bracket at +inf) as well as random ones."""
    from torchcal.conformal.core import SAMPLED_SELECTION_MIN, kth_smallest

    g = torch.Generator().manual_seed(11)
    n = SAMPLED_SELECTION_MIN + 12345
    x = torch.randn(n, generator=g, dtype=torch.float64)
    x = {"random": x, "sorted": x.sort().values, "reversed": x.sort(descending=True).values,
         "ties": torch.randint(0, 4, (n,), generator=g).double(),
         "mostly_inf": torch.cat([torch.full((n - 7,), math.inf, dtype=torch.float64),
                                  x[:7]])}[order]
    ref = x.sort().values
    for k in (1, 2, 7, 8, n // 3, int(0.9 * n) + 1, n - 1, n):
        assert kth_smallest(x, k).item() == ref[k - 1].item()
    assert kth_smallest(x.float(), n // 2).dtype == torch.float32

"""bootstrap_ci: the vectorised paths equal a per-resample loop over the same index sets."""

import numpy as np
import pytest
import torch

import torchcal.metrics as M
from torchcal.metrics.bootstrap import resample_indices


def _data(n=150, c=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = 2.5 * torch.randn(n, c, generator=g, dtype=torch.float64)
    y = torch.randint(0, c, (n,), generator=g)
    return z, y


def _loop(fn, z, y, n_resamples, seed, level=0.9, **kw):
    idx = resample_indices(z.shape[0], n_resamples, seed)
    vals = torch.stack([fn(logits=z[i], labels=y[i], **kw).double() for i in idx])
    return np.quantile(vals.numpy(), [(1 - level) / 2, (1 + level) / 2])


@pytest.mark.parametrize("name,kw", [
    ("ece", {}), ("mce", {"n_bins": 7}), ("rmsce", {}), ("adaptive_ece", {"n_bins": 10}),
    ("classwise_ece", {"n_bins": 5}), ("nll", {}), ("brier", {}), ("error", {}),
    ("topk_error", {"k": 2}),
])
def test_vectorised_equals_loop(name, kw):
    z, y = _data()
    fn = getattr(M, name)
    res = M.bootstrap_ci(name, logits=z, labels=y, n_resamples=25, seed=3, **kw)
    assert res.estimate.item() == fn(logits=z, labels=y, **kw).item()
    lo, hi = _loop(fn, z, y, 25, 3, **kw)
    assert res.low.item() == pytest.approx(lo, abs=1e-12)
    assert res.high.item() == pytest.approx(hi, abs=1e-12)
    assert res.low.item() <= res.high.item()
    # the function object and its name give the same result; a wrapper takes the loop path
    res_fn = M.bootstrap_ci(fn, logits=z, labels=y, n_resamples=25, seed=3, **kw)
    assert torch.equal(torch.stack(res_fn), torch.stack(res))
    if name in ("ece", "adaptive_ece"):
        res_wrap = M.bootstrap_ci(lambda **a: fn(**a), logits=z, labels=y, n_resamples=25,
                                  seed=3, **kw)
        assert res_wrap.low.item() == pytest.approx(lo, abs=1e-12)


def test_batching_does_not_change_results(monkeypatch):
    import torchcal.metrics.bootstrap as b

    z, y = _data(n=123)
    names = ["ece", "adaptive_ece", "classwise_ece", "nll"]
    full = [M.bootstrap_ci(n, logits=z, labels=y, n_resamples=30) for n in names]
    monkeypatch.setattr(b, "_BATCH_ELEMENTS", 123 * 7)  # 7 resamples per batch
    for n, r in zip(names, full, strict=True):
        r2 = M.bootstrap_ci(n, logits=z, labels=y, n_resamples=30)
        assert r2.low.item() == pytest.approx(r.low.item(), abs=1e-14)
        assert r2.high.item() == pytest.approx(r.high.item(), abs=1e-14)


def test_seed_level_and_dtype():
    z, y = _data()
    a = M.bootstrap_ci("ece", logits=z, labels=y, n_resamples=50, seed=1)
    b = M.bootstrap_ci("ece", logits=z, labels=y, n_resamples=50, seed=1)
    c = M.bootstrap_ci("ece", logits=z, labels=y, n_resamples=50, seed=2)
    assert a == b and a != c
    wide = M.bootstrap_ci("ece", logits=z, labels=y, n_resamples=200, level=0.99)
    narrow = M.bootstrap_ci("ece", logits=z, labels=y, n_resamples=200, level=0.5)
    assert wide.low <= narrow.low <= narrow.high <= wide.high
    f32 = M.bootstrap_ci("ece", logits=z.float(), labels=y, n_resamples=20)
    assert f32.estimate.dtype == f32.low.dtype == torch.float32
    # probs and numpy input
    r = M.bootstrap_ci("classwise_ece", probs=torch.softmax(z, 1).numpy(), labels=y.numpy(),
                       n_resamples=20)
    assert r.estimate.item() == pytest.approx(M.classwise_ece(logits=z, labels=y).item(), abs=1e-12)


def test_interval_covers_the_truth_on_a_calibrated_source():
    # the 90% interval of ECE on one sample from a miscalibrated source contains the
    # population value (0.1) - the estimate is unbiased enough at N = 20000 with 15 bins
    g = np.random.default_rng(0)
    u = g.uniform(0.6, 1.0, 20000)
    y = (g.uniform(size=u.shape[0]) >= u - 0.1).astype(np.int64)
    p = np.stack([u, 1 - u], 1)
    r = M.bootstrap_ci("ece", probs=p, labels=y, n_resamples=200)
    assert r.low.item() < 0.1 + 0.005 and r.high.item() > 0.1 - 0.005
    assert r.high.item() - r.low.item() < 0.02


def test_error_interval_uses_the_arg_max_rule_on_tied_probabilities():
    # tied rows [.5, .5] with label 1: `error` counts them wrong (arg-max = first index), so
    # every resample's error is the share of tied rows - never an interval [0, 0] around 0.5
    p = torch.full((20, 2), 0.5, dtype=torch.float64)
    p[:10] = torch.tensor([0.9, 0.1], dtype=torch.float64)
    y = torch.ones(20, dtype=torch.long)
    y[:10] = 0
    res = M.bootstrap_ci("error", probs=p, labels=y, n_resamples=50, seed=1)
    assert res.estimate.item() == 0.5
    idx = resample_indices(20, 50, 1)
    vals = np.array([M.error(probs=p[i], labels=y[i]).item() for i in idx])
    lo, hi = np.quantile(vals, [0.05, 0.95])
    assert res.low.item() == pytest.approx(lo, abs=1e-12) and lo > 0.2
    assert res.high.item() == pytest.approx(hi, abs=1e-12)
    # top-k error has its own rule (ties count as misses: here the tied rows, as for `error`),
    # still equal to a loop
    res_k = M.bootstrap_ci("topk_error", probs=p, labels=y, n_resamples=50, seed=1, k=1)
    vals_k = np.array([M.topk_error(probs=p[i], labels=y[i], k=1).item() for i in idx])
    assert res_k.estimate.item() == 0.5
    assert res_k.low.item() == pytest.approx(np.quantile(vals_k, 0.05), abs=1e-12)
    assert res_k.high.item() == pytest.approx(np.quantile(vals_k, 0.95), abs=1e-12)

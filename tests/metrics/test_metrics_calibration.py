"""ECE, MCE, RMSCE, AdaECE, Classwise-ECE and the reliability curve: hand-worked values, slow
references from the formulas, torchmetrics agreement, bin edges in every dtype, properties."""

import os
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchcal.metrics as M

sys.path.insert(0, os.path.dirname(__file__))
import metrics_reference as ref  # noqa: E402

# The doctest example, worked by hand:
#   sample  probs              label  conf  pred  correct
#   0       (.2, .5, .3)       1      .5    1     yes
#   1       (.9, .05, .05)     0      .9    0     yes
#   2       (.3, .3, .4)       0      .4    2     no
#   3       (.1, .8, .1)       2      .8    1     no
PROBS = torch.tensor([[0.2, 0.5, 0.3], [0.9, 0.05, 0.05], [0.3, 0.3, 0.4], [0.1, 0.8, 0.1]],
                     dtype=torch.float64)
LABELS = torch.tensor([1, 0, 0, 2])


def test_hand_worked_top_label():
    # bin 0 = samples {0, 2}: mean conf .45, accuracy 1/2 -> gap .05
    # bin 1 = samples {1, 3}: mean conf .85, accuracy 1/2 -> gap .35
    # ECE = 2/4 * .05 + 2/4 * .35 = .2; MCE = .35; RMSCE = sqrt(.5 * .0025 + .5 * .1225) = .25
    assert M.ece(probs=PROBS, labels=LABELS, n_bins=2).item() == pytest.approx(0.2, abs=1e-15)
    assert M.mce(probs=PROBS, labels=LABELS, n_bins=2).item() == pytest.approx(0.35, abs=1e-15)
    assert M.rmsce(probs=PROBS, labels=LABELS, n_bins=2).item() == pytest.approx(0.25, abs=1e-15)
    # one bin: conf mean .65, accuracy .5 -> ECE = MCE = RMSCE = .15
    for f in (M.ece, M.mce, M.rmsce, M.adaptive_ece):
        assert f(probs=PROBS, labels=LABELS, n_bins=1).item() == pytest.approx(0.15, abs=1e-15)


def test_hand_worked_adaptive():
    # sorted conf .4 .5 .8 .9, B = 4 -> interior edges s_0, s_1, s_2 = .4, .5, .8: one sample
    # per bin; gaps |1-.5|, |1-.9|, |0-.4|, |0-.8| -> AdaECE = (.5 + .1 + .4 + .8) / 4 = .45
    assert M.adaptive_ece(probs=PROBS, labels=LABELS, n_bins=4).item() == pytest.approx(
        0.45, abs=1e-15)
    # equal-width with 4 bins puts .4 and .5 together in (.25, .5]: differs
    assert M.ece(probs=PROBS, labels=LABELS, n_bins=4).item() == pytest.approx(0.2, abs=1e-15)


def test_hand_worked_classwise():
    # class 0: p = .2 .9 .3 .1, [y=0] = 0 1 1 0; bin 0 {.2,.3,.1} sum .6 vs 1 -> .4; bin 1 {.9}
    #          vs 1 -> .1; ECE_0 = .5/4
    # class 1: p = .5 .05 .3 .8, [y=1] = 1 0 0 0; bin 0 sum .85 vs 1 -> .15; bin 1 .8 vs 0 -> .8
    # class 2: p = .3 .05 .4 .1, [y=2] = 0 0 0 1; bin 0 sum .85 vs 1 -> .15
    # CW-ECE = (.5 + .95 + .15) / (4 * 3) = 2/15
    out = M.classwise_ece(probs=PROBS, labels=LABELS, n_bins=2)
    assert out.item() == pytest.approx(2 / 15, abs=1e-15)


def _random(n, c, seed, dtype=torch.float64, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(n, c, generator=g, dtype=torch.float64)
    y = torch.randint(0, c, (n,), generator=g)
    return z.to(dtype), y


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("n_bins", [1, 3, 15])
def test_against_slow_reference(dtype, n_bins):
    z, y = _random(300, 5, seed=n_bins, dtype=torch.float64)
    p = torch.softmax(z, 1).to(dtype)
    # re-normalisation is not needed: the tolerance on row sums is 1e-3
    e, m, r = ref.top_label_errors(p, y, n_bins)
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    assert M.ece(probs=p, labels=y, n_bins=n_bins).item() == pytest.approx(e, abs=tol)
    assert M.mce(probs=p, labels=y, n_bins=n_bins).item() == pytest.approx(m, abs=tol)
    assert M.rmsce(probs=p, labels=y, n_bins=n_bins).item() == pytest.approx(r, abs=tol)
    ea, _, _ = ref.top_label_errors(p, y, n_bins, equal_mass=True)
    assert M.adaptive_ece(probs=p, labels=y, n_bins=n_bins).item() == pytest.approx(ea, abs=tol)
    cw = ref.classwise_ece(p, y, n_bins)
    assert M.classwise_ece(probs=p, labels=y, n_bins=n_bins).item() == pytest.approx(cw, abs=tol)


def test_adaptive_with_ties_and_small_n_against_reference():
    # heavy ties: confidences on a coarse grid; N not divisible by B; N < B
    g = torch.Generator().manual_seed(3)
    for n, b in [(37, 5), (7, 15), (60, 15), (1, 15)]:
        conf = 0.5 + torch.randint(0, 6, (n,), generator=g).double() / 10
        p = torch.stack([conf, 1 - conf], 1)
        y = torch.randint(0, 2, (n,), generator=g)
        ea, _, _ = ref.top_label_errors(p, y, b, equal_mass=True)
        assert M.adaptive_ece(probs=p, labels=y, n_bins=b).item() == pytest.approx(ea, abs=1e-12)


def test_equal_mass_bins_hold_equal_counts_without_ties():
    n, b = 1000, 15
    conf = torch.linspace(0.3, 0.99, n, dtype=torch.float64)[torch.randperm(n)]
    idx, _ = M.equal_mass_bin_index(conf, b)
    counts = torch.bincount(idx, minlength=b)
    expected = torch.tensor([(k + 1) * n // b - k * n // b for k in range(b)])
    assert torch.equal(counts, expected)


def _away_from_edges(p, n_bins, eps=1e-5):
    conf = p.max(1).values.double()
    d = (conf * n_bins - torch.round(conf * n_bins)).abs() / n_bins
    return d > eps


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_bins", [5, 15])
def test_agrees_with_torchmetrics(dtype, n_bins):
    # a hard import: torchmetrics is in the `test` extra, a missing one must fail, not skip
    import torchmetrics.functional.classification as tm

    z, y = _random(4000, 10, seed=7, dtype=dtype)
    p = torch.softmax(z, 1)
    keep = _away_from_edges(p, n_bins)
    p, y = p[keep], y[keep]
    for norm, fn in [("l1", M.ece), ("max", M.mce), ("l2", M.rmsce)]:
        theirs = tm.multiclass_calibration_error(p, y, num_classes=10, n_bins=n_bins, norm=norm)
        ours = fn(probs=p, labels=y, n_bins=n_bins)
        assert abs(ours.item() - theirs.item()) < 1e-6, norm


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_bin_edges_exact_in_every_dtype(dtype):
    b = 15
    edges = torch.arange(b + 1, dtype=dtype) / b
    idx = M.equal_width_bin_index(edges, b)
    # 0 -> bin 0, e_k -> bin k - 1 (k >= 1), 1.0 -> bin B - 1
    assert idx.tolist() == [0] + list(range(b))
    eleven = torch.tensor(11, dtype=dtype) / 15
    assert M.equal_width_bin_index(eleven.reshape(1), b).item() == 10
    # the next representable value above an edge goes to the next bin
    above = torch.nextafter(eleven, torch.tensor(2.0, dtype=dtype)) if dtype in (
        torch.float32, torch.float64) else None
    if above is not None:
        assert M.equal_width_bin_index(above.reshape(1), b).item() == 11
    # against the per-value reference rule
    vals = torch.rand(200, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    vals = torch.cat([vals, edges])
    ours = M.equal_width_bin_index(vals, b).tolist()
    assert ours == [ref.equal_width_bin(float(v), b, dtype) for v in vals]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_confidences_on_edges_ece(dtype):
    # two classes, confidences exactly on edges k/B >= 1/2 (and 1.0): ECE by the reference
    b = 10
    conf = torch.arange(5, b + 1, dtype=dtype) / b
    p = torch.stack([conf, 1 - conf], 1)
    y = torch.tensor([0, 1, 0, 0, 1, 0])
    e, m, r = ref.top_label_errors(p, y, b)
    assert M.ece(probs=p, labels=y, n_bins=b).item() == pytest.approx(e, abs=1e-7)
    assert M.mce(probs=p, labels=y, n_bins=b).item() == pytest.approx(m, abs=1e-7)
    curve = M.reliability_curve(probs=p, labels=y, n_bins=b)
    # 0.5 in bin 4, 0.6 in bin 5, ..., 1.0 in bin 9: no hidden extra bin
    assert curve.counts.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert curve.edges.dtype == dtype and curve.edges.shape == (b + 1,)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_classwise_on_edges_zero_and_one(dtype):
    # Classwise-ECE bins every p_ik, so exact 0 (first bin), 1.0 (last bin) and values equal to
    # an edge k/B (bin k - 1) all occur: one-hot rows, rows on the edge grid, against the
    # per-value reference rule in the input's dtype
    b = 5
    edges = torch.arange(b + 1, dtype=dtype) / b
    rows = [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]
    for k in range(b + 1):
        rows.append([float(edges[k]), float(1 - edges[k]), 0.0])
        rows.append([0.0, float(edges[k]), float(1 - edges[k])])
    p = torch.tensor(rows, dtype=torch.float64).to(dtype)
    y = torch.arange(p.shape[0]) % 3
    got = M.classwise_ece(probs=p, labels=y, n_bins=b, validate_args=False).item()
    assert got == pytest.approx(ref.classwise_ece(p, y, b), abs=1e-6)
    # a wrong convention changes the value on this data: 0 and 1 in their own extra bins, or
    # edges assigned to the bin above (left-closed bins), give a different answer
    left_closed = torch.bucketize(p.double(), edges[1:-1].double(), right=True)
    assert not torch.equal(left_closed, M.equal_width_bin_index(p, b))


def test_reliability_curve_consistent_with_ece():
    z, y = _random(500, 4, seed=11)
    for strategy, fn in [("uniform", M.ece), ("quantile", M.adaptive_ece)]:
        c = M.reliability_curve(logits=z, labels=y, n_bins=7, strategy=strategy)
        filled = c.counts > 0
        assert c.counts.sum().item() == 500
        assert torch.isnan(c.accuracies[~filled]).all()
        gap = (c.accuracies[filled] - c.confidences[filled]).abs() * c.counts[filled]
        assert (gap.sum() / 500).item() == pytest.approx(fn(logits=z, labels=y, n_bins=7).item(),
                                                          abs=1e-12)
        assert c.edges[0].item() == 0.0 and c.edges[-1].item() == 1.0
        assert bool((c.edges[1:] >= c.edges[:-1]).all())
    with pytest.raises(ValueError, match="`strategy`"):
        M.reliability_curve(logits=z, labels=y, strategy="kmeans")


def test_logits_equal_probs_and_numpy_input():
    z, y = _random(200, 6, seed=1)
    p = torch.softmax(z, 1)
    for fn in (M.ece, M.mce, M.rmsce, M.adaptive_ece, M.classwise_ece):
        a = fn(logits=z, labels=y)
        b = fn(probs=p, labels=y)
        c = fn(logits=z.numpy(), labels=y.numpy())
        assert a.item() == pytest.approx(b.item(), abs=1e-14)
        assert isinstance(c, torch.Tensor) and c.ndim == 0 and c.device.type == "cpu"
        assert c.item() == pytest.approx(a.item(), abs=1e-14)


@pytest.mark.parametrize("dtype,expected", [(torch.float16, torch.float32),
                                            (torch.bfloat16, torch.float32),
                                            (torch.float32, torch.float32),
                                            (torch.float64, torch.float64)])
def test_result_dtype_and_input_not_modified(dtype, expected):
    z, y = _random(100, 3, seed=2)
    p = torch.softmax(z, 1).to(dtype)
    before = p.clone()
    for fn in (M.ece, M.mce, M.rmsce, M.adaptive_ece, M.classwise_ece):
        out = fn(probs=p, labels=y, validate_args=dtype not in (torch.float16, torch.bfloat16))
        assert out.dtype == expected and out.ndim == 0
    assert torch.equal(p, before)


def test_classwise_chunking_matches_one_chunk(monkeypatch):
    import torchcal.metrics.binning as common

    z, y = _random(301, 7, seed=5)
    full = M.classwise_ece(logits=z, labels=y)
    monkeypatch.setattr(common, "_CHUNK_ELEMENTS", 50)  # 7 rows per chunk
    chunked = M.classwise_ece(logits=z, labels=y)
    assert chunked.item() == pytest.approx(full.item(), abs=1e-15)


# --------------------------------------------------------------------------- properties
sizes = st.tuples(st.integers(1, 60), st.integers(2, 6), st.integers(1, 20),
                  st.integers(0, 2**31 - 1), st.floats(0.0, 8.0),
                  st.sampled_from([torch.float16, torch.float32, torch.float64]))


@settings(max_examples=60, deadline=None, database=None)
@given(sizes)
def test_properties(args):
    # float16 logits give many tied (and exactly 0 / 1) probabilities: ties in the equal-mass
    # bins, exact zeros in Classwise-ECE's first bin
    n, c, b, seed, scale, dtype = args
    z, y = _random(n, c, seed=seed, scale=scale, dtype=dtype)
    e = M.ece(logits=z, labels=y, n_bins=b).item()
    m = M.mce(logits=z, labels=y, n_bins=b).item()
    r = M.rmsce(logits=z, labels=y, n_bins=b).item()
    a = M.adaptive_ece(logits=z, labels=y, n_bins=b).item()
    cw = M.classwise_ece(logits=z, labels=y, n_bins=b).item()
    for v in (e, m, r, a, cw):
        assert 0.0 <= v <= 1.0
    # MCE >= RMSCE >= ECE (max >= quadratic mean >= mean of the per-bin gaps)
    assert m >= r - 1e-12 and r >= e - 1e-12
    # order invariance (float64 sums in another order may move a float32 result by one ulp)
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    for fn, v in ((M.ece, e), (M.mce, m), (M.rmsce, r), (M.adaptive_ece, a),
                  (M.classwise_ece, cw)):
        assert fn(logits=z[perm], labels=y[perm], n_bins=b).item() == pytest.approx(v, abs=tol)
    # and the slow reference from the formulas on the same (possibly tied) probabilities
    probs = torch.softmax(z if dtype == torch.float64 else z.float(), 1).to(dtype)
    ea, _, _ = ref.top_label_errors(probs, y, b, equal_mass=True)
    assert a == pytest.approx(ea, abs=tol)
    assert cw == pytest.approx(ref.classwise_ece(probs, y, b), abs=tol)


def _calibrated_source(n, seed):
    """Confidence u ~ U(1/2, 1) for class 0 (a 2-class problem), label 0 with probability u."""
    g = np.random.default_rng(seed)
    u = g.uniform(0.5, 1.0, n)
    y = (g.uniform(size=n) >= u).astype(np.int64)
    return np.stack([u, 1 - u], 1), y


@pytest.mark.parametrize("seed", [0, 1])
def test_perfectly_calibrated_source_tends_to_zero(seed):
    values = []
    for n in (1_000, 10_000, 200_000):
        p, y = _calibrated_source(n, seed)
        values.append((M.ece(probs=p, labels=y).item(), M.adaptive_ece(probs=p, labels=y).item(),
                       M.classwise_ece(probs=p, labels=y).item()))
    for k in range(3):
        assert values[-1][k] < 0.01
        assert values[-1][k] < values[0][k]
    # and a miscalibrated source does not: confidence u, accuracy u - 0.2
    g = np.random.default_rng(seed)
    u = g.uniform(0.7, 1.0, 200_000)
    y = (g.uniform(size=u.shape[0]) >= u - 0.2).astype(np.int64)
    p = np.stack([u, 1 - u], 1)
    assert M.ece(probs=p, labels=y).item() == pytest.approx(0.2, abs=0.01)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_confidence_gap_against_numpy(dtype):
    """Mean top-1 confidence minus accuracy, against a NumPy float64 computation; logits and
    probs agree, and the sign says over- (> 0) or under-confident (< 0)."""
    g = torch.Generator().manual_seed(3)
    z = (torch.randn(257, 6, generator=g) * 2).to(dtype)
    y = torch.randint(0, 6, (257,), generator=g)
    zn = z.double().numpy()
    p = np.exp(zn - zn.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = p.max(1).mean() - (p.argmax(1) == y.numpy()).mean()
    got = M.confidence_gap(logits=z, labels=y)
    assert got.dtype == dtype and got.ndim == 0
    assert float(got) == pytest.approx(want, abs=1e-6 if dtype == torch.float32 else 1e-12)
    assert float(M.confidence_gap(probs=torch.softmax(z.double(), 1), labels=y)) == \
        pytest.approx(want, abs=1e-12)
    over = M.confidence_gap(probs=torch.tensor([[0.9, 0.1]] * 2), labels=torch.tensor([0, 1]))
    assert float(over) == pytest.approx(0.4)  # confidence 0.9, accuracy 0.5
    with pytest.raises(ValueError, match="`labels`"):
        M.confidence_gap(logits=z, labels=y[:-1])


def test_ece_noise_floor_is_the_metrics_one():
    from torchcal.metrics import ece_noise_floor

    assert ece_noise_floor is M.ece_noise_floor
    # one bin, c = 0.5: E|Bin(n, 1/2)/n - 1/2| (exact by summing the binomial law)
    from math import comb

    n = 40
    exact = sum(comb(n, k) * abs(k / n - 0.5) for k in range(n + 1)) / 2 ** n
    assert M.ece_noise_floor([0.5] * n, n_bins=1, n_draws=20000) == pytest.approx(exact, rel=0.03)

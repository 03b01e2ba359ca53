"""ACE, smooth ECE, debiased ECE and the KS calibration error: each against its reference
implementation on the same inputs (relplot, uncertainty-calibration) or a slow reference
written here from the published definition, plus hand-worked values and properties."""

import math
import os
import sys

import numpy as np
import pytest
import torch

import torchcal.metrics as M

sys.path.insert(0, os.path.dirname(__file__))
import metrics_reference as ref  # noqa: E402


def draw(n, c, seed, *, scale=2.0, calibrated=False, dtype=torch.float64):
    """Softmax probabilities and labels; ``calibrated`` draws the labels from the probs."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(n, c, generator=g, dtype=torch.float64) * scale, dim=1)
    if calibrated:
        y = torch.multinomial(p, 1, generator=g).squeeze(1)
    else:
        y = torch.randint(0, c, (n,), generator=g)
    return p.to(dtype), y


# ----------------------------------------------------------------------------------------- ACE


def published_ace(probs, labels, n_bins):
    """focal_calibration's average_calibration_error, from its definition: bin ceil(B c - 1)
    of the top-1 confidence (Python floats), sum over all bins of |acc - conf| (an empty bin
    adds 0), divided by the number of non-empty bins."""
    count = [0] * n_bins
    conf = [0.0] * n_bins
    acc = [0] * n_bins
    for (c, pred), y in zip(ref.top1(probs), labels.tolist(), strict=True):
        b = int(math.ceil(n_bins * c - 1))
        count[b] += 1
        conf[b] += c
        acc[b] += pred == y
    total = sum(abs(acc[b] / count[b] - conf[b] / count[b]) for b in range(n_bins) if count[b])
    return total / sum(1 for k in count if k)


def our_rule_ace(probs, labels, n_bins):
    """The same average over non-empty bins with the project's bin rule (edges k/B in the
    input's dtype, right-closed, 0 in the first bin)."""
    bins = {}
    for (c, pred), y in zip(ref.top1(probs), labels.tolist(), strict=True):
        bins.setdefault(ref.equal_width_bin(c, n_bins, probs.dtype), []).append(
            (c, float(pred == y)))
    gaps = [abs(math.fsum(a for _, a in v) / len(v) - math.fsum(c for c, _ in v) / len(v))
            for v in bins.values()]
    return math.fsum(gaps) / len(gaps)


def test_ace_hand_worked():
    # bins of 4: conf .4 (pred 2, wrong) alone in (.25, .5]; .8 .9 .95 (right, right, wrong)
    # in (.75, 1]: gaps |0 - .4| = .4 and |2/3 - .8833| = .2167 -> ACE = .3083; ECE weights
    # them 1/4 and 3/4 instead: .1 + .1625 = .2625
    probs = torch.tensor([[0.3, 0.3, 0.4], [0.8, 0.1, 0.1], [0.9, 0.05, 0.05],
                          [0.95, 0.03, 0.02]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 1])
    gap = abs(2 / 3 - (0.8 + 0.9 + 0.95) / 3)
    assert M.ace(probs=probs, labels=labels, n_bins=4).item() == pytest.approx(
        (0.4 + gap) / 2, abs=1e-15)
    assert M.ece(probs=probs, labels=labels, n_bins=4).item() == pytest.approx(
        0.25 * 0.4 + 0.75 * gap, abs=1e-15)


@pytest.mark.parametrize(("n", "c", "n_bins", "seed"), [(50, 3, 10, 0), (400, 10, 15, 1),
                                                         (1000, 5, 7, 2)])
def test_ace_matches_the_published_definition(n, c, n_bins, seed):
    probs, labels = draw(n, c, seed)
    out = M.ace(probs=probs, labels=labels, n_bins=n_bins)
    assert out.dtype == torch.float64
    assert out.item() == pytest.approx(published_ace(probs, labels, n_bins), abs=1e-12)
    assert out.item() == pytest.approx(our_rule_ace(probs, labels, n_bins), abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_ace_bins_by_the_documented_rule_on_the_edges(dtype):
    # confidences exactly on the edges k/B in the input's dtype, where ceil(B c - 1) can differ
    n_bins = 10
    edges = torch.arange(n_bins + 1, dtype=dtype) / n_bins
    conf = edges[3:].repeat(4)
    probs = torch.stack([conf, 1 - conf], dim=1)
    labels = torch.arange(conf.shape[0]) % 3 == 0
    out = M.ace(probs=probs, labels=labels.long(), n_bins=n_bins, validate_args=False)
    assert out.item() == pytest.approx(our_rule_ace(probs, labels.long(), n_bins), abs=1e-6)


def test_ace_bootstrap_is_vectorised_and_matches_the_loop():
    probs, labels = draw(300, 4, 3)
    fast = M.bootstrap_ci("ace", probs=probs, labels=labels, n_resamples=40, seed=1)
    slow = M.bootstrap_ci(lambda **kw: M.ace(**kw), probs=probs, labels=labels,
                          n_resamples=40, seed=1)
    assert torch.allclose(torch.stack(fast), torch.stack(slow), atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------ smooth ECE


@pytest.fixture(scope="module")
def relplot():
    return pytest.importorskip("relplot")


@pytest.mark.parametrize(("n", "c", "seed", "scale"), [(4, 2, 0, 1.0), (300, 5, 1, 2.0),
                                                       (5000, 10, 2, 3.0), (2000, 3, 3, 0.3)])
def test_smooth_ece_matches_relplot(relplot, n, c, seed, scale):
    probs, labels = draw(n, c, seed, scale=scale)
    f, y = relplot.multiclass_logits_to_confidences(probs.numpy(), labels.numpy(), probs=True)
    expected, sigma = relplot.smECE(f, y, return_width=True)
    assert M.smooth_ece(probs=probs, labels=labels).item() == pytest.approx(expected,
                                                                            abs=1e-12)
    for s in (0.05, 0.003, 1.0):
        assert M.smooth_ece(probs=probs, labels=labels, sigma=s).item() == pytest.approx(
            relplot.smECE_sigma(f, y, s), abs=1e-12)
    curve = M.smooth_reliability_curve(probs=probs, labels=labels)
    assert curve.sigma == sigma
    assert curve.smooth_ece.item() == pytest.approx(expected, abs=1e-12)
    diagram = relplot.prepare_rel_diagram(f, y, plot_confidence_band=False,
                                          report_CE_std=False)
    np.testing.assert_allclose(curve.mesh.numpy(), diagram["mesh"], rtol=0, atol=1e-15)
    np.testing.assert_allclose(curve.accuracies.numpy(), diagram["mu"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(curve.density.numpy(), diagram["density"], rtol=1e-9,
                               atol=1e-12)


def test_smooth_ece_from_logits_and_float32_follow_the_same_numbers(relplot):
    probs, labels = draw(800, 4, 4)
    z = probs.log()
    expected = M.smooth_ece(probs=probs, labels=labels)
    assert M.smooth_ece(logits=z, labels=labels).item() == pytest.approx(expected.item(),
                                                                         abs=1e-12)
    out = M.smooth_ece(probs=probs.float(), labels=labels)
    assert out.dtype == torch.float32
    f, y = relplot.multiclass_logits_to_confidences(probs.float().numpy(), labels.numpy(),
                                                    probs=True)
    assert out.item() == pytest.approx(relplot.smECE(f.astype(np.float64), y), abs=1e-6)


def test_smooth_ece_is_small_when_calibrated_and_large_when_not():
    probs, labels = draw(20000, 5, 5, calibrated=True)
    assert M.smooth_ece(probs=probs, labels=labels).item() < 0.02
    sharp = torch.softmax(probs.log() * 3, dim=1)  # over-confident
    assert M.smooth_ece(probs=sharp, labels=labels).item() > 0.05


def test_smooth_reliability_curve_is_a_density_and_an_accuracy():
    probs, labels = draw(3000, 4, 6, calibrated=True)
    curve = M.smooth_reliability_curve(probs=probs, labels=labels, n_points=101)
    assert curve.mesh.shape == curve.accuracies.shape == curve.density.shape == (101,)
    assert torch.trapezoid(curve.density, curve.mesh).item() == pytest.approx(1.0, abs=0.02)
    dense = curve.density > 0.5
    assert ((curve.accuracies[dense] - curve.mesh[dense]).abs() < 0.1).all()


# ---------------------------------------------------------------------------- debiased ECE


@pytest.fixture(scope="module")
def calibration_pkg():
    return pytest.importorskip("calibration")  # the uncertainty-calibration package


@pytest.mark.parametrize(("n", "c", "n_bins", "seed"), [
    (5, 3, 15, 0), (100, 4, 15, 1), (997, 3, 7, 2), (5000, 10, 15, 3), (64, 2, 1, 4)])
@pytest.mark.parametrize("calibrated", [False, True])
def test_debiased_ece_matches_uncertainty_calibration(calibration_pkg, n, c, n_bins, seed,
                                                      calibrated):
    cal = calibration_pkg
    probs, labels = draw(n, c, seed, calibrated=calibrated)
    p, y = probs.numpy(), labels.numpy()
    quantile = cal.lower_bound_scaling_ce(p, y, p=2, debias=True, num_bins=n_bins,
                                          mode="top-label")
    uniform = cal.lower_bound_scaling_ce(p, y, p=2, debias=True, num_bins=n_bins,
                                         binning_scheme=cal.get_equal_prob_bins,
                                         mode="top-label")
    assert M.debiased_ece(probs=probs, labels=labels, n_bins=n_bins).item() == pytest.approx(
        quantile, abs=1e-12)
    assert M.debiased_ece(probs=probs, labels=labels, n_bins=n_bins,
                          strategy="uniform").item() == pytest.approx(uniform, abs=1e-12)
    if n_bins == 15:  # the package's headline call
        assert M.debiased_ece(probs=probs, labels=labels).item() == pytest.approx(
            cal.get_calibration_error(p, y, mode="top-label"), abs=1e-12)


def test_debiased_ece_with_tied_confidences(calibration_pkg):
    cal = calibration_pkg
    g = torch.Generator().manual_seed(7)
    conf = torch.tensor([0.5, 0.6, 0.7, 0.9], dtype=torch.float64)[
        torch.randint(0, 4, (300,), generator=g)]
    probs = torch.stack([conf, 1 - conf], dim=1)
    labels = (torch.rand(300, generator=g, dtype=torch.float64) > conf).long()
    expected = cal.lower_bound_scaling_ce(probs.numpy(), labels.numpy(), p=2, debias=True,
                                          num_bins=10, mode="top-label")
    assert M.debiased_ece(probs=probs, labels=labels, n_bins=10).item() == pytest.approx(
        expected, abs=1e-12)


def test_debiased_ece_hand_worked():
    # quantile edge (.6 + .9) / 2: bin {.6 x4} all right: (.6 - 1)^2 - 0 = .16; bin {.9 x4}
    # half right: (.9 - .5)^2 - .25 / 3; mean of the two, then the square root
    probs = torch.tensor([[0.9, 0.1]] * 4 + [[0.6, 0.4]] * 4, dtype=torch.float64)
    labels = torch.tensor([1, 1, 0, 0, 0, 0, 0, 0])
    expected = math.sqrt((0.16 + 0.16 - 0.25 / 3) / 2)
    assert M.debiased_ece(probs=probs, labels=labels, n_bins=2).item() == pytest.approx(
        expected, abs=1e-15)


def test_debiased_ece_removes_the_plug_in_bias_on_calibrated_data():
    debiased, plug_in = [], []
    for seed in range(20):
        probs, labels = draw(500, 4, 100 + seed, calibrated=True)
        debiased.append(M.debiased_ece(probs=probs, labels=labels).item())
        plug_in.append(M.rmsce(probs=probs, labels=labels).item())
    assert np.mean(debiased) < 0.5 * np.mean(plug_in)


# -------------------------------------------------------------------------------- KS error


def ks_reference(probs, labels):
    """Gupta et al. 2021: max over thresholds s of |(1/N) sum_{conf <= s} (a - conf)|, with
    the sums written out per distinct threshold."""
    tl = ref.top1(probs)
    ys = labels.tolist()
    pairs = [(c, float(pred == y)) for (c, pred), y in zip(tl, ys, strict=True)]
    best = 0.0
    for s in sorted({c for c, _ in pairs}):
        h = math.fsum(a for c, a in pairs if c <= s)
        h_tilde = math.fsum(c for c, _ in pairs if c <= s)
        best = max(best, abs(h - h_tilde))
    return best / len(pairs)


def ks_published(probs, labels):
    """The spline paper's code: sort, cumulative sums, the max over every prefix."""
    conf, pred = probs.max(dim=1)
    a = (pred == labels).double().numpy()
    order = np.argsort(conf.numpy())
    n = len(a)
    return np.abs(np.cumsum(conf.numpy()[order]) / n - np.cumsum(a[order]) / n).max()


@pytest.mark.parametrize(("n", "c", "seed"), [(1, 3, 0), (50, 3, 1), (700, 10, 2)])
def test_ks_error_matches_the_definition_and_the_published_code(n, c, seed):
    probs, labels = draw(n, c, seed)
    out = M.ks_error(probs=probs, labels=labels)
    assert out.item() == pytest.approx(ks_reference(probs, labels), abs=1e-12)
    assert out.item() == pytest.approx(ks_published(probs, labels), abs=1e-12)


def test_ks_error_with_ties_does_not_depend_on_sample_order():
    g = torch.Generator().manual_seed(8)
    conf = torch.tensor([0.55, 0.7, 0.8], dtype=torch.float64)[
        torch.randint(0, 3, (60,), generator=g)]
    probs = torch.stack([conf, 1 - conf], dim=1)
    labels = torch.randint(0, 2, (60,), generator=g)
    expected = ks_reference(probs, labels)
    for seed in range(5):
        perm = torch.randperm(60, generator=torch.Generator().manual_seed(seed))
        assert M.ks_error(probs=probs[perm], labels=labels[perm]).item() == pytest.approx(
            expected, abs=1e-12)


def test_ks_error_hand_worked_and_calibrated_is_small():
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    # sorted conf .6 .7 .8 .9 with a = 1 1 0 1: partial sums of a - conf .4 .7 -.1 0
    assert M.ks_error(probs=probs, labels=torch.tensor([0, 1, 1, 0])).item() == pytest.approx(
        0.7 / 4, abs=1e-7)
    probs, labels = draw(20000, 5, 9, calibrated=True)
    assert M.ks_error(probs=probs, labels=labels).item() < 0.02


# --------------------------------------------------------------------------------- shared


NEW = [M.ace, M.smooth_ece, M.debiased_ece, M.ks_error]


def test_exported():
    for name in ("ace", "smooth_ece", "debiased_ece", "ks_error", "smooth_reliability_curve",
                 "SmoothReliabilityCurve"):
        assert name in M.__all__


@pytest.mark.parametrize("fn", NEW)
def test_numpy_input_and_result_device_and_dtype(fn):
    probs, labels = draw(200, 4, 10)
    a = fn(probs=probs, labels=labels)
    b = fn(probs=probs.numpy(), labels=labels.numpy())
    assert a.ndim == 0 and a.dtype == torch.float64 and torch.equal(a, b)
    assert fn(probs=probs.half(), labels=labels).dtype == torch.float32


def test_bad_settings():
    probs, labels = draw(20, 3, 11)
    for s in (0, -0.1, 1.5, float("nan"), "x", True):
        with pytest.raises(ValueError, match="`sigma` to be None or a number in"):
            M.smooth_ece(probs=probs, labels=labels, sigma=s)
    with pytest.raises(ValueError, match="`strategy` to be one of"):
        M.debiased_ece(probs=probs, labels=labels, strategy="equal_mass")
    with pytest.raises(ValueError, match="`n_points` to be an integer >= 2"):
        M.smooth_reliability_curve(probs=probs, labels=labels, n_points=1)
    for fn in (M.ace, M.debiased_ece):
        with pytest.raises(ValueError, match="`n_bins` to be a positive integer"):
            fn(probs=probs, labels=labels, n_bins=0)

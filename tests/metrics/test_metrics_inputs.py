"""What users hit (issue 14, item 9; issue 16, item 6): probabilities passed as `logits=` warn,
masked classes (-inf logits) are accepted, binary (N,) inputs get a hint to stack them, and
the Classwise-ECE conventions that differ from the published code are documented and hold."""

import math
import os
import sys
import warnings

import numpy as np
import pytest
import torch

import torchcal.metrics as M

sys.path.insert(0, os.path.dirname(__file__))
import metrics_reference as ref  # noqa: E402

METRICS = [M.ece, M.mce, M.rmsce, M.ace, M.adaptive_ece, M.classwise_ece, M.nll, M.brier,
           M.error, M.topk_error, M.s99, M.smooth_ece, M.debiased_ece, M.ks_error]


def _call(fn, **kw):
    if fn is M.topk_error:
        kw.setdefault("k", 2)
    return fn(**kw)


def _scalar(out):
    return torch.stack(out) if isinstance(out, tuple) else out


def _probs(n=200, c=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(n, c, generator=g, dtype=torch.float64) * 2, dim=1)
    return p, torch.randint(0, c, (n,), generator=g)


# ------------------------------------------------------------- probabilities passed as logits


@pytest.mark.parametrize("fn", METRICS)
def test_probabilities_passed_as_logits_warn_at_the_callers_line(fn):
    p, y = _probs()
    with pytest.warns(UserWarning, match="`logits` look like probabilities") as rec:
        _call(fn, logits=p, labels=y)
    assert rec[0].filename == __file__  # the user's line, not torchcal's


def test_the_warning_is_shown_once_per_calling_line():
    p, y = _probs()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("default")
        for _ in range(5):
            M.ece(logits=p, labels=y)
    assert len([w for w in rec if "look like probabilities" in str(w.message)]) == 1


def test_the_issue_example_is_flagged_and_probs_give_the_truth():
    # logits=p gave a flattened softmax(p) and a wrong ECE: the warning says so
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(2000, 10, generator=g) * 4, dim=1)
    y = torch.randint(0, 10, (2000,), generator=g)
    with pytest.warns(UserWarning, match="Pass them as `probs=` instead"):
        wrong = M.ece(logits=p, labels=y).item()
    truth = M.ece(probs=p, labels=y).item()
    assert truth > 0.5 and abs(truth - wrong) > 0.3


@pytest.mark.parametrize("fn", METRICS)
def test_real_logits_and_probs_do_not_warn(fn):
    p, y = _probs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _call(fn, logits=p.log(), labels=y)
        _call(fn, probs=p, labels=y)
        _call(fn, logits=p * 0.5, labels=y)  # in [0, 1] but rows do not sum to 1
        _call(fn, logits=p, labels=y, validate_args=False)  # the fast path checks nothing


# ----------------------------------------------------------------------------- masked classes


@pytest.mark.parametrize("fn", METRICS)
def test_masked_classes_are_accepted_and_get_probability_zero(fn):
    g = torch.Generator().manual_seed(2)
    z = torch.randn(300, 5, generator=g, dtype=torch.float64) * 2
    mask = torch.rand(300, 5, generator=g) < 0.3
    mask[:, 0] = False  # class 0 is never masked; the labels avoid masked classes
    z = z.masked_fill(mask, float("-inf"))
    p = torch.softmax(z, dim=1)
    y = torch.where(mask.gather(1, torch.randint(0, 5, (300, 1), generator=g)).squeeze(1),
                    0, torch.randint(0, 5, (300,), generator=g))
    y = torch.where(mask[torch.arange(300), y], 0, y)
    out = _scalar(_call(fn, logits=z, labels=y))
    assert torch.isfinite(out).all()
    assert torch.allclose(out, _scalar(_call(fn, probs=p, labels=y)), atol=1e-12, rtol=0)


def test_masked_class_matches_dropping_the_column():
    p, y = _probs(300, 4, 3)
    z = torch.cat([p.log(), torch.full((300, 1), float("-inf"), dtype=torch.float64)], dim=1)
    for fn in (M.ece, M.adaptive_ece, M.nll, M.brier, M.error, M.smooth_ece, M.ks_error):
        assert _call(fn, logits=z, labels=y).item() == pytest.approx(
            _call(fn, logits=p.log(), labels=y).item(), abs=1e-12)
    # Classwise-ECE averages over all C columns: the masked column adds 0 and counts in C
    assert M.classwise_ece(logits=z, labels=y).item() == pytest.approx(
        M.classwise_ece(probs=p, labels=y).item() * 4 / 5, abs=1e-12)
    assert M.nll(logits=z, labels=torch.full((300,), 4)).item() == math.inf


def test_masked_logits_in_ood_scores():
    z = torch.tensor([[2.0, 0.0, float("-inf")], [0.0, 1.0, float("-inf")]])
    s, _ = M.ood_scores(id_logits=z, ood_logits=z)
    dropped, _ = M.ood_scores(id_logits=z[:, :2], ood_logits=z[:, :2])
    assert torch.isfinite(s).all() and torch.allclose(s, dropped, atol=1e-6, rtol=0)


def test_nan_and_plus_inf_and_fully_masked_rows_are_still_refused():
    z = torch.zeros(3, 3)
    for bad, match in ((float("nan"), "found 1 NaN/Inf"), (float("inf"), "found 1 NaN/Inf")):
        zb = z.clone()
        zb[1, 1] = bad
        with pytest.raises(ValueError, match=match):
            M.ece(logits=zb, labels=torch.zeros(3, dtype=torch.long))
    zb = z.clone()
    zb[2] = float("-inf")
    with pytest.raises(ValueError, match="every class of row 2 is masked"):
        M.ece(logits=zb, labels=torch.zeros(3, dtype=torch.long))


# ------------------------------------------------------------------------- binary (N,) input


@pytest.mark.parametrize("fn", METRICS)
def test_binary_probabilities_get_a_hint_to_stack_them(fn):
    p1 = torch.tensor([0.2, 0.9, 0.6])
    y = torch.tensor([0, 1, 1])
    with pytest.raises(ValueError, match=r"shape \(3,\); .*torch\.stack\(\[1 - p, p\], "
                                         r"dim=1\)` of shape \(N, 2\)"):
        _call(fn, probs=p1, labels=y)
    with pytest.raises(ValueError, match=r"torch\.stack\(\[torch\.zeros_like\(z\), z\]"):
        _call(fn, logits=np.array([0.5, -1.0, 2.0]), labels=y)
    # and the stacked form works
    _call(fn, probs=torch.stack([1 - p1, p1], dim=1), labels=y)


# ------------------------------------------------------------- Classwise-ECE conventions (#16)


def published_classwise(probs, labels, n_bins):
    """focal_calibration's ClasswiseECELoss from its definition: classes 0..max(label), bins
    (k/B, (k+1)/B] with linspace edges and no special case for 0."""
    edges = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64).tolist()
    rows, ys = probs.tolist(), labels.tolist()
    n, total = len(rows), []
    for k in range(max(ys) + 1):
        sce = 0.0
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            inside = [(r[k], 1.0 if y == k else 0.0) for r, y in zip(rows, ys, strict=True)
                      if lo < r[k] <= hi]
            if inside:
                conf = math.fsum(c for c, _ in inside) / len(inside)
                acc = math.fsum(a for _, a in inside) / len(inside)
                sce += abs(conf - acc) * len(inside) / n
        total.append(sce)
    return sum(total) / len(total)


def test_classwise_ece_averages_over_all_classes_not_max_label_plus_one():
    p, y = _probs(300, 5, 4)
    y = y.clamp(max=2)  # classes 3 and 4 never occur among the labels
    ours = M.classwise_ece(probs=p, labels=y, n_bins=10).item()
    assert ours == pytest.approx(ref.classwise_ece(p, y, 10), abs=1e-12)
    published = published_classwise(p, y, 10)
    # the published code drops classes 3 and 4 (their terms are not zero) and divides by 3
    assert abs(ours - published) > 1e-3
    y_full = y.clone()
    y_full[0] = 4  # every class index up to C - 1 occurs: the two conventions agree
    assert M.classwise_ece(probs=p, labels=y_full, n_bins=10).item() == pytest.approx(
        published_classwise(p, y_full, 10), abs=1e-12)


def test_classwise_ece_counts_exact_zero_probabilities_in_the_first_bin():
    p, y = _probs(300, 4, 5)
    p[:100, 3] = 0.0  # exact zeros (a masked class, a saturated softmax)
    p[:100] /= p[:100].sum(dim=1, keepdim=True)
    y[:50] = 3  # half of those samples have the zero-probability class as their label
    ours = M.classwise_ece(probs=p, labels=y, n_bins=10).item()
    assert ours == pytest.approx(ref.classwise_ece(p, y, 10), abs=1e-12)
    assert abs(ours - published_classwise(p, y, 10)) > 1e-3  # it drops the zeros


def test_the_conventions_are_documented():
    doc = M.classwise_ece.__doc__
    assert "max(label) + 1" in doc and "all C classes" in doc
    assert "exact-zero probability is in the first bin" in doc
    assert "exact-zero probabilities" in M.binning.__doc__
    assert "counted in the first bin" in M.binning.__doc__

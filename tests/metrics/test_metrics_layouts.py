"""Dense layouts: every labelled metric and CalibrationMeter take (N, C, d1, ...) predictions
with (N, d1, ...) labels and ignore_index (default -100), and equal the metric of the
flattened rows whose label is kept; checked against torchmetrics'
MulticlassCalibrationError(ignore_index=-100).

Convention differences with torchmetrics (why the comparison uses float32 logits of moderate
scale): torchmetrics casts the confidences to float32, bins them left-closed ``[e_k, e_{k+1})``
on ``linspace`` edges with an extra bin for a confidence of exactly 1.0, guesses logits from
the value range (softmax when a value is outside [0, 1]) and has ``ignore_index=None`` by
default; torchcal bins right-closed on ``k/B`` edges in the input's dtype, 1.0 in the last bin,
never guesses, and ignores -100 by default.  With float32 confidences away from the edges and
below 1.0 the two agree to float rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchcal.metrics as M

LABELLED = [M.ece, M.mce, M.rmsce, M.ace, M.adaptive_ece, M.classwise_ece, M.nll, M.brier,
            M.error, M.topk_error, M.confidence_gap, M.debiased_ece, M.smooth_ece, M.ks_error]


def dense(shape=(4, 5, 8, 8), seed=0, dtype=torch.float64, n_ignored=20):
    """(N, C, d1, d2) logits, (N, d1, d2) labels with ``n_ignored`` entries set to -100, and
    the flattened kept rows computed independently (a NumPy transpose and mask)."""
    g = torch.Generator().manual_seed(seed)
    z = (2 * torch.randn(*shape, generator=g)).to(dtype)
    y = torch.randint(0, shape[1], (shape[0],) + shape[2:], generator=g)
    flat_idx = torch.randperm(y.numel(), generator=g)[:n_ignored]
    y.view(-1)[flat_idx] = -100
    zn = np.moveaxis(z.numpy(), 1, -1).reshape(-1, shape[1])
    yn = y.numpy().reshape(-1)
    keep = yn != -100
    return z, y, torch.from_numpy(zn[keep].copy()), torch.from_numpy(yn[keep].copy())


@pytest.mark.parametrize("metric", LABELLED, ids=lambda f: f.__name__)
def test_dense_layout_equals_flattened_rows(metric):
    z, y, zf, yf = dense()
    kw = {"k": 2} if metric is M.topk_error else {}
    got = metric(logits=z, labels=y, **kw)
    want = metric(logits=zf, labels=yf, **kw)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # and from probabilities (softmax over axis 1), NumPy input, a 1-D spatial layout
    p = torch.softmax(z, dim=1)
    torch.testing.assert_close(metric(probs=p.numpy(), labels=y.numpy(), **kw),
                               metric(probs=torch.softmax(zf, dim=1), labels=yf, **kw),
                               rtol=0, atol=1e-12)


def test_layouts_of_the_other_labelled_metrics():
    z, y, zf, yf = dense(shape=(3, 4, 11))
    for got, want in [
        (M.s99(logits=z, labels=y, threshold=0.5), M.s99(logits=zf, labels=yf, threshold=0.5)),
        (M.reliability_curve(logits=z, labels=y, n_bins=5).counts,
         M.reliability_curve(logits=zf, labels=yf, n_bins=5).counts),
        (M.smooth_reliability_curve(logits=z, labels=y).accuracies,
         M.smooth_reliability_curve(logits=zf, labels=yf).accuracies),
        (M.bootstrap_ci("ece", logits=z, labels=y, n_resamples=20),
         M.bootstrap_ci("ece", logits=zf, labels=yf, n_resamples=20)),
    ]:
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_ignore_index_on_2d_input_and_its_options():
    z, _, zf, yf = dense(shape=(40, 3), n_ignored=0)
    y = yf.clone()
    y[:7] = -100
    torch.testing.assert_close(M.ece(logits=z, labels=y), M.ece(logits=z[7:], labels=y[7:]))
    # a class index as ignore_index
    y2 = yf.clone()
    keep = y2 != 1
    torch.testing.assert_close(M.nll(logits=z, labels=y2, ignore_index=1),
                               M.nll(logits=z[keep], labels=y2[keep]))
    # ignore_index=None keeps every label: -100 is then out of range
    with pytest.raises(ValueError, match=r"`labels` to be in \[0, 2\]"):
        M.ece(logits=z, labels=y, ignore_index=None)
    with pytest.raises(TypeError, match="`ignore_index` to be an int or None, got float"):
        M.ece(logits=z, labels=y, ignore_index=-100.0)


def test_layout_errors_name_the_arguments():
    z = torch.randn(2, 3, 5)
    with pytest.raises(ValueError, match=r"`labels` of shape \(N, d1, ...\) = \(2, 5\) to "
                                         r"match `logits` of shape \(N, C, d1, ...\) = \(2, 3, 5\), "
                                         r"got \(2, 4\)"):
        M.ece(logits=z, labels=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"`probs` .* got \(10,\)"):
        M.brier(probs=torch.softmax(z, 1), labels=torch.zeros(10, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one label not equal to ignore_index=-100, "
                                         "but all 10 are"):
        M.ece(logits=z, labels=torch.full((2, 5), -100))
    with pytest.raises(ValueError, match="to be 2-D of shape"):  # 1-D keeps its own hint
        M.ece(logits=torch.randn(5), labels=torch.zeros(5, dtype=torch.long))


def test_meter_takes_dense_batches_and_skips_all_padding():
    z, y, zf, yf = dense(shape=(6, 4, 7), n_ignored=10)
    meter = M.CalibrationMeter(num_classes=4, n_bins=10, topk=2)
    meter.update(logits=z[:3], labels=y[:3])
    meter.update(logits=z[3:], labels=torch.full_like(y[3:], -100))  # a batch of padding only
    meter.update(logits=z[3:], labels=y[3:])
    ref = M.CalibrationMeter(num_classes=4, n_bins=10, topk=2)
    ref.update(logits=zf, labels=yf)
    got, want = meter.compute(), ref.compute()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-12, equal_nan=True)
    assert meter.num_samples == yf.numel()
    # (3 + C) B + 7 = 77 entries
    with pytest.raises(ValueError, match=r"`state` to be a float64 tensor of shape \(77,\), "
                                         "got torch.float32"):
        meter.state = torch.zeros(3)


@pytest.mark.parametrize("norm,fn", [("l1", M.ece), ("max", M.mce), ("l2", M.rmsce)])
def test_against_torchmetrics_with_ignore_index(norm, fn):
    tm = pytest.importorskip("torchmetrics.classification")
    # float32 logits (torchmetrics bins float32 confidences), (N, C, T) as a language model's
    z, y, _, _ = dense(shape=(8, 6, 50), dtype=torch.float32, n_ignored=37, seed=3)
    metric = tm.MulticlassCalibrationError(num_classes=6, n_bins=15, norm=norm, ignore_index=-100)
    metric.update(z, y)
    want = float(metric.compute())
    assert abs(float(fn(logits=z, labels=y)) - want) < 1e-6
    meter = M.CalibrationMeter(num_classes=6, n_bins=15)
    meter.update(logits=z, labels=y)
    key = {"l1": "ece", "max": "mce", "l2": "rmsce"}[norm]
    assert abs(float(meter.compute()[key]) - want) < 1e-6

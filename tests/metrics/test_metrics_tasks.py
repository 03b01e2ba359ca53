"""Issue 39 item 1: task="binary" / "multilabel" for the ECE family, the meter and the
reliability diagram, against torchmetrics' BinaryCalibrationError, netcal's ECE and
scikit-learn's calibration_curve; the once-only warning of a 2-column multiclass input;
issue 43 item 5: CalibrationMeter(metrics=...) keeps only the state they need."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import torchcal.metrics as M
from torchcal.metrics import CalibrationMeter, tasks
from torchcal.metrics.meter import METER_KEYS


def _binary(n=4000, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    z = 2 * torch.randn(n, generator=g, dtype=dtype) + 0.5
    y = (torch.rand(n, generator=g, dtype=dtype) < torch.sigmoid(0.7 * z)).long()
    return z, y


@pytest.mark.parametrize("seed", [0, 1])
def test_binary_equals_torchmetrics_binary_calibration_error(seed):
    tm = pytest.importorskip("torchmetrics.classification")
    z, y = _binary(seed=seed)
    p = torch.sigmoid(z)
    for norm, fn in (("l1", M.ece), ("max", M.mce), ("l2", M.rmsce)):
        theirs = float(tm.BinaryCalibrationError(n_bins=15, norm=norm)(p, y))
        assert float(fn(probs=p, labels=y, task="binary")) == pytest.approx(theirs, abs=1e-6)
        assert float(fn(logits=z, labels=y, task="binary")) == pytest.approx(theirs, abs=1e-6)
    # dense (N, d) layout with ignore_index, as torchmetrics' ignore_index
    zz, yy = z.view(40, 100), y.view(40, 100).clone()
    yy[:, :7] = -100
    keep = yy != -100
    theirs = float(tm.BinaryCalibrationError(n_bins=15, ignore_index=-100)(torch.sigmoid(zz), yy))
    assert float(M.ece(logits=zz, labels=yy, task="binary")) == pytest.approx(theirs, abs=1e-6)
    assert float(M.ece(logits=zz[keep], labels=yy[keep], task="binary")) == pytest.approx(
        theirs, abs=1e-6)


def test_binary_equals_netcal_and_the_classwise_ece_of_the_two_columns():
    netcal = pytest.importorskip("netcal.metrics")
    z, y = _binary(seed=2, dtype=torch.float64)
    p = torch.sigmoid(z)
    theirs = netcal.ECE(bins=15).measure(p.numpy(), y.numpy())
    assert float(M.ece(probs=p, labels=y, task="binary")) == pytest.approx(theirs, abs=1e-6)
    two = torch.stack([1 - p, p], dim=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tasks.TwoColumnWarning)
        assert float(M.classwise_ece(probs=two, labels=y)) == pytest.approx(
            float(M.ece(probs=p, labels=y, task="binary")), abs=1e-9)
        # the multiclass number of the same input is the top label's: another number
        assert abs(float(M.ece(probs=two, labels=y))
                   - float(M.ece(probs=p, labels=y, task="binary"))) > 1e-3
    assert float(M.classwise_ece(probs=p, labels=y, task="binary")) == pytest.approx(
        float(M.classwise_ece(probs=two, labels=y)), abs=1e-12)


def test_binary_reliability_curve_equals_sklearn_calibration_curve():
    from sklearn.calibration import calibration_curve
    z, y = _binary(seed=3, dtype=torch.float64)
    p = torch.sigmoid(z)
    curve = M.reliability_curve(probs=p, labels=y, n_bins=10, task="binary")
    prob_true, prob_pred = calibration_curve(y.numpy(), p.numpy(), n_bins=10)
    filled = curve.counts > 0
    np.testing.assert_allclose(curve.accuracies[filled].numpy(), prob_true, atol=1e-12)
    np.testing.assert_allclose(curve.confidences[filled].numpy(), prob_pred, atol=1e-12)
    # the curve's ECE is the binary ECE
    n = curve.counts.sum()
    gap = (curve.counts[filled] * (curve.accuracies[filled] - curve.confidences[filled]).abs())
    assert float(gap.sum() / n) == pytest.approx(
        float(M.ece(probs=p, labels=y, n_bins=10, task="binary")), abs=1e-12)


def _multilabel(seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(600, 5, 3, generator=g, dtype=torch.float64)
    y = (torch.rand(600, 5, 3, generator=g, dtype=torch.float64) < p ** 1.3).long()
    y[:50, 1] = -100  # some entries ignored
    y[:, 4, :] = -100  # label 4 never seen: left out of the mean
    return p, y


@pytest.mark.parametrize("name", ["ece", "mce", "rmsce", "ace", "adaptive_ece",
                                  "confidence_gap"])
def test_multilabel_is_the_mean_of_the_per_label_binary_values(name):
    fn = getattr(M, name)
    p, y = _multilabel()
    per_label = [float(fn(probs=p[:, j], labels=y[:, j], task="binary")) for j in range(4)]
    got = float(fn(probs=p, labels=y, task="multilabel"))
    assert got == pytest.approx(np.mean(per_label), abs=1e-12)
    logits = torch.logit(p)
    assert float(fn(logits=logits, labels=y, task="multilabel")) == pytest.approx(got, abs=1e-9)


def test_multilabel_reliability_curve_per_label_and_classwise():
    p, y = _multilabel(1)
    curve = M.reliability_curve(probs=p, labels=y, n_bins=6, task="multilabel")
    assert tuple(curve.counts.shape) == (5, 6) and tuple(curve.edges.shape) == (7,)
    one = M.reliability_curve(probs=p[:, 2], labels=y[:, 2], n_bins=6, task="binary")
    torch.testing.assert_close(curve.counts[2], one.counts)
    torch.testing.assert_close(curve.accuracies[2], one.accuracies, equal_nan=True)
    q = M.reliability_curve(probs=p, labels=y, n_bins=6, task="multilabel", strategy="quantile")
    assert tuple(q.edges.shape) == (5, 7)
    assert float(M.classwise_ece(probs=p, labels=y, task="multilabel")) == float(
        M.ece(probs=p, labels=y, task="multilabel"))


def test_two_columns_under_multiclass_warn_once(monkeypatch):
    monkeypatch.setattr(tasks, "_warned_two_columns", False)
    p = torch.tensor([[0.3, 0.7], [0.8, 0.2]])
    y = torch.tensor([1, 1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        M.ece(probs=p, labels=y)
        M.ece(probs=p, labels=y)
        M.reliability_curve(probs=p, labels=y)
        CalibrationMeter(2).update(probs=p, labels=y)
        M.ece(probs=torch.full((2, 3), 1 / 3), labels=y)
        M.ece(probs=p[:, 1], labels=y, task="binary")
    mine = [w for w in caught if issubclass(w.category, tasks.TwoColumnWarning)]
    assert len(mine) == 1
    assert mine[0].filename == __file__  # points at the user's line
    assert "task='binary'" in str(mine[0].message)


def test_binary_and_multilabel_bad_inputs():
    z, y = _binary(20)
    with pytest.raises(ValueError, match="`task` to be one of"):
        M.ece(logits=z, labels=y, task="binay")
    with pytest.raises(TypeError, match="`labels` to be integers or bools"):
        M.ece(logits=z, labels=y.float(), task="binary")
    with pytest.raises(ValueError, match=r"`labels` to be 0 or 1 .* such as 2"):
        M.ece(logits=z, labels=y * 2, task="binary")
    with pytest.raises(ValueError, match=r"`labels` of shape \(20,\)"):
        M.ece(logits=z, labels=y[:10], task="binary")
    with pytest.raises(ValueError, match=r"`probs` to be probabilities in \[0, 1\]"):
        M.ece(probs=z, labels=y, task="binary")
    with pytest.raises(ValueError, match="NaN"):
        M.ece(logits=torch.full((3,), float("nan")), labels=y[:3], task="binary")
    with pytest.warns(UserWarning, match="look like probabilities"):
        M.ece(logits=torch.sigmoid(z), labels=y, task="binary")
    with pytest.raises(ValueError, match=r"\(N, L\) or \(N, L, d1, ...\)"):
        M.ece(logits=z, labels=y, task="multilabel")
    with pytest.raises(ValueError, match="at least one entry"):
        M.ece(logits=z, labels=torch.full_like(y, -100), task="binary")


def test_meter_binary_and_multilabel_equal_the_functions():
    z, y = _binary(1000, seed=5, dtype=torch.float64)
    y[:9] = -100
    meter = CalibrationMeter(task="binary", n_bins=10)
    for zi, yi in zip(z.split(300), y.split(300), strict=True):
        meter.update(logits=zi, labels=yi)
    out = meter.compute()
    for key in ("ece", "mce", "rmsce", "adaptive_ece", "classwise_ece"):
        ref = getattr(M, key)(logits=z, labels=y, n_bins=10, task="binary")
        assert float(out[key]) == pytest.approx(float(ref), abs=1e-12), key
    keep = y != -100
    p, t = torch.sigmoid(z[keep]), y[keep].double()
    assert float(out["nll"]) == pytest.approx(
        float(torch.nn.functional.binary_cross_entropy(p, t)), abs=1e-12)
    assert float(out["brier"]) == pytest.approx(float(((p - t) ** 2).mean()), abs=1e-12)
    assert float(out["error"]) == pytest.approx(float(((p > 0.5).double() != t).double().mean()))
    assert torch.isnan(out["topk_error"])
    p, y = _multilabel(2)
    meter = CalibrationMeter(5, task="multilabel", n_bins=10)
    meter.update(probs=p[:300], labels=y[:300])
    meter.update(probs=p[300:], labels=y[300:])
    out = meter.compute()
    for key in ("ece", "mce", "rmsce", "adaptive_ece"):
        ref = getattr(M, key)(probs=p, labels=y, n_bins=10, task="multilabel")
        assert float(out[key]) == pytest.approx(float(ref), abs=1e-12), key
    with pytest.raises(ValueError, match="`num_classes` \\(the number of labels\\)"):
        CalibrationMeter(task="multilabel")
    with pytest.raises(ValueError, match="num_labels=5 columns, got 4"):
        meter.update(probs=p[:, :4], labels=y[:, :4])


def test_meter_metrics_keep_only_their_state():
    g = torch.Generator().manual_seed(6)
    z = 6 * torch.randn(500, 100, generator=g, dtype=torch.float64)  # some above 0.99
    y = torch.randint(0, 100, (500,), generator=g)
    full = CalibrationMeter(100, n_bins=15)
    full.update(logits=z, labels=y)
    ref = full.compute()
    assert tuple(ref) == METER_KEYS and full.state_size == (3 + 100) * 15 + 7
    sizes = {("ece",): 3 * 15 + 1, ("ece", "mce", "rmsce"): 3 * 15 + 1,
             ("classwise_ece",): 100 * 15 + 1, ("nll", "brier"): 3, ("s99_accuracy",): 3,
             ("adaptive_ece",): 1, ("topk_error", "error"): 3}
    for keys, size in sizes.items():
        meter = CalibrationMeter(100, n_bins=15, metrics=keys)
        assert meter.state_size == size
        meter.update(logits=z[:200], labels=y[:200])
        meter.update(logits=z[200:], labels=y[200:])
        out = meter.compute()
        assert tuple(out) == tuple(k for k in METER_KEYS if k in keys)
        for k in keys:
            assert float(out[k]) == pytest.approx(float(ref[k]), abs=1e-12, nan_ok=True), k
    assert CalibrationMeter(100, metrics=("ece",))._conf == []  # no confidences kept
    with pytest.raises(ValueError, match="`metrics` to be None or a non-empty collection"):
        CalibrationMeter(10, metrics=("ece", "accuracy"))
    with pytest.raises(ValueError, match="adaptive=True with 'adaptive_ece'"):
        CalibrationMeter(10, adaptive=False, metrics=("adaptive_ece",))


def test_reliability_diagram_tasks():
    pytest.importorskip("matplotlib")
    from torchcal.plot import reliability_diagram
    z, y = _binary(500, seed=7)
    fig = reliability_diagram(logits=z, labels=y, task="binary")
    top = fig.axes[0]
    assert top.get_ylabel() == "fraction of positives"
    assert fig.axes[1].get_xlabel() == "predicted probability"
    texts = [t.get_text() for t in top.texts]
    assert f"ECE = {100 * float(M.ece(logits=z, labels=y, task='binary')):.2f}%" in texts
    p, yy = _multilabel(3)
    fig = reliability_diagram(probs=p, labels=yy, task="multilabel")
    value = 100 * float(M.ece(probs=p, labels=yy, task="multilabel"))
    assert f"ECE (mean over labels) = {value:.2f}%" in [t.get_text() for t in fig.axes[0].texts]
    # the pooled bars: bin counts are every kept (sample, label) entry
    assert sum(p.get_height() for p in fig.axes[1].patches) == int((yy != -100).sum())


def test_bin_free_and_debiased_binary_equal_their_reference_packages():
    z, y = _binary(3000, seed=8, dtype=torch.float64)
    p = torch.sigmoid(z)
    relplot = pytest.importorskip("relplot")
    assert float(M.smooth_ece(probs=p, labels=y, task="binary")) == pytest.approx(
        relplot.smECE(p.numpy(), y.numpy()), abs=1e-9)
    cal = pytest.importorskip("calibration")
    assert float(M.debiased_ece(probs=p, labels=y, task="binary")) == pytest.approx(
        cal.get_calibration_error(p.numpy(), y.numpy(), p=2, debias=True), abs=1e-9)
    # KS: the largest gap of the cumulative sums of p and y, sorted by p (no ties here)
    order = np.argsort(p.numpy())
    ks = np.abs(np.cumsum(y.numpy()[order] - p.numpy()[order])).max() / len(p)
    assert float(M.ks_error(probs=p, labels=y, task="binary")) == pytest.approx(ks, abs=1e-12)
    pm, ym = _multilabel(4)
    for fn in (M.smooth_ece, M.debiased_ece, M.ks_error):
        per_label = [float(fn(probs=pm[:, j], labels=ym[:, j], task="binary"))
                     for j in range(4)]
        assert float(fn(probs=pm, labels=ym, task="multilabel")) == pytest.approx(
            np.mean(per_label), abs=1e-12)


def test_smooth_reliability_curve_binary():
    z, y = _binary(800, seed=9, dtype=torch.float64)
    curve = M.smooth_reliability_curve(logits=z, labels=y, task="binary")
    assert float(curve.smooth_ece) == pytest.approx(
        float(M.smooth_ece(logits=z, labels=y, task="binary")), abs=1e-12)
    with pytest.raises(ValueError, match="each label's column with task='binary'"):
        M.smooth_reliability_curve(logits=z.view(400, 2), labels=y.view(400, 2),
                                   task="multilabel")

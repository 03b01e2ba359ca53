"""torchcal.integrations.torchmetrics: Metric classes over CalibrationMeter's fixed-size state
equal torchcal.metrics' functions, keep 368 bytes at 2,000,000 samples (torchmetrics' own
ECE: 16 MB), log through LightningModule.log in a real fit, take task="binary" (equal to
torchmetrics' BinaryCalibrationError) and "multilabel", and keep their float64 state under
every dtype cast (issue 39)."""

from __future__ import annotations

import pytest
import torch
from integration_extras import require
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchcal.metrics as M

require("torchmetrics", "torchmetrics")
from torchcal.integrations.torchmetrics import (  # noqa: E402
    BrierScore,
    CalibrationError,
    CalibrationMetrics,
    ClasswiseCalibrationError,
    MaxCalibrationError,
    NegativeLogLikelihood,
    RMSCalibrationError,
)

PAIRS = [(CalibrationError, M.ece), (MaxCalibrationError, M.mce), (RMSCalibrationError, M.rmsce),
         (ClasswiseCalibrationError, M.classwise_ece), (NegativeLogLikelihood, M.nll),
         (BrierScore, M.brier)]


@pytest.mark.parametrize("cls,fn", PAIRS, ids=lambda x: getattr(x, "__name__", ""))
def test_metric_equals_the_function(cls, fn):
    g = torch.Generator().manual_seed(0)
    z = 2 * torch.randn(3, 5, 40, generator=g, dtype=torch.float64)  # (N, C, T)
    y = torch.randint(0, 5, (3, 40), generator=g)
    y[0, :7] = -100
    metric = cls(num_classes=5, n_bins=10)
    for i in range(3):  # batch by batch
        metric.update(z[i:i + 1], y[i:i + 1])
    got = metric.compute()
    kwargs = {} if fn in (M.nll, M.brier) else {"n_bins": 10}
    torch.testing.assert_close(got, fn(logits=z, labels=y, **kwargs), rtol=0, atol=1e-12)
    metric.reset()
    assert metric.state.abs().max() == 0
    probs = cls(num_classes=5, n_bins=10, input_format="probs")
    probs.update(torch.softmax(z, dim=1), y)
    assert float(probs.compute()) == pytest.approx(float(got), abs=1e-12)


def test_forward_gives_the_batch_value_and_accumulates():
    g = torch.Generator().manual_seed(1)
    z, y = torch.randn(100, 4, generator=g, dtype=torch.float64), torch.randint(0, 4, (100,), generator=g)
    metric = CalibrationError(num_classes=4)
    for part in (slice(0, 50), slice(50, 100)):
        torch.testing.assert_close(metric(z[part], y[part]), M.ece(logits=z[part], labels=y[part]))
    torch.testing.assert_close(metric.compute(), M.ece(logits=z, labels=y))


def test_collection_and_errors():
    z, y = torch.randn(30, 4, dtype=torch.float64), torch.randint(0, 4, (30,))
    metric = CalibrationMetrics(num_classes=4)
    metric.update(z, y)
    out = metric.compute()
    assert set(out) == set(CalibrationMetrics.KEYS)
    torch.testing.assert_close(out["error"], M.error(logits=z, labels=y), check_dtype=False)
    with pytest.raises(ValueError, match="`input_format` to be one of"):
        CalibrationError(num_classes=4, input_format="logit")
    with pytest.raises(ValueError, match="`logits` to have num_classes=4 columns, got 3"):
        CalibrationError(num_classes=4).update(z[:, :3], y % 3)


def test_state_bytes_at_two_million_samples():
    torchmetrics = pytest.importorskip("torchmetrics.classification")
    ours = CalibrationError(num_classes=10, n_bins=15)
    theirs = torchmetrics.MulticlassCalibrationError(num_classes=10, n_bins=15)
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        z = torch.randn(200_000, 10, generator=g)
        y = torch.randint(0, 10, (200_000,), generator=g)
        ours.update(z, y)
        theirs.update(z, y)
    ours_bytes = ours.state.numel() * ours.state.element_size()
    theirs_bytes = sum(t.numel() * t.element_size()
                       for name in ("confidences", "accuracies") for t in getattr(theirs, name))
    assert ours_bytes == (3 * 15 + 1) * 8 == 368  # the bin sums and the count (metrics=)
    assert theirs_bytes == 2_000_000 * 8 == 16_000_000
    # torchmetrics sums the 2M float32 confidences per bin in float32 (scatter_add_): its ECE
    # is off by a few 1e-6 here (5e-6 measured); torchcal's sums are float64
    assert float(ours.compute()) == pytest.approx(float(theirs.compute()), abs=2e-5)


def test_logged_by_a_lightning_module(tmp_path):
    L = require("lightning", "lightning")
    g = torch.Generator().manual_seed(0)
    xv, yv = torch.randn(120, 8, generator=g), torch.randint(0, 3, (120,), generator=g)
    seen = []

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 3)
            self.val_ece = CalibrationError(num_classes=3)
            self.val_nll = NegativeLogLikelihood(num_classes=3)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            z = self.net(x)
            seen.append((z.detach().clone(), y))
            self.val_ece.update(z, y)
            self.val_nll.update(z, y)
            self.log("val_ece", self.val_ece)
            self.log("val_nll", self.val_nll)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(xv, yv), batch_size=50)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=tmp_path)
    trainer.fit(Module(), data, data)
    z = torch.cat([s[0] for s in seen])
    y = torch.cat([s[1] for s in seen])
    assert z.shape[0] == 120
    logged = trainer.callback_metrics
    assert float(logged["val_ece"]) == pytest.approx(float(M.ece(logits=z, labels=y)), abs=1e-6)
    assert float(logged["val_nll"]) == pytest.approx(float(M.nll(logits=z, labels=y)), abs=1e-6)


CASTS = ["to_float32", "set_dtype", "parent_to_bfloat16", "bf16-true", "16-true"]


def _cast(metric, how):
    """Apply one of the casts a metric meets in a training program; returns the context the
    next update runs in (Lightning's precision plugins also change the default dtype)."""
    import contextlib
    if how == "to_float32":
        metric.to(torch.float32)
    elif how == "set_dtype":
        metric.set_dtype(torch.float16)
    elif how == "parent_to_bfloat16":
        parent = nn.Module()
        parent.metric = metric
        parent.to(torch.bfloat16)
    else:
        require("lightning", "lightning")
        from lightning.pytorch.plugins.precision import HalfPrecision
        plugin = HalfPrecision(how)
        holder = nn.Module()
        holder.metric = metric
        plugin.convert_module(holder)
        return plugin.forward_context()
    return contextlib.nullcontext()


@pytest.mark.parametrize("how", CASTS)
@pytest.mark.parametrize("cls", [CalibrationError, CalibrationMetrics])
def test_state_stays_float64_under_every_cast(cls, how):
    g = torch.Generator().manual_seed(2)
    z = torch.randn(64, 4, generator=g)
    y = torch.randint(0, 4, (64,), generator=g)
    metric, twin = cls(num_classes=4, n_bins=10), cls(num_classes=4, n_bins=10)
    metric.update(z[:32], y[:32])
    twin.update(z[:32], y[:32])
    before = metric.state.clone()
    second = z[32:].to(torch.bfloat16 if "bf" in how else z.dtype)
    with _cast(metric, how):
        assert metric.state.dtype == torch.float64
        torch.testing.assert_close(metric.state, before, rtol=0, atol=0)  # nothing rounded
        metric.update(second, y[32:])
        got = metric.compute()
    assert metric.state.dtype == torch.float64
    twin.update(second, y[32:])  # the same batches without the cast
    torch.testing.assert_close(metric.state, twin.state, rtol=0, atol=0)
    value = got["ece"] if isinstance(got, dict) else got
    assert float(value) == float(twin.compute()["ece"] if isinstance(got, dict)
                                 else twin.compute())
    if "bf" not in how:
        assert float(value) == pytest.approx(float(M.ece(logits=z, labels=y, n_bins=10)),
                                             abs=1e-6)  # a float32 result


def test_state_follows_the_device_and_torchmetrics_survives_the_same_casts():
    theirs = pytest.importorskip("torchmetrics.classification").MulticlassCalibrationError(
        num_classes=3)
    ours = CalibrationError(num_classes=3)
    z, y = torch.randn(20, 3), torch.randint(0, 3, (20,))
    for how in CASTS[:3]:
        for m in (ours, theirs):
            _cast(m, how)
            m.update(z, y)
    assert ours.to("cpu").state.device.type == "cpu"
    assert ours.state.dtype == torch.float64


def test_binary_equals_torchmetrics_binary_calibration_error():
    tm = pytest.importorskip("torchmetrics.classification")
    g = torch.Generator().manual_seed(3)
    z = 2 * torch.randn(5000, generator=g)
    y = (torch.rand(5000, generator=g) < torch.sigmoid(z)).long()
    for norm, cls in (("l1", CalibrationError), ("max", MaxCalibrationError),
                      ("l2", RMSCalibrationError)):
        ours = cls(task="binary", n_bins=15)
        for zi, yi in zip(z.split(1000), y.split(1000), strict=True):
            ours.update(zi, yi)
        theirs = tm.BinaryCalibrationError(n_bins=15, norm=norm)(torch.sigmoid(z), y)
        assert float(ours.compute()) == pytest.approx(float(theirs), abs=1e-6)
        assert float(ours.compute()) == pytest.approx(
            float({"l1": M.ece, "max": M.mce, "l2": M.rmsce}[norm](
                logits=z, labels=y, task="binary")), abs=1e-7)  # float32 result
    probs = CalibrationError(task="binary", input_format="probs")
    probs.update(torch.sigmoid(z), y)
    assert float(probs.compute()) == pytest.approx(
        float(tm.BinaryCalibrationError(n_bins=15)(torch.sigmoid(z), y)), abs=1e-6)


def test_multilabel_is_the_mean_of_the_per_label_binary_values():
    g = torch.Generator().manual_seed(4)
    p = torch.rand(500, 3, generator=g, dtype=torch.float64)
    y = (torch.rand(500, 3, generator=g, dtype=torch.float64) < p).long()
    y[:40, 1] = -100
    metric = CalibrationMetrics(num_classes=3, task="multilabel", input_format="probs")
    metric.update(p[:250], y[:250])
    metric.update(p[250:], y[250:])
    out = metric.compute()
    per_label = [float(M.ece(probs=p[:, j], labels=y[:, j], task="binary")) for j in range(3)]
    assert float(out["ece"]) == pytest.approx(sum(per_label) / 3, abs=1e-12)
    assert metric.state.numel() == 3 * 3 * 15 + 4  # bins per label + n, nll, brier, correct

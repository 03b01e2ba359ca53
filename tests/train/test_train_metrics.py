"""The trainer's logged numbers against independent computations."""

from __future__ import annotations

import math

import pytest
import torch

from torchcal.metrics.epoch import epoch_metrics
from torchcal.train.engine import PackedStats, split_loss
from torchcal.train.loss_groups import LossGroups


def _ref_ece(logits, labels, n_bins):
    """Slow reference: loop over bins (k/B, (k+1)/B], 0 in the first bin."""
    p = logits.double().softmax(1)
    conf, pred = p.max(1)
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        m = (conf > lo) & (conf <= hi) if b else (conf <= hi)
        if m.any():
            acc = (pred[m] == labels[m]).double().mean()
            total += m.double().mean() * abs(float(acc) - float(conf[m].mean()))
    return float(total)


def test_streaming_train_stats_match_the_full_computation():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(517, 7, generator=g) * 3
    y = torch.randint(0, 7, (517,), generator=g)
    stats = PackedStats(1, 15, torch.device("cpu"))  # one lane
    ce = torch.nn.functional.cross_entropy
    for s in range(0, 517, 64):  # batches, with a loss that is the batch sum
        zb, yb = z[s:s + 64], y[s:s + 64]
        stats.update(zb[None], yb[None], (ce(zb, yb, reduction="sum") * 2)[None])
    out = dict(zip(("loss", "nll", "error", "ece"), stats.numbers()[0].tolist(), strict=True))
    assert out["nll"] == pytest.approx(float(ce(z.double(), y)), abs=1e-6)
    assert out["loss"] == pytest.approx(2 * float(ce(z.double(), y)), abs=1e-5)
    assert out["error"] == pytest.approx(float((z.argmax(1) != y).double().mean()), abs=1e-12)
    assert out["ece"] == pytest.approx(_ref_ece(z, y, 15), abs=1e-6)


def test_epoch_metrics_and_diagnostics():
    z = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0], [0.0, 0.0]])
    y = torch.tensor([0, 0, 1, 1])
    m = epoch_metrics(z, y, n_bins=15, diagnostics=True)
    nll = -torch.log_softmax(z.double(), 1)[torch.arange(4), y]
    p = z.double().softmax(1)
    ent = -(p * p.log()).sum(1)
    correct = torch.tensor([True, False, False, False])  # a tie [0, 0] predicts class 0
    assert torch.equal(correct, z.argmax(1) == y)
    assert m["nll"] == pytest.approx(float(nll.mean()), abs=1e-6)
    assert m["error"] == pytest.approx(float(1 - correct.double().mean()))
    assert m["ece"] == pytest.approx(_ref_ece(z, y, 15), abs=1e-6)
    assert m["nll_correct"] == pytest.approx(float(nll[correct].mean()), abs=1e-6)
    assert m["nll_incorrect"] == pytest.approx(float(nll[~correct].mean()), abs=1e-6)
    assert m["entropy_correct"] == pytest.approx(float(ent[correct].mean()), abs=1e-6)
    assert m["entropy_incorrect"] == pytest.approx(float(ent[~correct].mean()), abs=1e-6)
    # no incorrect sample: the incorrect diagnostics are NaN (null in the log)
    m2 = epoch_metrics(z[:1], y[:1], diagnostics=True)
    assert math.isnan(m2["nll_incorrect"]) and math.isnan(m2["entropy_incorrect"])


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("lanes", [1, 3])
def test_split_loss_is_the_per_sample_mean(reduction, lanes):
    """The logged loss of a split, computed in chunks of 64 (300 = 4 x 64 + 44), is each
    lane's per-sample mean whatever the loss' reduction (a sum must not be divided twice or
    a mean summed over chunks)."""
    from torchcal.losses import create_loss

    g = torch.Generator().manual_seed(1)
    z = torch.randn(300, lanes, 5, generator=g)
    y = torch.randint(0, 5, (300,), generator=g)
    losses = [create_loss("ce") for _ in range(lanes)]
    for ls in losses:
        ls.reduction = reduction
    groups = LossGroups(losses, torch.device("cpu"))
    rows = torch.tensor([reduction == "mean"] * lanes)
    got = split_loss(groups, z, y, 64, rows)
    want = torch.stack([torch.nn.functional.cross_entropy(z[:, m], y) for m in range(lanes)])
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_train_ece_has_the_sign_of_a_gap_in_each_bin():
    """Hand-worked: an under-confident bin (confidence 0.9, both right: gap +0.1) and an
    over-confident one (0.7, both wrong: gap -0.7) give ECE = 0.5 * 0.1 + 0.5 * 0.7 = 0.4; a
    signed sum (a lost ``abs``) would give |0.05 - 0.35| = 0.3."""
    z = torch.tensor([[math.log(9.0), 0.0]] * 2 + [[math.log(7 / 3), 0.0]] * 2)
    y = torch.tensor([0, 0, 1, 1])
    stats = PackedStats(1, 15, torch.device("cpu"))
    stats.update(z[None, :3], y[None, :3], torch.zeros(1))  # two batches: the sums must add
    stats.update(z[None, 3:], y[None, 3:], torch.zeros(1))  # per bin
    assert float(stats.numbers()[0, 3]) == pytest.approx(0.4, abs=1e-6)
    assert epoch_metrics(z, y, n_bins=15)["ece"] == pytest.approx(0.4, abs=1e-6)
    assert _ref_ece(z, y, 15) == pytest.approx(0.4, abs=1e-6)

"""NLL, Brier, error, top-k error and S99 against hand-worked values and slow references."""

import math
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import torchcal.metrics as M

sys.path.insert(0, os.path.dirname(__file__))
import metrics_reference as ref  # noqa: E402


def _random(n, c, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(n, c, generator=g, dtype=torch.float64),
            torch.randint(0, c, (n,), generator=g))


def test_hand_worked():
    p = torch.tensor([[0.5, 0.5], [0.25, 0.75]], dtype=torch.float64)
    y = torch.tensor([0, 1])
    # NLL = (log 2 + log 4/3) / 2 ; Brier = ((.5^2 + .5^2) + (.25^2 + .25^2)) / 2 = .3125
    assert M.nll(probs=p, labels=y).item() == pytest.approx(
        (math.log(2) + math.log(4 / 3)) / 2, abs=1e-15)
    assert M.brier(probs=p, labels=y).item() == pytest.approx(0.3125, abs=1e-15)
    # the tie in row 0 is broken towards class 0 (first index), so both are correct
    assert M.error(probs=p, labels=y).item() == 0.0
    assert M.error(probs=p, labels=torch.tensor([1, 0])).item() == 1.0


def test_against_references_and_torch():
    z, y = _random(400, 7, seed=0)
    p = torch.softmax(z, 1)
    assert M.nll(logits=z, labels=y).item() == pytest.approx(ref.nll(p, y), rel=1e-12)
    assert M.nll(logits=z, labels=y).item() == pytest.approx(F.cross_entropy(z, y).item(),
                                                             rel=1e-12)
    assert M.nll(probs=p, labels=y).item() == pytest.approx(ref.nll(p, y), rel=1e-12)
    assert M.brier(logits=z, labels=y).item() == pytest.approx(ref.brier(p, y), rel=1e-12)
    tl = ref.top1(p)
    err = sum(pred != t for (_, pred), t in zip(tl, y.tolist(), strict=True)) / 400
    assert M.error(logits=z, labels=y).item() == pytest.approx(err, abs=1e-15)


def test_nll_from_logits_is_exact_for_tiny_probabilities():
    z = torch.tensor([[0.0, -200.0]], dtype=torch.float32)
    y = torch.tensor([1])
    assert M.nll(logits=z, labels=y).item() == pytest.approx(200.0, rel=1e-6)
    # probs with an exact 0 for the true class: inf, honestly
    assert math.isinf(M.nll(probs=torch.tensor([[1.0, 0.0]]), labels=y).item())


def test_brier_is_sum_over_classes_not_mean():
    p = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    assert M.brier(probs=p, labels=torch.tensor([1])).item() == 2.0  # not 2/4


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_topk_error_reference(k):
    z, y = _random(300, 7, seed=k)
    p = torch.softmax(z, 1)
    rows, ys = p.tolist(), y.tolist()
    miss = 0
    for row, t in zip(rows, ys, strict=True):
        rank = sum(1 for v in row if v > row[t])
        miss += rank >= k
    assert M.topk_error(logits=z, labels=y, k=k).item() == pytest.approx(miss / 300, abs=1e-15)
    if k == 1:
        assert M.topk_error(logits=z, labels=y, k=1).item() == M.error(logits=z, labels=y).item()
    if k == 7:
        assert M.topk_error(logits=z, labels=y, k=7).item() == 0.0


def test_topk_ties_count_as_misses():
    # class 2 ties with class 1 for the 2nd place: a miss at k=2 (a hit before issue 25),
    # a hit at k=3; on probabilities and on the logits alike
    p = torch.tensor([[0.4, 0.3, 0.3]])
    assert M.topk_error(probs=p, labels=torch.tensor([2]), k=2).item() == 1.0
    assert M.topk_error(probs=p, labels=torch.tensor([2]), k=1).item() == 1.0
    assert M.topk_error(probs=p, labels=torch.tensor([2]), k=3).item() == 0.0
    assert M.topk_error(logits=p.log(), labels=torch.tensor([2]), k=2).item() == 1.0


def test_s99():
    p = torch.tensor([[0.995, 0.005], [0.5, 0.5], [0.001, 0.999], [0.3, 0.7]],
                     dtype=torch.float64)
    share, acc = M.s99(probs=p, labels=torch.tensor([0, 0, 0, 1]))
    assert share.item() == 0.5 and acc.item() == 0.5
    # exactly at the threshold counts (>=)
    p2 = torch.tensor([[0.99, 0.01]], dtype=torch.float64)
    share, acc = M.s99(probs=p2, labels=torch.tensor([0]))
    assert share.item() == 1.0 and acc.item() == 1.0
    share, acc = M.s99(probs=torch.tensor([[0.6, 0.4]]), labels=torch.tensor([0]))
    assert share.item() == 0.0 and math.isnan(acc.item())
    share, _ = M.s99(probs=p, labels=torch.tensor([0, 0, 0, 1]), threshold=0.5)
    assert share.item() == 1.0


def test_numpy_and_dtypes():
    z, y = _random(50, 5, seed=3)
    for fn in (M.nll, M.brier, M.error, M.topk_error):
        a = fn(logits=z.numpy(), labels=y.numpy())
        b = fn(logits=z, labels=y)
        assert a.dtype == torch.float64 and a.item() == pytest.approx(b.item(), abs=1e-14)
        c = fn(logits=z.half(), labels=y, validate_args=True)
        assert c.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_s99_threshold_is_exact_in_low_precision(dtype):
    # the largest value below 0.99 in each dtype (bfloat16: 0.98828125, which is what 0.99
    # itself rounds to in bfloat16) is not confident; the smallest value >= 0.99 is
    spacing = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}[dtype]
    below = torch.tensor(math.floor(0.99 / spacing) * spacing, dtype=dtype)
    above = torch.tensor(math.ceil(0.99 / spacing) * spacing, dtype=dtype)
    assert below.double() < 0.99 <= above.double()
    conf = torch.stack([below, above, torch.tensor(0.5, dtype=dtype)])
    p = torch.stack([conf, 1 - conf], 1)
    y = torch.tensor([0, 1, 0])
    share, acc = M.s99(probs=p, labels=y, validate_args=False)
    assert share.item() == pytest.approx(1 / 3) and acc.item() == 0.0
    meter = M.CalibrationMeter(2)
    meter.update(probs=p, labels=y, validate_args=False)
    out = meter.compute()
    assert out["s99_share"].item() == pytest.approx(1 / 3) and out["s99_accuracy"].item() == 0.0

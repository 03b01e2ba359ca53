"""MMCE (weighted): double-loop reference in both normalisations, edge cases, reductions."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from loss_data import logits_targets

import torchcal.functional as TF
from torchcal.losses import MMCELoss, create_loss


def ref_penalty(x, t, normalization, width=0.4):
    """Double loop from REFERENCE.md §1 (and the published code's normalisation)."""
    rows = []
    for row, y in zip(x.tolist(), t.tolist(), strict=True):
        e = [math.exp(v) for v in row]
        s = sum(e)
        p = [v / s for v in e]
        r = max(p)
        rows.append((r, p.index(r) == y))
    cor = [r for r, ok in rows if ok]
    wrong = [r for r, ok in rows if not ok]
    m, n = len(cor), len(wrong)
    if m == 0 or n == 0:
        return 0.0

    def k(a, b):
        return math.exp(-abs(a - b) / width)

    s_cc = sum((1 - a) * (1 - b) * k(a, b) for a in cor for b in cor)
    s_ww = sum(a * b * k(a, b) for a in wrong for b in wrong)
    s_cw = sum((1 - a) * b * k(a, b) for a in cor for b in wrong)
    if normalization == "paper":
        sq = s_cc / m**2 + s_ww / n**2 - 2 * s_cw / (m * n)
    else:  # published: mean over each matrix, then divided again (+1e-5)
        sq = (s_cc / m**2) / (m * m + 1e-5) + (s_ww / n**2) / (n * n + 1e-5) \
            - 2 * (s_cw / (m * n)) / (m * n + 1e-5)
    return math.sqrt(max(sq, 0.0) + 1e-10)


_data = partial(logits_targets, n=16, c=3, scale=1.5)


@pytest.mark.parametrize("normalization", ["published", "paper"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mmce_matches_double_loop(normalization, seed):
    x, t = _data(seed=seed)
    pen = ref_penalty(x, t, normalization)
    assert pen > 1e-3
    ce = F.cross_entropy(x, t)
    got = TF.mmce_loss(x, t, 2.0, normalization=normalization)
    torch.testing.assert_close(got, ce + 2.0 * pen)
    torch.testing.assert_close(MMCELoss(0.5, normalization, reduction="sum")(x, t),
                               16 * (ce + 0.5 * pen))
    conf, pred = torch.softmax(x, 1).max(1)
    torch.testing.assert_close(TF.mmce_penalty(conf, pred == t, normalization=normalization),
                               torch.tensor(pen, dtype=torch.float64))


def test_mmce_zero_penalty_for_all_correct_or_all_wrong():
    x, _ = _data()
    pred = x.argmax(1)
    for t in (pred, (pred + 1) % 3):
        assert ref_penalty(x, t, "published") == 0.0
        torch.testing.assert_close(TF.mmce_loss(x, t), F.cross_entropy(x, t))
        conf = torch.softmax(x, 1).amax(1)
        assert TF.mmce_penalty(conf, pred == t) == 0


def test_mmce_gradcheck_and_ignore_index():
    x, t = _data(n=8, seed=1)
    xr = x.clone().requires_grad_(True)
    for norm in ("published", "paper"):
        assert torch.autograd.gradcheck(lambda z, nm=norm: TF.mmce_loss(z, t, normalization=nm),
                                        (xr,))
    # ignored samples are left out of both CE and the penalty
    t2 = t.clone()
    t2[[0, 5]] = -100
    keep = t2 != -100
    torch.testing.assert_close(TF.mmce_loss(x, t2), TF.mmce_loss(x[keep], t[keep]))
    torch.testing.assert_close(TF.mmce_loss(x, t2, reduction="sum"),
                               6 * TF.mmce_loss(x[keep], t[keep]))


def test_mmce_spatial_input_is_flattened_samples():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 2, 2, generator=g, dtype=torch.float64)
    t = torch.randint(0, 3, (2, 2, 2), generator=g)
    rows = x.movedim(1, -1).reshape(-1, 3)
    torch.testing.assert_close(TF.mmce_loss(x, t), TF.mmce_loss(rows, t.reshape(-1)))


def test_mmce_reduction_none_is_an_error_and_registry():
    x, t = _data()
    with pytest.raises(ValueError, match="reduction='none'"):
        TF.mmce_loss(x, t, reduction="none")
    loss = create_loss("mmce")
    assert loss.published_reduction == "sum" and loss.lam == 2.0
    with pytest.raises(ValueError, match="`width`"):
        TF.mmce_loss(x, t, width=0.0)


def test_mmce_all_ignored_or_empty_batch_matches_cross_entropy_reductions():
    # "sum" is M·(CE_mean + λ·MMCE) = 0 for M = 0 kept entries (like F.cross_entropy's sum),
    # not 0·NaN; "mean" over nothing is NaN as in PyTorch.
    x, t = _data(n=6)
    for tt, xx in ((torch.full_like(t, -100), x), (t[:0], x[:0])):
        xr = xx.clone().requires_grad_(True)
        out = TF.mmce_loss(xr, tt, reduction="sum")
        assert out == 0 and out == F.cross_entropy(xx, tt, reduction="sum")
        out.backward()
        assert torch.all(xr.grad == 0)
        assert torch.isnan(TF.mmce_loss(xx, tt)) and torch.isnan(F.cross_entropy(xx, tt))

"""Cross-entropy, label smoothing (both conventions) and Brier: slow references and gradients."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from loss_data import logits_targets

import torchcal.functional as TF
from torchcal.losses import BrierLoss, CrossEntropyLoss, LabelSmoothingLoss

_data = partial(logits_targets, n=10, c=4)


def _probs(row):
    e = [math.exp(v) for v in row]
    s = sum(e)
    return [v / s for v in e]


def ref_ls(x, t, alpha, spread):
    out = []
    c = x.shape[1]
    for i in range(x.shape[0]):
        p = _probs(x[i].tolist())
        if spread == "others":
            q = [alpha / (c - 1)] * c
            q[int(t[i])] = 1 - alpha
        else:
            q = [alpha / c] * c
            q[int(t[i])] = 1 - alpha + alpha / c
        out.append(-sum(qc * math.log(pc) for qc, pc in zip(q, p, strict=True)))
    return torch.tensor(out, dtype=torch.float64)


def ref_brier(x, t):
    out = []
    for i in range(x.shape[0]):
        p = _probs(x[i].tolist())
        out.append(sum((pc - (1.0 if c == int(t[i]) else 0.0)) ** 2 for c, pc in enumerate(p)))
    return torch.tensor(out, dtype=torch.float64)


def test_cross_entropy_module_and_reference():
    x, t = _data()
    ref = torch.tensor([-math.log(_probs(r)[int(k)]) for r, k in zip(x.tolist(), t, strict=True)],
                       dtype=torch.float64)
    torch.testing.assert_close(TF.cross_entropy(x, t, reduction="none"), ref)
    torch.testing.assert_close(CrossEntropyLoss(reduction="sum")(x, t), ref.sum())


@pytest.mark.parametrize("alpha", [0.0, 0.05, 0.3, 0.9])
@pytest.mark.parametrize("spread", ["others", "uniform"])
def test_label_smoothing_matches_reference(alpha, spread):
    x, t = _data()
    torch.testing.assert_close(TF.label_smoothing_loss(x, t, alpha, spread=spread,
                                                       reduction="none"),
                               ref_ls(x, t, alpha, spread))
    torch.testing.assert_close(LabelSmoothingLoss(alpha, spread)(x, t),
                               ref_ls(x, t, alpha, spread).mean())


def test_label_smoothing_two_classes_large_alpha():
    # "others" with C=2 and alpha > 0.5 has q_y < q_other (ε = 2α > 1): still the formula
    x, t = _data(c=2)
    torch.testing.assert_close(TF.label_smoothing_loss(x, t, 0.8, reduction="none"),
                               ref_ls(x, t, 0.8, "others"))


def test_label_smoothing_alpha_as_0d_tensor():
    # like every other hyperparameter, a 0-d tensor is accepted as a number
    x, t = _data()
    torch.testing.assert_close(TF.label_smoothing_loss(x, t, torch.tensor(0.1)),
                               TF.label_smoothing_loss(x, t, 0.1))


def test_label_smoothing_alpha_zero_is_cross_entropy():
    x, t = _data()
    for spread in ("others", "uniform"):
        torch.testing.assert_close(TF.label_smoothing_loss(x, t, 0.0, spread=spread),
                                   F.cross_entropy(x, t))


@pytest.mark.parametrize("alpha", [0.05, 0.2])
def test_label_smoothing_uniform_is_torch_label_smoothing(alpha):
    x, t = _data()
    t[3] = -100
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    for red in ("none", "sum", "mean"):
        torch.testing.assert_close(
            TF.label_smoothing_loss(x1, t, alpha, spread="uniform", reduction=red),
            F.cross_entropy(x2, t, label_smoothing=alpha, reduction=red))
    TF.label_smoothing_loss(x1, t, alpha, spread="uniform").backward()
    F.cross_entropy(x2, t, label_smoothing=alpha).backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    # "others" with α equals torch's label_smoothing with α·C/(C-1)
    torch.testing.assert_close(TF.label_smoothing_loss(x, t, alpha),
                               F.cross_entropy(x, t, label_smoothing=alpha * 4 / 3))


def test_label_smoothing_needs_two_classes_for_others():
    x = torch.zeros(3, 1)
    t = torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="at least 2 classes"):
        TF.label_smoothing_loss(x, t, 0.1)
    assert TF.label_smoothing_loss(x, t, 0.0) == 0


def test_brier_matches_reference_and_hand_value():
    x, t = _data()
    torch.testing.assert_close(TF.brier_loss(x, t, reduction="none"), ref_brier(x, t))
    torch.testing.assert_close(BrierLoss()(x, t), ref_brier(x, t).mean())
    # p = (0.5, 0.3, 0.2), y = 1: 0.25 + 0.49 + 0.04
    xh = torch.log(torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64))
    torch.testing.assert_close(TF.brier_loss(xh, torch.tensor([1])),
                               torch.tensor(0.78, dtype=torch.float64))


def test_brier_is_exact_for_confident_samples():
    # p_y = 1 - 1e-6: B = q² + Σ others² = 2e-12.  In float32 a naive 1 - 2 p_y + Σ p² is
    # off by up to ~1e-7 (here it returns 0); d_y = expm1(log p_y) keeps it within float32's
    # log_softmax accuracy (a few % here).
    x = torch.tensor([[0.0, -math.log(1e6 - 1)]], dtype=torch.float64)
    ref = ref_brier(x, torch.tensor([0])).item()
    got32 = TF.brier_loss(x.float(), torch.tensor([0])).item()
    assert abs(got32 - ref) < 0.1 * ref
    p = torch.softmax(x.float(), 1)[0]
    naive = (1 - 2 * p[0] + (p * p).sum()).item()
    assert abs(naive - ref) > 0.5 * ref  # the naive form loses the value entirely


def test_gradcheck_basic_losses():
    x, t = _data(n=5, c=3)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z: TF.brier_loss(z, t, reduction="sum"), (x,))
    assert torch.autograd.gradcheck(lambda z: TF.label_smoothing_loss(z, t, 0.1), (x,))
    assert torch.autograd.gradcheck(
        lambda z: TF.label_smoothing_loss(z, t, 0.1, spread="uniform"), (x,))
    assert torch.autograd.gradcheck(lambda z: TF.cross_entropy(z, t), (x,))


def test_brier_gradient_matches_autograd_reference():
    x, t = _data()
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    TF.brier_loss(x1, t, reduction="sum").backward()
    p = torch.softmax(x2, 1)
    ((p - F.one_hot(t, 4)) ** 2).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)

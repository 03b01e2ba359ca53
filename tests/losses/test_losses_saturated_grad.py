"""Every registered loss has finite values and finite gradients at saturated probabilities
(issue 24, 2: ECE-KDE marginal/top_label gave NaN gradients once a probability was exactly 1)."""

from __future__ import annotations

import warnings

import pytest
import torch

from torchcal.losses import create_loss, list_losses

VARIANTS = [(name, {}) for name in list_losses()] + [
    ("ece_kde", {"mc_type": m}) for m in ("marginal", "top_label")] + [
    ("ece_kde", {"mc_type": "canonical", "bandwidth": 0.05})]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("gap", [20.0, 40.0, 100.0, 1000.0])
@pytest.mark.parametrize(("name", "kwargs"), VARIANTS,
                         ids=[f"{n}-{'-'.join(map(str, k.values()))}" for n, k in VARIANTS])
def test_finite_gradient_at_saturated_probabilities(name, kwargs, gap, dtype):
    z = torch.tensor([[gap, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 2.0]], dtype=dtype,
                     requires_grad=True)
    y = torch.tensor([0, 1, 0, 1])
    loss = create_loss(name, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. a temperature fit at its grid's end
        if getattr(loss, "wants_validation", False):
            loss.on_validation(logits=z.detach(), labels=y)
        value = loss(z, y)
        value.backward()
    assert torch.isfinite(value), value
    assert torch.isfinite(z.grad).all(), z.grad


@pytest.mark.parametrize("mc_type", ["marginal", "top_label"])
def test_ece_kde_gradient_at_saturation_is_the_limit_of_nearby_gradients(mc_type):
    # p = 1 exactly (gap 40 in float64: 1 - p < ulp) against a gap where p < 1 is representable
    def grad(gap):
        z = torch.tensor([[gap, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 2.0]], dtype=torch.float64,
                         requires_grad=True)
        create_loss("ece_kde", mc_type=mc_type, bandwidth=0.1)(z, torch.tensor([0, 1, 0, 1])
                                                                ).backward()
        return z.grad
    torch.testing.assert_close(grad(40.0)[1:], grad(30.0)[1:], rtol=1e-6, atol=1e-9)

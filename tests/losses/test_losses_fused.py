"""The analytic backwards of ``torchcal.functional._fused`` (issue 50): against finite
differences (``gradcheck``, float64), against autograd through the formula written out here,
under ``torch.func.grad`` and ``torch.func.vmap`` (the packed path: equal to one call per member,
bit for bit) and at saturated rows (finite gradients)."""

from __future__ import annotations

import pytest
import torch

from torchcal.functional import brier_loss, bsce_gra_loss, bsce_loss, label_smoothing_loss
from torchcal.functional._fused import WEIGHT_KINDS, weighted_ce_apply
from torchcal.functional.temperature import (
    temperature_bsce_gra_loss,
    temperature_bsce_loss,
    temperature_dual_focal_gra_loss,
    temperature_dual_focal_loss,
    temperature_focal_gra_loss,
    temperature_focal_loss,
)

FNS = {("focal", False): temperature_focal_loss, ("focal", True): temperature_focal_gra_loss,
       ("dual", False): temperature_dual_focal_loss,
       ("dual", True): temperature_dual_focal_gra_loss,
       ("bsce", False): temperature_bsce_loss, ("bsce", True): temperature_bsce_gra_loss}


def _formula(x, y, kind, gamma, t, detach):
    """``-w(q)·log p_y`` by autograd, written from the definitions (no shared helper)."""
    log_p = torch.log_softmax(x, 1)
    q = torch.softmax(x / t, 1)
    if detach:
        q = q.detach()
    qy = q.gather(1, y[:, None])[:, 0]
    if kind == "focal":
        w = (1 - qy) ** gamma
    elif kind == "dual":
        below = torch.where(q < qy[:, None], q, torch.zeros_like(q))
        w = (1 - qy + below.amax(1)) ** gamma
    else:
        d = q - torch.nn.functional.one_hot(y, x.shape[1]).to(x.dtype)
        w = (d * d).sum(1) ** (gamma / 2)
    return -(w * log_p.gather(1, y[:, None])[:, 0])


def _data(seed, shape=(12, 6), scale=2.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=dtype),
            torch.randint(0, shape[1], shape[:1] + shape[2:], generator=g))


@pytest.mark.parametrize("kind", WEIGHT_KINDS)
@pytest.mark.parametrize("detach", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7, torch.tensor([1.6], dtype=torch.float64)])
def test_gradcheck_and_autograd_formula(kind, detach, temperature):
    fn = FNS[(kind, detach)]
    t = float(temperature)
    for seed, gamma in enumerate((3.0, 0.5, 1.0)):
        x, y = _data(seed)
        x.requires_grad_(True)
        if not detach:  # a GRA gradient is Σ w ∇CE by design, not the value's derivative
            assert torch.autograd.gradcheck(
                lambda a, y=y, gamma=gamma: fn(a, y, gamma=gamma, temperature=temperature,
                                               reduction="sum"), (x,))
        v = fn(x, y, gamma=gamma, temperature=temperature, reduction="none")
        ref = _formula(x, y, kind, gamma, t, detach)
        torch.testing.assert_close(v, ref, rtol=1e-10, atol=1e-12)
        (g,) = torch.autograd.grad(v.sum(), x)
        (rg,) = torch.autograd.grad(ref.sum(), x)
        torch.testing.assert_close(g, rg, rtol=1e-9, atol=1e-12)


@pytest.mark.filterwarnings("error")
def test_label_smoothing_vmap_equals_one_call_per_member():
    xs = torch.stack([_data(30 + i, (16, 10), 3.0, torch.float32)[0] for i in range(3)])
    ys = torch.stack([_data(30 + i, (16, 10), 3.0, torch.float32)[1] for i in range(3)])

    def f(x, y):
        return label_smoothing_loss(x, y, 0.05)

    g = torch.func.vmap(torch.func.grad(f))(xs, ys)
    for i in range(3):
        assert torch.equal(g[i], torch.func.grad(f)(xs[i], ys[i]))


def test_label_smoothing_gradcheck_both_spreads_and_large_eps():
    x, y = _data(5, (10, 4))
    x.requires_grad_(True)
    for alpha, spread in ((0.05, "others"), (0.3, "uniform"), (0.9, "uniform")):
        assert torch.autograd.gradcheck(
            lambda a, al=alpha, sp=spread: label_smoothing_loss(a, y, al, spread=sp,
                                                                reduction="sum"), (x,))
    x2, y2 = _data(6, (8, 2))  # C = 2, alpha > 1/2: eps = 2 alpha > 1
    x2.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a: label_smoothing_loss(a, y2, 0.7), (x2,))
    # against the definition -(sum_c q_c log p_c)
    q = torch.full((8, 2), 0.7).scatter(1, y2[:, None], 0.3).double()
    ref = -(q * torch.log_softmax(x2, 1)).sum(1).mean()
    torch.testing.assert_close(label_smoothing_loss(x2, y2, 0.7), ref)


@pytest.mark.parametrize("kind", WEIGHT_KINDS)
def test_spatial_input_and_ignore_index(kind):
    """(N, C, d) logits equal the same rows as (M, C); ignored entries get no gradient."""
    x, y = _data(7, (4, 5, 3))
    y[1, 2] = -100
    x.requires_grad_(True)
    fn = FNS[(kind, False)]
    v = fn(x, y, temperature=0.8, reduction="none")
    assert v[1, 2] == 0
    (g,) = torch.autograd.grad(v.sum(), x)
    assert torch.all(g[1, :, 2] == 0)
    rows, yr = x.detach().movedim(1, -1).reshape(-1, 5), y.reshape(-1)
    keep = yr != -100
    ref = _formula(rows[keep], yr[keep], kind, 5.0 if kind == "dual" else (
        2.0 if kind == "bsce" else 3.0), 0.8, False)
    torch.testing.assert_close(v.reshape(-1)[keep], ref)
    assert torch.autograd.gradcheck(lambda a: fn(a, y, temperature=0.8), (x,))


@pytest.mark.filterwarnings("error")  # no per-member fallback of a missing batching rule
@pytest.mark.parametrize("kind", WEIGHT_KINDS)
@pytest.mark.parametrize("detach", [False, True])
def test_vmap_and_func_grad_equal_one_call_per_member_bit_for_bit(kind, detach):
    fn = FNS[(kind, detach)]
    m = 3
    data = [_data(20 + i, (16, 10), 3.0, torch.float32) for i in range(m)]
    xs = torch.stack([d[0] for d in data])
    ys = torch.stack([d[1] for d in data])
    ts = torch.tensor([[1.0], [0.6], [2.5]], dtype=torch.float64)

    def f(x, y, t):
        return fn(x, y, temperature=t, reduction="sum")

    v = torch.func.vmap(f)(xs, ys, ts)
    g = torch.func.vmap(torch.func.grad(f))(xs, ys, ts)
    for i in range(m):
        xi = xs[i].clone().requires_grad_(True)
        vi = f(xi, ys[i], ts[i])
        vi.backward()
        assert torch.equal(v[i], vi.detach())
        assert torch.equal(g[i], xi.grad)
        assert torch.equal(torch.func.grad(f)(xs[i], ys[i], ts[i]), xi.grad)


@pytest.mark.parametrize("kind", WEIGHT_KINDS)
@pytest.mark.parametrize("gamma", [0.5, 1.0, 3.0])
def test_saturated_rows_have_finite_gradients(kind, gamma):
    """p_y = 1 in float32 (a huge margin): the weight's slope is taken at its limit."""
    x = torch.tensor([[60.0, 0.0, -3.0], [0.0, 0.0, 0.0]], requires_grad=True)
    y = torch.tensor([0, 1])
    v = FNS[(kind, False)](x, y, gamma=gamma, temperature=0.5, reduction="sum")
    v.backward()
    assert torch.isfinite(v) and torch.isfinite(x.grad).all()


def test_temperature_one_is_the_plain_path():
    """A number equal to 1 reads q = p (no second log_softmax): the same loss as T = 1.0 as a
    tensor, to rounding."""
    x, y = _data(9, (20, 7))
    for kind in WEIGHT_KINDS:
        a, _ = weighted_ce_apply(x, y, kind=kind, gamma=2.0, temperature=1.0, detach=False,
                                 ignore_index=-100, validate_args=True)
        b, _ = weighted_ce_apply(x, y, kind=kind, gamma=2.0,
                                 temperature=torch.ones(1, dtype=torch.float64), detach=False,
                                 ignore_index=-100, validate_args=True)
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0.0)


@pytest.mark.filterwarnings("error")  # an in-place scatter under vmap would warn (no rule)
def test_in_place_scatter_only_outside_transforms():
    """The Brier/BSCE losses and weights (their scatter in place in plain eager mode) give under
    ``torch.func.grad`` the gradient of a plain backward, bit for bit, and under ``vmap(grad)``
    the same to rounding (β != 2 goes through autograd's pow and sum, whose batched kernels may
    round otherwise: unchanged by issue 50), with no per-member fallback."""
    x, y = _data(11, (8, 5))
    cases = (lambda a: bsce_loss(a, y, beta=1.5), lambda a: bsce_loss(a, y),
             lambda a: bsce_gra_loss(a, y), lambda a: brier_loss(a, y),
             lambda a: temperature_bsce_loss(a, y, beta=3.0, temperature=0.7),
             lambda a: temperature_bsce_gra_loss(a, y, beta=3.0, temperature=0.7),
             lambda a: temperature_bsce_loss(a, y, temperature=0.7))
    for f in cases:
        xr = x.clone().requires_grad_(True)
        f(xr).backward()
        g = torch.func.grad(f)(x)
        assert torch.equal(g, xr.grad)
        gv = torch.func.vmap(torch.func.grad(f))(x.expand(2, 8, 5))[1]
        torch.testing.assert_close(gv, g, rtol=1e-12, atol=1e-14)


def test_compiled_func_grad_equals_eager(detach=True):
    """``torch.compile`` of ``torch.func.grad`` (the compiled packed step) differentiates the
    Function's forward instead of calling its backward: the GRA forms' forward detaches the
    weight, so both give the GRA gradient (and the plain forms the true one)."""
    x, y = _data(12, (16, 10), 3.0, torch.float32)
    t = torch.tensor([0.6], dtype=torch.float64)
    for kind in WEIGHT_KINDS:
        def f(a, fn=FNS[(kind, detach)]):
            return fn(a, y, temperature=t, validate_args=False)

        torch._dynamo.reset()
        c = torch.compile(torch.func.grad(f), backend="eager", fullgraph=True)(x)
        torch.testing.assert_close(c, torch.func.grad(f)(x), rtol=1e-5, atol=1e-7)

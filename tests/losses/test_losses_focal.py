"""Focal family: focal, inverse focal, signed focal, FLSD, Lambert-W γ*, scheduled focal.

Slow references are written here from REFERENCE.md §1 with per-sample Python loops in float64.
"""

from __future__ import annotations

import io
import math
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from loss_data import logits_targets

import torchcal.functional as TF
from torchcal.losses import (
    FocalLoss,
    InverseFocalLoss,
    SampleDependentFocalLoss,
    ScheduledFocalLoss,
    create_loss,
)

_data = partial(logits_targets, n=10, c=4)


def ref_signed_focal(x, t, gammas):
    out = []
    for i in range(x.shape[0]):
        row = [math.exp(v) for v in x[i].tolist()]
        p = row[int(t[i])] / sum(row)
        g = float(gammas[i])
        w = (1 - p) ** g if g >= 0 else (1 + p) ** (-g)
        out.append(-w * math.log(p))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0, 3.0, 5.0])
def test_focal_and_inverse_focal_match_reference(gamma):
    x, t = _data()
    g = [gamma] * len(t)
    torch.testing.assert_close(TF.focal_loss(x, t, gamma, reduction="none"),
                               ref_signed_focal(x, t, g))
    torch.testing.assert_close(TF.inverse_focal_loss(x, t, gamma, reduction="none"),
                               ref_signed_focal(x, t, [-v for v in g]))
    # module form
    torch.testing.assert_close(FocalLoss(gamma, reduction="sum")(x, t),
                               ref_signed_focal(x, t, g).sum())
    torch.testing.assert_close(InverseFocalLoss(gamma)(x, t),
                               ref_signed_focal(x, t, [-v for v in g]).mean())


def test_signed_focal_per_sample_gamma_matches_reference_and_wrappers():
    x, t = _data()
    gam = torch.tensor([-2.0, -0.5, -0.2, 0.0, 0.2, 0.5, 1.0, 3.0, 20.0, -1.0], dtype=torch.float64)
    torch.testing.assert_close(TF.signed_focal_loss(x, t, gam, reduction="none"),
                               ref_signed_focal(x, t, gam))
    # a float32 gamma tensor is fine too; float gamma of either sign
    torch.testing.assert_close(TF.signed_focal_loss(x, t, gam.float(), reduction="none"),
                               ref_signed_focal(x, t, gam))
    torch.testing.assert_close(TF.signed_focal_loss(x, t, -2.0), TF.inverse_focal_loss(x, t, 2.0))
    torch.testing.assert_close(TF.signed_focal_loss(x, t, 2.0), TF.focal_loss(x, t, 2.0))
    # per-sample γ >= 0 through focal_loss
    torch.testing.assert_close(TF.focal_loss(x, t, gam.abs(), reduction="none"),
                               ref_signed_focal(x, t, gam.abs()))
    torch.testing.assert_close(TF.inverse_focal_loss(x, t, gam.abs(), reduction="none"),
                               ref_signed_focal(x, t, -gam.abs()))


def test_focal_gamma_zero_is_cross_entropy_values_and_gradients():
    x, t = _data()
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    a = TF.focal_loss(x1, t, 0.0)
    b = F.cross_entropy(x2, t)
    torch.testing.assert_close(a, b)
    a.backward()
    b.backward()
    torch.testing.assert_close(x1.grad, x2.grad)


def test_gradcheck_focal_family():
    x, t = _data(n=6, c=4)
    x.requires_grad_(True)
    gam = torch.tensor([-2.0, -0.5, 0.0, 0.3, 2.0, 4.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda z: TF.signed_focal_loss(z, t, gam, reduction="sum"), (x,), fast_mode=True)
    for g in (0.3, 1.0, 3.0):
        assert torch.autograd.gradcheck(lambda z, g=g: TF.focal_loss(z, t, g), (x,), fast_mode=True)
        assert torch.autograd.gradcheck(lambda z, g=g: TF.inverse_focal_loss(z, t, g), (x,), fast_mode=True)
    # FLSD (piecewise; away from the thresholds it is focal with fixed per-sample γ)
    assert torch.autograd.gradcheck(lambda z: TF.flsd53_loss(z, t, reduction="none"), (x,), fast_mode=True)
    assert torch.autograd.gradcheck(lambda z: TF.flsd532_loss(z, t), (x,), fast_mode=True)


def test_weight_is_not_detached():
    # focal's gradient differs from a detached-weight (FL-GRA) gradient
    x, t = _data()
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    TF.focal_loss(x1, t, 3.0).backward()
    TF.focal_gra_loss(x2, t, 3.0).backward()
    assert not torch.allclose(x1.grad, x2.grad)


# ---------------------------------------------------------------------------- FLSD
def ref_flsd(x, t, gam_hi):
    gs = []
    for i in range(x.shape[0]):
        p = torch.softmax(x[i], 0)[t[i]].item()
        gs.append(5.0 if p < 0.2 else (3.0 if p < 0.5 else gam_hi))
    return ref_signed_focal(x, t, gs)


def test_flsd_matches_reference():
    x, t = _data(n=40, c=3, seed=3)
    p = torch.softmax(x, 1).gather(1, t[:, None]).squeeze(1)
    assert (p < 0.2).any() and ((p >= 0.2) & (p < 0.5)).any() and (p >= 0.5).any()
    torch.testing.assert_close(TF.flsd53_loss(x, t, reduction="none"), ref_flsd(x, t, 3.0))
    torch.testing.assert_close(TF.flsd532_loss(x, t, reduction="none"), ref_flsd(x, t, 2.0))
    torch.testing.assert_close(create_loss("flsd53")(x, t), ref_flsd(x, t, 3.0).mean())
    torch.testing.assert_close(create_loss("flsd532", reduction="sum")(x, t),
                               ref_flsd(x, t, 2.0).sum())
    # a general schedule
    loss = SampleDependentFocalLoss(thresholds=(0.3,), gammas=(4.0, 1.0), reduction="none")
    ref = ref_signed_focal(x, t, [4.0 if v < 0.3 else 1.0 for v in p.tolist()])
    torch.testing.assert_close(loss(x, t), ref)


def test_sample_dependent_gamma_thresholds_exact():
    for dtype in (torch.float32, torch.float64):
        p = torch.tensor([0.0, 0.19999, 0.2, 0.3, 0.49999, 0.5, 0.7, 1.0], dtype=dtype)
        below = torch.nextafter(torch.tensor([0.2, 0.5], dtype=dtype), torch.zeros(2, dtype=dtype))
        assert TF.sample_dependent_gamma(p).tolist() == [5, 5, 3, 3, 3, 3, 3, 3]
        assert TF.sample_dependent_gamma(p, *TF.FLSD532).tolist() == [5, 5, 3, 3, 3, 2, 2, 2]
        assert TF.sample_dependent_gamma(below, *TF.FLSD532).tolist() == [5, 3]


def _logits_with_exact_py(value, dtype):
    """Two-class logits (0, z) with exp(log_softmax)[0] exactly == value (searched)."""
    z0 = math.log((1 - value) / value)
    z = torch.tensor([z0], dtype=dtype)
    for _ in range(200):
        x = torch.cat([torch.zeros(1, dtype=dtype), z]).reshape(1, 2)
        p = torch.log_softmax(x, 1)[0, 0].exp()
        if p == torch.tensor(value, dtype=dtype):
            return x
        # p too large -> increase z
        direction = torch.tensor([math.inf if p > value else -math.inf], dtype=dtype)
        z = torch.nextafter(z, direction)
    raise AssertionError("no exact logits found")


# float32 exp(log_softmax) cannot produce exactly 0.2 for two classes (its output grid near 0.2
# is coarser than float32's), so that case is covered by test_sample_dependent_gamma_thresholds_exact.
@pytest.mark.parametrize("dtype, threshold, gam_at, gam_below", [
    (torch.float64, 0.2, 3.0, 5.0), (torch.float64, 0.5, 2.0, 3.0), (torch.float32, 0.5, 2.0, 3.0)])
def test_flsd_at_exact_thresholds_through_the_loss(dtype, threshold, gam_at, gam_below):
    x = _logits_with_exact_py(threshold, dtype)
    t = torch.tensor([0])
    got = TF.flsd532_loss(x, t, reduction="none")
    torch.testing.assert_close(got, TF.focal_loss(x, t, gam_at, reduction="none"))
    # a hair below the threshold
    xb = x.clone()
    for _ in range(100):  # raise z by ulps until p_y drops just below the threshold
        if torch.log_softmax(xb, 1)[0, 0].exp() < threshold:
            break
        xb[0, 1] = torch.nextafter(xb[0, 1], torch.tensor(math.inf, dtype=dtype)) if xb[0, 1] != 0 \
            else torch.tensor(torch.finfo(dtype).eps, dtype=dtype)
    assert torch.log_softmax(xb, 1)[0, 0].exp() < threshold
    torch.testing.assert_close(TF.flsd532_loss(xb, t, reduction="none"),
                               TF.focal_loss(xb, t, gam_below, reduction="none"))


# ---------------------------------------------------------------------------- γ*
def _g(p, gamma):
    return (1 - p) ** gamma - gamma * p * (1 - p) ** (gamma - 1) * math.log(p)


def test_gamma_star_published_values():
    assert abs(TF.focal_gamma_star(0.2) - 4.8506) < 1e-4
    assert abs(TF.focal_gamma_star(0.25) - 3.0702) < 1e-4
    assert abs(TF.focal_gamma_star(0.3) - 1.9572) < 1e-4


def test_gamma_star_solves_g_equals_one_and_bounds_g_above_p0():
    for p0 in (0.05, 0.1, 0.2, 0.3, 0.4, 0.45):
        gs = TF.focal_gamma_star(p0)
        assert abs(_g(p0, gs) - 1.0) < 1e-6
        # for p >= p0, g(p, γ*) <= 1
        for p in np.linspace(p0, 0.999, 50):
            assert _g(p, gs) <= 1 + 1e-6


def test_gamma_star_matches_high_precision_closed_form():
    # REFERENCE.md's closed form evaluated with 50+ significant digits (mpmath ships with torch,
    # via sympy).  The published code's "+1e-12 inside W" variant is 2x too small from
    # p0 ≈ 0.49999 on and infinite below p0 ≈ 1e-15; γ* must not be either.
    mp = pytest.importorskip("mpmath")

    def exact(p0):
        with mp.workdps(700):  # enough digits for ln(1 - 1e-300)
            p = mp.mpf(p0)
            a, b = 1 - p, p * mp.log(p)
            return float(mp.re(a / b + mp.lambertw(-a ** (1 - a / b) * mp.log(a) / b, -1)
                               / mp.log(a)))

    ps = [1e-300, 1e-100, 1e-20, 1e-15, 1e-12, 1e-9, 1e-6, 1e-3, 0.01, 0.1, 0.2, 0.25, 0.3,
          0.4, 0.45, 0.49, 0.499, 0.4999, 0.49999, 0.499999, 0.4999999, 0.49999999]
    got = TF.focal_gamma_star(np.array(ps))
    ref = np.array([exact(repr(p)) for p in ps])
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got[:16], ref[:16], rtol=1e-13)  # p0 <= 0.49
    np.testing.assert_allclose(got[16:], ref[16:], rtol=1e-8)  # near 0.5: conditioning of ln
    # a list is accepted like an array
    np.testing.assert_allclose(TF.focal_gamma_star([0.2, 0.3]), got[[10, 12]])


def test_gamma_star_domain_and_kinds():
    assert TF.focal_gamma_star(0.5) == 0.0 and TF.focal_gamma_star(0.9) == 0.0
    assert isinstance(TF.focal_gamma_star(0.3), float)
    arr = TF.focal_gamma_star(np.array([0.2, 0.25, 0.5, 0.75, 0.999999]))
    assert isinstance(arr, np.ndarray) and arr.shape == (5,)
    assert np.all(arr[2:] == 0.0) and not np.signbit(arr[2:]).any()
    ten = TF.focal_gamma_star(torch.tensor([[0.2, 0.6]], dtype=torch.float32))
    assert isinstance(ten, torch.Tensor) and ten.dtype == torch.float32 and ten.shape == (1, 2)
    assert abs(ten[0, 0].item() - 4.8506) < 1e-3 and ten[0, 1].item() == 0.0
    # near 0.5 from below: small, non-negative, real; decreasing in p0
    ps = np.linspace(0.01, 0.4999, 200)
    gs = TF.focal_gamma_star(ps)
    assert np.all(np.isfinite(gs)) and np.all(gs >= 0) and np.all(np.diff(gs) < 0)
    # unbounded as p0 -> 0, finite for every float64 p0 whose γ* fits in float64
    assert TF.focal_gamma_star(1e-6) > 1e5
    assert 1e300 < TF.focal_gamma_star(1e-300) < math.inf
    # within rounding of 0.5 the answer is tiny, non-negative and real
    just_below = float(np.nextafter(0.5, 0.0))
    assert 0.0 <= TF.focal_gamma_star(just_below) < 1e-12
    for bad in (0.0, 1.0, -0.1, 1.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="`p0`"):
            TF.focal_gamma_star(bad)
    with pytest.raises(ValueError, match="`p0`"):
        TF.focal_gamma_star(np.array([0.2, 1.0]))
    with pytest.raises(ValueError, match="`p0`"):
        TF.focal_gamma_star("0.2")
    with pytest.raises(ValueError, match="`p0`"):
        TF.focal_gamma_star([0.2, "x"])
    with pytest.raises(ValueError, match="`p0`"):
        TF.focal_gamma_star([0.2, 0.0])


# ---------------------------------------------------------------------------- scheduled
def test_scheduled_focal_presets_and_boundaries():
    for name, last in (("flsc531", 1.0), ("flsc532", 2.0)):
        loss = create_loss(name)
        assert isinstance(loss, ScheduledFocalLoss)
        seen = {}
        for e in (0, 99, 100, 249, 250, 349):
            loss.set_epoch(e)
            seen[e] = loss.gamma
        assert seen == {0: 5.0, 99: 5.0, 100: 3.0, 249: 3.0, 250: last, 349: last}
        x, t = _data()
        loss.set_epoch(120)
        torch.testing.assert_close(loss(x, t), TF.focal_loss(x, t, 3.0))
    with pytest.raises(ValueError, match="`epoch`"):
        loss.set_epoch(-1)


def test_scheduled_focal_bad_milestones_name_the_argument():
    for bad in (100, None, (100.5, 250), (-1, 250)):
        with pytest.raises(ValueError, match="`milestones`"):
            ScheduledFocalLoss(bad, (5.0, 3.0, 1.0))


def test_scheduled_focal_state_round_trip():
    loss = create_loss("flsc532")
    loss.set_epoch(260)
    buf = io.BytesIO()
    torch.save(loss.state_dict(), buf)
    buf.seek(0)
    fresh = create_loss("flsc532")
    assert fresh.gamma == 5.0
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert fresh.epoch == 260 and fresh.gamma == 2.0

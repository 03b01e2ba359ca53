"""Tests of AdaFocalLoss: hand-worked updates, loss values/gradients against slow references
written from the formula, bin lookup at the edges, state round trip, protocol, bad input and a
short training run on digits."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchcal.functional import focal_loss, signed_focal_loss
from torchcal.losses import AdaFocalLoss, create_loss, list_losses
from torchcal.losses.adafocal import adafocal_gamma_update
from torchcal.losses.base import loss_on_validation, loss_wants_validation, published_reduction

# --------------------------------------------------------------------------- helpers


def logits_with_conf(confs, correct, num_classes=2):
    """float64 logits whose top-1 confidence is exactly-ish ``confs`` and labels with the given
    correctness (prediction is class 0; a wrong label is class 1)."""
    confs = torch.as_tensor(confs, dtype=torch.float64)
    rest = (1 - confs) / (num_classes - 1)
    probs = torch.cat([confs[:, None], rest[:, None].expand(-1, num_classes - 1)], 1)
    labels = torch.where(torch.as_tensor(correct, dtype=torch.bool), 0, 1)
    return probs.log(), labels


def ref_equal_mass(conf: np.ndarray, n_bins: int):
    """Interior equal-mass edges and right-closed bin index, straight from REFERENCE §2."""
    s = np.sort(conf)
    n = len(s)
    edges = np.array([s[max(k * n // n_bins - 1, 0)] for k in range(1, n_bins)])
    idx = np.array([int(np.sum(edges < x)) for x in conf])
    return edges, idx


def ref_update(gammas, conf, correct, n_bins, lam, s_th, g_min, g_max):
    """Slow AdaFocal update, one bin at a time, from the rule."""
    edges, idx = ref_equal_mass(conf, n_bins)
    new = []
    for b in range(n_bins):
        m = idx == b
        g = float(gammas[b])
        if not m.any():  # empty bin: kept
            new.append(g)
            continue
        d = conf[m].mean() - correct[m].mean()
        g2 = g * math.exp(lam * d) if g > 0 else g * math.exp(-lam * d)
        if abs(g2) < s_th:
            g2 = -s_th if g2 > 0 else s_th
        new.append(min(max(g2, g_min), g_max))
    return np.array(new), np.concatenate([[0.0], edges, [1.0]])


def ref_bin(p, edges):
    """Left-closed lookup written out: lower <= p < upper, with open-ended first/last bins."""
    b_count = len(edges) - 1
    if p < edges[1]:
        return 0
    if p >= edges[b_count - 1]:
        return b_count - 1
    for b in range(1, b_count - 1):
        if edges[b] <= p < edges[b + 1]:
            return b
    raise AssertionError("unreachable")


def ref_loss(logits, target, gammas, edges):
    """Per-sample AdaFocal loss by the formula, one sample at a time (float64, autograd)."""
    out = []
    p = torch.softmax(logits.double(), 1)
    for i in range(logits.shape[0]):
        py = p[i, target[i]]
        g = float(gammas[ref_bin(float(py.detach()), edges.tolist())])
        w = (1 - py) ** g if g >= 0 else (1 + py) ** (-g)
        out.append(-w * torch.log(py))
    return torch.stack(out)


def set_state(loss, gammas, edges):
    with torch.no_grad():
        loss.gammas.copy_(torch.as_tensor(gammas, dtype=torch.float64))
        loss.bin_edges.copy_(torch.as_tensor(edges, dtype=torch.float64))


# ------------------------------------------------------------------ construction / registry


def test_registry_and_defaults():
    assert "adafocal" in list_losses()
    loss = create_loss("adafocal", n_bins=10, lam=0.5)
    assert isinstance(loss, AdaFocalLoss)
    assert (loss.n_bins, loss.lam, loss.gamma_init, loss.gamma_max, loss.gamma_min,
            loss.switch_point, loss.update_every) == (10, 0.5, 1.0, 20.0, -2.0, 0.2, None)
    with pytest.raises(TypeError, match="unexpected"):
        create_loss("adafocal", gamma=3)
    d = AdaFocalLoss()
    assert d.gammas.shape == (15,) and d.bin_edges.shape == (16,)
    assert torch.equal(d.gammas, torch.ones(15, dtype=torch.float64))
    assert torch.equal(d.bin_edges, torch.arange(16, dtype=torch.float64) / 15)
    assert d.history == []


def test_protocol():
    loss = AdaFocalLoss(n_bins=3, update_every=50)
    assert loss_wants_validation(loss) and loss.update_every == 50
    assert published_reduction(loss) == "sum"
    z, y = logits_with_conf([0.9, 0.8, 0.7], [0, 1, 1])
    loss_on_validation(loss, logits=z, labels=y)
    assert len(loss.history) == 1 and not torch.equal(loss.gammas, torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"n_bins": 0}, "n_bins"),
        ({"n_bins": 2.5}, "n_bins"),
        ({"lam": -0.1}, "lam"),
        ({"lam": float("nan")}, "lam"),
        ({"gamma_min": 3.0, "gamma_max": 3.0}, "gamma_min"),
        ({"gamma_min": 5.0, "gamma_max": 1.0}, "gamma_min"),
        ({"switch_point": 0.0}, "switch_point"),
        ({"switch_point": -0.2}, "switch_point"),
        ({"gamma_init": 25.0}, "gamma_init"),
        ({"gamma_init": -3.0}, "gamma_init"),
        ({"gamma_max": float("inf")}, "gamma_max"),
        ({"update_every": 0}, "update_every"),
        ({"reduction": "avg"}, "reduction"),
    ],
)
def test_bad_hyperparameters(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        AdaFocalLoss(**kwargs)


def test_bad_validation_input():
    loss = AdaFocalLoss(n_bins=3)
    z = torch.randn(6, 4)
    with pytest.raises(ValueError, match="`labels`"):
        loss.update(logits=z, labels=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="`labels`"):
        loss.update(logits=z, labels=torch.full((6,), 4))
    with pytest.raises(TypeError, match="`labels`"):
        loss.update(logits=z, labels=torch.zeros(6))
    with pytest.raises(ValueError, match="`logits`"):
        loss.update(logits=torch.randn(6), labels=torch.zeros(6, dtype=torch.long))
    bad = z.clone()
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match="`logits`.*NaN"):
        loss.update(logits=bad, labels=torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one validation sample"):
        loss.update(logits=torch.zeros(0, 4), labels=torch.zeros(0, dtype=torch.long))
    # nothing changed by the failed calls
    assert loss.history == [] and torch.equal(loss.gammas, torch.ones(3, dtype=torch.float64))
    # NumPy input is accepted
    loss.update(logits=z.numpy(), labels=np.zeros(6, dtype=np.int64))
    assert len(loss.history) == 1


def test_bad_training_input():
    loss = AdaFocalLoss()
    with pytest.raises(ValueError, match="`target`"):
        loss(torch.randn(4, 3), torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="`target`"):
        loss(torch.randn(4, 3), torch.tensor([0, 1, 2, 3]))


# ------------------------------------------------------------------ the update, by hand


def test_hand_worked_update():
    # 8 validation samples, 4 equal-mass bins of 2: {.55,.6} {.7,.8} {.85,.9} {.95,.99}
    confs = [0.9, 0.55, 0.99, 0.7, 0.6, 0.85, 0.8, 0.95]
    correct = [1, 0, 1, 1, 0, 1, 0, 1]
    z, y = logits_with_conf(confs, correct)
    loss = AdaFocalLoss(n_bins=4, lam=1.0)
    set_state(loss, [1.0, -0.5, 0.22, 19.9], [0, 0.25, 0.5, 0.75, 1])
    loss.update(logits=z, labels=y)
    # gaps: bin0 .575 - 0, bin1 .75 - .5, bin2 .875 - 1, bin3 .97 - 1
    gaps = torch.tensor([0.575, 0.25, -0.125, -0.03], dtype=torch.float64)
    torch.testing.assert_close(loss.history[0]["gaps"], gaps)
    expected = torch.tensor([
        math.exp(0.575),          # γ>0, over-confident: grows
        -0.5 * math.exp(-0.25),   # γ<0, over-confident: |γ| shrinks (less inverse focal)
        -0.2,                     # 0.22·exp(-.125) = 0.194 < S_th: flips to -S_th
        19.9 * math.exp(-0.03),   # under-confident: shrinks
    ], dtype=torch.float64)
    torch.testing.assert_close(loss.gammas, expected)
    torch.testing.assert_close(loss.bin_edges, torch.tensor([0, 0.6, 0.8, 0.9, 1], dtype=torch.float64))
    assert loss.history[0]["counts"].tolist() == [2, 2, 2, 2]
    assert torch.equal(loss.history[0]["gammas"], loss.gammas)


def test_hand_worked_clipping_and_flip_back():
    confs = [0.55, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99]
    correct = [0, 0, 1, 0, 1, 1, 1, 1]
    z, y = logits_with_conf(confs, correct)
    loss = AdaFocalLoss(n_bins=4, lam=10.0)
    # bin0 d=.575: 1·e^5.75 = 314 -> 20; bin1 d=.25 and γ=-.21: -.21·e^-2.5 -> |γ|<S_th -> +.2;
    # bin2 d=-.125 and γ=-1.5: -1.5·e^1.25 = -5.2 -> -2; bin3 d=-.03, γ=2: 2·e^-.3
    set_state(loss, [1.0, -0.21, -1.5, 2.0], [0, 0.25, 0.5, 0.75, 1])
    loss.update(logits=z, labels=y)
    expected = torch.tensor([20.0, 0.2, -2.0, 2 * math.exp(-0.3)], dtype=torch.float64)
    torch.testing.assert_close(loss.gammas, expected)
    # with a narrower clip range the clip applies after the switch
    loss2 = AdaFocalLoss(n_bins=4, lam=10.0, gamma_min=-0.1, gamma_max=0.15, gamma_init=0.1)
    set_state(loss2, [0.1, -0.1, 0.1, 0.1], [0, 0.25, 0.5, 0.75, 1])
    loss2.update(logits=z, labels=y)
    # bin0: .1e^5.75 -> .15 ; bin1: -.1e^-2.5 -> +.2 -> .15 ; bin2: .1e^-1.25=.029 -> -.2 -> -.1
    # bin3: .1e^-.3 = .074 -> -.2 -> -.1
    torch.testing.assert_close(loss2.gammas, torch.tensor([0.15, 0.15, -0.1, -0.1], dtype=torch.float64))


def test_gamma_update_function_rules():
    g = torch.tensor([1.0, 0.0, -0.0, 0.5, -0.5, 3.0], dtype=torch.float64)
    d = torch.tensor([0.0, 0.3, 0.3, -2.0, -2.0, 0.1], dtype=torch.float64)
    out = adafocal_gamma_update(g, d, lam=1.0, switch_point=0.2, gamma_min=-2.0, gamma_max=20.0)
    # γ=0 is treated as "not positive": 0·exp(..) = 0 < S_th -> +S_th
    expected = [1.0, 0.2, 0.2, -0.2, -2.0, 3.0 * math.exp(0.1)]
    # 0.5·e^-2 = .068 -> -.2 ; -.5·e^2 = -3.69 -> clip -2
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64))
    counts = torch.tensor([1, 0, 1, 1, 0, 1])
    out2 = adafocal_gamma_update(g, d, counts=counts)
    assert out2[1] == 0.0 and out2[4] == -0.5 and out2[2] == 0.2


def test_empty_bins_and_fewer_samples_than_bins():
    # N=2 < B=4: edges s0,s0,s0 -> bins 1 and 2 are empty and keep their γ (even |γ|<S_th)
    z, y = logits_with_conf([0.7, 0.9], [0, 1])
    loss = AdaFocalLoss(n_bins=4, gamma_init=0.1)
    loss.update(logits=z, labels=y)
    h = loss.history[0]
    assert h["counts"].tolist() == [1, 0, 0, 1]
    assert h["gaps"][1] == 0 and h["gaps"][2] == 0
    assert loss.gammas[1] == 0.1 and loss.gammas[2] == 0.1
    # bin0 d=.7: .1·e^.7 = .201 stays ; bin3 d=-.1: .1·e^-.1 < .2 -> -.2
    torch.testing.assert_close(loss.gammas[[0, 3]],
                               torch.tensor([0.1 * math.exp(0.7), -0.2], dtype=torch.float64))
    torch.testing.assert_close(loss.bin_edges, torch.tensor([0, 0.7, 0.7, 0.7, 1], dtype=torch.float64))
    # zero-width bins are never chosen by a training sample (float64 p: the edges are the float64
    # validation confidences, and the lookup compares exactly in the wider dtype)
    p = torch.tensor([0.0, 0.69, 0.7, 0.71, 1.0], dtype=torch.float64)
    assert loss.bin_of(p).tolist() == [0, 0, 3, 3, 3]
    # a single validation sample works too
    one = AdaFocalLoss(n_bins=3)
    z1, y1 = logits_with_conf([0.8], [1])
    one.update(logits=z1, labels=y1)
    assert one.history[0]["counts"].tolist() == [1, 0, 0]
    # ties: everything in bin 0 (right-closed), the others are empty and unchanged
    tie = AdaFocalLoss(n_bins=3)
    zt, yt = logits_with_conf([0.8] * 6, [1, 1, 1, 0, 0, 0])
    tie.update(logits=zt, labels=yt)
    assert tie.history[0]["counts"].tolist() == [6, 0, 0]
    torch.testing.assert_close(tie.gammas, torch.tensor([math.exp(0.3), 1, 1], dtype=torch.float64))


@pytest.mark.parametrize("n, c, n_bins", [(500, 10, 15), (97, 3, 7), (10, 5, 15), (64, 100, 4)])
def test_update_matches_slow_reference(n, c, n_bins):
    gen = torch.Generator().manual_seed(n + c)
    z = torch.randn(n, c, generator=gen) * 3
    y = torch.randint(0, c, (n,), generator=gen)
    loss = AdaFocalLoss(n_bins=n_bins, lam=2.0)
    g0 = torch.empty(n_bins, dtype=torch.float64).uniform_(-2, 5, generator=gen)
    set_state(loss, g0, torch.arange(n_bins + 1, dtype=torch.float64) / n_bins)
    for step in range(3):
        zz = z + step * torch.randn(n, c, generator=gen)
        before = loss.gammas.clone().numpy()
        loss.update(logits=zz, labels=y)
        p = torch.softmax(zz.double(), 1).float().double().numpy()  # conf in float32 as the loss
        conf = p.max(1)
        correct = (p.argmax(1) == y.numpy()).astype(float)
        g_ref, e_ref = ref_update(before, conf, correct, n_bins, 2.0, 0.2, -2.0, 20.0)
        np.testing.assert_allclose(loss.gammas.numpy(), g_ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(loss.bin_edges.numpy(), e_ref, rtol=1e-6, atol=1e-7)
    assert len(loss.history) == 3


def test_update_gaps_agree_with_adaptive_ece_and_are_order_free():
    from torchcal.metrics import adaptive_ece

    gen = torch.Generator().manual_seed(3)
    z = torch.randn(1000, 10, generator=gen) * 2
    y = torch.randint(0, 10, (1000,), generator=gen)
    a = AdaFocalLoss()
    a.update(logits=z, labels=y)
    h = a.history[0]
    ada = (h["counts"].double() / 1000 * h["gaps"].abs()).sum()
    torch.testing.assert_close(ada.float(), adaptive_ece(logits=z, labels=y, n_bins=15).float())
    perm = torch.randperm(1000, generator=gen)
    b = AdaFocalLoss()
    b.update(logits=z[perm], labels=y[perm])
    assert torch.equal(a.gammas, b.gammas) and torch.equal(a.bin_edges, b.bin_edges)


# ------------------------------------------------------------------ the loss


def test_first_epoch_is_focal_gamma_one():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(64, 7, generator=gen) * 3
    y = torch.randint(0, 7, (64,), generator=gen)
    loss = AdaFocalLoss()
    torch.testing.assert_close(loss(z, y), focal_loss(z, y, gamma=1.0))
    torch.testing.assert_close(loss(z, y), ref_loss(z, y, loss.gammas, loss.bin_edges).mean().float())


def _random_state(n_bins, gen):
    gammas = torch.empty(n_bins, dtype=torch.float64).uniform_(-2, 6, generator=gen)
    inner = torch.sort(torch.rand(n_bins - 1, generator=gen, dtype=torch.float64)).values
    return gammas, torch.cat([torch.zeros(1, dtype=torch.float64), inner, torch.ones(1, dtype=torch.float64)])


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_loss_values_against_formula(reduction):
    gen = torch.Generator().manual_seed(11)
    z = torch.randn(200, 6, generator=gen, dtype=torch.float64) * 2
    y = torch.randint(0, 6, (200,), generator=gen)
    loss = AdaFocalLoss(n_bins=6, reduction=reduction)
    gammas, edges = _random_state(6, gen)
    set_state(loss, gammas, edges)
    ref = ref_loss(z, y, gammas, edges)
    b = [ref_bin(v, edges.tolist()) for v in torch.softmax(z, 1)[torch.arange(200), y].tolist()]
    assert len(set(b)) == 6  # every bin, both signs of γ exercised
    assert (gammas < 0).any() and (gammas > 0).any()
    exp = {"none": ref, "mean": ref.mean(), "sum": ref.sum()}[reduction]
    out = loss(z, y)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, exp, rtol=1e-12, atol=1e-12)
    # the public functional with the per-sample γ gives the same
    g_ps = gammas[torch.tensor(b)]
    torch.testing.assert_close(out, signed_focal_loss(z, y, g_ps, reduction=reduction))


def test_gradients_against_formula_and_gradcheck():
    gen = torch.Generator().manual_seed(5)
    z = (torch.randn(40, 5, generator=gen, dtype=torch.float64) * 2)
    y = torch.randint(0, 5, (40,), generator=gen)
    loss = AdaFocalLoss(n_bins=5, reduction="sum")
    gammas = torch.tensor([3.0, -1.5, 0.5, -0.2, 1.0], dtype=torch.float64)
    _, edges = _random_state(5, gen)
    set_state(loss, gammas, edges)
    z1 = z.clone().requires_grad_()
    loss(z1, y).backward()
    z2 = z.clone().requires_grad_()
    ref_loss(z2, y, gammas, edges).sum().backward()
    torch.testing.assert_close(z1.grad, z2.grad, rtol=1e-10, atol=1e-12)
    # finite differences (the bin lookup is piecewise constant; these points are off the edges)
    p_y = torch.softmax(z, 1)[torch.arange(40), y]
    dist_to_edge = (p_y[:, None] - edges[None, 1:-1]).abs().min()
    assert dist_to_edge > 1e-4
    zs, ys = z[:15], y[:15]
    g_used = gammas[loss.bin_of(p_y[:15])]
    assert (g_used > 0).any() and (g_used < 0).any()  # both focal and inverse focal checked
    assert torch.autograd.gradcheck(lambda x: loss(x, ys), (zs.clone().requires_grad_(),),
                                    fast_mode=True)


def test_gradient_finite_at_certainty():
    loss = AdaFocalLoss(n_bins=2)
    set_state(loss, [0.5, -0.5], [0, 0.5, 1])
    for g in ([0.5, 0.5], [-0.5, -0.5]):
        set_state(loss, g, [0, 0.5, 1])
        z = torch.tensor([[60.0, 0.0], [0.0, 0.0]], requires_grad=True)
        loss(z, torch.tensor([0, 0])).backward()
        assert torch.isfinite(z.grad).all()


def test_bin_lookup_at_edges():
    loss = AdaFocalLoss(n_bins=4)
    set_state(loss, [1, 2, 3, 4], [0, 0.2, 0.5, 0.75, 1])
    p = torch.tensor([0.0, 0.1999, 0.2, 0.3, 0.5, 0.7499, 0.75, 0.9, 1.0], dtype=torch.float64)
    assert loss.bin_of(p).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 3]
    assert loss.bin_of(p).tolist() == [ref_bin(v, [0, 0.2, 0.5, 0.75, 1]) for v in p.tolist()]
    # float32 values compare against the edges in float32 (0.2 as float32 is at the edge)
    assert loss.bin_of(torch.tensor([0.2, 0.75], dtype=torch.float32)).tolist() == [1, 3]
    # equal-width before the first update: k/B boundaries go up
    fresh = AdaFocalLoss(n_bins=15)
    v = torch.arange(16, dtype=torch.float64) / 15
    assert fresh.bin_of(v).tolist() == list(range(15)) + [14]


def test_forward_picks_gamma_by_true_class_probability():
    # sample 0: predicted class 1 with p=.8, true class 0 with p_y=.2 -> bin of .2, not of .8
    loss = AdaFocalLoss(n_bins=2, reduction="none")
    set_state(loss, [4.0, -2.0], [0, 0.5, 1])
    z = torch.tensor([[math.log(0.2), math.log(0.8)]], dtype=torch.float64)
    out = loss(z, torch.tensor([0]))
    torch.testing.assert_close(out, torch.tensor([-(0.8 ** 4) * math.log(0.2)], dtype=torch.float64))


def test_ignore_index_multidim_and_dtypes():
    gen = torch.Generator().manual_seed(2)
    loss = AdaFocalLoss(n_bins=3, ignore_index=-1)
    gammas, edges = _random_state(3, gen)
    set_state(loss, gammas, edges)
    z = torch.randn(4, 5, 3, generator=gen, dtype=torch.float64)  # (N, C, d)
    y = torch.randint(0, 5, (4, 3), generator=gen)
    y[0, 1] = -1
    loss.reduction = "none"
    out = loss(z, y)
    assert out.shape == (4, 3) and out[0, 1] == 0
    flat_z = z.permute(0, 2, 1).reshape(-1, 5)
    flat_y = y.reshape(-1)
    keep = flat_y != -1
    ref = ref_loss(flat_z[keep], flat_y[keep], gammas, edges)
    torch.testing.assert_close(out.reshape(-1)[keep], ref)
    loss.reduction = "mean"
    torch.testing.assert_close(loss(z, y), ref.mean())
    # half / bfloat16 inputs compute in float32
    zz = torch.randn(8, 5, generator=gen)
    yy = torch.randint(0, 5, (8,), generator=gen)
    for dt in (torch.float16, torch.bfloat16):
        v = loss(zz.to(dt), yy)
        assert v.dtype == torch.float32
        torch.testing.assert_close(v, loss(zz.to(dt).float(), yy))


# ------------------------------------------------------------------ state


def test_state_round_trip_through_weights_only_load():
    gen = torch.Generator().manual_seed(4)
    a = AdaFocalLoss(n_bins=5)
    for _ in range(2):
        a.update(logits=torch.randn(300, 4, generator=gen) * 3,
                 labels=torch.randint(0, 4, (300,), generator=gen))
    buf = io.BytesIO()
    torch.save({"loss": a.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)["loss"]
    b = AdaFocalLoss(n_bins=5)
    b.load_state_dict(state)
    assert torch.equal(a.gammas, b.gammas) and torch.equal(a.bin_edges, b.bin_edges)
    assert len(b.history) == 2
    for ha, hb in zip(a.history, b.history, strict=True):
        assert ha.keys() == hb.keys() and all(torch.equal(ha[k], hb[k]) for k in ha)
    z = torch.randn(50, 4, generator=gen)
    y = torch.randint(0, 4, (50,), generator=gen)
    assert torch.equal(a(z, y), b(z, y))
    # both continue identically
    zv, yv = torch.randn(300, 4, generator=gen) * 3, torch.randint(0, 4, (300,), generator=gen)
    a.update(logits=zv, labels=yv)
    b.update(logits=zv, labels=yv)
    assert torch.equal(a.gammas, b.gammas) and torch.equal(a.bin_edges, b.bin_edges)
    # a mismatched number of bins is refused
    with pytest.raises(RuntimeError, match="size mismatch"):
        AdaFocalLoss(n_bins=4).load_state_dict(state)
    with pytest.raises(ValueError, match="extra state"):
        AdaFocalLoss(n_bins=5).load_state_dict({**state, "_extra_state": [1, 2]})
    # reset returns to the initial state
    a.reset()
    assert a.history == [] and torch.equal(a.gammas, torch.ones(5, dtype=torch.float64))
    assert torch.equal(a.bin_edges, torch.arange(6, dtype=torch.float64) / 5)


# ------------------------------------------------------------------ training on digits


def test_short_training_run_on_digits():
    from sklearn.datasets import load_digits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest on a shared machine
    try:
        _digits_run(load_digits)
    finally:
        torch.set_num_threads(threads)


def _digits_run(load_digits):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    x = x + 0.3 * torch.randn(x.shape, generator=gen)  # noisy digits: errors to be confident on
    y = torch.tensor(y, dtype=torch.long)
    perm = torch.randperm(len(y), generator=gen)
    tr, va = perm[:400], perm[400:1000]
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    # over-fit with cross-entropy first so that validation is over-confident
    for _ in range(60):
        opt.zero_grad()
        F.cross_entropy(model(x[tr]), y[tr]).backward()
        opt.step()
    loss_fn = AdaFocalLoss(n_bins=5)
    for epoch in range(3):
        with torch.no_grad():
            zv = model(x[va])
        p = torch.softmax(zv.double(), 1).float().double().numpy()
        conf = p.max(1)
        correct = (p.argmax(1) == y[va].numpy()).astype(float)
        _, idx = ref_equal_mass(conf, 5)
        gaps = np.array([conf[idx == b].mean() - correct[idx == b].mean() for b in range(5)])
        before = loss_fn.gammas.clone().numpy()
        loss_fn.on_validation(logits=zv, labels=y[va])
        after = loss_fn.gammas.numpy()
        np.testing.assert_allclose(loss_fn.history[-1]["gaps"].numpy(), gaps, rtol=1e-6, atol=1e-7)
        pos = before > 0
        over, under = pos & (gaps > 1e-9), pos & (gaps < -1e-9)
        # γ>0 bins: over-confident (d>0) bins get a larger γ, under-confident ones a smaller one
        assert np.all(after[over] > before[over]) and np.all(after[under] < before[under])
        if epoch == 0:
            assert over.sum() >= 4  # the CE-trained net is over-confident in (almost) every bin
            assert np.all(after[over] > 1.0)
        for _ in range(10):
            opt.zero_grad()
            out = loss_fn(model(x[tr]), y[tr])
            assert torch.isfinite(out)
            out.backward()
            opt.step()
    assert len(loss_fn.history) == 3
    assert loss_fn.gammas.min() >= -2.0 and loss_fn.gammas.max() <= 20.0
    assert loss_fn.bin_edges[0] == 0 and loss_fn.bin_edges[-1] == 1
    assert torch.all(loss_fn.bin_edges[1:] >= loss_fn.bin_edges[:-1])


def test_single_bin_is_one_global_gamma():
    gen = torch.Generator().manual_seed(8)
    z = torch.randn(30, 3, generator=gen, dtype=torch.float64) * 2
    y = torch.randint(0, 3, (30,), generator=gen)
    loss = AdaFocalLoss(n_bins=1)
    loss.update(logits=z, labels=y)
    p = torch.softmax(z, 1)
    d = float(p.max(1).values.mean() - (p.argmax(1) == y).double().mean())
    torch.testing.assert_close(loss.gammas, torch.tensor([math.exp(d)], dtype=torch.float64))
    assert loss.bin_edges.tolist() == [0.0, 1.0]
    torch.testing.assert_close(loss(z, y), focal_loss(z, y, gamma=math.exp(d)))

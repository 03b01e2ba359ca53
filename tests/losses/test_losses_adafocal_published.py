"""AdaFocalLoss(edges="published") against a reference written in this file from the published
AdaFocal code's logic (interpolated equal-mass edges, float32 bin membership, ties with the
minimum dropped, every bin updated) over whole γ trajectories."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchcal.losses import AdaFocalLoss, create_loss
from torchcal.losses.adafocal import published_equal_mass_edges


class PublishedAdaFocalReference:
    """The published update and lookup, one bin and one sample at a time (dict state)."""

    def __init__(self, n_bins, lam=1.0, gamma_init=1.0, s_th=0.2, g_min=-2.0, g_max=20.0):
        self.b, self.lam, self.s_th, self.g_min, self.g_max = n_bins, lam, s_th, g_min, g_max
        self.stats = [{"lower": k / n_bins, "upper": (k + 1) / n_bins, "gamma": gamma_init}
                      for k in range(n_bins)]

    def update(self, conf32: np.ndarray, correct: np.ndarray):
        n = len(conf32)
        # histedges_equalN: interpolate the sorted values at B+1 equally spaced positions
        edges = np.interp(np.linspace(0, n, self.b + 1), np.arange(n), np.sort(conf32))
        conf_t = torch.from_numpy(conf32)  # float32, as the published torch.FloatTensor
        for k in range(self.b):
            lower, upper = float(edges[k]), float(edges[k + 1])
            in_bin = (conf_t.gt(lower) & conf_t.le(upper)).numpy()  # compared in float32
            if in_bin.any():
                gap = conf32[in_bin].astype(np.float64).mean() - correct[in_bin].mean()
            else:
                gap = 0.0
            g = self.stats[k]["gamma"]
            g2 = g * math.exp(self.lam * gap) if g > 0 else g * math.exp(-self.lam * gap)
            if abs(g2) < self.s_th:
                g2 = -self.s_th if g2 > 0 else self.s_th
            self.stats[k] = {"lower": lower, "upper": upper,
                             "gamma": max(min(g2, self.g_max), self.g_min)}

    def gamma_of(self, p: float) -> float:
        for k, st in enumerate(self.stats):
            if k == 0 and p < st["upper"]:
                break
            if k == self.b - 1 and p >= st["lower"]:
                break
            if st["lower"] <= p < st["upper"]:
                break
        return st["gamma"]


def _val(n, c, seed, *, tie_decimals=None, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(n, c, generator=g)
    if tie_decimals is not None:
        z = torch.round(z, decimals=tie_decimals)
    y = torch.randint(0, c, (n,), generator=g)
    return z, y


def _conf_correct(z, y):
    # the loss' own float32 confidences (exp(top - logsumexp))
    top, pred = z.max(1)
    conf = torch.exp(top - torch.logsumexp(z, 1))
    return conf.numpy(), (pred == y).double().numpy()


def test_edges_are_numpy_interp_bit_for_bit():
    rng = np.random.default_rng(0)
    for n, b in [(6, 3), (5000, 15), (7, 15), (1, 4), (100, 7), (37, 15)]:
        s = np.sort(rng.random(n).astype(np.float32))
        ref = np.interp(np.linspace(0, n, b + 1), np.arange(n), s)
        got = published_equal_mass_edges(torch.from_numpy(s), b).numpy()
        assert np.array_equal(got, ref), (n, b)


@pytest.mark.parametrize("n, c, n_bins, ties", [
    (500, 10, 15, None), (5000, 10, 15, None), (60, 5, 15, 0), (9, 3, 15, None), (40, 4, 6, 1),
])
def test_gamma_trajectory_matches_published_logic(n, c, n_bins, ties):
    loss = AdaFocalLoss(n_bins=n_bins, edges="published")
    ref = PublishedAdaFocalReference(n_bins)
    for step in range(6):
        z, y = _val(n, c, 10 * step + n, tie_decimals=ties, scale=1.0 + step)
        loss.update(logits=z, labels=y)
        ref.update(*_conf_correct(z, y))
        want = torch.tensor([st["gamma"] for st in ref.stats], dtype=torch.float64)
        torch.testing.assert_close(loss.gammas, want, rtol=1e-12, atol=1e-12)
        interior = torch.tensor([st["lower"] for st in ref.stats[1:]], dtype=torch.float64)
        assert torch.equal(loss.bin_edges[1:-1], interior)
        assert loss.bin_edges[0] == 0 and loss.bin_edges[-1] == 1
        # training samples pick γ by the published lookup on p_y
        x, t = _val(64, c, 1000 + step)
        p_y = torch.softmax(x, 1).gather(1, t[:, None]).squeeze(1)
        got = loss.gammas[loss.bin_of(p_y)]
        want_g = torch.tensor([ref.gamma_of(float(p)) for p in p_y], dtype=torch.float64)
        torch.testing.assert_close(got, want_g, rtol=1e-12, atol=1e-12)


def test_ties_with_the_minimum_are_dropped_and_empty_bins_switch():
    # validation confidences 0.6 (x3, the minimum), 0.7, 0.9: two bins with x = 0, 2.5, 5
    conf = torch.tensor([0.6, 0.6, 0.6, 0.7, 0.9], dtype=torch.float64)
    z = torch.stack([conf.log(), (1 - conf).log()], 1)
    y = torch.tensor([0, 1, 0, 0, 1])  # all predicted class 0
    loss = AdaFocalLoss(n_bins=2, edges="published", gamma_init=0.21)
    loss.update(logits=z, labels=y)
    s = np.sort(conf.numpy())  # x_1 = 2.5: halfway between s_2 = 0.6 and s_3 = 0.7
    assert loss.bin_edges[1].item() == (s[3] - s[2]) * 0.5 + s[2]
    h = loss.history[-1]
    # bin 0 = (0.6, 0.65]: the three 0.6 are not in it (equal to the minimum): empty
    assert h["counts"].tolist() == [0, 2]
    assert h["gaps"][0] == 0
    assert loss.gammas[0] == 0.21  # empty: d = 0, |γ| >= S_th, unchanged
    # an empty bin still goes through the sign switch in the published code
    loss2 = AdaFocalLoss(n_bins=2, edges="published", gamma_init=0.1, switch_point=0.2)
    loss2.update(logits=z, labels=y)
    assert loss2.gammas[0] == -0.2  # published: empty bin, d = 0, switched
    loss3 = AdaFocalLoss(n_bins=2, gamma_init=0.1, switch_point=0.2)  # the default bins them
    loss3.update(logits=z, labels=y)
    assert loss3.history[-1]["counts"].tolist() == [3, 2]


def test_membership_is_decided_in_float32():
    # s = [0.1, a, b] with a, b adjacent float32 values and b's mantissa even: the float64
    # midpoint edge (x = 1.5) rounds to b in float32, so b falls in bin 0 (b <= e), as in the
    # published float32 comparison; a float64 comparison would put it in bin 1.
    a = np.nextafter(np.float32(0.5), np.float32(1))
    b = np.nextafter(a, np.float32(1))
    conf = np.array([0.1, a, b], dtype=np.float32)
    mid = (np.float64(b) - np.float64(a)) * 0.5 + np.float64(a)
    assert np.float32(mid) == b and np.float64(b) > mid
    c = torch.from_numpy(conf)
    z = torch.stack([c.log(), torch.log1p(-c)], 1)  # float32 logits: conf ~ c
    y = torch.zeros(3, dtype=torch.long)
    conf32, correct = _conf_correct(z, y)
    loss = AdaFocalLoss(n_bins=2, edges="published")
    loss.update(logits=z, labels=y)
    ref = PublishedAdaFocalReference(2)
    ref.update(conf32, correct)
    torch.testing.assert_close(loss.gammas, torch.tensor([st["gamma"] for st in ref.stats],
                                                         dtype=torch.float64), rtol=1e-12, atol=0)
    if np.float32(np.interp(1.5, [0, 1, 2], np.sort(conf32))) == np.sort(conf32)[2]:
        assert loss.history[-1]["counts"].tolist() == [2, 0]


def test_default_is_unchanged_and_differs_from_published():
    z, y = _val(5000, 10, 3)
    a = AdaFocalLoss()
    b = create_loss("adafocal", edges="published")
    a.update(logits=z, labels=y)
    b.update(logits=z, labels=y)
    assert a.edges == "equal_mass" and b.edges == "published"
    diff = (a.bin_edges - b.bin_edges).abs().max().item()
    assert 0 < diff < 5e-2
    # the default is torchcal's equal-mass definition
    from torchcal.metrics.binning import equal_mass_edges

    conf, _ = _conf_correct(z, y)
    assert torch.equal(a.bin_edges[1:-1], equal_mass_edges(torch.from_numpy(conf), 15).double())
    assert "edges='published'" in repr(b)


def test_bad_edges_value():
    with pytest.raises(ValueError, match="`edges` to be one of"):
        AdaFocalLoss(edges="interp")

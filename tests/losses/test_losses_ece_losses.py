"""DECE, ECE-KDE and the ECE-loss against references written here: DECE and the ECE-loss from
the published code's logic (loops over samples and bins), ECE-KDE with SciPy's Dirichlet and
Beta densities as the kernels; gradients; the registry's display names."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from loss_data import logits_targets
from scipy import stats
from scipy.special import logsumexp

import torchcal.functional as TF
from torchcal.functional.ece_losses import KDE_BANDWIDTHS
from torchcal.losses import DECELoss, ECEGapLoss, ECEKDELoss, create_loss, list_losses
from torchcal.losses.base import loss_on_validation, published_reduction

_data = partial(logits_targets, n=10, c=4)


# ------------------------------------------------------------------------------------ DECE
def _dece_ref(p: np.ndarray, y: np.ndarray, n_bins=15, t_a=100.0, t_b=0.01) -> float:
    """DECE one sample and one bin at a time (the published soft binning and soft rank)."""
    n, c = p.shape
    cuts = [b / n_bins for b in range(n_bins)]
    bins, confs, accs = [], [], []
    for i in range(n):
        conf = max(p[i])
        h = [(conf * (b + 1) - sum(cuts[: b + 1])) / t_b for b in range(n_bins)]
        m = max(h)
        e = [math.exp(v - m) for v in h]
        soft = [(v / sum(e) + 1e-6) / (1 + (n_bins + 1) * 1e-6) for v in e]
        rank = 0.5 + sum(1 / (1 + math.exp(-t_a * (p[i, k] - p[i, y[i]]))) for k in range(c))
        bins.append(soft)
        confs.append(conf)
        accs.append(max(0.0, 2.0 - rank))
    total = 0.0
    for b in range(n_bins):
        mass = sum(bins[i][b] for i in range(n))
        bc = sum(bins[i][b] * confs[i] for i in range(n)) / mass
        ba = sum(bins[i][b] * accs[i] for i in range(n)) / mass
        total += mass * abs(ba - bc) / n
    return total


@pytest.mark.parametrize("n_bins, t_a, t_b", [(15, 100.0, 0.01), (5, 10.0, 0.1)])
def test_dece_against_the_published_logic(n_bins, t_a, t_b):
    z, t = _data(n=20, seed=1)
    t[:8] = z[:8].argmax(1)
    p = torch.softmax(z, 1)
    want = _dece_ref(p.numpy(), t.numpy(), n_bins, t_a, t_b)
    got = TF.dece(probs=p, labels=t, n_bins=n_bins, t_a=t_a, t_b=t_b)
    assert got.item() == pytest.approx(want, abs=1e-12)
    assert TF.dece(logits=z, labels=t, n_bins=n_bins, t_a=t_a, t_b=t_b).item() == pytest.approx(
        want, abs=1e-12)
    loss = TF.dece_loss(z, t, 0.5, n_bins=n_bins, t_a=t_a, t_b=t_b)
    assert loss.item() == pytest.approx(0.5 * want, abs=1e-12)
    with_ce = TF.dece_loss(z, t, 0.5, n_bins=n_bins, t_a=t_a, t_b=t_b, cross_entropy=True,
                           reduction="sum")
    assert with_ce.item() == pytest.approx(20 * (float(F.cross_entropy(z, t)) + 0.5 * want),
                                           abs=1e-10)


def test_dece_gradients_and_ignore_index():
    z, t = _data(n=6, seed=2)
    assert torch.autograd.gradcheck(lambda x: TF.dece_loss(x, t, t_a=10.0, t_b=0.1),
                                    (z.clone().requires_grad_(),))
    t2 = t.clone()
    t2[1] = -100
    keep = t2 != -100
    torch.testing.assert_close(TF.dece_loss(z, t2), TF.dece_loss(z[keep], t[keep]))


def test_dece_module():
    z, t = _data(n=8, seed=3)
    loss = create_loss("dece")
    assert isinstance(loss, DECELoss) and published_reduction(loss) == "mean"
    assert (loss.lam, loss.n_bins, loss.t_a, loss.t_b, loss.cross_entropy) == (1.0, 15, 100.0,
                                                                                 0.01, False)
    torch.testing.assert_close(loss(z, t), TF.dece(logits=z, labels=t))
    for kw, match in [({"n_bins": 0}, "`n_bins`"), ({"t_a": 0.0}, "`t_a`"), ({"t_b": -1.0}, "`t_b`"),
                      ({"lam": -1.0}, "`lam`"), ({"cross_entropy": 1}, "`cross_entropy`"),
                      ({"reduction": "none"}, "reduction='none'")]:
        with pytest.raises(ValueError, match=match):
            DECELoss(**kw)
    with pytest.raises(ValueError, match="exactly one of"):
        TF.dece(labels=t)


# ----------------------------------------------------------------------------------- ECE-KDE
def _kde_ref(p: np.ndarray, y: np.ndarray, h: float, order: float, mc_type: str) -> float:
    """ECE-KDE with SciPy's densities as the kernels, leave-one-out ratios in loops."""
    n, c = p.shape

    def ratios(kern, labels):
        out = []
        for i in range(n):
            others = [j for j in range(n) if j != i]
            den = sum(kern(i, j) for j in others)
            out.append(sum(kern(i, j) * labels[j] for j in others) / den)
        return np.array(out)

    if mc_type == "canonical":
        dens = np.array([[stats.dirichlet.pdf(p[i], p[j] / h + 1) for j in range(n)]
                         for i in range(n)])
        onehot = np.eye(c)[y]
        r = ratios(lambda i, j: dens[i, j], onehot)
        return float(np.mean(np.sum(np.abs(r - p) ** order, axis=1)))

    def beta_est(s, lab):
        dens = np.array([[stats.beta.pdf(s[i], s[j] / h + 1, (1 - s[j]) / h + 1)
                          for j in range(n)] for i in range(n)])
        return float(np.mean(np.abs(ratios(lambda i, j: dens[i, j], lab) - s) ** order))

    if mc_type == "top_label":
        return beta_est(p.max(1), (p.argmax(1) == y).astype(float))
    return sum(beta_est(p[:, k], (y == k).astype(float)) for k in range(c))


@pytest.mark.parametrize("mc_type", ["canonical", "marginal", "top_label"])
@pytest.mark.parametrize("h, order", [(0.1, 1.0), (0.3, 2.0)])
def test_ece_kde_against_scipy_kernels(mc_type, h, order):
    z, t = _data(n=12, c=3, seed=4, scale=1.0)
    t[:5] = z[:5].argmax(1)
    p = torch.softmax(z, 1)
    want = _kde_ref(p.numpy(), t.numpy(), h, order, mc_type)
    got = TF.ece_kde(probs=p, labels=t, bandwidth=h, p=order, mc_type=mc_type)
    assert got.item() == pytest.approx(want, rel=1e-9, abs=1e-12)
    torch.testing.assert_close(TF.ece_kde(logits=z, labels=t, bandwidth=h, p=order,
                                          mc_type=mc_type), got)
    loss = TF.ece_kde_loss(z, t, 0.7, bandwidth=h, p=order, mc_type=mc_type)
    assert loss.item() == pytest.approx(float(F.cross_entropy(z, t)) + 0.7 * want, rel=1e-9)


def test_ece_kde_special_cases_of_the_published_code():
    # a class with one positive sample: that sample's ratio is 0 (no other positive), and a
    # class with none: every ratio is 0 - the published special cases, as one formula
    p = torch.tensor([[0.7, 0.3], [0.6, 0.4], [0.2, 0.8], [0.3, 0.7]], dtype=torch.float64)
    s = p.max(1).values
    for y, n_correct in [(torch.tensor([1, 0, 0, 0]), 1), (torch.tensor([1, 1, 0, 0]), 0)]:
        assert int((p.argmax(1) == y).sum()) == n_correct
        want = _kde_ref(p.numpy(), y.numpy(), 0.2, 1.0, "top_label")
        got = TF.ece_kde(probs=p, labels=y, bandwidth=0.2, mc_type="top_label")
        assert got.item() == pytest.approx(want, rel=1e-9)
        if n_correct == 0:
            assert got.item() == pytest.approx(float(s.mean()), rel=1e-12)


def test_ece_kde_gradients_ignore_index_and_bad_input():
    z, t = _data(n=6, c=3, seed=5, scale=1.0)
    for mc in ("canonical", "marginal", "top_label"):
        assert torch.autograd.gradcheck(
            lambda x, mc=mc: TF.ece_kde_loss(x, t, 1.0, bandwidth=0.2, mc_type=mc),
            (z.clone().requires_grad_(),))
    t2 = t.clone()
    t2[2] = -100
    keep = t2 != -100
    torch.testing.assert_close(TF.ece_kde_loss(z, t2, bandwidth=0.2),
                               TF.ece_kde_loss(z[keep], t[keep], bandwidth=0.2))
    for call, match in [
        (lambda: TF.ece_kde(logits=z[:1], labels=t[:1]), "at least 2 samples"),
        (lambda: TF.ece_kde(logits=z, labels=t, bandwidth=0.0), "`bandwidth`"),
        (lambda: TF.ece_kde(logits=z, labels=t, p=-1.0), "`p`"),
        (lambda: TF.ece_kde(logits=z, labels=t, mc_type="classwise"), "`mc_type`"),
        (lambda: TF.ece_kde_loss(z, t, reduction="none"), "reduction='none'"),
        (lambda: ECEKDELoss(mc_type="x"), "`mc_type`"),
        (lambda: ECEKDELoss(lam=float("nan")), "`lam`"),
    ]:
        with pytest.raises(ValueError, match=match):
            call()
    # the default bandwidth 0.001 stays finite on extreme logits
    x = torch.tensor([[1e4, -1e4, 0.0], [0.0, 0.0, 0.0], [-1e4, 1e4, 0.0]], requires_grad=True)
    out = create_loss("ece_kde")(x, torch.tensor([0, 1, 2]))
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(x.grad).all()


def test_kde_bandwidth_is_the_leave_one_out_argmax():
    z, _ = _data(n=15, c=3, seed=6, scale=1.0)
    p = torch.softmax(z, 1).numpy()
    best, best_h = -math.inf, None
    for h in KDE_BANDWIDTHS:
        ll = 0.0
        for i in range(15):  # in log space: tiny bandwidths underflow the densities
            ll += logsumexp([stats.dirichlet.logpdf(p[i], p[j] / h + 1) for j in range(15)
                             if j != i]) - math.log(14)
        if ll > best:
            best, best_h = ll, h
    assert TF.kde_bandwidth(probs=torch.from_numpy(p)) == best_h
    assert TF.kde_bandwidth(logits=z) == best_h


# ---------------------------------------------------------------------------------- ECE-loss
class PublishedECELossReference:
    """The repository's ECE-loss: validation statistics and the per-sample weight, in loops."""

    def __init__(self, n_bins, total_epoch, lam_cw=2.0):
        self.b, self.total, self.lam_cw = n_bins, total_epoch, lam_cw

    def update(self, z, y):
        p = torch.softmax(z.float(), 1)
        conf, pred = p.max(1)
        b = self.b
        # equal-width: bin ceil(B·conf - 1), signed gap conf - acc (0 for an empty bin)
        self.width = []
        for k in range(b):
            m = [i for i in range(len(y)) if max(math.ceil(b * float(conf[i]) - 1), 0) == k]
            self.width.append(0.0 if not m else float(np.mean([float(conf[i]) for i in m])
                                                      - np.mean([float(pred[i] == y[i]) for i in m])))
        # equal-mass: interpolated edges, float32 membership e_k < conf <= e_{k+1}
        edges = np.interp(np.linspace(0, len(y), b + 1), np.arange(len(y)), np.sort(conf.numpy()))
        self.mass = []
        for k in range(b):
            m = (conf.gt(float(edges[k])) & conf.le(float(edges[k + 1]))).numpy()
            self.mass.append(0.0 if not m.any() else float(
                conf.double()[m].mean() - (pred == y).double()[m].mean()))
        # classwise ECE of every class, 15 equal-width bins on p_k vs [y = k]
        self.cw = []
        for k in range(p.shape[1]):
            pk, total = p[:, k], 0.0
            for j in range(b):
                m = (pk > j / b) & (pk <= (j + 1) / b)
                if m.any():
                    total += abs(float(pk[m].double().mean()) - float((y[m] == k).double().mean())) \
                        * float(m.double().mean())
            self.cw.append(total)

    def loss_sum(self, x, t, epoch):
        b = self.b
        p = torch.softmax(x, 1).gather(1, t[:, None]).squeeze(1)
        ew = [0.0] * len(t)
        for i, v in enumerate(p.float()):
            for k in range(b):
                if torch.tensor(k * (1 / b), dtype=torch.float32) <= v < torch.tensor(
                        (k + 1) * (1 / b), dtype=torch.float32):
                    ew[i] = self.width[k]
                    break
        order = sorted(range(len(t)), key=lambda i: (float(p[i]), i))
        size = len(t) // b
        em = [0.0] * len(t)
        for r, i in enumerate(order):
            em[i] = self.mass[b - 1] if size == 0 or r >= b * size else self.mass[r // size]
        lam = 1 - epoch / self.total
        total = 0.0
        for i in range(len(t)):
            u = (abs(ew[i]) + abs(em[i]) + self.lam_cw * abs(self.cw[int(t[i])])) / 3
            total += (lam + (1 - lam) * u) * -math.log(float(p[i]))
        return total


@pytest.mark.parametrize("n_train", [64, 10])
def test_ece_loss_against_the_published_logic(n_train):
    g = torch.Generator().manual_seed(7)
    z = 3 * torch.randn(400, 6, generator=g)
    y = torch.randint(0, 6, (400,), generator=g)
    z[torch.arange(400), y] += 2.0
    x = 2 * torch.randn(n_train, 6, generator=g, dtype=torch.float64)
    t = torch.randint(0, 6, (n_train,), generator=g)
    loss = ECEGapLoss(total_epochs=50, reduction="sum")
    ref = PublishedECELossReference(15, 50)
    loss_on_validation(loss, logits=z, labels=y)
    ref.update(z, y)
    torch.testing.assert_close(loss.width_gaps, torch.tensor(ref.width, dtype=torch.float64),
                               rtol=0, atol=1e-6)
    torch.testing.assert_close(loss.mass_gaps, torch.tensor(ref.mass, dtype=torch.float64),
                               rtol=0, atol=1e-6)
    torch.testing.assert_close(loss.classwise, torch.tensor(ref.cw, dtype=torch.float64),
                               rtol=0, atol=1e-6)
    for epoch in (0, 20, 49):
        loss.set_epoch(epoch)
        assert loss(x, t).item() == pytest.approx(ref.loss_sum(x, t, epoch), rel=1e-5)


def test_ece_loss_state_and_first_epochs():
    x, t = _data(n=8, c=5, seed=8)
    loss = create_loss("ece_gap")
    assert published_reduction(loss) == "sum" and loss.total_epochs == 350
    torch.testing.assert_close(loss(x, t), F.cross_entropy(x, t))  # no statistics yet
    loss.set_epoch(100)
    torch.testing.assert_close(loss(x, t), (1 - 100 / 350) * F.cross_entropy(x, t))
    z, y = _data(n=100, c=5, seed=9, scale=3.0)
    loss.update(logits=z, labels=y)
    fresh = create_loss("ece_gap")
    fresh.load_state_dict(loss.state_dict())
    assert fresh.epoch == 100
    torch.testing.assert_close(fresh(x, t), loss(x, t))
    with pytest.raises(ValueError, match="`epoch`"):
        loss.set_epoch(-1)
    with pytest.raises(ValueError, match="Expected 5 classes"):
        loss(torch.zeros(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="`total_epochs`"):
        ECEGapLoss(total_epochs=0)


# ------------------------------------------------------------------------- display names
def test_every_registered_loss_has_a_display_name_and_order():
    from torchcal.report.aggregate import LOSS_ORDER, loss_label

    for name in list_losses():
        assert loss_label(name) != name, name
        assert name in LOSS_ORDER, name

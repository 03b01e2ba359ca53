"""Temperature-aware losses and the consistency loss: slow references from the formulas,
gradients (autograd/finite differences, the GRA gradient Σ w ∇CE), the validation fit of T
against a brute-force grid search, state round trip, and bad input."""

from __future__ import annotations

import io
import math
from functools import partial

import pytest
import torch
from loss_data import logits_targets

import torchcal.functional as TF
from torchcal.losses import (
    ConsistencyLoss,
    TemperatureBSCEGRALoss,
    TemperatureBSCELoss,
    TemperatureDualFocalGRALoss,
    TemperatureDualFocalLoss,
    TemperatureFocalGRALoss,
    TemperatureFocalLoss,
    create_loss,
)
from torchcal.losses.base import loss_on_validation, loss_wants_validation, published_reduction
from torchcal.losses.temperature import PUBLISHED_TEMPERATURE_GRID
from torchcal.posthoc import TemperatureScaling

_data = partial(logits_targets, n=10, c=5)


def _val(n=300, c=6, seed=5):
    """Informative but over-confident validation logits (the fitted T lies inside (1, 10))."""
    z, y = _data(n=n, c=c, seed=seed, scale=4.0)
    z[torch.arange(n), y] += 5.0
    return z, y


def _weight_ref(kind, q_row, y, gamma, beta=2.0):
    """The weight of one sample from its scaled probabilities (a list of floats)."""
    qy = q_row[y]
    if kind == "focal":
        return (1 - qy) ** gamma
    if kind == "dual":
        below = [v for v in q_row if v < qy]
        return (1 - qy + (max(below) if below else 0.0)) ** gamma
    s = sum(abs((1.0 if c == y else 0.0) - v) ** beta for c, v in enumerate(q_row))
    return s ** (gamma / beta)


def _ref(kind, z, t, gamma, temp, beta=2.0):
    """Per-sample loss from the formula, one sample at a time (float64 Python numbers)."""
    out = []
    for i in range(z.shape[0]):
        row = z[i].tolist()
        m = max(row)
        lse = m + math.log(sum(math.exp(v - m) for v in row))
        e = [math.exp((v - m) / temp) for v in row]
        q = [v / sum(e) for v in e]
        w = _weight_ref(kind, q, int(t[i]), gamma, beta)
        out.append(w * (lse - row[int(t[i])]))
    return torch.tensor(out, dtype=torch.float64)


CASES = [
    ("focal", TF.temperature_focal_loss, TF.temperature_focal_gra_loss, {}),
    ("dual", TF.temperature_dual_focal_loss, TF.temperature_dual_focal_gra_loss, {}),
    ("bsce", TF.temperature_bsce_loss, TF.temperature_bsce_gra_loss, {"beta": 2.0}),
    ("bsce", TF.temperature_bsce_loss, TF.temperature_bsce_gra_loss, {"beta": 1.0}),
    ("bsce", TF.temperature_bsce_loss, TF.temperature_bsce_gra_loss, {"beta": 3.0}),
]


@pytest.mark.parametrize("kind, fn, gra, kw", CASES)
@pytest.mark.parametrize("temp", [0.3, 1.0, 2.5])
@pytest.mark.parametrize("gamma", [0.5, 2.0])
def test_values_against_the_formula(kind, fn, gra, kw, temp, gamma):
    z, t = _data(seed=int(temp * 10))
    z[0, 1] = z[0, 2]  # a tie (dual focal's strict "below")
    want = _ref(kind, z, t, gamma, temp, **kw)
    args = (kw["beta"], gamma) if "beta" in kw else (gamma,)
    torch.testing.assert_close(fn(z, t, *args, temp, reduction="none"), want)
    torch.testing.assert_close(gra(z, t, *args, temp, reduction="none"), want)
    torch.testing.assert_close(fn(z, t, *args, temp, reduction="sum"), want.sum())
    # the temperature as a 0-d tensor (the modules' buffer) gives the same
    tt = torch.tensor(temp, dtype=torch.float64)
    torch.testing.assert_close(fn(z, t, *args, tt, reduction="none"), want)


@pytest.mark.parametrize("kind, fn, gra, kw", CASES)
def test_gradients(kind, fn, gra, kw):
    z, t = _data(n=6, c=4, seed=3)
    args = (kw["beta"], 2.0) if "beta" in kw else (2.0,)
    # the weight keeps its gradient: autograd equals finite differences
    assert torch.autograd.gradcheck(lambda x: fn(x, t, *args, 1.7), (z.clone().requires_grad_(),))
    # GRA: the gradient is Σ w_i ∇CE_i with the (detached) reference weights
    w = (_ref(kind, z, t, 2.0, 1.7, **kw)
         / torch.nn.functional.cross_entropy(z, t, reduction="none"))
    x1 = z.clone().requires_grad_(True)
    gra(x1, t, *args, 1.7, reduction="sum").backward()
    x2 = z.clone().requires_grad_(True)
    (w * torch.nn.functional.cross_entropy(x2, t, reduction="none")).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    assert not torch.autograd.gradcheck(lambda x: gra(x, t, *args, 1.7),
                                        (z.clone().requires_grad_(),), raise_exception=False)


def test_temperature_one_is_the_plain_loss():
    z, t = _data(n=16, seed=4)
    torch.testing.assert_close(TF.temperature_focal_loss(z, t, 3.0), TF.focal_loss(z, t, 3.0))
    torch.testing.assert_close(TF.temperature_focal_gra_loss(z, t, 3.0), TF.focal_gra_loss(z, t, 3.0))
    torch.testing.assert_close(TF.temperature_dual_focal_loss(z, t, 5.0), TF.dual_focal_loss(z, t, 5.0))
    torch.testing.assert_close(TF.temperature_dual_focal_gra_loss(z, t, 5.0),
                               TF.dual_focal_gra_loss(z, t, 5.0))
    torch.testing.assert_close(TF.temperature_bsce_loss(z, t, 3.0, 1.5), TF.bsce_loss(z, t, 3.0, 1.5))
    torch.testing.assert_close(TF.temperature_bsce_gra_loss(z, t), TF.bsce_gra_loss(z, t))


def _ece_ref(z, y, n_bins=15):
    p = torch.softmax(z, 1)
    conf, pred = p.max(1)
    correct = (pred == y).double()
    total = 0.0
    for b in range(n_bins):
        m = (conf > b / n_bins) & (conf <= (b + 1) / n_bins)
        if m.any():
            total += abs(float(conf[m].mean()) - float(correct[m].mean())) * float(m.double().mean())
    return total


@pytest.mark.parametrize("criterion", ["ece", "nll"])
def test_validation_fit_is_the_published_grid_search(criterion):
    z, y = _val()
    loss = create_loss("temperature_focal", criterion=criterion)
    assert loss_wants_validation(loss)
    loss_on_validation(loss, logits=z, labels=y)
    # brute force: every T = 0.01, ..., 10.00, the first (smallest) T with the lowest score
    scores = []
    for k in range(1, 1001):
        zt = z / (k / 100)
        if criterion == "ece":
            scores.append(_ece_ref(zt, y))
        else:
            scores.append(float(torch.nn.functional.cross_entropy(zt, y)))
    best = min(range(1000), key=lambda i: (round(scores[i], 12), i))
    got = float(loss.temperature)
    assert got in PUBLISHED_TEMPERATURE_GRID
    assert scores[round(got * 100) - 1] == pytest.approx(scores[best], abs=1e-12)
    assert got == pytest.approx((best + 1) / 100, abs=0.011)
    assert 1.0 < got < 10.0  # over-confident logits: T > 1


def test_modules_use_the_fitted_temperature_and_round_trip():
    z, y = _val(n=200, c=5, seed=6)
    x, t = _data(n=12, c=5, seed=7)
    for cls, fn, args in [
        (TemperatureFocalLoss, TF.temperature_focal_loss, (3.0,)),
        (TemperatureFocalGRALoss, TF.temperature_focal_gra_loss, (3.0,)),
        (TemperatureDualFocalLoss, TF.temperature_dual_focal_loss, (5.0,)),
        (TemperatureDualFocalGRALoss, TF.temperature_dual_focal_gra_loss, (5.0,)),
        (TemperatureBSCELoss, TF.temperature_bsce_loss, (2.0, 2.0)),
        (TemperatureBSCEGRALoss, TF.temperature_bsce_gra_loss, (2.0, 2.0)),
    ]:
        loss = cls()
        assert published_reduction(loss) == "sum"
        torch.testing.assert_close(loss(x, t), fn(x, t, *args, 1.0))
        temp = loss.fit_temperature(logits=z, labels=y)
        assert float(loss.temperature) == temp != 1.0
        torch.testing.assert_close(loss(x, t), fn(x, t, *args, temp))
        buf = io.BytesIO()
        torch.save(loss.state_dict(), buf)
        fresh = cls()
        fresh.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
        assert float(fresh.temperature) == temp
        assert f"temperature={temp:g}" in repr(loss)


def test_the_fit_equals_temperature_scaling_on_the_published_grid():
    z, y = _val(n=150, c=4, seed=8)
    loss = TemperatureBSCEGRALoss(criterion="nll")
    want = TemperatureScaling(method="grid_nll", grid=[k / 100 for k in range(1, 1001)]).fit(z, y)
    assert loss.fit_temperature(logits=z, labels=y) == want.temperature_


def test_consistency_loss_sources_of_q():
    x, t = _data(n=8, c=4, seed=9)
    z, y = _val(n=200, c=4, seed=10)
    q = torch.softmax(torch.randn(8, 4, dtype=torch.float64), 1)
    want = ((1 - q.gather(1, t[:, None]).squeeze(1)) ** 3
            * torch.nn.functional.cross_entropy(x, t, reduction="none")).mean()
    loss = ConsistencyLoss()
    torch.testing.assert_close(loss(x, t, calibrated_probs=q), want)
    torch.testing.assert_close(TF.consistency_loss(x, t, q), want)
    # without a calibrator: T fitted on validation, i.e. temperature focal GRA with γ = 3
    loss_on_validation(loss, logits=z, labels=y)
    ref = TemperatureFocalGRALoss()
    ref.fit_temperature(logits=z, labels=y)
    torch.testing.assert_close(loss(x, t), ref(x, t))
    # with a calibrator: softmax before its first fit, its predict_proba after
    cal = TemperatureScaling(method="nll")
    loss = ConsistencyLoss(calibrator=cal)
    torch.testing.assert_close(loss(x, t), TF.focal_gra_loss(x, t, 3.0))
    loss_on_validation(loss, logits=z, labels=y)
    assert cal.is_fitted
    torch.testing.assert_close(loss(x, t), TF.consistency_loss(x, t, cal.predict_proba(x)))
    # the gradient is Σ w ∇CE (GRA)
    xr = x.clone().requires_grad_(True)
    ConsistencyLoss(gamma=2.0, reduction="sum")(xr, t, calibrated_probs=q).backward()
    xh = x.clone().requires_grad_(True)
    w = (1 - q.gather(1, t[:, None]).squeeze(1)) ** 2
    (w * torch.nn.functional.cross_entropy(xh, t, reduction="none")).sum().backward()
    torch.testing.assert_close(xr.grad, xh.grad)


@pytest.mark.parametrize("call, match", [
    (lambda x, t: TF.temperature_focal_loss(x, t, temperature=0.0), "`temperature`"),
    (lambda x, t: TF.temperature_focal_loss(x, t, temperature=-1.0), "`temperature`"),
    (lambda x, t: TF.temperature_focal_gra_loss(x, t, temperature=float("inf")), "`temperature`"),
    (lambda x, t: TF.temperature_dual_focal_loss(x, t, temperature=float("nan")), "`temperature`"),
    (lambda x, t: TF.temperature_focal_loss(x, t, temperature=torch.tensor(2.0, requires_grad=True)),
     "`temperature`"),
    (lambda x, t: TF.temperature_focal_loss(x, t, gamma=-1.0), "`gamma`"),
    (lambda x, t: TF.temperature_dual_focal_gra_loss(x, t, gamma=float("nan")), "`gamma`"),
    (lambda x, t: TF.temperature_bsce_loss(x, t, beta=0.0), "`beta`"),
    (lambda x, t: TF.temperature_bsce_gra_loss(x, t, gamma=-2.0), "`gamma`"),
    (lambda x, t: TF.consistency_loss(x, t, torch.ones(3, 3)), "`calibrated_probs`"),
    (lambda x, t: TF.consistency_loss(x, t, torch.ones(4, 3), gamma=-1.0), "`gamma`"),
])
def test_bad_hyperparameters(call, match):
    x, t = _data(n=4, c=3)
    with pytest.raises(ValueError, match=match):
        call(x, t)


def test_bad_module_arguments():
    for ctor, err, match in [
        (lambda: TemperatureFocalLoss(criterion="adaece"), ValueError, "`criterion`"),
        (lambda: TemperatureBSCELoss(beta=-1.0), ValueError, "`beta`"),
        (lambda: TemperatureDualFocalGRALoss(gamma=float("inf")), ValueError, "`gamma`"),
        (lambda: ConsistencyLoss(calibrator=lambda z: z), TypeError, "`calibrator`"),
        (lambda: TemperatureFocalGRALoss(reduction="avg"), ValueError, "`reduction`"),
    ]:
        with pytest.raises(err, match=match):
            ctor()
    with pytest.raises(TypeError, match="`calibrated_probs`"):
        TF.consistency_loss(torch.zeros(2, 2), torch.tensor([0, 1]), [[0.5, 0.5], [0.5, 0.5]])

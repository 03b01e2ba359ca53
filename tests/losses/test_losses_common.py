"""Shared behaviour of every torchcal loss: F.cross_entropy's conventions, registry, numerics.

Each loss is checked for: reduction ("none"/"sum"/"mean") and ignore_index semantics as in
F.cross_entropy (including (N, C, d1, d2) inputs), gradients of ignored entries, bfloat16 input,
autocast, logits up to ±1e4 (p_y exactly 0 and 1), 0 < γ < 1 at p_y = 1, bad input messages,
and a smoke test over every registry entry (so losses registered later are covered too).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchcal.functional as TF
from torchcal.losses import CalibrationLoss, create_loss, list_losses
from torchcal.losses.base import loss_on_validation, loss_set_epoch

# Equal-width gaps of the ECE-loss; bins 4 and 5 are equal, so that p_y = 1/3 (the uniform row
# below), on the edge 5/15 in one dtype and not in another, gets the same weight in all dtypes.
ECE_GAPS = torch.tensor([-0.3, -0.25, -0.2, -0.15, -0.1, -0.1, 0.0, 0.05, 0.1, 0.15, 0.2, 0.25,
                         0.3, 0.35, 0.4])

# Every per-sample loss (MMCE is a batch loss, tested in its own file and below).
PER_SAMPLE = {
    "ce": lambda x, t, **kw: TF.cross_entropy(x, t, **kw),
    "ls_others": lambda x, t, **kw: TF.label_smoothing_loss(x, t, 0.1, **kw),
    "ls_uniform": lambda x, t, **kw: TF.label_smoothing_loss(x, t, 0.1, spread="uniform", **kw),
    "brier": lambda x, t, **kw: TF.brier_loss(x, t, **kw),
    "focal": lambda x, t, **kw: TF.focal_loss(x, t, 3.0, **kw),
    "focal_half": lambda x, t, **kw: TF.focal_loss(x, t, 0.5, **kw),
    "inverse_focal": lambda x, t, **kw: TF.inverse_focal_loss(x, t, 3.0, **kw),
    "signed_focal": lambda x, t, **kw: TF.signed_focal_loss(
        x, t, torch.linspace(-2.0, 2.0, t.numel()).reshape(t.shape), **kw),
    "flsd53": lambda x, t, **kw: TF.flsd53_loss(x, t, **kw),
    "flsd532": lambda x, t, **kw: TF.flsd532_loss(x, t, **kw),
    "dual_focal": lambda x, t, **kw: TF.dual_focal_loss(x, t, 5.0, **kw),
    "dual_focal_half": lambda x, t, **kw: TF.dual_focal_loss(x, t, 0.5, **kw),
    "bsce_gra": lambda x, t, **kw: TF.bsce_gra_loss(x, t, **kw),
    "bsce_gra_b1": lambda x, t, **kw: TF.bsce_gra_loss(x, t, 1.0, 1.0, **kw),
    "bsce": lambda x, t, **kw: TF.bsce_loss(x, t, **kw),
    "bsce_b3g1": lambda x, t, **kw: TF.bsce_loss(x, t, 3.0, 0.5, **kw),
    "focal_gra": lambda x, t, **kw: TF.focal_gra_loss(x, t, **kw),
    "dual_focal_gra": lambda x, t, **kw: TF.dual_focal_gra_loss(x, t, **kw),
    "gradient_weighted": lambda x, t, **kw: TF.gradient_weighted_loss(
        x, t, torch.linspace(0.5, 2.0, t.numel()).reshape(t.shape), **kw),
    # the published code's other per-sample losses (issue #16)
    "temperature_focal": lambda x, t, **kw: TF.temperature_focal_loss(x, t, 3.0, 1.7, **kw),
    "temperature_focal_gra": lambda x, t, **kw: TF.temperature_focal_gra_loss(x, t, 0.5, 0.6, **kw),
    "temperature_dual_focal": lambda x, t, **kw: TF.temperature_dual_focal_loss(x, t, 5.0, 1.7,
                                                                               **kw),
    "temperature_dual_focal_gra": lambda x, t, **kw: TF.temperature_dual_focal_gra_loss(
        x, t, 5.0, 0.6, **kw),
    "temperature_bsce": lambda x, t, **kw: TF.temperature_bsce_loss(x, t, 2.0, 2.0, 1.7, **kw),
    "temperature_bsce_b1": lambda x, t, **kw: TF.temperature_bsce_loss(x, t, 1.0, 0.5, 0.6, **kw),
    "temperature_bsce_gra": lambda x, t, **kw: TF.temperature_bsce_gra_loss(x, t, 3.0, 1.0, 1.7,
                                                                           **kw),
    "tlbs": lambda x, t, **kw: TF.tlbs_loss(x, t, **kw),
    "focal_gra_flsd53": lambda x, t, **kw: TF.sample_dependent_focal_gra_loss(x, t, **kw),
    "bsce_adaptive_gra": lambda x, t, **kw: TF.bsce_adaptive_gra_loss(x, t, **kw),
    "consistency": lambda x, t, **kw: TF.consistency_loss(
        x, t, torch.softmax(x.detach().float() / 2.0, 1) if x.ndim > 1 else x, **kw),
    "ce_exp": lambda x, t, **kw: TF.ce_exp_loss(x, t, **kw),
    "focal_exp": lambda x, t, **kw: TF.focal_exp_loss(x, t, 2.0, 0.5, **kw),
    "dual_focal_exp": lambda x, t, **kw: TF.dual_focal_exp_loss(x, t, **kw),
    "brier_exp": lambda x, t, **kw: TF.brier_exp_loss(x, t, 2.0, **kw),
    "ece_gap": lambda x, t, **kw: TF.ece_gap_loss(
        x, t, ECE_GAPS, torch.linspace(0.2, -0.1, 15),
        torch.linspace(0.0, 0.2, x.shape[1] if x.ndim > 1 else 1), progress=0.7, **kw),
}
NAMES = sorted(PER_SAMPLE)


def _data(n=12, c=5, extra=(), dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = 2.0 * torch.randn((n, c) + tuple(extra), generator=g, dtype=dtype)
    t = torch.randint(0, c, (n,) + tuple(extra), generator=g)
    return x, t


@pytest.mark.parametrize("name", NAMES)
def test_reduction_semantics_match_cross_entropy(name):
    fn = PER_SAMPLE[name]
    x, t = _data()
    t[[1, 4]] = -100
    none = fn(x, t, reduction="none")
    assert none.shape == t.shape
    assert torch.all(none[[1, 4]] == 0)
    kept = t != -100
    torch.testing.assert_close(fn(x, t, reduction="sum"), none.sum())
    torch.testing.assert_close(fn(x, t, reduction="mean"), none.sum() / kept.sum())
    torch.testing.assert_close(fn(x, t), none[kept].mean())
    # a custom ignore_index, and the same as dropping the rows
    t2 = t.clone()
    t2[[1, 4]] = 3
    torch.testing.assert_close(fn(x, t2, ignore_index=3), none[kept & (t2 != 3)].sum()
                               / (kept & (t2 != 3)).sum())
    if name not in ("signed_focal", "gradient_weighted"):  # per-sample tensors depend on N
        torch.testing.assert_close(fn(x[kept], t[kept], reduction="none"), none[kept])
    # all ignored: mean is NaN like F.cross_entropy, sum is 0
    tall = torch.full_like(t, -100)
    assert torch.isnan(F.cross_entropy(x, tall)) and torch.isnan(fn(x, tall))
    assert fn(x, tall, reduction="sum") == 0


@pytest.mark.parametrize("name", NAMES)
def test_spatial_inputs_equal_flattened_rows(name):
    fn = PER_SAMPLE[name]
    x, t = _data(n=3, c=4, extra=(2, 3))
    t[0, 1, 2] = -100
    rows = x.movedim(1, -1).reshape(-1, 4)
    trow = t.reshape(-1)
    if name in ("signed_focal", "gradient_weighted"):  # per-sample tensors follow the target's shape
        return
    out = fn(x, t, reduction="none")
    assert out.shape == t.shape
    torch.testing.assert_close(out.reshape(-1), fn(rows, trow, reduction="none"))
    # gradients too
    xa = x.clone().requires_grad_(True)
    fn(xa, t).backward()
    xb = rows.clone().requires_grad_(True)
    fn(xb, trow).backward()
    torch.testing.assert_close(xa.grad.movedim(1, -1).reshape(-1, 4), xb.grad)


@pytest.mark.parametrize("name", NAMES)
def test_ignored_entries_get_zero_gradient(name):
    fn = PER_SAMPLE[name]
    x, t = _data()
    t[2] = -100
    x.requires_grad_(True)
    fn(x, t, reduction="sum").backward()
    assert torch.all(x.grad[2] == 0)
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_and_float32_inputs(name):
    fn = PER_SAMPLE[name]
    x, t = _data(dtype=torch.float32)
    xb = x.to(torch.bfloat16).requires_grad_(True)
    out = fn(xb, t)
    assert out.dtype == torch.float32 and torch.isfinite(out)
    out.backward()
    assert xb.grad.dtype == torch.bfloat16 and torch.isfinite(xb.grad.float()).all()
    # computed in float32 from the bf16 values
    torch.testing.assert_close(out, fn(xb.detach().float(), t))


@pytest.mark.parametrize("name", NAMES)
def test_autocast_computes_in_float32(name):
    fn = PER_SAMPLE[name]
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 5)
    feats = torch.randn(12, 6)
    t = torch.randint(0, 5, (12,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = lin(feats)
        assert logits.dtype == torch.bfloat16
        out = fn(logits, t)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, fn(logits.detach().float(), t))
    out.backward()
    assert torch.isfinite(lin.weight.grad).all()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_extreme_logits_finite(name, dtype):
    fn = PER_SAMPLE[name]
    # p_y exactly 1 (rows 0, 2), exactly 0 (rows 1, 3), ties, and a uniform row
    x = torch.tensor([[1e4, -1e4, 0.0], [1e4, -1e4, 0.0], [-1e4, 1e4, -1e4], [-1e4, 1e4, 1e4],
                      [0.0, 0.0, 0.0]], dtype=dtype, requires_grad=True)
    t = torch.tensor([0, 1, 1, 0, 2])
    out = fn(x, t, reduction="none")
    assert torch.isfinite(out).all(), out
    out.sum().backward()
    assert torch.isfinite(x.grad.float()).all(), x.grad
    # p_y = 1: zero loss and zero gradient for every loss whose minimum is at p_y = 1
    if name not in ("ls_others", "ls_uniform", "inverse_focal", "signed_focal"):
        assert out[0].item() == 0 and torch.all(x.grad[0] == 0)
    # not merely finite: the float64 computation on the same logits, up to float32 rounding
    # (gradients to about |log p_y|·eps·|∇|, here 2e4·6e-8; bfloat16 rounds the gradient)
    if dtype != torch.float64:
        x64 = x.detach().double().requires_grad_(True)
        out64 = fn(x64, t, reduction="none")
        out64.sum().backward()
        torch.testing.assert_close(out.double(), out64, rtol=1e-6, atol=0)
        torch.testing.assert_close(x.grad.double(), x64.grad, rtol=0, atol=1e-2)


def test_focal_half_gamma_at_py_one_has_the_limit_gradient():
    # autograd through (1-p)^γ would give NaN here (∞ · 0); the closed form gives the limit 0,
    # and near p_y = 1 the gradient matches finite differences.
    x = torch.tensor([[40.0, 0.0]], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0])
    TF.focal_loss(x, t, 0.5).backward()
    assert torch.isfinite(x.grad).all()
    x2 = torch.tensor([[8.0, 0.0]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: TF.focal_loss(z, t, 0.5), (x2,))
    assert torch.autograd.gradcheck(lambda z: TF.dual_focal_loss(z, t, 0.5), (x2,))


def test_cross_entropy_matches_torch():
    x, t = _data(extra=(3,))
    t[0, 0] = -100
    for red in ("none", "sum", "mean"):
        torch.testing.assert_close(TF.cross_entropy(x, t, reduction=red),
                                   F.cross_entropy(x, t, reduction=red))


# ---------------------------------------------------------------------------- bad input
ALL_FUNCS = dict(PER_SAMPLE, mmce=lambda x, t, **kw: TF.mmce_loss(x, t, **kw),
                 mmce_unweighted=lambda x, t, **kw: TF.mmce_unweighted_loss(x, t, **kw),
                 mmce_gra=lambda x, t, **kw: TF.mmce_gra_loss(x, t, **kw),
                 dece=lambda x, t, **kw: TF.dece_loss(x, t, **kw),
                 ece_kde=lambda x, t, **kw: TF.ece_kde_loss(x, t, **kw))


@pytest.mark.parametrize("name", sorted(ALL_FUNCS))
def test_bad_targets_and_shapes(name):
    fn = ALL_FUNCS[name]
    x, t = _data(n=4, c=3)
    with pytest.raises(ValueError, match="`target` values in \\[0, 2\\]"):
        fn(x, torch.tensor([0, 1, 3, 0]))
    with pytest.raises(ValueError, match="`target` values"):
        fn(x, torch.tensor([0, -1, 2, 0]))
    with pytest.raises(TypeError, match="`target`"):
        fn(x, t.double())
    with pytest.raises(ValueError, match="`target` of shape"):
        fn(x, t[:3])
    with pytest.raises(TypeError, match="`input`"):
        fn(x.long(), t)
    with pytest.raises(ValueError, match="`input` of shape"):
        fn(x[0], t[0])
    with pytest.raises(ValueError, match="`reduction`"):
        fn(x, t, reduction="avg")


@pytest.mark.parametrize("call, match", [
    (lambda x, t: TF.focal_loss(x, t, -1.0), "`gamma`"),
    (lambda x, t: TF.focal_loss(x, t, float("nan")), "`gamma`"),
    (lambda x, t: TF.focal_loss(x, t, float("inf")), "`gamma`"),
    (lambda x, t: TF.focal_loss(x, t, torch.tensor([1.0, -1.0, 1.0, 1.0])), "`gamma`"),
    (lambda x, t: TF.focal_loss(x, t, torch.ones(3)), "`gamma`"),
    (lambda x, t: TF.signed_focal_loss(x, t, torch.tensor([1.0, float("nan"), 1.0, 1.0])),
     "`gamma`"),
    (lambda x, t: TF.inverse_focal_loss(x, t, -0.5), "`gamma`"),
    (lambda x, t: TF.dual_focal_loss(x, t, -2.0), "`gamma`"),
    (lambda x, t: TF.focal_gra_loss(x, t, float("nan")), "`gamma`"),
    (lambda x, t: TF.dual_focal_gra_loss(x, t, -1.0), "`gamma`"),
    (lambda x, t: TF.bsce_gra_loss(x, t, beta=0.0), "`beta`"),
    (lambda x, t: TF.bsce_gra_loss(x, t, beta=-1.0), "`beta` to be a finite number > 0"),
    (lambda x, t: TF.bsce_gra_loss(x, t, beta=float("inf")), "`beta`"),
    (lambda x, t: TF.bsce_loss(x, t, beta=float("nan")), "`beta`"),
    (lambda x, t: TF.bsce_gra_loss(x, t, gamma=float("inf")), "`gamma`"),
    (lambda x, t: TF.label_smoothing_loss(x, t, alpha=float("inf")), "`alpha`"),
    (lambda x, t: TF.label_smoothing_loss(x, t, alpha=torch.tensor(1.0)), "`alpha`"),
    (lambda x, t: TF.mmce_loss(x, t, width=-0.4), "`width` to be a finite number > 0"),
    (lambda x, t: TF.mmce_loss(x, t, lam=float("inf")), "`lam`"),
    (lambda x, t: TF.bsce_loss(x, t, gamma=-1.0), "`gamma`"),
    (lambda x, t: TF.label_smoothing_loss(x, t, alpha=1.0), "`alpha`"),
    (lambda x, t: TF.label_smoothing_loss(x, t, alpha=-0.1), "`alpha`"),
    (lambda x, t: TF.label_smoothing_loss(x, t, alpha=float("nan")), "`alpha`"),
    (lambda x, t: TF.label_smoothing_loss(x, t, spread="all"), "`spread`"),
    (lambda x, t: TF.sample_dependent_focal_loss(x, t, (0.5, 0.2), (5, 3, 3)), "`thresholds`"),
    (lambda x, t: TF.sample_dependent_focal_loss(x, t, (0.2,), (5, 3, 3)), "`gammas`"),
    (lambda x, t: TF.sample_dependent_focal_loss(x, t, (0.2,), (5, -3)), "`gammas`"),
    (lambda x, t: TF.mmce_loss(x, t, reduction="none"), "reduction='none'"),
    (lambda x, t: TF.mmce_loss(x, t, lam=-1.0), "`lam`"),
    (lambda x, t: TF.mmce_loss(x, t, normalization="x"), "`normalization`"),
    (lambda x, t: TF.gradient_weighted_loss(x, t, torch.ones(3)), "`weight`"),
    (lambda x, t: TF.gradient_weighted_loss(x, t, torch.tensor([1.0, 1, float("inf"), 1])),
     "`weight`"),
])
def test_bad_hyperparameters(call, match):
    x, t = _data(n=4, c=3)
    with pytest.raises(ValueError, match=match):
        call(x, t)


def test_module_constructors_reject_bad_hyperparameters():
    from torchcal import losses as L

    for ctor, match in [
        (lambda: L.FocalLoss(gamma=-1), "`gamma`"),
        (lambda: L.InverseFocalLoss(gamma=float("inf")), "`gamma`"),
        (lambda: L.DualFocalLoss(gamma=-1), "`gamma`"),
        (lambda: L.LabelSmoothingLoss(alpha=1.5), "`alpha`"),
        (lambda: L.LabelSmoothingLoss(spread="x"), "`spread`"),
        (lambda: L.MMCELoss(reduction="none"), "reduction='none'"),
        (lambda: L.MMCELoss(lam=float("nan")), "`lam`"),
        (lambda: L.BSCEGRALoss(beta=0), "`beta`"),
        (lambda: L.BSCELoss(beta=float("inf")), "`beta`"),
        (lambda: L.DualFocalGRALoss(gamma=float("nan")), "`gamma`"),
        (lambda: L.MMCELoss(width=-1.0), "`width` to be a finite number > 0"),
        (lambda: L.LabelSmoothingLoss(alpha=-0.01), "`alpha`"),
        (lambda: L.BSCELoss(gamma=-2), "`gamma`"),
        (lambda: L.FocalGRALoss(gamma=-2), "`gamma`"),
        (lambda: L.ScheduledFocalLoss((250, 100), (5, 3, 1)), "`milestones`"),
        (lambda: L.ScheduledFocalLoss((100, 250), (5, 3)), "`gammas`"),
        (lambda: L.SampleDependentFocalLoss((0.2, 0.5), (5, 3)), "`gammas`"),
        (lambda: L.CrossEntropyLoss(reduction="avg"), "`reduction`"),
    ]:
        with pytest.raises(ValueError, match=match):
            ctor()


# ---------------------------------------------------------------------------- registry
EXPECTED = {"ce", "ls", "brier", "mmce", "focal", "inverse_focal", "flsd53", "flsd532", "flsc531",
            "flsc532", "dual_focal", "bsce", "bsce_gra", "focal_gra", "dual_focal_gra"}


def test_registry_names_and_unknown_name():
    names = list_losses()
    assert EXPECTED <= set(names)
    assert names == sorted(names)
    assert list_losses("flsd*") == ["flsd53", "flsd532"]
    with pytest.raises(ValueError, match="Unknown loss 'nope'.*focal"):
        create_loss("nope")
    with pytest.raises(TypeError, match="unexpected argument"):
        create_loss("focal", gama=2.0)


def test_registry_defaults_and_published_reductions():
    assert create_loss("focal").gamma == 3.0
    assert create_loss("inverse_focal").gamma == 3.0
    assert create_loss("dual_focal").gamma == 5.0
    assert create_loss("ls").alpha == 0.05 and create_loss("ls").spread == "others"
    assert create_loss("mmce").lam == 2.0 and create_loss("mmce").normalization == "published"
    b = create_loss("bsce_gra")
    assert (b.beta, b.gamma) == (2.0, 2.0)
    assert create_loss("focal_gra").gamma == 3.0
    assert create_loss("dual_focal_gra").gamma == 5.0
    assert create_loss("flsd53").gammas == (5.0, 3.0, 3.0)
    assert create_loss("flsd532").gammas == (5.0, 3.0, 2.0)
    assert create_loss("brier").published_reduction == "mean"
    for name in EXPECTED - {"brier"}:
        assert create_loss(name).published_reduction == "sum", name
    assert create_loss("focal", gamma=2.0, reduction="sum").reduction == "sum"


@pytest.mark.parametrize("name", list_losses())
def test_registry_smoke(name):
    loss = create_loss(name)
    assert isinstance(loss, torch.nn.Module)
    assert getattr(loss, "published_reduction", "sum") in ("sum", "mean")
    if isinstance(loss, CalibrationLoss):
        loss.set_epoch(0)
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = (3 * torch.randn(16, 7, generator=g)).to(dtype).requires_grad_(True)
        t = torch.randint(0, 7, (16,), generator=g)
        out = loss(x, t)
        assert out.ndim == 0 and torch.isfinite(out), (name, dtype)
        out.backward()
        assert torch.isfinite(x.grad.float()).all(), (name, dtype)
    # extreme logits
    x = torch.tensor([[1e4, -1e4, 0.0], [-1e4, 1e4, 0.0], [0.0, 0.0, 0.0]], requires_grad=True)
    out = loss(x, torch.tensor([0, 0, 1]))
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(x.grad).all(), name
    # sum vs mean for per-sample losses: sum = N * mean when nothing is ignored
    x = torch.randn(10, 4, generator=g, dtype=torch.float64)
    t = torch.randint(0, 4, (10,), generator=g)
    ls = create_loss(name, reduction="sum") if "reduction" in _accepted(name) else None
    if ls is not None:
        torch.testing.assert_close(ls(x, t), 10 * create_loss(name)(x, t))


def _accepted(name):
    import inspect

    from torchcal.losses._registry import loss_entrypoint

    return inspect.signature(loss_entrypoint(name)).parameters


@pytest.mark.parametrize("name", list_losses())
def test_registry_autocast_computes_in_float32(name):
    # every registry entry (MMCE and AdaFocal included, which the per-sample table above leaves
    # out) computes in float32 under bfloat16 autocast, equal to the float32 computation on the
    # same bf16 logits, with finite gradients
    loss = create_loss(name)
    g = torch.Generator().manual_seed(2)
    if name == "adafocal":  # a state with equal-mass edges and γ of both signs
        loss.update(logits=3 * torch.randn(200, 5, generator=g),
                    labels=torch.randint(0, 5, (200,), generator=g))
        with torch.no_grad():
            loss.gammas.copy_(torch.linspace(-2.0, 4.0, loss.n_bins, dtype=torch.float64))
    lin = torch.nn.Linear(6, 5)
    feats = torch.randn(32, 6, generator=g)
    t = torch.randint(0, 5, (32,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = lin(feats)
        assert logits.dtype == torch.bfloat16
        out = loss(logits, t)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, loss(logits.detach().float(), t))
    out.backward()
    assert torch.isfinite(lin.weight.grad).all()


@pytest.mark.parametrize("name", list_losses())
def test_registry_gradients(name):
    # Every registry entry in float64 (so losses registered later are covered too):
    # torch.autograd.gradcheck for losses whose weight carries gradient; for the GRA family,
    # whose weight is detached by design, the gradient is Σ w_i ∇CE_i with w_i = ℓ_i / CE_i,
    # the same as a backward hook scaling each sample's CE gradient by w_i, and it is *not*
    # the gradient of the loss surface (gradcheck must fail).
    from torchcal.losses import GradientWeightedLoss

    g = torch.Generator().manual_seed(7)
    x = 2.0 * torch.randn(6, 4, generator=g, dtype=torch.float64)
    t = torch.randint(0, 4, (6,), generator=g)
    p_y = torch.softmax(x, 1).gather(1, t[:, None]).squeeze(1)
    # away from FLSD's thresholds (its γ is piecewise constant in p_y)
    assert ((p_y[:, None] - torch.tensor([0.2, 0.5], dtype=torch.float64)).abs() > 1e-3).all()
    loss = create_loss(name)
    # a state past the first epoch and one validation pass (stateful losses: ECE-loss blends
    # from plain CE at epoch 0, the temperature-aware ones fit T)
    loss_set_epoch(loss, 100)
    loss_on_validation(loss, logits=3 * torch.randn(64, 4, generator=g, dtype=torch.float64),
                       labels=torch.randint(0, 4, (64,), generator=g))
    xr = x.clone().requires_grad_(True)
    if hasattr(loss, "gradient_weights"):
        # a detached weight times a per-sample base loss b (the exponentially weighted family,
        # MMCE-GRA): loss(reduction="sum") = Σ w_i b_i and its gradient is Σ w_i ∇b_i
        loss.reduction = "sum"
        w, b = loss.gradient_weights(x, t)
        torch.testing.assert_close(loss(x, t), (w * b).sum())
        loss(xr, t).backward()
        xh = x.clone().requires_grad_(True)
        bh = loss.gradient_weights(xh, t)[1]
        bh.register_hook(lambda grad: grad * w)
        bh.sum().backward()
        torch.testing.assert_close(xr.grad, xh.grad)
        assert not torch.autograd.gradcheck(lambda z: loss(z, t), (xr,), raise_exception=False)
    elif isinstance(loss, GradientWeightedLoss):
        loss.reduction = "none"
        w = (loss(x, t) / F.cross_entropy(x, t, reduction="none")).detach()
        loss.reduction = "sum"
        loss(xr, t).backward()
        xh = x.clone().requires_grad_(True)
        ce = F.cross_entropy(xh, t, reduction="none")
        ce.register_hook(lambda grad: grad * w)
        ce.sum().backward()
        torch.testing.assert_close(xr.grad, xh.grad)
        assert not torch.autograd.gradcheck(lambda z: loss(z, t), (xr,), raise_exception=False)
    else:
        assert torch.autograd.gradcheck(lambda z: loss(z, t), (xr,))


@pytest.mark.parametrize("name", NAMES + ["mmce"])
def test_sync_free_target_path_equals_the_checked_path(name, monkeypatch):
    """On an accelerator the target checks run without a host sync (an ignore mask is always
    built, bad targets trip ``torch._assert_async``). Forced on the CPU here: the same values
    and gradients as the synchronous path, with and without ignored entries."""
    import torchcal.functional._loss_utils as LU

    fn = PER_SAMPLE.get(name) or (lambda x, t, **kw: TF.mmce_loss(x, t, **kw))
    x, t = _data(n=16, c=5, seed=3)
    t_ign = t.clone()
    t_ign[::3] = -100
    ref = []
    for tt in (t, t_ign):
        xr = x.clone().requires_grad_(True)
        fn(xr, tt, reduction="sum").backward()
        ref.append((fn(x, tt, reduction="mean"), xr.grad))
    calls = []

    def forced(target):
        calls.append(1)
        return True

    monkeypatch.setattr(LU, "sync_free", forced)
    for tt, (v_ref, g_ref) in zip((t, t_ign), ref, strict=True):
        xr = x.clone().requires_grad_(True)
        fn(xr, tt, reduction="sum").backward()
        torch.testing.assert_close(fn(x, tt, reduction="mean"), v_ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(xr.grad, g_ref, rtol=1e-12, atol=1e-12)
    bad = t.clone()
    bad[2] = 7
    with pytest.raises((RuntimeError, IndexError)):  # _assert_async / F.cross_entropy's check
        fn(x, bad)
    assert calls, "the sync-free path was never taken"


# ---------------------------------------------------------------------------- the loss base
@pytest.mark.parametrize("name", list_losses())
def test_repr_shows_the_validated_hyperparameters(name):
    loss = create_loss(name, reduction="sum", validate_args=False)
    text = repr(loss)
    assert text.startswith(type(loss).__name__ + "(") and "reduction='sum'" in text
    assert "validate_args=False" in text and loss.validate_args is False
    for attr in loss._hyperparameters:  # every stored hyperparameter is shown, with its value
        assert f"{attr}={getattr(loss, attr)!r}" in text


def test_base_validates_declared_hyperparameters_and_flags():
    from torchcal._validation import Options
    from torchcal.losses.base import HYPERPARAMETER_CHECKS as V

    class Toy(CalibrationLoss):
        _parameter_constraints = {"gamma": V["gamma"], "lam": V["lam"], "alpha": V["alpha"],
                                  "beta": V["beta"], "width": V["width"],
                                  "spread": Options(("x", "y"))}

        def __init__(self, gamma=2, lam=1, alpha=0.1, beta=1, width=0.5, spread="x", **kw):
            super().__init__(gamma=gamma, lam=lam, alpha=alpha, beta=beta, width=width,
                             spread=spread, **kw)

    toy = Toy(ignore_index=3)
    assert (toy.gamma, toy.lam, toy.alpha, toy.beta, toy.width, toy.spread) == (
        2.0, 1.0, 0.1, 1.0, 0.5, "x")
    assert repr(toy) == ("Toy(gamma=2.0, lam=1.0, alpha=0.1, beta=1.0, width=0.5, spread='x', "
                         "reduction='mean', ignore_index=3)")
    for kw, match in [({"gamma": -1}, "`gamma`"), ({"lam": float("nan")}, "`lam`"),
                      ({"alpha": 1.0}, "`alpha`"), ({"beta": 0}, "`beta`"),
                      ({"width": -0.1}, "`width`"), ({"spread": "z"}, "`spread`")]:
        with pytest.raises(ValueError, match=match):
            Toy(**kw)
    with pytest.raises(TypeError, match="`validate_args`"):
        Toy(validate_args="no")


@pytest.mark.parametrize("name", ["bsce_gra", "focal_gra", "dual_focal_gra"])
def test_gra_presets_take_an_explicit_weight_like_the_combinator(name):
    from torchcal.losses import GradientWeightedLoss

    loss = create_loss(name, reduction="none")
    assert isinstance(loss, GradientWeightedLoss)
    x, t = _data()
    w = torch.linspace(0.5, 2.0, t.numel(), dtype=x.dtype)
    torch.testing.assert_close(loss(x, t, w), TF.gradient_weighted_loss(x, t, w, reduction="none"))
    assert not torch.allclose(loss(x, t), loss(x, t, w))

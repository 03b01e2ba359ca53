"""UncertaintyWeighting (Kendall et al. 2018): value, gradient, closed-form optimum, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from torchcal.losses.multitask import UncertaintyWeighting

KINDS = ("regression", "classification", "regression")


def test_value_matches_formula():
    mtl = UncertaintyWeighting(kinds=KINDS, init=[0.3, -0.2, 1.1])
    L = [torch.tensor(0.7), torch.tensor(2.5), torch.tensor(0.05)]
    c = [0.5, 1.0, 0.5]
    s = [0.3, -0.2, 1.1]
    expected = sum(ci * math.exp(-si) * li.item() + 0.5 * si for ci, si, li in zip(c, s, L, strict=True))
    assert mtl(L).item() == pytest.approx(expected, rel=1e-6)
    # a 1-D tensor of losses is the same
    assert mtl(torch.stack(L)).item() == pytest.approx(expected, rel=1e-6)
    torch.testing.assert_close(
        mtl.weights(), torch.tensor([ci * math.exp(-si) for ci, si in zip(c, s, strict=True)])
    )


def test_uniform_form_uses_half_everywhere():
    mtl = UncertaintyWeighting(kinds=KINDS, form="uniform")
    torch.testing.assert_close(mtl.weights(), torch.full((3,), 0.5))
    assert mtl(torch.tensor([1.0, 2.0, 3.0])).item() == pytest.approx(3.0)


def test_gradient_wrt_log_vars_matches_formula():
    torch.manual_seed(0)
    mtl = UncertaintyWeighting(kinds=KINDS, init=[0.1, 0.4, -0.7]).double()
    L = torch.tensor([0.9, 1.7, 0.2], dtype=torch.float64, requires_grad=True)
    mtl(L).backward()
    c = mtl.coefficients
    s = mtl.log_vars.detach()
    # d/ds_t = -c_t exp(-s_t) L_t + 1/2 ;  d/dL_t = c_t exp(-s_t)
    torch.testing.assert_close(mtl.log_vars.grad, -c * torch.exp(-s) * L.detach() + 0.5)
    torch.testing.assert_close(L.grad, c * torch.exp(-s))
    # and finite differences agree with autograd
    assert torch.autograd.gradcheck(lambda lv: (c * torch.exp(-lv) * L.detach() + 0.5 * lv).sum(),
                                    (s.clone().requires_grad_(),))


def test_gradient_descent_converges_to_closed_form_optimum():
    L = torch.tensor([0.8, 2.0, 0.05])
    mtl = UncertaintyWeighting(kinds=KINDS)
    opt = torch.optim.SGD(mtl.parameters(), lr=0.5)
    for _ in range(150):  # contraction ~0.75 per step near the optimum
        opt.zero_grad()
        mtl(L).backward()
        opt.step()
    c = torch.tensor([0.5, 1.0, 0.5])
    s_star = torch.log(2 * c * L)
    torch.testing.assert_close(mtl.log_vars.detach(), s_star, atol=1e-4, rtol=0)
    # at the optimum the weight of each task is 1 / (2 L_t)
    torch.testing.assert_close(mtl.weights(), 1 / (2 * L), atol=1e-3, rtol=1e-3)


def test_float64_losses_keep_float64():
    mtl = UncertaintyWeighting(kinds=("classification",))
    out = mtl([torch.tensor(1.0, dtype=torch.float64)])
    assert out.dtype == torch.float64


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"kinds": ("regression", "segmentation")}, ValueError, "`kinds`"),
        ({"kinds": ()}, ValueError, "`kinds`"),
        ({"kinds": "regression"}, TypeError, "`kinds`"),
        ({"kinds": ("regression",), "form": "libmtl"}, ValueError, "`form`"),
        ({"kinds": ("regression", "classification"), "init": [0.0]}, ValueError, "`init`"),
        ({"kinds": ("regression",), "init": float("nan")}, ValueError, "`init`"),
    ],
)
def test_bad_constructor_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        UncertaintyWeighting(**kwargs)


def test_bad_losses():
    mtl = UncertaintyWeighting(kinds=KINDS)
    with pytest.raises(ValueError, match="3 task losses"):
        mtl([torch.tensor(1.0), torch.tensor(2.0)])
    with pytest.raises(ValueError, match=r"`losses\[1\]`.*scalar"):
        mtl([torch.tensor(1.0), torch.ones(4), torch.tensor(2.0)])
    with pytest.raises(ValueError, match="shape"):
        mtl(torch.ones(2, 3))
    with pytest.raises(TypeError, match=r"`losses\[0\]`"):
        mtl(["a", torch.tensor(1.0), torch.tensor(1.0)])
    with pytest.raises(TypeError, match="`losses`"):
        mtl(torch.ones(3, dtype=torch.long))


def test_state_dict_round_trip():
    a = UncertaintyWeighting(kinds=KINDS, init=[0.1, 0.2, 0.3])
    b = UncertaintyWeighting(kinds=KINDS)
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b.log_vars, a.log_vars)
    assert set(a.state_dict()) == {"log_vars", "coefficients"}


def test_digits_example_runs_and_learns_weights(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "multitask_digits.py"
    spec = importlib.util.spec_from_file_location("multitask_digits_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for form, coefs in (("kendall", (1.0, 0.5)), ("uniform", (0.5, 0.5))):
            out = mod.main(["--epochs", "3", "--form", form])
            printed = capsys.readouterr().out
            w, s = out["weights"], out["log_vars"]
            # the printed weights are c_t * exp(-s_t) of the learned log-variances
            assert w == pytest.approx([c * math.exp(-v) for c, v in zip(coefs, s, strict=True)],
                                      rel=1e-6)
            assert (f"learned weights c*exp(-s): classification {w[0]:.3f}, "
                    f"regression {w[1]:.3f}") in printed
            # both s_t were learned (they start at 0), and the classifier learned the digits
            assert min(abs(v) for v in s) > 0.02
            assert out["accuracy"] > 0.5
    finally:
        torch.set_num_threads(n)

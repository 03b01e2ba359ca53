"""Issue 43 item 2: torchcal's SGD (``torchcal.train.run.SGD``, built without importing
``torch._dynamo``) trains bit for bit as ``torch.optim.SGD`` and keeps the same state dict;
that it imports no ``torch._dynamo`` is checked in a fresh process by
``tests/cli/test_cli_startup.py``."""

from __future__ import annotations

import pickle

import pytest
import torch

from torchcal.train.run import SGD


def _train(cls, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    opt = cls(model.parameters(), **kw)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[3], gamma=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(6):
        opt.zero_grad()
        x = torch.randn(8, 5, generator=g)
        torch.nn.functional.cross_entropy(model(x), torch.arange(8) % 3).backward()
        opt.step()
        sched.step()
    state = opt.state_dict()
    opt.load_state_dict(state)
    return [p.detach().clone() for p in model.parameters()], state, torch.is_grad_enabled()


@pytest.mark.parametrize("kw", [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9, weight_decay=5e-4),
    dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    dict(lr=0.1, momentum=0.5, dampening=0.3),
])
def test_sgd_is_bit_for_bit_torch_sgd(kw):
    ours, state, grad_on = _train(SGD, **kw)
    ref, ref_state, _ = _train(torch.optim.SGD, **kw)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref, strict=True))
    assert state["param_groups"] == ref_state["param_groups"]
    assert state["state"].keys() == ref_state["state"].keys()
    for k, v in state["state"].items():
        for name, t in v.items():
            assert torch.equal(t, ref_state["state"][k][name]) if t is not None else \
                ref_state["state"][k][name] is None
    assert grad_on  # step() restores the grad mode


def test_sgd_step_takes_a_closure_and_is_a_torch_sgd():
    w = torch.nn.Parameter(torch.tensor([1.0]))
    opt = SGD([w], lr=0.5)

    def closure():
        opt.zero_grad()
        loss = (w ** 2).sum()
        loss.backward()
        return loss

    assert float(opt.step(closure)) == 1.0 and float(w.detach()) == 0.0
    assert isinstance(opt, torch.optim.SGD)


def test_an_unfitted_calibrator_error_pickles():
    import sklearn.exceptions

    from torchcal.errors import NotFittedError
    from torchcal.posthoc import TemperatureScaling

    with pytest.raises(NotFittedError) as e:
        TemperatureScaling().transform(torch.zeros(2, 3))
    back = pickle.loads(pickle.dumps(e.value))
    assert isinstance(back, sklearn.exceptions.NotFittedError) and str(back) == str(e.value)

"""The engine's ownership (issue 40, item 2): the engine uses a stack only through the
:class:`~torchcal.train.stacks.Stack` protocol, steps every schedule itself (no flag set on an
optimiser), gives ``split_logits`` the sources (a stack holds no run), builds a run's and a
ghost's optimiser and schedule with one builder, and stops a pack whose ghost cannot be built."""

from __future__ import annotations

import json
import types
import warnings

import pytest
import torch
from test_train_packed import _restore_threads  # noqa: F401 - the autouse fixture
from test_train_packed import cfg
from torch import nn

import torchcal.train.packed as P
from torchcal.train.checkpoint import load_checkpoint
from torchcal.train.joint_head import NoHead
from torchcal.train.packed import train_packed
from torchcal.train.stacks import PackedModel, SoloModel, Stack
from torchcal.train.steps import SGD, Run

pytestmark = pytest.mark.filterwarnings("ignore:OOD set")

_PROTOCOL = ("packed", "amp", "train", "start_epoch", "forward", "forward_shared", "step",
             "annotate", "split_logits", "finite", "fc_norms", "stacked_state")


def _models(n: int = 2) -> tuple[list[nn.Module], list[SGD]]:
    models = []
    for m in range(n):
        torch.manual_seed(m)
        models.append(nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)))
    return models, [SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]


class _OnlyTheProtocol:
    """A stack that lets the engine reach the :class:`Stack` protocol's members only."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack
        self.packed, self.amp = stack.packed, stack.amp

    def __getattr__(self, name):
        if name not in _PROTOCOL:
            raise AttributeError(f"the engine used {name!r}, which is not in the Stack protocol")
        return getattr(self._stack, name)


# ------------------------------------------------------------------------------------------
# the protocol
# ------------------------------------------------------------------------------------------
def test_both_stacks_implement_the_protocol_and_hold_no_run(tmp_path):
    models, opts = _models()
    pack = PackedModel(models, opts, "loop")
    assert isinstance(pack, Stack) and pack.packed and pack.amp == "off"
    assert not any(isinstance(v, Run) for v in vars(pack).values())
    assert set(pack.stacked_state()) == ({f"p.{k}" for k in pack.params}
                                         | {f"m.{j}" for j in range(len(pack.params))})
    x = torch.randn(5, 4)
    assert pack.forward_shared(x).shape == (5, 2, 3)
    model = nn.Sequential(nn.Linear(4, 3))
    run = types.SimpleNamespace(fwd=model, model=model, head=NoHead(), optimizer=None,
                                scaler=None, env=types.SimpleNamespace(enabled=False),
                                device=torch.device("cpu"), amp="off", n_batches=3,
                                loss_fn=nn.CrossEntropyLoss())
    solo = SoloModel(run)
    assert isinstance(solo, Stack) and not solo.packed and solo.stacked_state() == {}
    assert not any(v is run for v in vars(solo).values())
    torch.testing.assert_close(solo.forward_shared(x), model(x).unsqueeze(1))


def test_split_logits_wants_one_source_per_member():
    models, opts = _models()
    pack = PackedModel(models, opts, "loop")
    with pytest.raises(ValueError, match="`sources` to hold one source per member \\(2\\), got 1"):
        pack.split_logits([object()], 8)
    solo = SoloModel(types.SimpleNamespace(
        fwd=models[0], model=models[0], head=NoHead(), optimizer=opts[0], scaler=None,
        env=types.SimpleNamespace(enabled=False), device=torch.device("cpu"), amp="off",
        n_batches=1, loss_fn=nn.CrossEntropyLoss()))
    with pytest.raises(ValueError, match="`sources` to hold one source \\(a run alone\\), got 2"):
        solo.split_logits([object(), object()], 8)


def test_the_engine_uses_nothing_but_the_protocol(tmp_path, monkeypatch):
    """A pack trained through a stack that exposes only the protocol's members gives the very
    weights, logs and schedules of the plain pack."""
    def configs(tag):
        return [cfg(tmp_path, f"{tag}{s}", seed=s, loss=loss, eval_test_every=0)
                for s, loss in ((0, "ce"), (1, "focal"))]
    plain = train_packed(configs("a"))
    real = P._packed_model
    monkeypatch.setattr(P, "_packed_model", lambda mbs, fwd: _OnlyTheProtocol(real(mbs, fwd)))
    proxied = train_packed(configs("b"))
    assert all(isinstance(r, dict) for r in plain + proxied), (plain, proxied)
    for s in (0, 1):
        a = load_checkpoint(tmp_path / f"a{s}" / "checkpoints" / "last.pt")
        b = load_checkpoint(tmp_path / f"b{s}" / "checkpoints" / "last.pt")
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
        assert a["scheduler"] == b["scheduler"]
        strip = [{k: v for k, v in json.loads(x).items() if k != "seconds"}
                 for x in (tmp_path / f"a{s}" / "log.jsonl").read_text().splitlines()]
        assert strip == [{k: v for k, v in json.loads(x).items() if k != "seconds"}
                         for x in (tmp_path / f"b{s}" / "log.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------
# the schedules: stepped by the engine, in order, with no flag on the optimisers
# ------------------------------------------------------------------------------------------
def test_a_pack_steps_its_schedules_without_the_order_warning_or_a_flag(tmp_path):
    configs = [cfg(tmp_path, f"w{s}", seed=s, epochs=3, milestones=[1, 2], lr_gamma=0.5,
                   eval_test_every=0) for s in (0, 1)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = train_packed(configs)
    assert all(isinstance(r, dict) for r in res), res
    order = [w for w in caught if "lr_scheduler.step()" in str(w.message)]
    assert not order, [str(w.message) for w in order]
    for s in (0, 1):
        lrs = [json.loads(x)["lr"] for x in (tmp_path / f"w{s}" / "log.jsonl").read_text()
               .splitlines()]
        lr = configs[0].lr
        assert lrs == [lr, lr * 0.5, lr * 0.5 * 0.5]
        state = load_checkpoint(tmp_path / f"w{s}" / "checkpoints" / "last.pt")
        assert state["scheduler"]["last_epoch"] == 3


def test_no_stack_flags_an_optimiser_as_stepped():
    models, opts = _models()
    PackedModel(models, opts, "loop")
    assert not any(hasattr(o, "_opt_called") for o in opts)

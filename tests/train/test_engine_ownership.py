"""The engine's ownership (issue 40, item 2): the engine uses a stack only through the
:class:`~torchcal.train.stacks.Stack` protocol, steps every schedule itself (no flag set on an
optimiser), gives ``split_logits`` the sources (a stack holds no run), builds a run's and a
ghost's optimiser and schedule with one builder, and stops a pack whose ghost cannot be built."""

from __future__ import annotations

import dataclasses
import json
import types
import warnings

import pytest
import torch
from test_train_packed import cfg
from torch import nn

import torchcal.train.packed as P
from torchcal.errors import CheckpointError, TorchcalError
from torchcal.train.checkpoint import load_checkpoint
from torchcal.train.pack_commit import ghost_run
from torchcal.train.packs import train_packed
from torchcal.train.plugin import RunPlugin
from torchcal.train.run import SGD, Run, build_loss, build_optimizer
from torchcal.train.stacks import AlonePolicy, PackedModel, PackPolicy, SoloModel, Stack

pytestmark = pytest.mark.filterwarnings("ignore:OOD set")

_PROTOCOL = ("policy", "amp", "train", "start_epoch", "forward", "forward_shared", "step",
             "annotate", "split_logits", "finite", "fc_norms", "stacked_state", "graph")


def _models(n: int = 2) -> tuple[list[nn.Module], list[SGD]]:
    models = []
    for m in range(n):
        torch.manual_seed(m)
        models.append(nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)))
    return models, [SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]


class _OnlyTheProtocol:
    """A stack that lets the engine reach the :class:`Stack` protocol's lanes only."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack
        self.policy, self.amp = stack.policy, stack.amp

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
    assert isinstance(pack, Stack) and isinstance(pack.policy, PackPolicy) and pack.amp == "off"
    assert not any(isinstance(v, Run) for v in vars(pack).values())
    assert set(pack.stacked_state()) == ({f"p.{k}" for k in pack.params}
                                         | {f"m.{j}" for j in range(len(pack.params))})
    x = torch.randn(5, 4)
    assert pack.forward_shared(x).shape == (5, 2, 3)
    model = nn.Sequential(nn.Linear(4, 3))
    run = types.SimpleNamespace(fwd=model, model=model, plugin=RunPlugin(), optimizer=None,
                                scaler=None, env=types.SimpleNamespace(enabled=False),
                                device=torch.device("cpu"), amp="off", n_batches=3,
                                loss_fn=nn.CrossEntropyLoss())
    solo = SoloModel(run)
    assert isinstance(solo, Stack) and isinstance(solo.policy, AlonePolicy)
    assert solo.stacked_state() == {} and solo.graph() is None
    assert not any(v is run for v in vars(solo).values())
    torch.testing.assert_close(solo.forward_shared(x), model(x).unsqueeze(1))


def test_the_policies_are_the_only_difference_between_alone_and_packed(tmp_path):
    """The strategies in place of the engine's flags: a run alone raises what stops it and
    names no pack; a packed lane becomes a ghost holding its error, its checkpoint names the
    pack's layout, and a diverged one gets a LaneDivergedError naming its run."""
    alone, pack = AlonePolicy(), PackPolicy()
    mb = types.SimpleNamespace(index=0, ghost=False, error=None,
                               run=types.SimpleNamespace(dir=types.SimpleNamespace(path=tmp_path)))
    err = RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        alone.stop(mb, err)
    assert not mb.ghost and mb.error is None
    pack.stop(mb, err)
    assert mb.ghost and mb.error is err
    assert alone.checkpoint_meta(["a", "b"], 1, ["a"]) == {}
    assert pack.checkpoint_meta(["a", "b"], 1, ["a"]) == {
        "pack": {"slots": ["a", "b"], "slot": 1, "writers": ["a"]}}
    drained = []
    assert pack.stop_error(mb, 2, {"train_loss": 0.5}, True, lambda: drained.append(1)) is None
    bad = pack.stop_error(mb, 2, {"train_loss": float("nan")}, True, lambda: drained.append(1))
    assert isinstance(bad, P.LaneDivergedError) and "training loss nan" in str(bad)
    assert str(tmp_path) in str(bad) and not drained  # a pack waits for no file
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for policy in (pack, alone):
            with policy.stepping_schedules():
                warnings.warn("Detected call of `lr_scheduler.step()` before "
                              "`optimizer.step()`. x", UserWarning, stacklevel=1)
    assert len(caught) == 1  # the alone policy's; the pack's is ignored


def test_split_logits_wants_one_source_per_lane():
    models, opts = _models()
    pack = PackedModel(models, opts, "loop")
    with pytest.raises(ValueError, match="`sources` to hold one source per lane \\(2\\), got 1"):
        pack.split_logits([object()], 8)
    with pytest.raises(TypeError, match="`sources` to be the lanes' batch sources.*'val'"):
        pack.split_logits("val", 8)
    with pytest.raises(TypeError, match="runs"):
        PackedModel(*_models(), "loop", runs=[object(), object()])  # a stack holds no run
    solo = SoloModel(types.SimpleNamespace(
        fwd=models[0], model=models[0], plugin=RunPlugin(), optimizer=opts[0], scaler=None,
        env=types.SimpleNamespace(enabled=False), device=torch.device("cpu"), amp="off",
        n_batches=1, loss_fn=nn.CrossEntropyLoss()))
    with pytest.raises(ValueError, match="`sources` to hold one source \\(a run alone\\), got 2"):
        solo.split_logits([object(), object()], 8)


def test_the_engine_uses_nothing_but_the_protocol(tmp_path, monkeypatch):
    """A pack trained through a stack that exposes only the protocol's lanes gives the very
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


# ------------------------------------------------------------------------------------------
# one builder of optimiser and schedule
# ------------------------------------------------------------------------------------------
def test_build_optimizer_is_the_runs_sgd_and_multistep_schedule(tmp_path):
    c = cfg(tmp_path, "b", lr=0.2, momentum=0.8, weight_decay=1e-3, nesterov=True,
            epochs=10, milestones=[3, 5], lr_gamma=0.3)
    model = nn.Linear(3, 2)
    opt, sched = build_optimizer(model, c, RunPlugin(), 10)
    assert type(opt) is SGD
    g = opt.param_groups[0]
    assert (g["lr"], g["momentum"], g["weight_decay"], g["nesterov"]) == (0.2, 0.8, 1e-3, True)
    assert isinstance(sched, torch.optim.lr_scheduler.MultiStepLR)
    assert sorted(sched.milestones.elements()) == sorted(c.effective_milestones())
    assert sched.gamma == 0.3
    with pytest.raises(ValueError, match="`steps` to be a non-negative integer, got -1"):
        build_optimizer(model, c, RunPlugin(), -1)


def test_a_ghost_gets_the_optimiser_and_schedule_of_its_own_run(tmp_path, monkeypatch):
    """``ghost_run`` builds through ``build_optimizer`` with the ghost's config."""
    calls = []
    real = build_optimizer

    def spy(model, config, head, steps):
        calls.append((config.out_dir, steps))
        return real(model, config, head, steps)

    import torchcal.train.pack_commit as PC
    monkeypatch.setattr(PC, "build_optimizer", spy)
    c = cfg(tmp_path, "t", epochs=3)
    model = nn.Linear(3, 2)
    opt, sched = real(model, c, RunPlugin(), 6)
    template = types.SimpleNamespace(config=c, model=model, num_classes=2,
                                     device=torch.device("cpu"), optimizer=opt, scheduler=sched,
                                     plugin=RunPlugin(), n_batches=2)
    ghost_cfg = dataclasses.replace(c, out_dir=str(tmp_path / "g"), seed=7)
    ghost = ghost_run(template, ghost_cfg, build_loss)
    assert calls == [(ghost_cfg.out_dir, 6)]
    assert ghost.optimizer is not opt and ghost.scheduler.optimizer is ghost.optimizer
    assert ghost.optimizer.param_groups[0]["params"][0] is next(ghost.model.parameters())


# ------------------------------------------------------------------------------------------
# a ghost that cannot be built stops its pack
# ------------------------------------------------------------------------------------------
def _lane(tmp_path, name, index, epoch, model="mnist1d_cnn"):
    r = types.SimpleNamespace(config=cfg(tmp_path, name, model=model), start_epoch=epoch)
    return types.SimpleNamespace(index=index, run=r)


def test_a_ghost_that_cannot_be_built_stops_its_pack(tmp_path):
    """A pack's recorded layout names a run that neither resumes nor has a readable config:
    the pack is not trained at another size; each of its lanes gets an error naming it,
    and the group's other pack goes on."""
    a, c = _lane(tmp_path, "a", 0, 1), _lane(tmp_path, "c", 1, 0)
    layout = (str(tmp_path / "a"), str(tmp_path / "b"))  # "b" was a lane; it has no config
    configs = [a.run.config, c.run.config]
    results = [None, None]
    packs = P._packs([(a, layout), (c, (str(tmp_path / "c"),))], configs, [0, 1], results)
    assert [[mb.index for mb in p] for p in packs] == [[1]]
    assert isinstance(results[0], CheckpointError) and results[1] is None
    msg = str(results[0])
    assert "Cannot resume the pack of" in msg and repr(str(tmp_path / "b")) in msg
    assert "another size" in msg and "config.json" in msg


def test_a_ghost_of_another_model_stops_its_pack(tmp_path):
    a = _lane(tmp_path, "a", 0, 1)
    other = cfg(tmp_path, "b", model="mlp")  # passed, but its ghost cannot share the pack
    results = [None]
    packs = P._packs([(a, (str(tmp_path / "a"), other.out_dir))], [a.run.config, other], [0],
                     results)
    assert packs == []
    assert isinstance(results[0], CheckpointError)
    assert isinstance(results[0].__cause__, TorchcalError) and "trained model 'mlp'" in str(
        results[0])


def test_train_packed_reports_a_pack_whose_ghost_is_gone(tmp_path):
    """End to end: a pack of a and b trained 1 epoch; b's run directory is then removed and a
    resumed (with a new run c) to 2 epochs.  a's recorded pack cannot be rebuilt at its size,
    so a gets an error naming b (before, a went on silently in a pack of one); c trains."""
    import shutil

    first = [cfg(tmp_path, n, seed=s, epochs=1, eval_test_every=0) for s, n in ((0, "a"),
                                                                              (1, "b"))]
    assert all(isinstance(r, dict) for r in train_packed(first))
    shutil.rmtree(tmp_path / "b")
    again = [dataclasses.replace(first[0], epochs=2, resume=True),
             cfg(tmp_path, "c", seed=2, epochs=2, eval_test_every=0)]
    res = train_packed(again)
    assert isinstance(res[0], CheckpointError), res[0]
    assert repr(str(tmp_path / "b")) in str(res[0]) and "cannot be rebuilt as a ghost" in str(
        res[0])
    assert isinstance(res[1], dict) and res[1]["epochs"] == 2
    assert load_checkpoint(tmp_path / "a" / "checkpoints" / "last.pt")["epoch"] == 1

"""The grouped packed engine (issue 31): one loss call per loss configuration, a step whose
work does not grow with its lanes, no host synchronisation inside a step, every registry loss
packed equal to its separate run, and a pack that commits its epoch as one."""

from __future__ import annotations

import collections
import dataclasses
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.func import vmap
from torch.utils._python_dispatch import TorchDispatchMode
from train_configs import cnn_config

import torchcal
import torchcal.train.engine as E
import torchcal.train.packed as P
from torchcal.experiments.calibration import CLAIM_LOSSES, DEMO_LOSS_KWARGS
from torchcal.losses import create_loss, list_losses
from torchcal.losses.temperature import ConsistencyLoss
from torchcal.posthoc import TemperatureScaling
from torchcal.train import train
from torchcal.train.checkpoint import load_checkpoint
from torchcal.train.loss_groups import LossGroups, PackedLossWarning
from torchcal.train.pack_commit import pack_layout, staged_path
from torchcal.train.packs import train_packed

pytestmark = pytest.mark.filterwarnings("ignore:OOD set", "ignore::RuntimeWarning",
                                        "ignore::UserWarning")


def cfg(tmp_path, name, **kw):
    """Digits through a narrow 1-D CNN (test_train_packed's runs), no test pass, no best.pt."""
    return cnn_config(tmp_path, name, **{"eval_test_every": 0, "select_best_by": "none", **kw})


def _weights(run_dir):
    return load_checkpoint(run_dir / "checkpoints" / "last.pt")["model"]


def _same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# ------------------------------------------------------------------------------------------
# every registry loss under vmap, and LossGroups
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list_losses())
def test_every_registry_loss_runs_under_vmap_with_its_gradient(name):
    """Value and gradient of the vmapped loss over 3 lanes equal the 3 separate calls
    (float64); brier and bsce used an autograd.Function that vmap refused.  With vmap's slow
    fallback (a Python loop over the lanes for an op without a batching rule) turned off,
    so an in-place op that has no batching rule fails here (bsce_gra's ``scatter_`` did)."""
    torch.manual_seed(0)
    loss = create_loss(name)
    z = torch.randn(3, 16, 10, dtype=torch.float64)
    y = torch.randint(0, 10, (3, 16))
    za = z.clone().requires_grad_(True)
    if getattr(loss, "wants_validation", False):  # the state a first validation sets
        loss.on_validation(logits=torch.randn(64, 10, dtype=torch.float64),
                           labels=torch.randint(0, 10, (64,)))
    was = torch._C._functorch._is_vmap_fallback_enabled()
    torch._C._functorch._set_vmap_fallback_enabled(False)
    try:
        out = vmap(loss)(za, y)
        (ga,) = torch.autograd.grad(out.sum(), za)
    finally:
        torch._C._functorch._set_vmap_fallback_enabled(was)
    zb = z.clone().requires_grad_(True)
    ref = torch.stack([loss(zb[i], y[i]) for i in range(3)])
    (gb,) = torch.autograd.grad(ref.sum(), zb)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-14)


def test_loss_groups_stack_lane_state_and_fall_back_with_a_reason():
    """Two AdaFocal lanes with different γ per bin, two focal γ's and a consistency loss
    with a calibrator (not batchable: called alone, and said why): one call gives each
    lane's own loss, in pack order, and after the lanes' state changed a refresh reads it."""
    torch.manual_seed(1)
    losses = [create_loss("adafocal"), create_loss("focal", gamma=3.0),
              create_loss("adafocal"), create_loss("focal", gamma=1.0),
              ConsistencyLoss(calibrator=TemperatureScaling())]
    for ls in losses:
        ls.reduction = "sum"
    losses[2].gammas.copy_(torch.linspace(0.5, 4.0, losses[2].n_bins, dtype=torch.float64))
    with pytest.warns(PackedLossWarning, match="calibrator"):  # slower, and said so
        groups = LossGroups(losses, torch.device("cpu"))
    assert len(groups.groups) == 3 and list(groups.unbatched) == [4]
    assert "calibrator" in groups.unbatched[4]
    z = torch.randn(5, 32, 10, dtype=torch.float64)
    y = torch.randint(0, 10, (5, 32))

    def separate():
        return torch.stack([ls(z[m], y[m]) for m, ls in enumerate(losses)])

    torch.testing.assert_close(groups(z, y), separate(), rtol=1e-12, atol=0)
    losses[0].gammas.fill_(7.0)  # a hook moved lane 0's state
    assert not torch.allclose(groups(z, y), separate())
    groups.refresh()
    torch.testing.assert_close(groups(z, y), separate(), rtol=1e-12, atol=0)


# ------------------------------------------------------------------------------------------
# the step's work does not grow with the lanes; no host sync inside a step
# ------------------------------------------------------------------------------------------
class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0
        self.syncs = collections.Counter()
        self.in_step = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        name = func.overloadpacket.__name__
        if self.in_step and name in ("_local_scalar_dense", "item", "is_nonzero", "equal"):
            self.syncs[name] += 1
        return func(*args, **(kwargs or {}))


def _ops(tmp_path, lanes, epochs, tag):
    configs = [cfg(tmp_path, f"{tag}{lanes}e{epochs}r{i}",
                   loss=CLAIM_LOSSES[i % len(CLAIM_LOSSES)], seed=i // len(CLAIM_LOSSES),
                   loss_kwargs=DEMO_LOSS_KWARGS.get(CLAIM_LOSSES[i % len(CLAIM_LOSSES)], {}),
                   epochs=epochs, evaluate=False, checkpoint_every=epochs)
               for i in range(lanes)]
    with _Ops() as mode:
        res = train_packed(configs, forward="vmap")
    assert all(isinstance(r, dict) for r in res), res
    return mode.n


def test_ops_per_epoch_at_35_lanes_at_most_1_5x_those_at_7(tmp_path):
    """The demo's 7 claim losses: aten operations of one epoch (2 epochs minus 1) at 35
    lanes over those at 7, with the vmapped forward a GPU runs (the benchmark
    benchmarks/bench_packed_ops.py on MNIST-1D measured 3.41x before the grouped engine, 1.07x
    after; the CPU's per-lane forward adds the model's operations per lane)."""
    per = {m: _ops(tmp_path, m, 2, "a") - _ops(tmp_path, m, 1, "b") for m in (7, 35)}
    assert per[35] <= 1.5 * per[7], per


def _watch_steps(monkeypatch) -> _Ops:
    """An op counter that records the value reads (syncs) inside the engine's training steps;
    a loss hook's own validation pass (AdaFocal every few batches) reads values outside them."""
    mode = _Ops()

    def flagged(fn, inside: bool):
        def wrapped(*a, **kw):
            mode.in_step = inside
            try:
                return fn(*a, **kw)
            finally:
                mode.in_step = not inside
        return wrapped

    in_steps, validation = flagged(E.train_epoch, True), flagged(E._drive_validation, False)
    monkeypatch.setattr(E, "train_epoch", in_steps)
    monkeypatch.setattr(E, "_drive_validation", validation)
    return mode


def test_no_host_synchronisation_inside_a_training_step(tmp_path, monkeypatch):
    """No ``.item()``-like read of a tensor's value between two steps (the epoch's numbers
    are read once at its end)."""
    mode = _watch_steps(monkeypatch)
    configs = [cfg(tmp_path, f"r{i}", loss=loss, seed=i, epochs=1, evaluate=False,
                   loss_kwargs={"update_every": 3} if loss == "adafocal" else {})
               for i, loss in enumerate(CLAIM_LOSSES)]
    with mode:
        res = train_packed(configs)
    assert all(isinstance(r, dict) for r in res), res
    assert mode.syncs == {}, mode.syncs


@pytest.mark.parametrize("loss", CLAIM_LOSSES)
def test_no_host_synchronisation_inside_a_step_of_a_run_alone(tmp_path, monkeypatch, loss):
    """``train`` is the engine's stack of one: its steps read no tensor's value either."""
    mode = _watch_steps(monkeypatch)
    c = cfg(tmp_path, "alone", loss=loss, epochs=1, evaluate=False,
            loss_kwargs={"update_every": 3} if loss == "adafocal" else {})
    with mode:
        train(c)
    assert mode.syncs == {}, mode.syncs


_ADAFOCAL_GROUP = """
import warnings
import torch
from torchcal.losses import create_loss
from torchcal.train.loss_groups import LossGroups
losses = [create_loss("adafocal") for _ in range(2)]
g = torch.Generator().manual_seed(0)
for i, ls in enumerate(losses):
    ls.set_epoch(0)
    ls.on_validation(logits=torch.randn(300, 10, generator=g) * (i + 1),
                     labels=torch.randint(0, 10, (300,), generator=g))
groups = LossGroups(losses, torch.device("cpu"))
z, y = torch.randn(2, 64, 10, generator=g), torch.randint(0, 10, (2, 64), generator=g)
with warnings.catch_warnings():
    warnings.simplefilter("error")
    got = groups(z, y)
want = torch.stack([ls(z[m], y[m]) for m, ls in enumerate(losses)])
torch.testing.assert_close(got, want)
"""


def test_a_vmapped_adafocal_group_warns_nothing():
    """Two AdaFocal lanes vmapped after a validation update: their bin edges are a slice of
    the stacked state, which ``searchsorted`` warned about as non-contiguous (a warning the
    demo printed), until ``bin_index`` copied them into contiguous memory.  In a fresh process:
    PyTorch gives that warning once per process."""
    src = str(Path(torchcal.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _ADAFOCAL_GROUP], env=env, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


# ------------------------------------------------------------------------------------------
# every registry loss packed equals its separate run
# ------------------------------------------------------------------------------------------
def _demo_kwargs(name):
    return dict(DEMO_LOSS_KWARGS.get(name, {}))


#: The registry losses whose packed run differs from its separate run in a bit (none: MMCE, whose
#: vmapped call rounds differently, is called on its own rows, ``vmap_rounds_alike = False``).
NOT_BITWISE: list[str] = []


def test_every_registry_loss_packed_equals_its_separate_run(tmp_path):
    """All registry losses in one pack (grouped: the focal pair shares one call) against their
    separate runs after 2 epochs: with the CPU's per-lane forward (``forward="loop"``, the
    default there) the parameters and the logged numbers bit for bit; vmapped (a GPU's way:
    batched convolutions sum in another order) to float rounding."""
    names = list_losses()

    def configs(tag):
        cs = [cfg(tmp_path, f"{tag}{i}", loss=n, seed=i % 3, loss_kwargs=_demo_kwargs(n),
                  evaluate=False) for i, n in enumerate(names)]
        return cs + [cfg(tmp_path, f"{tag}dup", loss="focal", seed=7, evaluate=False)]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loop = train_packed(configs("l"), forward="loop")
        vm = train_packed(configs("v"), forward="vmap")
    for res in (loop, vm):
        assert all(isinstance(r, dict) for r in res), [r for r in res if not isinstance(r, dict)]
    not_bitwise = []
    for i, c in enumerate(configs("l")):
        sep = train(dataclasses.replace(c, out_dir=str(tmp_path / f"s{i}")))
        b = _weights(tmp_path / f"s{i}")
        a = _weights(tmp_path / Path(c.out_dir).name)
        if not all(torch.equal(a[k], b[k]) for k in a):
            not_bitwise.append(c.loss)
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
        # a run alone is the engine's stack of one: its logged numbers come from the same
        # stacked computations, so they are equal too (every number of the last epoch's line)
        assert loop[i]["final"] == sep["final"], c.loss
        v = _weights(tmp_path / ("v" + Path(c.out_dir).name[1:]))
        for k in v:
            torch.testing.assert_close(v[k], b[k], rtol=1e-4, atol=1e-5,
                                       msg=lambda m, k=k, c=c: f"{c.loss} {k}: {m}")
        for key in ("train_loss", "train_ece", "val_loss", "val_ece", "val_nll"):
            assert vm[i]["final"][key] == pytest.approx(sep["final"][key], rel=1e-4,
                                                        abs=1e-6), (c.loss, key)
    assert not_bitwise == NOT_BITWISE, not_bitwise


# ------------------------------------------------------------------------------------------
# a pack's epoch commits as one
# ------------------------------------------------------------------------------------------
LANES = [(0, "ce"), (1, "adafocal"), (2, "focal")]


def _configs(tmp_path, tag, epochs=4):
    return [cfg(tmp_path, f"{tag}{s}", seed=s, loss=loss, epochs=epochs, resume=True)
            for s, loss in LANES]


@pytest.mark.parametrize("where", ["staging", "committing"])
def test_a_kill_between_the_lanes_checkpoints_resumes_to_the_same_numbers(
        tmp_path, monkeypatch, where):
    """Interrupted after the first lane of epoch 3 staged (or committed) its checkpoint, so
    that the lanes' ``last.pt`` (or staged files) stand at different epochs: the resume
    finishes or drops the staged files, every lane resumes at one epoch in its pack, and
    every lane ends bit for bit as the uninterrupted pack."""
    train_packed(_configs(tmp_path, "u"))
    name = "stage_checkpoint" if where == "staging" else "commit_staged"
    orig = getattr(E, name)
    calls = {"n": 0}

    def dying(*a, **kw):
        calls["n"] += 1
        out = orig(*a, **kw)
        if calls["n"] == 2 * len(LANES) + 1:  # epoch 3: one lane done, the others not
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(E, name, dying)
    with pytest.raises(KeyboardInterrupt):
        train_packed(_configs(tmp_path, "k"))
    monkeypatch.setattr(E, name, orig)
    epochs = [load_checkpoint(tmp_path / f"k{s}" / "checkpoints" / "last.pt")["epoch"]
              for s, _ in LANES]
    staged = [staged_path(tmp_path / f"k{s}").exists() for s, _ in LANES]
    if where == "staging":
        assert epochs == [2, 2, 2] and staged == [True, False, False]
    else:
        assert epochs == [3, 2, 2] and staged == [False, True, True]
    res = train_packed(_configs(tmp_path, "k"))
    want = 2 if where == "staging" else 3
    assert [r["resumed_from"] for r in res] == [want] * 3
    for s, _ in LANES:
        assert _same_weights(tmp_path / f"k{s}", tmp_path / f"u{s}"), s
        assert not staged_path(tmp_path / f"k{s}").exists()
        lk = (tmp_path / f"k{s}" / "log.jsonl").read_text().splitlines()
        lu = (tmp_path / f"u{s}" / "log.jsonl").read_text().splitlines()
        strip = [{k: v for k, v in __import__("json").loads(x).items() if k != "seconds"}
                 for x in lk]
        assert strip == [{k: v for k, v in __import__("json").loads(x).items()
                          if k != "seconds"} for x in lu]


def test_a_diverged_lane_stays_a_ghost_across_a_resume(tmp_path, monkeypatch):
    """In a pack of 2, a lane diverges in epoch 2; the run is interrupted in epoch 3 and
    resumed: the companion resumes beside the diverged lane's ghost (the pack keeps its size,
    read from the checkpoint's layout) and ends bit for bit as the uninterrupted pack's."""
    from test_train_packed import _Diverging, interrupt_in_epoch

    from torchcal.losses import register_loss
    from torchcal.losses._registry import LOSSES
    register_loss("test_diverging_ghost")(_Diverging)
    try:
        def configs(tag):
            return [cfg(tmp_path, f"{tag}0", seed=0, loss="focal", epochs=4, resume=True),
                    cfg(tmp_path, f"{tag}1", seed=1, loss="test_diverging_ghost", epochs=4,
                        resume=True)]
        res_u = train_packed(configs("u"))
        interrupt_in_epoch(monkeypatch, configs("k"), 2)
        res_k = train_packed(configs("k"))
    finally:
        LOSSES.unregister("test_diverging_ghost")
    assert isinstance(res_u[1], P.LaneDivergedError)
    assert isinstance(res_k[1], P.LaneDivergedError)
    assert res_k[0]["resumed_from"] == 2
    assert _same_weights(tmp_path / "k0", tmp_path / "u0")
    assert res_k[0]["results"]["test"]["pre"]["ece"] == res_u[0]["results"]["test"]["pre"]["ece"]


def test_a_pack_record_that_is_not_a_layout_is_not_trusted():
    """A checkpoint's ``pack`` record is read for its values: anything but a list of run
    directories is no layout (the resume packs the configs given)."""
    assert pack_layout({"pack": {"slots": ["a", "b"]}}) == ("a", "b")
    for bad in ({"pack": {"slots": "ab"}}, {"pack": {"slots": [1, 2]}}, {"pack": ["a"]},
                {"pack": {"slots": []}}, {}, None):
        assert pack_layout(bad) is None, bad

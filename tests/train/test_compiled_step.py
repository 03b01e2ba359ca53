"""The packed step as one graph (:mod:`torchcal.train.compiled`, issue 38).

* Dynamo captures the step in one graph (``fullgraph=True``, and ``torch._dynamo.explain`` on
  the demo's pack) for every registry loss, in a pack (every loss, two lanes each, in one
  pack) and alone (a pack of one lane);
* the captured step equals the eager step (``PackedModel.forward``, ``LossGroups``,
  ``PackedStats.update``, ``PackedModel.step``: autograd and ``torch.optim.SGD``) to float
  rounding, over three steps with clipping, momentum, weight decay and (in one case) Nesterov.

Cost (the suite runs on 2 cores): inductor needs minutes of CPU per graph here, and AOTAutograd
about a minute for every registry loss.  So the exhaustive sweeps run Dynamo's capture with
the ``eager`` backend (the traced graph, run as traced: what a graph break, a stale Python
constant or a wrong functional gradient would break), all losses in one compiled function per
sweep; the demo's pack also goes through ``aot_eager`` (AOTAutograd's functionalisation and
decompositions).  Every registry loss alone: ``TORCHCAL_TEST_ALL=1`` (a representative set
otherwise).  Inductor's kernels: every registry loss in ``tests/losses/test_losses_compile.py``,
a whole inductor step with ``TORCHCAL_TEST_INDUCTOR=1`` (the last test here) and
``benchmarks/bench_compiled_ops.py`` (whose inductor run at 35 lanes equals nothing but
counts).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounter

import torchcal.train.engine as engine
from torchcal.losses import AdaFocalLoss, create_loss, list_losses
from torchcal.train import compiled as compiled_mod
from torchcal.train.compiled import CompiledStep, CompiledStepWarning, make_compiled_step
from torchcal.train.engine import PackedStats
from torchcal.train.loss_groups import LossGroups
from torchcal.train.stacks import PackedModel, Stack

NAMES = list_losses()
D, C, N, B, STEPS = 6, 5, 96, 16, 3


class _Source:
    """The shared training data of a pack (``BatchSource.take``'s contract)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randn(N, D, generator=g)
        self.labels = torch.randint(0, C, (N,), generator=g)

    def take(self, index: torch.Tensor):
        flat = index.reshape(-1)
        return (self.data[flat].reshape(*index.shape, D),
                self.labels[flat].reshape(index.shape))


def _loss(name: str):
    loss = create_loss(name)
    if isinstance(loss, AdaFocalLoss):  # state that differs from its defaults
        g = torch.Generator().manual_seed(5)
        loss.update(logits=3 * torch.randn(200, C, generator=g),
                    labels=torch.randint(0, C, (200,), generator=g))
    return loss


def _pack(names: list[str], nesterov: bool = False):
    """A pack of one small MLP per name (seeded by position) with SGD, and its loss groups."""
    models, opts = [], []
    for m, _ in enumerate(names):
        torch.manual_seed(m)
        model = nn.Sequential(nn.Linear(D, 8), nn.ReLU(), nn.Linear(8, C))
        models.append(model)
        opts.append(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9,
                                    weight_decay=5e-4, nesterov=nesterov))
    pack = PackedModel(models, opts, "vmap")
    groups = LossGroups([_loss(n) for n in names], torch.device("cpu"))
    return pack, groups


def _indices(m: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + step)
    return torch.stack([torch.randperm(N, generator=g)[:B] for _ in range(m)])


def _eager(pack: PackedModel, groups: LossGroups, src: _Source, stats: PackedStats, index):
    """The engine's eager step (``engine._eager_step``)."""
    x, y = src.take(index)
    logits = pack.forward(x).float()
    loss = groups(logits, y)
    sums = loss.detach()
    stats.update(logits, y, torch.where(groups.mean_rows, sums * y.shape[1], sums))
    pack.step(loss, logits, y, 2.0, index)


def _steppers(packs, src, backend="aot_eager"):
    steps = []
    for pack, groups in packs:
        cs = CompiledStep(pack, groups, src, 2.0, backend=backend)
        cs.lr.fill_(pack.opt.param_groups[0]["lr"])
        steps.append(cs)
    return steps


def _together(steps):
    """Every pack's step in one function (one trace, one compilation for all losses)."""

    def run(index_list, stats_list):
        for cs, index, stats in zip(steps, index_list, stats_list, strict=True):
            cs._step(index, stats)

    return run


CLAIMS = ["ce", "focal", "flsd53", "dual_focal", "adafocal", "bsce", "bsce_gra"]
#: the losses checked alone in the normal suite (every registry loss with TORCHCAL_TEST_ALL=1):
#: one of each kind of state and computation (per-bin γ, a scheduled γ, a temperature, MMCE's
#: kernel, binned and KDE ECE terms, a consistency term)
ALONE = NAMES if os.environ.get("TORCHCAL_TEST_ALL") else [
    "ce", "adafocal", "flsc531", "mmce", "dece", "ece_kde", "temperature_focal", "consistency",
    "dual_focal_gra"]
SWEEPS = {"packed": [[n for n in NAMES for _ in range(2)]],  # every loss, two lanes each
          "alone": [[n] for n in ALONE],  # packs of one
          "claims": [CLAIMS]}  # the demo's pack, through AOTAutograd too


def _compare(packs_names, backend):
    """Eager and compiled steps (``fullgraph=True``: a graph break fails) over ``STEPS``."""
    src = _Source()
    eager = [_pack(names) for names in packs_names]
    comp = [_pack(names) for names in packs_names]
    steps = _steppers(comp, src)
    fn = torch.compile(_together(steps), backend=backend, fullgraph=True, dynamic=False)
    dev = torch.device("cpu")
    st_e = [PackedStats(len(n), 15, dev) for n in packs_names]
    st_c = [PackedStats(len(n), 15, dev) for n in packs_names]
    for step in range(STEPS):
        index = [_indices(len(n), step) for n in packs_names]
        for (pack, groups), stats, ix in zip(eager, st_e, index, strict=True):
            _eager(pack, groups, src, stats, ix)
        fn(index, st_c)
    for (pe, _), (pc, _), se, sc, names in zip(eager, comp, st_e, st_c, packs_names,
                                               strict=True):
        for k, p in pe.params.items():
            diff = (p - pc.params[k]).abs().amax(dim=tuple(range(1, p.dim())))
            bad = [names[m] for m in torch.nonzero(diff > 2e-5 * (1 + p.abs().max())).flatten()]
            assert not bad, f"{k}: {bad} differ by {float(diff.max()):.2e}"
        torch.testing.assert_close(sc.scalars, se.scalars, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(sc.bins[0], se.bins[0])  # the same samples in each bin


@pytest.mark.parametrize(("sweep", "backend"), [("packed", "eager"), ("alone", "eager"),
                                                ("claims", "aot_eager")])
def test_compiled_step_is_one_graph_and_equals_eager(sweep, backend):
    """Dynamo captures the step of every registry loss in one graph (``fullgraph=True``
    raises at a graph break) and the captured step equals the eager step to float rounding:
    every registry loss in one pack, each (of :data:`ALONE`) alone; the claim losses' pack also
    through AOTAutograd (``aot_eager``: functionalisation and decompositions)."""
    _compare(SWEEPS[sweep], backend)


def test_explain_finds_no_graph_break_in_the_demo_pack():
    src = _Source()
    packs = [_pack(CLAIMS + CLAIMS)]
    steps = _steppers(packs, src)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch._dynamo.explain(_together(steps))(
            [_indices(14, 0)], [PackedStats(14, 15, torch.device("cpu"))])
    assert out.graph_break_count == 0, out.break_reasons
    assert out.graph_count == 1


def test_compiled_sgd_nesterov_and_no_clipping_equal_eager():
    src = _Source()
    names = ["ce", "focal", "ce", "focal"]
    (pe, ge), (pc, gc) = _pack(names, nesterov=True), _pack(names, nesterov=True)
    cs = CompiledStep(pc, gc, src, None, backend="aot_eager")
    dev = torch.device("cpu")
    se, sc = PackedStats(4, 15, dev), PackedStats(4, 15, dev)
    for step in range(STEPS):
        pe.opt.param_groups[0]["lr"] = pc.opt.param_groups[0]["lr"] = 0.1 / (step + 1)
        ix = _indices(4, step)
        x, y = src.take(ix)
        logits = pe.forward(x).float()
        loss = ge(logits, y)
        se.update(logits, y, torch.where(ge.mean_rows, loss.detach() * B, loss.detach()))
        pe.step(loss, logits, y, None, ix)
        assert cs(ix, sc)
    for k, p in pe.params.items():
        torch.testing.assert_close(pc.params[k], p, rtol=1e-5, atol=1e-6)
    # the stacked momentum buffers are the ones the lanes' optimisers (checkpoints) see
    mb = pc.opt.state[pc.params["0.weight"]]["momentum_buffer"]
    assert mb.data_ptr() == cs.momenta[0].data_ptr()
    assert torch.count_nonzero(mb) > 0


def test_learning_rate_change_does_not_recompile():
    src = _Source()
    pack, groups = _pack(["ce", "adafocal"])
    backend = CompileCounter()
    cs = CompiledStep(pack, groups, src, 2.0, backend=backend)
    stats = PackedStats(2, 15, torch.device("cpu"))
    for step in range(4):
        pack.opt.param_groups[0]["lr"] = 0.1 * 0.5 ** step
        groups.losses[1].update(logits=torch.randn(50, C), labels=torch.randint(0, C, (50,)))
        groups.refresh()  # new loss state, in place
        assert cs(_indices(2, step), stats)
    assert backend.frame_count == 1


def test_config_validates_compile_step():
    from torchcal.train import TrainConfig  # noqa: PLC0415 - the public entry point
    with pytest.raises(ValueError, match="compile_step"):
        TrainConfig(compile_step="yes").validate()
    assert TrainConfig().compile_step == "auto"


def test_auto_is_eager_on_the_cpu_and_unpackable_config_warns():
    src = _Source()
    pack, groups = _pack(["ce", "ce"])

    class _Batches:
        shared, src = True, None

    _Batches.src = src
    assert make_compiled_step(pack, groups, _Batches(), "auto", 2.0) is None
    assert make_compiled_step(pack, groups, _Batches(), "off", 2.0) is None
    assert isinstance(make_compiled_step(pack, groups, _Batches(), "on", 2.0), CompiledStep)
    _Batches.shared = False
    with pytest.warns(CompiledStepWarning, match="not one gather"):
        assert make_compiled_step(pack, groups, _Batches(), "on", 2.0) is None


#: the names the Stack protocol declares (its annotated attributes and methods)
_PROTOCOL = {n for n in vars(Stack) if not n.startswith("_")} | set(Stack.__annotations__)


class _OnlyTheProtocol:
    """A stack that lets its user reach the :class:`Stack` protocol's names only."""

    def __init__(self, stack) -> None:
        self._stack = stack

    def __getattr__(self, name):
        if name not in _PROTOCOL:
            raise AttributeError(f"{name!r} is not in the Stack protocol")
        return getattr(self._stack, name)


def test_the_compiled_step_uses_nothing_but_the_protocol():
    """A compiled step made through a stack that exposes only the protocol (its ``graph()``)
    steps the very parameters and momenta of one made on the pack itself; a stack without a
    graph (a run alone) gets no compiled step and no warning, and ``CompiledStep`` refuses it
    by name."""
    assert {"graph", "policy", "step", "forward"} <= _PROTOCOL and "params" not in _PROTOCOL
    src = _Source()
    (plain, gp), (proxied, gq) = _pack(["ce", "focal"]), _pack(["ce", "focal"])

    class _Batches:
        shared = True

    _Batches.src = src
    a = CompiledStep(plain, gp, src, 2.0, backend="aot_eager")
    b = make_compiled_step(_OnlyTheProtocol(proxied), gq, _Batches(), "on", 2.0,
                           backend="aot_eager")
    stats = [PackedStats(2, 15, torch.device("cpu")) for _ in range(2)]
    for step in range(2):
        assert a(_indices(2, step), stats[0]) and b(_indices(2, step), stats[1])
    for k in plain.params:
        assert torch.equal(plain.params[k], proxied.params[k]), k
    assert all(torch.equal(x, y) for x, y in zip(a.momenta, b.momenta, strict=True))
    assert torch.equal(stats[0].scalars, stats[1].scalars)

    class _Alone:
        def graph(self):
            return None

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert make_compiled_step(_Alone(), gp, _Batches(), "on", 2.0) is None
    with pytest.raises(TypeError, match="`pack` to be a stack with a step graph.*_Alone"):
        CompiledStep(_Alone(), gp, src, 2.0)


def _configs(root, mode: str, epochs: int = 2):
    from torchcal.train import get_recipe  # noqa: PLC0415 - as the other packed tests
    base = get_recipe("mnist1d-cnn")
    losses = ["ce", "adafocal", "focal"]
    return [dataclasses.replace(base, loss=loss, seed=i, epochs=epochs,
                                out_dir=f"{root}/{mode}/r{i}", evaluate=False, progress=False,
                                device="cpu", num_threads=1, compile_step=mode,
                                data_kwargs={"n_train": 600, "n_val": 200, "n_test": 200})
            for i, loss in enumerate(losses)]


def test_train_epoch_builds_no_tensor_from_a_host_list(tmp_path, monkeypatch):
    """``torch.tensor([...], device=...)`` in a step loop is a synchronising copy on CUDA
    (gpu_demo_check's ``syncs`` stopped there every epoch); the pack builds it once."""
    from torchcal.train.packs import train_packed  # noqa: PLC0415
    calls = []
    plain = engine.train_epoch

    def watched(*args, **kw):
        real = torch.tensor

        def spy(*a, **k):
            calls.append(a)
            return real(*a, **k)

        monkeypatch.setattr(torch, "tensor", spy)
        try:
            return plain(*args, **kw)
        finally:
            monkeypatch.setattr(torch, "tensor", real)

    monkeypatch.setattr(engine, "train_epoch", watched)
    res = train_packed(_configs(tmp_path, "off", epochs=1), forward="vmap")
    assert not any(isinstance(r, BaseException) for r in res)
    assert not [a for a in calls if a and isinstance(a[0], list)]


def test_engine_trains_a_pack_through_the_compiled_step(tmp_path, monkeypatch):
    """``compile_step="on"`` through ``train_packed`` (Dynamo's capture with the eager backend
    here): the lanes' parameters and logged numbers equal the eager pack's to float
    rounding, and the step compiles once per batch shape (full and last batch)."""
    from torchcal.train.checkpoint import load_checkpoint  # noqa: PLC0415
    from torchcal.train.packs import train_packed  # noqa: PLC0415
    backend = CompileCounter()
    monkeypatch.setattr(engine, "make_compiled_step",
                        functools.partial(compiled_mod.make_compiled_step, backend=backend))
    res = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompiledStepWarning)
        for mode in ("off", "on"):
            res[mode] = train_packed(_configs(tmp_path, mode), forward="vmap")
            assert not any(isinstance(r, BaseException) for r in res[mode]), res[mode]
    assert backend.frame_count == 2
    for a, b in zip(res["off"], res["on"], strict=True):  # the last epoch's statistics
        for key in ("train_loss", "train_nll", "train_error", "train_ece", "val_ece"):
            assert b["final"][key] == pytest.approx(a["final"][key], rel=1e-4, abs=1e-6), key
    for i in range(3):
        a = load_checkpoint(tmp_path / f"off/r{i}/checkpoints/last.pt")["model"]
        b = load_checkpoint(tmp_path / f"on/r{i}/checkpoints/last.pt")["model"]
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not os.environ.get("TORCHCAL_TEST_INDUCTOR"),
                    reason="inductor compiles for minutes on a small CPU: TORCHCAL_TEST_INDUCTOR=1")
def test_inductor_step_equals_eager():
    src = _Source()
    names = ["ce", "adafocal", "focal", "mmce", "ce", "adafocal"]
    (pe, ge), (pc, gc) = _pack(names), _pack(names)
    cs = CompiledStep(pc, gc, src, 2.0)
    dev = torch.device("cpu")
    se, sc = PackedStats(6, 15, dev), PackedStats(6, 15, dev)
    for step in range(STEPS):
        ix = _indices(6, step)
        _eager(pe, ge, src, se, ix)
        assert cs(ix, sc), cs.failed
    for k, p in pe.params.items():
        torch.testing.assert_close(pc.params[k], p, rtol=1e-5, atol=1e-6)


def test_mnist1d_packed_forward_equals_vmap_without_layout_changes():
    """Issue 38 item 3: the MNIST-1D CNN's packed forward keeps the lanes' channels side by
    side from the first convolution to the last (no ``permute`` between the layers, one
    contiguous copy of the input); values and gradients equal ``vmap`` over the model's
    forward to float rounding."""
    import collections  # noqa: PLC0415 - this test only

    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC0415

    from torchcal.models.mnist1d import MNIST1DCNN  # noqa: PLC0415

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.c: collections.Counter[str] = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.c[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    models = [MNIST1DCNN(10, width=8) for _ in range(5)]
    pack = PackedModel(models, [torch.optim.SGD(m.parameters(), lr=0.1) for m in models], "vmap")
    x = torch.randn(5, 32, 40)
    with Ops() as ops:
        z = pack.forward(x)
        z.square().sum().backward()
    assert ops.c["permute"] == 0 and ops.c["clone"] + ops.c["copy_"] <= 3, ops.c
    got = {k: p.grad.clone() for k, p in pack.params.items()}
    params = {k: p.detach().requires_grad_() for k, p in pack.params.items()}
    ref = torch.func.vmap(pack._call)(params, pack.buffers, x)
    ref.square().sum().backward()
    torch.testing.assert_close(z, ref, rtol=1e-5, atol=1e-6)
    for k, p in params.items():
        torch.testing.assert_close(got[k], p.grad, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="Expected input of shape"):
        models[0].forward_packed(pack.params, torch.randn(5, 32, 39))


def test_a_step_that_does_not_compile_trains_eagerly_with_one_warning(tmp_path, monkeypatch):
    """A compilation failure: one CompiledStepWarning naming it, then the eager step, so the
    pack's numbers are the eager pack's bit for bit."""
    from torchcal.train.checkpoint import load_checkpoint  # noqa: PLC0415
    from torchcal.train.packs import train_packed  # noqa: PLC0415

    def broken(gm, example_inputs):
        raise RuntimeError("no kernel for this")

    monkeypatch.setattr(engine, "make_compiled_step",
                        functools.partial(compiled_mod.make_compiled_step, backend=broken))
    train_packed(_configs(tmp_path, "off", epochs=1), forward="vmap")
    with pytest.warns(CompiledStepWarning, match="did not compile.*no kernel for this") as rec:
        res = train_packed(_configs(tmp_path, "on", epochs=1), forward="vmap")
    assert not any(isinstance(r, BaseException) for r in res), res
    assert len([w for w in rec if w.category is CompiledStepWarning]) == 1
    for i in range(3):
        a = load_checkpoint(tmp_path / f"off/r{i}/checkpoints/last.pt")["model"]
        b = load_checkpoint(tmp_path / f"on/r{i}/checkpoints/last.pt")["model"]
        assert all(torch.equal(a[k], b[k]) for k in a)

"""Packed training: a lane of a pack is the run ``train`` would give with its seed."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from train_configs import cnn_config

import torchcal.train.engine as E
import torchcal.train.packed as P
from torchcal.losses import register_loss
from torchcal.losses._registry import LOSSES
from torchcal.losses.cross_entropy import CrossEntropyLoss
from torchcal.train import JointHeadConfig, TrainConfig, train
from torchcal.train.checkpoint import load_checkpoint
from torchcal.train.packed import LaneDivergedError
from torchcal.train.packs import form_packs, pack_problem, train_packed
from torchcal.train.stacks import PackedModel

pytestmark = pytest.mark.filterwarnings("ignore:OOD set")


def cfg(tmp_path, name, **kw):
    """digits through the 1-D CNN (no BatchNorm) or ``small_cnn`` (BatchNorm), with momentum,
    weight decay and a clipping norm small enough to clip every step."""
    return cnn_config(tmp_path, name, **kw)


def _close_states(a, b, atol=1e-5):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            torch.testing.assert_close(a[k].double(), b[k].double(), atol=atol, rtol=1e-4,
                                       msg=lambda m, k=k: f"{k}: {m}")


def _assert_same_run(packed_dir, separate_dir, atol=1e-5):
    a = load_checkpoint(packed_dir / "checkpoints" / "last.pt", map_location="cpu")
    b = load_checkpoint(separate_dir / "checkpoints" / "last.pt", map_location="cpu")
    assert a["epoch"] == b["epoch"]
    _close_states(a["model"], b["model"], atol)
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys() and sa
    for k in sa:
        torch.testing.assert_close(sa[k]["momentum_buffer"], sb[k]["momentum_buffer"],
                                   atol=atol, rtol=1e-4)
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    assert a["scheduler"] == b["scheduler"]
    _close_states(a["loss"] or {}, b["loss"] or {}, atol)
    la = [json.loads(s) for s in (packed_dir / "log.jsonl").read_text().splitlines()]
    lb = [json.loads(s) for s in (separate_dir / "log.jsonl").read_text().splitlines()]
    assert [sorted(x) for x in la] == [sorted(x) for x in lb]
    for x, y in zip(la, lb, strict=True):
        for k in ("train_loss", "train_ece", "val_loss", "val_nll", "val_ece", "test_nll"):
            assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-6), k
    assert (packed_dir / "results.json").is_file() and (packed_dir / "config.json").is_file()


LANES = [(0, "ce"), (1, "adafocal"), (2, "focal")]


CNN1D = ("mnist1d_cnn", {"in_length": 64, "width": 8})
BN_CNN = ("small_cnn", {"in_channels": 1, "in_features": 64, "width": 4})


@pytest.mark.parametrize("model, data_seed", [(CNN1D, 1), (CNN1D, None), (BN_CNN, 1)])
def test_lanes_match_separate_runs(tmp_path, model, data_seed):
    """Each lane (own seed, own loss: AdaFocal's per-bin γ, own clipping, own momentum)
    ends with the parameters, optimiser state, loss state and log of a separate run; with a
    fixed split (``data_seed``) the lanes' validation runs packed, with the split following
    the seed each lane's own (BatchNorm: running statistics per lane)."""
    configs = [cfg(tmp_path, f"p{s}", seed=s, loss=loss, model=model[0], model_kwargs=model[1],
                   data_seed=data_seed,
                   loss_kwargs={"update_every": 7} if loss == "adafocal" else {})
               for s, loss in LANES]  # AdaFocal also updates γ every 7 batches
    res = train_packed(configs)
    assert all(isinstance(r, dict) for r in res), res
    for (s, _loss), c in zip(LANES, configs, strict=True):
        sep = train(dataclasses.replace(c, out_dir=str(tmp_path / f"s{s}")))
        _assert_same_run(tmp_path / f"p{s}", tmp_path / f"s{s}")
        assert res[s]["final"]["val_ece"] == pytest.approx(sep["final"]["val_ece"], rel=1e-4)


def test_one_sgd_with_global_clipping_would_differ(tmp_path):
    """The test above can fail: clipping the packed gradient by one global norm (what a plain
    ``clip_grad_norm_`` over the stacked parameters does) gives other weights."""
    configs = [cfg(tmp_path, f"p{s}", seed=s, loss=loss, epochs=1) for s, loss in LANES[:2]]

    def global_clip(self, losses, logits, y, max_norm, index=None):
        self.opt.zero_grad(set_to_none=True)
        losses.sum().backward()
        torch.nn.utils.clip_grad_norm_(list(self.params.values()), max_norm)
        self.opt.step()

    orig = PackedModel.step
    PackedModel.step = global_clip
    try:
        train_packed(configs)
    finally:
        PackedModel.step = orig
    train(dataclasses.replace(configs[0], out_dir=str(tmp_path / "s0")))
    with pytest.raises(AssertionError):
        _assert_same_run(tmp_path / "p0", tmp_path / "s0")


class _Diverging(CrossEntropyLoss):
    """Cross-entropy that turns NaN from epoch ``after`` on (state changes in ``set_epoch``, as
    the grouped loss call requires: ``forward`` is a function of inputs, hyperparameters and
    buffers)."""

    after = 1

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.factor = float("nan") if epoch >= self.after else 1.0

    def forward(self, input, target):
        return super().forward(input, target) * getattr(self, "factor", 1.0)


class _Stable(_Diverging):
    after = 10**9


def _weights(run_dir):
    return load_checkpoint(run_dir / "checkpoints" / "last.pt")["model"]


def test_a_diverging_lane_stops_alone(tmp_path):
    """The diverged lane keeps its last good epoch; its companions finish as the runs they
    would be alone, and bit for bit as in the same pack without a divergence (the diverged
    lane stays in its slot as a ghost: the pack keeps its size)."""
    register_loss("test_diverging")(_Diverging)
    register_loss("test_stable")(_Stable)
    try:
        configs = [cfg(tmp_path, "p0", seed=0, loss="ce", epochs=3),
                   cfg(tmp_path, "p1", seed=1, loss="test_diverging", epochs=3),
                   cfg(tmp_path, "p2", seed=2, loss="focal", epochs=3)]
        res = train_packed(configs)
        calm = [dataclasses.replace(c, out_dir=str(tmp_path / f"q{i}"))
                for i, c in enumerate(configs)]
        calm[1] = dataclasses.replace(calm[1], loss="test_stable")
        res_calm = train_packed(calm)
    finally:
        LOSSES.unregister("test_diverging")
        LOSSES.unregister("test_stable")
    assert isinstance(res[1], LaneDivergedError)
    assert "diverged in epoch 2" in str(res[1]) and "p1" in str(res[1])
    assert all(isinstance(r, dict) for r in res_calm), res_calm
    # it keeps its first epoch's log line and checkpoint, nothing after
    log = (tmp_path / "p1" / "log.jsonl").read_text().splitlines()
    assert len(log) == 1
    assert load_checkpoint(tmp_path / "p1" / "checkpoints" / "last.pt")["epoch"] == 1
    assert not (tmp_path / "p1" / "results.json").exists()
    # the others finish and are the runs they would be alone
    for s in (0, 2):
        assert isinstance(res[s], dict) and res[s]["epochs"] == 3
        a, b = _weights(tmp_path / f"p{s}"), _weights(tmp_path / f"q{s}")
        assert all(torch.equal(a[k], b[k]) for k in a), s
        train(dataclasses.replace(configs[s], out_dir=str(tmp_path / f"s{s}")))
        _assert_same_run(tmp_path / f"p{s}", tmp_path / f"s{s}")


def test_interrupt_and_resume_give_the_uninterrupted_runs(tmp_path, monkeypatch):
    """Ctrl-C during epoch 3 leaves every lane at its epoch-2 checkpoint; a second call
    resumes them (packed again) to the numbers of uninterrupted separate runs; a finished
    lane is not trained again."""
    configs = [cfg(tmp_path, f"p{s}", seed=s, loss=loss, epochs=3, resume=True)
               for s, loss in LANES]
    interrupt_in_epoch(monkeypatch, configs, 2)
    for s, _ in LANES:
        assert load_checkpoint(tmp_path / f"p{s}" / "checkpoints" / "last.pt")["epoch"] == 2
    res = train_packed(configs)
    assert [r["resumed_from"] for r in res] == [2, 2, 2]
    for s, _ in LANES:
        train(dataclasses.replace(configs[s], out_dir=str(tmp_path / f"s{s}"), resume=False))
        _assert_same_run(tmp_path / f"p{s}", tmp_path / f"s{s}")
    again = train_packed(configs)  # finished: evaluated again, not trained
    assert [r["resumed_from"] for r in again] == [3, 3, 3]


def interrupt_in_epoch(monkeypatch, configs, epoch: int) -> None:
    """Train ``configs`` packed with a Ctrl-C at the end of (0-based) ``epoch``."""
    orig = E.end_epoch

    def interrupting(pack, lanes, groups, stats, e, *a, **kw):
        if e == epoch:
            raise KeyboardInterrupt
        return orig(pack, lanes, groups, stats, e, *a, **kw)

    monkeypatch.setattr(E, "end_epoch", interrupting)
    with pytest.raises(KeyboardInterrupt):
        train_packed(configs)
    monkeypatch.setattr(E, "end_epoch", orig)


def test_a_lane_that_cannot_start_does_not_stop_the_others(tmp_path):
    good = cfg(tmp_path, "a", seed=0, epochs=1)
    train(dataclasses.replace(good, out_dir=str(tmp_path / "b")))
    taken = cfg(tmp_path, "b", seed=1, epochs=1)  # holds a run, resume=False: refused
    res = train_packed([good, taken])
    assert isinstance(res[0], dict) and res[0]["epochs"] == 1
    assert isinstance(res[1], Exception) and "already holds a run" in str(res[1])


def test_form_packs_groups_and_deals_round_robin():
    c = TrainConfig()
    a = dataclasses.replace(c, seed=1, loss="focal", out_dir="x")
    other = dataclasses.replace(c, lr=0.5)
    head = dataclasses.replace(c, joint_head=JointHeadConfig(enabled=True))

    def positions(configs, **kw):
        return [list(p.positions) for p in form_packs(configs, **kw)]

    # one group per setting, in the order given; an unpackable config alone (hand-worked)
    assert positions([c, a, other, a, head, c], max_lanes=6) == [[0, 1, 3, 5], [2], [4]]
    # at most 2 lanes: the 3 runs of the group dealt round robin into ceil(3 / 2) = 2 packs
    assert positions([c, a, c, a, c], max_lanes=3) == [[0, 2, 4], [1, 3]]
    assert positions([c, a, c, a, c], max_lanes=2) == [[0, 3], [1, 4], [2]]
    assert pack_problem(head) is not None and pack_problem(c) is None
    with pytest.raises(ValueError, match="`max_lanes`"):
        form_packs([c], max_lanes=0)
    with pytest.raises(ValueError, match="`max_lanes`"):
        train_packed([c], max_lanes=0)
    with pytest.raises(TypeError, match="TrainConfig"):
        train_packed([{"seed": 0}])


def test_a_run_that_cannot_be_packed_trains_alone(tmp_path, monkeypatch):
    """A config pack_problem refuses (here TensorBoard logging) is trained by train() itself,
    beside a pack of the others."""
    seen = []
    monkeypatch.setattr(P, "_train_alone", lambda c: seen.append(c.out_dir) or {"epochs": 1})
    tb = cfg(tmp_path, "tb", seed=0, epochs=1, tensorboard=True)
    res = train_packed([tb, cfg(tmp_path, "a", seed=1, epochs=1),
                        cfg(tmp_path, "b", seed=2, epochs=1)])
    assert seen == [tb.out_dir] and res[0] == {"epochs": 1}
    assert res[1]["epochs"] == 1 and res[2]["epochs"] == 1


def test_a_lane_does_not_depend_on_its_companions_at_one_pack_size(tmp_path):
    """In packs of one size a lane's numbers are bit for bit the same whichever runs share
    the pack (another seed, another loss): what makes a sweep's numbers independent of how its
    workers pick packs. (Packs of another size may round differently: docs/guide/packing.md.)"""
    def lane0(name, companions):
        cs = [cfg(tmp_path, f"{name}0", seed=0, loss="ce")]
        cs += [cfg(tmp_path, f"{name}{i + 1}", seed=s, loss=loss)
               for i, (s, loss) in enumerate(companions)]
        res = train_packed(cs)
        assert all(isinstance(r, dict) for r in res), res
        ck = torch.load(tmp_path / f"{name}0" / "checkpoints" / "last.pt", weights_only=True)
        return ck["model"] if "model" in ck else ck

    a = lane0("a", [(1, "ce"), (2, "ce")])
    b = lane0("b", [(5, "focal"), (3, "adafocal")])
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k

"""Issue 40's leftovers: each question has one answer in the code.

"Is this CUDA?" (:func:`torchcal.train.device.is_cuda`, which the trainer's process group and a
sweep's pack sizes and resources all ask); "do the lanes share data?"
(:func:`torchcal.train.run.shares_data`, for the engine's batches, OOD sets and final evaluation);
a lane's config is read by ``train.evaluation.read_config``; and an earlier version's flat
name of a plug-in field is TrainConfig's to map, in a sweep's overrides too.
"""

from __future__ import annotations

import types

import pytest

import torchcal.train.trainer as T
from torchcal.experiments import training as X
from torchcal.train import TrainConfig
from torchcal.train.device import is_cuda


class _Stop(Exception):
    pass


def test_one_cuda_test(monkeypatch, tmp_path):
    import torchcal.train.packs as packs

    assert packs.is_cuda is is_cuda  # the packs' name is the train layer's helper
    assert is_cuda("cuda:1") and is_cuda("cuda") and not is_cuda("cpu")
    asked: list[str] = []

    def stop(dev_type):
        raise _Stop(dev_type)

    monkeypatch.setattr(T, "is_cuda", lambda device: asked.append(device) or True)
    monkeypatch.setattr(T, "setup_distributed", stop)
    cfg = TrainConfig(dataset="digits", model="mlp", epochs=1, out_dir=str(tmp_path / "r"),
                      device="cpu")
    with pytest.raises(_Stop, match="cuda"):  # the trainer asked the helper, and followed it
        T.train(cfg)
    assert asked == ["cpu"]


def _run(**src):
    return types.SimpleNamespace(src=src, splits=None, local_bs=4,
                                 env=types.SimpleNamespace(enabled=False))


def test_one_answer_to_do_the_lanes_share_data(monkeypatch):
    """``torchcal.train.run.shares_data`` decides it for the engine's training batches, its OOD
    sets and its final evaluation (before: three tests, of the train or the val source)."""
    import torchcal.train.engine as E
    from torchcal.train.run import shares_data

    a, b = object(), object()
    train = types.SimpleNamespace(array=True)
    one, other = _run(train=train, val=a), _run(train=train, val=b)
    assert shares_data([one, _run(train=train, val=a)]) and not shares_data([one, other])
    lanes = [types.SimpleNamespace(run=one), types.SimpleNamespace(run=_run(train=train, val=a))]
    assert E.Batches(lanes).shared
    asked = []
    monkeypatch.setattr(E, "shares_data", lambda runs: asked.append(len(runs)) or False)
    assert not E.Batches(lanes).shared and asked == [2]


def test_a_ghost_config_is_read_as_every_run_config(monkeypatch, tmp_path):
    """``train/packed.py`` reads a lane's config with ``train.evaluation.read_config`` (one
    reader, one error handling), not by hand."""
    import torchcal.train.packed as P
    from torchcal.errors import CheckpointError, TorchcalError

    cfg = TrainConfig(dataset="digits", model="mlp", epochs=1, out_dir=str(tmp_path / "g"))
    read = []
    monkeypatch.setattr(P, "read_config", lambda d: read.append(d) or cfg)
    assert P._lane_config(str(tmp_path / "g"), []) is cfg and read == [str(tmp_path / "g")]
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match="none can be read") as info:
        P._lane_config(str(tmp_path / "missing"), [])
    assert isinstance(info.value.__cause__, TorchcalError) and "config.json" in str(info.value)


def test_a_sweep_override_sets_a_plugin_group_as_a_dict():
    """``torchcal demo --train-arg 'joint_head={"enabled": true}'``: a plug-in group given as a
    dict sets its fields over the recipe's; a group's field at the top level (the names before
    the grouping) is refused naming its place."""
    kw = dict(loss="ce", seed=0, run_dir="r")
    cfg = X.benchmark_config("digits-mlp", **kw,
                             overrides={"joint_head": {"enabled": True, "lr": 0.01}})
    assert cfg.joint_head.enabled and cfg.joint_head.lr == 0.01
    assert cfg.joint_head.weight_decay == TrainConfig().joint_head.weight_decay
    assert cfg == TrainConfig.from_dict(cfg.to_dict())
    with pytest.raises(ValueError, match=r"\['uncertainty_head'\]; `uncertainty_head` is "
                                         r"`joint_head.enabled`"):
        X.benchmark_config("digits-mlp", **kw, overrides={"uncertainty_head": True})
    with pytest.raises(ValueError, match=r"TrainConfig has no field\(s\) \['no_such_field'\]"):
        X.benchmark_config("digits-mlp", **kw, overrides={"no_such_field": 1})

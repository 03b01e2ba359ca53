"""Issue 40's leftovers: each question has one answer in the code.

"Is this CUDA?" (:func:`torchcal.train.device.is_cuda`, which the trainer's process group and a
sweep's pack sizes and resources all ask).
"""

from __future__ import annotations

import pytest

import torchcal.train.trainer as T
from torchcal.experiments import training as X
from torchcal.train import TrainConfig
from torchcal.train.device import is_cuda


class _Stop(Exception):
    pass


def test_one_cuda_test(monkeypatch, tmp_path):
    assert X.is_cuda is is_cuda  # the experiments' name is the train layer's helper
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

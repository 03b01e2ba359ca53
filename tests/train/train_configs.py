"""The train tests' run configurations in one place: the digits MLP (``tiny_config``, also the
``tiny_config`` fixture of ``conftest.py``) and the digits through a narrow 1-D CNN
(``cnn_config``, the packed engine's runs).  Each is the ``digits-mlp`` recipe as a run in
``root / name`` on one CPU thread with no progress bar; ``fields`` override anything."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from torchcal.train import TrainConfig, get_recipe


def tiny_config(root: Path, name: str = "run", **fields) -> TrainConfig:
    """The digits MLP, one epoch, not evaluated."""
    base = dict(out_dir=str(Path(root) / name), progress=False, num_threads=1, device="cpu",
                evaluate=False, epochs=1)
    return dataclasses.replace(get_recipe("digits-mlp"), **{**base, **fields})


def cnn_config(root: Path, name: str = "run", **fields) -> TrainConfig:
    """The digits through the 1-D CNN at width 8 (no BatchNorm; ``model="small_cnn"`` for one
    with BatchNorm), 2 epochs, a clipping norm small enough to clip every step, a checkpoint
    and a test pass every epoch."""
    base = dict(model="mnist1d_cnn", model_kwargs={"in_length": 64, "width": 8}, grad_clip=0.05,
                epochs=2, checkpoint_every=1, eval_test_every=1, evaluate=True)
    return tiny_config(root, name, **{**base, **fields})

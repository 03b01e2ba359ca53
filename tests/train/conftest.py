"""Shared settings of the train tests: the one tiny-config factory."""

from __future__ import annotations

import dataclasses

import pytest

from torchcal.train import TrainConfig, get_recipe


@pytest.fixture()
def tiny_config(tmp_path):
    """``tiny_config(name="run", **fields)``: the digits MLP recipe (``digits-mlp``) as a run
    of this test, in ``tmp_path / name``, one CPU thread, no progress bar, one epoch, not
    evaluated; ``fields`` override any of these (``evaluate=True``, ``epochs=3``, ...)."""

    def make(name: str = "run", **fields) -> TrainConfig:
        base = dict(out_dir=str(tmp_path / name), progress=False, num_threads=1, device="cpu",
                    evaluate=False, epochs=1)
        return dataclasses.replace(get_recipe("digits-mlp"), **{**base, **fields})

    return make


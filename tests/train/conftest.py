"""Shared settings of the train tests: the one tiny-config factory (the configurations live in
``train_configs.py``) and torch's thread count restored after every test."""

from __future__ import annotations

import pytest
import torch
from train_configs import tiny_config as _tiny_config


@pytest.fixture()
def tiny_config(tmp_path):
    """``tiny_config(name="run", **fields)``: the digits MLP recipe (``digits-mlp``) as a run
    of this test, in ``tmp_path / name``, one CPU thread, no progress bar, one epoch, not
    evaluated; ``fields`` override any of these (``evaluate=True``, ``epochs=3``, ...)."""

    def make(name: str = "run", **fields):
        return _tiny_config(tmp_path, name, **fields)

    return make



@pytest.fixture(autouse=True)
def _restore_threads():
    """A test that trains sets torch's thread count (``num_threads=1``): put it back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)

"""Shared fixtures of the post-hoc calibration tests."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small tensors: one intra-op thread is faster, and much faster on a loaded machine."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)

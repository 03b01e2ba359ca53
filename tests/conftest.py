"""Suite-wide test settings."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _data_root_outside_the_repository(tmp_path_factory):
    """Data sets a test loads without naming a root (``$TORCHCAL_DATA_ROOT``, else ``./data``)
    go to a temporary directory, never into the working tree (a default MNIST-1D demo's settings
    check generated ``./data/mnist1d`` in the repository)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHCAL_DATA_ROOT", str(tmp_path_factory.mktemp("data_root")))
        yield

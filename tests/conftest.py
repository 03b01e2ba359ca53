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


@pytest.fixture(scope="session")
def demo_configs():
    """``demo_configs(cfg, out)``: the TrainConfigs ``run_demo(cfg)`` trains into ``out``,
    each resolved once, seed-major."""
    from torchcal.experiments import demo
    from torchcal.experiments.benchmark import get_benchmark

    def configs(cfg, out):
        bench = get_benchmark(cfg.benchmark)
        return demo._run_configs(demo._resolve(cfg, bench), bench, out)

    return configs

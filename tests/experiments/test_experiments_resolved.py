"""Issue 32 item 2: workers receive resolved, serialisable TrainConfig dicts.  A recipe
registered in the parent process only (a notebook, a script, `python -c`, a Ray driver) trains
through the demo's runner on the local executor's worker processes and on Ray, and the demo
resolves each run's TrainConfig once and looks its benchmark up once."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest

from torchcal.experiments import DemoConfig, LocalExecutor, run_demo
from torchcal.experiments import demo as demo_module
from torchcal.experiments import training as training_module
from torchcal.train import TrainConfig, get_recipe, register_recipe
from torchcal.train.recipes import RECIPES

pytestmark = pytest.mark.filterwarnings("ignore:OOD set")
RECIPE = "zz-parent-only"
HIDDEN = [24, 12]  # not the digits recipe's (256, 256): the workers must train this recipe


@pytest.fixture
def parent_recipe():
    """A recipe registered in this process only: spawned workers and Ray tasks import a
    torchcal that does not know it."""
    register_recipe(RECIPE, dataclasses.replace(get_recipe("digits-mlp"),
                                                model_kwargs={"hidden": list(HIDDEN)}))
    try:
        yield
    finally:
        RECIPES.unregister(RECIPE)


def _cfg(out: Path, **kw) -> DemoConfig:
    return DemoConfig(benchmark="digits", recipe=RECIPE, losses=("ce",), seeds=(0, 1), epochs=1,
                      progress=False, figures=False, pack=False, out=out, **kw)


def _check_runs(out: Path) -> dict[int, dict]:
    tests = {}
    for seed in (0, 1):
        run = out / "runs" / "ce" / f"seed{seed}"
        cfg = json.loads((run / "config.json").read_text())
        assert cfg["recipe"] == RECIPE and cfg["model_kwargs"] == {"hidden": HIDDEN}
        tests[seed] = json.loads((run / "results.json").read_text())["test"]
    return tests


def test_runs_are_the_resolved_train_configs(demo_configs, parent_recipe, tmp_path):
    tc = demo_configs(_cfg(tmp_path), tmp_path)[0]
    assert isinstance(tc, TrainConfig) and pickle.loads(pickle.dumps(tc)) == tc  # to workers
    assert tc.recipe == RECIPE and tc.model_kwargs == {"hidden": HIDDEN} and tc.epochs == 1
    assert tc.seed == 0 and tc.loss == "ce" and tc.out_dir == str(tmp_path / "runs/ce/seed0")


def test_a_parent_only_recipe_trains_in_worker_processes(parent_recipe, tmp_path, monkeypatch):
    """Two spawned workers (they never saw the recipe); before, each failed with
    UnknownRecipeError and the report found no evaluated run."""
    res = run_demo(_cfg(tmp_path / "local"), LocalExecutor(workers=2))
    assert res.failed == []
    local = _check_runs(tmp_path / "local")
    # the same runs in this process: the same numbers
    res = run_demo(_cfg(tmp_path / "inproc"), LocalExecutor(workers=1))
    assert res.failed == [] and _check_runs(tmp_path / "inproc") == local


def test_the_demo_resolves_each_run_once(parent_recipe, tmp_path, monkeypatch):
    """A 2-run demo: the recipe is resolved into a TrainConfig twice (once per run; it was 9
    times) and the benchmark looked up once (it was 18 times)."""
    calls = {"recipe": 0, "benchmark": 0}
    real_recipe, real_bench = training_module.get_recipe, demo_module.get_benchmark

    def count(key, fn):
        def wrapped(*a, **kw):
            calls[key] += 1
            return fn(*a, **kw)
        return wrapped

    monkeypatch.setattr(training_module, "get_recipe", count("recipe", real_recipe))
    monkeypatch.setattr(demo_module, "get_benchmark", count("benchmark", real_bench))
    res = run_demo(_cfg(tmp_path / "d"), LocalExecutor(workers=1))
    assert res.failed == []
    assert calls == {"recipe": 2, "benchmark": 1}

# the same on Ray: tests/experiments/test_experiments_ray.py (its module's Ray instance)

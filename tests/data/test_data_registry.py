"""Issue 32 item 3: data sets, OOD sets and executors are registries.  A toy data set registered
here (its loader, a declared option with a constraint, a default OOD set) is listed by
`torchcal data list`, trains with its OOD set evaluated, runs through `torchcal demo` under a
benchmark registered here with its option passed as `--data-arg`, and an executor registered
here is offered by `--executor`: no file of cli/, experiments/ or report/ names any of them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import torchcal
from torchcal.cli import main
from torchcal.data import (
    DATASETS,
    OOD_SETS,
    ArrayDataset,
    DataOption,
    DataSet,
    DataSplits,
    OodDefault,
    OodSet,
    default_ood_sets,
    list_datasets,
    load_ood,
    load_splits,
    register_dataset,
    register_ood_set,
)
from torchcal.experiments import (
    Benchmark,
    ExecutorType,
    LocalExecutor,
    Profile,
    register_benchmark,
    register_executor,
)
from torchcal.experiments.benchmark import BENCHMARKS
from torchcal.experiments.demo import TRAINING_RUNS
from torchcal.experiments.runner import EXECUTORS
from torchcal.train import get_recipe, register_recipe
from torchcal.train.recipes import RECIPES

PKG = Path(torchcal.__file__).resolve().parent
SEEN: dict[str, list] = {"load": [], "ood": [], "executor": []}


def _blobs(n: int, seed: int, shift: float) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    x = torch.randn(n, 8, generator=g) + shift * torch.nn.functional.one_hot(y, 8).float()
    return x, y


def load_toy(root, *, download, seed, val_fraction, n=90, shift=2.0):
    SEEN["load"].append({"n": n, "shift": shift, "seed": seed})
    parts = [ArrayDataset(*_blobs(n, seed + k, shift)) for k in range(3)]
    return DataSplits(*parts, 3, (8,), None, None, False, "zz_toy", 0, {"n": n})


def load_toy_ood(root, *, download, seed, n=30, shift=2.0):
    SEEN["ood"].append({"n": n, "shift": shift, "seed": seed})
    x, _y = _blobs(n, 1000 + seed, 0.0)
    return ArrayDataset(x * 3.0, torch.full((n,), -1))


@pytest.fixture
def toy():
    """The toy set, its OOD set, a recipe and a benchmark on it, and an executor; all
    unregistered afterwards."""
    for v in SEEN.values():
        v.clear()
    register_ood_set(OodSet("zz_toy_ood", load_toy_ood, (DataOption("n", type=int, min_val=1),
                                                        DataOption("shift", type=float))))
    register_dataset(DataSet(
        "zz_toy", load_toy,
        (DataOption("n", "samples per split", int, min_val=3),
         DataOption("shift", "class separation", float, min_val=0.0)),
        (OodDefault("zz_toy_ood", {"n": 30}, seeded=True, shared=("shift",)),),
        "three Gaussian blobs"))
    register_recipe("zz-toy-mlp", dataclasses.replace(
        get_recipe("digits-mlp"), dataset="zz_toy", model_kwargs={"hidden": [16]},
        batch_size=32, epochs=2, milestones=[1]))
    register_benchmark(Benchmark(
        name="zz_toy", title="calibration on toy blobs", recipe="zz-toy-mlp",
        profiles={p: Profile(seeds=(0,), epochs=2, losses=("ce",))
                  for p in ("default", "quick", "full")},
        data_kwargs={"shift": 1.5}, prebuild_data=True, kind=TRAINING_RUNS))

    def make(*, workers, address=None):
        SEEN["executor"].append(workers)
        return LocalExecutor(workers=1)

    register_executor(ExecutorType("zz_inline", make, "in this process (a test's)"))
    try:
        yield
    finally:
        DATASETS.unregister("zz_toy")
        OOD_SETS.unregister("zz_toy_ood")
        RECIPES.unregister("zz-toy-mlp")
        BENCHMARKS.unregister("zz_toy")
        EXECUTORS.unregister("zz_inline")


def test_a_registered_data_set_loads_with_checked_options(toy, capsys):
    assert "zz_toy" in list_datasets() and default_ood_sets("zz_toy") == ("zz_toy_ood",)
    s = load_splits("zz_toy", seed=3, n=12)
    assert len(s.train) == 12 and SEEN["load"] == [{"n": 12, "shift": 2.0, "seed": 3}]
    with pytest.raises(ValueError, match=r"Expected `n` to be .*got 2"):
        load_splits("zz_toy", n=2)
    with pytest.raises(ValueError, match="Unexpected keyword.*'zz_toy': noise_std; accepted: n, shift"):
        load_splits("zz_toy", noise_std=0.5)
    assert len(load_ood("zz_toy_ood", n=4)) == 4
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "zz_toy" in out and "zz_toy_ood" in out


def test_a_registered_data_set_trains_through_the_demo(toy, tmp_path, capsys):
    """Its benchmark, its --data-arg option and its executor; the OOD set gets the run's data
    seed and the shared option, as the registration declares."""
    out = tmp_path / "demo"
    argv = ["demo", "--benchmark", "zz_toy", "--executor", "zz_inline", "--no-progress",
            "--no-figures", "--no-pack", "--out", str(out)]
    assert main([*argv, "--data-arg", "shift=2.5"]) == 0, capsys.readouterr().err
    assert SEEN["executor"] == [2]
    res = json.loads((out / "runs" / "ce" / "seed0" / "results.json").read_text())
    assert res["n"]["test"] == 90 and "zz_toy_ood" in res["ood"]
    assert {"n": 90, "shift": 2.5, "seed": 0} in SEEN["load"]  # the data seed: the run's (0)
    assert SEEN["ood"][-1] == {"n": 30, "shift": 2.5, "seed": 0}
    cfg = json.loads((out / "runs" / "ce" / "seed0" / "config.json").read_text())
    assert cfg["dataset"] == "zz_toy" and cfg["data_kwargs"] == {"shift": 2.5}
    # the benchmark's own option value when the user gives none; an undeclared option or one
    # outside its constraint is refused before anything trains, naming it
    capsys.readouterr()
    assert main([*argv[:-1], str(tmp_path / "bad"), "--data-arg", "noise_std=0.3"]) == 2
    assert "Unexpected keyword(s) for data set 'zz_toy': noise_std" in capsys.readouterr().err
    assert main([*argv[:-1], str(tmp_path / "bad2"), "--data-arg", "shift=-1"]) == 2
    assert "`shift`" in capsys.readouterr().err
    assert not (tmp_path / "bad" / "runs").exists()


def test_the_registrations_touch_no_cli_experiments_or_report_file():
    for part in ("cli", "experiments", "report"):
        for f in (PKG / part).glob("*.py"):
            text = f.read_text(encoding="utf-8")
            assert "zz_toy" not in text and "zz_inline" not in text, f
            if part == "cli":  # the demo's executors and data options come from the registries
                assert '"ray"' not in text or f.name == "__init__.py", f

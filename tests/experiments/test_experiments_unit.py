"""Issue 40 item 1, one unit of work: a demo resolves each run once (a typed RunSpec, JSON
only at the executor's boundary) and forms its packs once; one function (train_runs) trains a
pack and a run alone; the evaluate fallback and the dead code are gone; the calibration
benchmarks name their kind; a report computes its claims once."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import pytest

import torchcal.experiments.packed as exp_packed
import torchcal.report.build as report_build
import torchcal.report.claims as report_claims
import torchcal.train.packed as train_packed_module
from torchcal.evaluate import config_meta
from torchcal.experiments import (
    Benchmark,
    DemoConfig,
    LocalExecutor,
    Profile,
    calibration,
    demo,
    run_demo,
)
from torchcal.experiments import training as training_module
from torchcal.experiments.training import RunSpec, run_job, run_spec, train_runs
from torchcal.train import TrainConfig
from torchcal.train.config import config_identity
from torchcal.train.packed import train_pack

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore:OOD set")

TINY = dict(seeds=(0, 1), epochs=1, losses=("ce", "focal"), progress=False, benchmark="digits",
            figures=False, workers=1)


def _counter(calls, key, fn):
    def wrapped(*a, **kw):
        calls[key] += 1
        return fn(*a, **kw)
    return wrapped


def test_a_demo_resolves_each_run_once_and_forms_its_packs_once(tmp_path, monkeypatch):
    """4 runs in 2 packs of 2: the recipe is resolved 4 times (the parent), each config read
    from its JSON once (the worker), pack_groups called once (it was 3: the parent, then each
    pack again), the claims checked once per report (they were 3 times in build_report)."""
    calls = dict.fromkeys(("train_config", "from_dict", "pack_groups", "claims"), 0)
    real_from_dict = TrainConfig.from_dict.__func__
    monkeypatch.setattr(TrainConfig, "from_dict", classmethod(
        _counter(calls, "from_dict", real_from_dict)))
    monkeypatch.setattr(training_module, "train_config",
                        _counter(calls, "train_config", training_module.train_config))
    groups = _counter(calls, "pack_groups", train_packed_module.pack_groups)
    monkeypatch.setattr(exp_packed, "pack_groups", groups)
    monkeypatch.setattr(train_packed_module, "pack_groups", groups)
    claims = _counter(calls, "claims", report_claims.check_claims)
    monkeypatch.setattr(report_claims, "check_claims", claims)
    monkeypatch.setattr(report_build, "check_claims", claims)
    res = run_demo(DemoConfig(out=tmp_path / "d", **TINY), LocalExecutor(workers=1))
    assert res.failed == []
    # train_config: 4 in the parent (from the recipe) + 4 in the worker (from the JSON config)
    assert calls == {"train_config": 8, "from_dict": 4, "pack_groups": 1, "claims": 1}


def test_the_demo_keeps_typed_specs_and_sends_json(tmp_path):
    cfg = demo.resolve(DemoConfig(**TINY))
    jobs, specs = demo.TRAINING_RUNS.plan(cfg, demo.get_benchmark("digits"), tmp_path)
    assert all(isinstance(s, RunSpec) for s in specs) and len(specs) == 4
    assert [len(j.spec["members"]) for j in jobs] == [2, 2]  # JSON at the boundary
    assert all(isinstance(r["config"], dict) for j in jobs for r in j.spec["members"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        specs[0].seed = 3
    assert run_spec(specs[0]) is specs[0]  # never resolved again
    assert run_spec(specs[0].to_json()).config == specs[0].config


def _spec(run_dir: Path, loss: str = "ce", **overrides) -> RunSpec:
    return run_spec({"recipe": "digits-mlp", "loss": loss, "loss_kwargs": {}, "seed": 0,
                     "epochs": 1, "n_bins": 15, "data_kwargs": {}, "run_dir": str(run_dir),
                     "overrides": overrides})


def test_train_runs_treats_a_run_alone_as_a_pack_of_one(tmp_path):
    (res,) = train_runs([_spec(tmp_path / "r")])
    assert res["error"] is None and res["skipped"] is False and res["packed"] == 1
    meta = json.loads((tmp_path / "r" / "results.json").read_text())["meta"]
    spec = _spec(tmp_path / "r")  # the one builder of a result's meta: config_meta
    assert meta == {**config_meta(spec.config.to_dict()), "epoch": 1, "checkpoint": "last",
                    **json.loads(json.dumps(config_identity(spec.config)))}  # and its identity
    (again,) = train_runs([_spec(tmp_path / "r")])
    assert again["skipped"] is True and again["packed"] == 0


def test_train_runs_locks_each_run_directory_once(tmp_path, monkeypatch):
    """The pack's run directories are locked by train_runs; the packed trainer does not lock
    them again (it did: experiments/packed.py and train/packed.py)."""
    seen: list[str] = []
    real = train_packed_module.exclusive_lock

    @contextlib.contextmanager
    def spy(d, **kw):
        seen.append(str(d))
        with real(d, **kw) as p:
            yield p

    monkeypatch.setattr(train_packed_module, "exclusive_lock", spy)
    res = train_runs([_spec(tmp_path / "a"), _spec(tmp_path / "b", loss="focal")])
    assert [r["error"] for r in res] == [None, None] and res[0]["packed"] == 2
    assert seen == []


def test_train_pack_refuses_configs_of_two_packs(tmp_path):
    a, b = _spec(tmp_path / "a").config, _spec(tmp_path / "b").config
    with pytest.raises(ValueError, match="`configs` to form one pack"):
        train_pack([a, dataclasses.replace(b, lr=0.5)])
    with pytest.raises(ValueError, match="`configs`"):
        train_pack([])


def test_overrides_evaluate_false_is_refused_clearly(tmp_path):
    """The evaluate_saved_logits fallback is gone: evaluate=False was its only way in, and it
    then failed on a missing logits file; now the spec is refused, naming the override."""
    assert not hasattr(training_module, "evaluate_saved_logits")
    assert not hasattr(exp_packed, "evaluate_saved_logits")
    with pytest.raises(ValueError, match="`overrides` not to set evaluate=False"):
        _spec(tmp_path / "r", evaluate=False)
    res = run_job({"recipe": "digits-mlp", "loss": "ce", "loss_kwargs": {}, "seed": 0,
                   "epochs": 1, "n_bins": 15, "run_dir": str(tmp_path / "r"),
                   "overrides": {"evaluate": False}})
    assert "evaluate=False" in res["error"] and "does not exist" not in res["error"]
    assert not (tmp_path / "r").exists()


def test_dead_code_is_gone():
    assert not hasattr(demo, "sweep_jobs") and not hasattr(demo, "demo_loss_kwargs")
    assert not hasattr(report_build, "runs_from_records")
    assert not hasattr(TrainConfig, "to_json") and not hasattr(training_module, "run_meta")


def test_every_benchmark_names_its_kind():
    assert calibration.MNIST1D.kind is demo.TRAINING_RUNS
    assert calibration.DIGITS.kind is demo.TRAINING_RUNS
    assert calibration.DIGITS.suite == "calibration"
    profiles = {p: Profile(seeds=(0,)) for p in ("default", "quick", "full")}
    assert Benchmark(name="x", title="x", recipe="digits-mlp",
                     profiles=profiles).kind is demo.TRAINING_RUNS  # the default
    with pytest.raises(TypeError, match="`kind` to be a BenchmarkKind"):
        Benchmark(name="x", title="x", recipe="digits-mlp", profiles=profiles, kind=object())


def test_the_model_is_described_without_building_it(monkeypatch):
    tc = _spec(Path("/x")).config
    assert not hasattr(calibration, "build_model")  # the MLP's widths are read, not built
    assert calibration._model_and_info(tc)[0] == "MLP 64-256-256-10"
    wide = dataclasses.replace(tc, model_kwargs={"hidden": [8]})
    assert calibration._model_and_info(wide)[0] == "MLP 64-8-10"

    def no_data(_tc):
        raise OSError("no data here")

    monkeypatch.setattr(calibration, "build_data", no_data)
    assert calibration._model_and_info(tc) == ("`mlp`", {})

    def bug(_tc):
        raise KeyError("a bug")

    monkeypatch.setattr(calibration, "build_data", bug)
    with pytest.raises(KeyError):  # no bare except: a bug is not hidden
        calibration._model_and_info(tc)

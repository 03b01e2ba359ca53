"""Issues 40 and 49, one unit of work: a run is its TrainConfig, resolved once in the parent
(no other spec type, no JSON in between); the packs are formed once (form_packs) and one
sequence (train_pack) trains a pack and a run alone, returning RunOutcomes that round-trip
through JSON; the evaluate fallback and the dead code are gone; the calibration benchmarks name
their kind; a report computes its claims once."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from pathlib import Path

import pytest

import torchcal.report.build as report_build
import torchcal.report.claims as report_claims
import torchcal.train.packed as train_packed_module
import torchcal.train.packs as packs_module
import torchcal.train.run as train_run_module
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
from torchcal.experiments.training import benchmark_config
from torchcal.results_file import config_meta
from torchcal.train import TrainConfig
from torchcal.train.config import config_identity
from torchcal.train.packs import Pack, RunOutcome, form_packs, train_pack

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore:OOD set")

TINY = dict(seeds=(0, 1), epochs=1, losses=("ce", "focal"), progress=False, benchmark="digits",
            figures=False, workers=1)


def _counter(calls, key, fn):
    def wrapped(*a, **kw):
        calls[key] += 1
        return fn(*a, **kw)
    return wrapped


def test_a_demo_resolves_each_run_once_and_forms_its_packs_once(tmp_path, monkeypatch):
    """4 runs in 2 packs of 2, in this process: the recipe resolved 4 times (it was 8: the
    parent, then the worker from JSON), no config read back from JSON (it was 4), each config
    validated once (it was twice: the parent's check, then the worker), the packs formed once,
    the claims checked once per report (they were 3 times in build_report)."""
    calls = dict.fromkeys(("benchmark_config", "from_dict", "form_packs", "validate",
                           "claims"), 0)
    real_from_dict = TrainConfig.from_dict.__func__
    monkeypatch.setattr(TrainConfig, "from_dict", classmethod(
        _counter(calls, "from_dict", real_from_dict)))
    monkeypatch.setattr(TrainConfig, "validate",
                        _counter(calls, "validate", TrainConfig.validate))
    monkeypatch.setattr(demo, "benchmark_config",
                        _counter(calls, "benchmark_config", training_module.benchmark_config))
    monkeypatch.setattr(demo, "form_packs", _counter(calls, "form_packs", form_packs))
    claims = _counter(calls, "claims", report_claims.check_claims)
    monkeypatch.setattr(report_claims, "check_claims", claims)
    monkeypatch.setattr(report_build, "check_claims", claims)
    res = run_demo(DemoConfig(out=tmp_path / "d", **TINY), LocalExecutor(workers=1))
    assert res.failed == []
    assert calls == {"benchmark_config": 4, "from_dict": 0, "form_packs": 1, "validate": 4,
                     "claims": 1}


def test_the_demo_plans_configs_and_sends_them_in_packs(tmp_path):
    cfg = demo.resolve(DemoConfig(**TINY))
    jobs, configs = demo.TRAINING_RUNS.plan(cfg, demo.get_benchmark("digits"), tmp_path)
    assert all(isinstance(c, TrainConfig) for c in configs) and len(configs) == 4
    assert [len(j.spec["pack"].configs) for j in jobs] == [2, 2]
    sent = [c for j in jobs for c in j.spec["pack"].configs]
    assert sorted(map(id, sent)) == sorted(map(id, configs))  # the very objects, no copy
    assert {j.fn for j in jobs} == {training_module.run_pack_job}  # one job function
    with pytest.raises(dataclasses.FrozenInstanceError):
        configs[0].seed = 3
    nopack, _ = demo.TRAINING_RUNS.plan(dataclasses.replace(cfg, pack=False),
                                        demo.get_benchmark("digits"), tmp_path)
    assert [j.n_runs for j in nopack] == [1, 1, 1, 1] and nopack[0].name == "ce seed 0"


def _config(run_dir: Path, loss: str = "ce", **overrides) -> TrainConfig:
    return benchmark_config("digits-mlp", loss=loss, seed=0, epochs=1, run_dir=str(run_dir),
                            overrides=overrides)


def _alone(cfg: TrainConfig) -> Pack:
    (pack,) = form_packs([cfg])
    return pack


def test_train_pack_treats_a_run_alone_as_a_pack_of_one(tmp_path):
    (res,) = train_pack(_alone(_config(tmp_path / "r")), keep_results=True)
    assert res.error is None and res.skipped is False and res.lanes == 1
    meta = json.loads((tmp_path / "r" / "results.json").read_text())["meta"]
    cfg = _config(tmp_path / "r")  # the one builder of a result's meta: config_meta
    assert meta == {**config_meta(cfg.to_dict()), "epoch": 1, "checkpoint": "last",
                    **json.loads(json.dumps(config_identity(cfg)))}  # and its identity
    assert res.results["meta"] == meta  # the outcome holds what the run wrote
    (again,) = train_pack(_alone(_config(tmp_path / "r")), keep_results=True)
    assert again.skipped is True and again.lanes == 0 and again.results["meta"] == meta


def test_train_pack_locks_each_run_directory_once(tmp_path, monkeypatch):
    """The pack's run directories are locked by train_pack; the packed engine does not lock
    them again (it did: experiments/packed.py and train/packed.py)."""
    seen: list[str] = []
    real = train_packed_module.exclusive_lock

    @contextlib.contextmanager
    def spy(d, **kw):
        seen.append(str(d))
        with real(d, **kw) as p:
            yield p

    monkeypatch.setattr(train_packed_module, "exclusive_lock", spy)
    (pack,) = form_packs([_config(tmp_path / "a"), _config(tmp_path / "b", loss="focal")],
                         max_lanes=2)
    res = train_pack(pack)
    assert [r.error for r in res] == [None, None] and res[0].lanes == 2
    assert seen == []


def test_train_pack_takes_only_a_formed_pack(tmp_path):
    a = _config(tmp_path / "a")
    with pytest.raises(TypeError, match="`pack` to be a Pack"):
        train_pack([a])
    with pytest.raises(ValueError, match="`forward`"):
        train_pack(_alone(a), forward="sideways")


def test_validate_and_build_loss_once_per_run_in_a_pack(tmp_path, monkeypatch):
    """form_packs validates each config once; the pack's worker validates none again and
    builds each run's loss once (it was twice: the parent's check, then the worker)."""
    calls = dict.fromkeys(("validate", "build_loss"), 0)
    monkeypatch.setattr(TrainConfig, "validate",
                        _counter(calls, "validate", TrainConfig.validate))
    monkeypatch.setattr(train_run_module, "build_loss",
                        _counter(calls, "build_loss", train_run_module.build_loss))
    (pack,) = form_packs([_config(tmp_path / "a"), _config(tmp_path / "b", loss="focal")],
                         max_lanes=2)
    assert calls == {"validate": 2, "build_loss": 0}
    assert [o.error for o in train_pack(pack)] == [None, None]
    assert calls == {"validate": 2, "build_loss": 2}


def test_run_outcome_round_trips_through_json():
    done = RunOutcome("runs/ce/seed0", "ce", 0, seconds=1.25, lanes=3,
                      results={"meta": {"epoch": 2}, "test": {"pre": {"ece": 0.125}}})
    failed = RunOutcome("runs/focal/seed1", "focal", 1, error="ValueError: bad gamma",
                        traceback="Traceback ...", skipped=False)
    for o in (done, failed, RunOutcome("r", "ce", 2, skipped=True)):
        text = json.dumps(o.to_json())  # JSON proper: what crosses a process or Ray
        back = RunOutcome.from_json(json.loads(text))
        assert back == o and isinstance(back, RunOutcome)
    assert done.to_json()["results"]["test"]["pre"]["ece"] == 0.125
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.error = "x"
    with pytest.raises(TypeError, match="unexpected keyword"):
        RunOutcome.from_json({**failed.to_json(), "members": []})
    assert not math.isnan(done.seconds)


def test_overrides_evaluate_false_is_refused_clearly(tmp_path):
    """The evaluate_saved_logits fallback is gone: evaluate=False was its only way in, and it
    then failed on a missing logits file; now the config is refused, naming the override."""
    assert not hasattr(training_module, "evaluate_saved_logits")
    assert not hasattr(packs_module, "evaluate_saved_logits")
    with pytest.raises(ValueError, match="`overrides` not to set evaluate=False"):
        _config(tmp_path / "r", evaluate=False)
    assert not (tmp_path / "r").exists()


def test_dead_code_is_gone():
    assert not hasattr(demo, "sweep_jobs") and not hasattr(demo, "demo_loss_kwargs")
    assert not hasattr(report_build, "runs_from_records")
    assert not hasattr(TrainConfig, "to_json") and not hasattr(training_module, "run_meta")
    # issue 49: one config type, one job function, no second pack former
    for name in ("RunSpec", "run_spec", "spec_labels", "train_config", "train_job", "run_job",
                 "train_runs", "is_stale", "clear_run_dir"):
        assert not hasattr(training_module, name), name
    for name in ("pack_groups", "pack_problem", "train_pack", "train_packed", "MEMBER_FIELDS"):
        assert not hasattr(train_packed_module, name), name


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
    tc = _config(Path("/x"))
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

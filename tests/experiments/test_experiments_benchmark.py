"""Issue 23 item 1: a benchmark is data; which losses it trains comes from the loss registry."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch.nn.functional as F
from torch import nn

from torchcal._io import LOCK_NAME
from torchcal.cli import main
from torchcal.cli.demo import parse_demo_loss_args
from torchcal.experiments import (
    Benchmark,
    BenchmarkKind,
    DemoConfig,
    Job,
    LocalExecutor,
    Profile,
    get_benchmark,
    list_benchmarks,
    register_benchmark,
    run_demo,
)
from torchcal.experiments.benchmark import BENCHMARKS
from torchcal.experiments.demo import appendix_text, applicable_losses, intro_text
from torchcal.losses import LOSSES, register_loss
from torchcal.report.build import write_report_pages


class _PlainCE(nn.Module):
    """A user's loss: cross-entropy under another name."""

    def __init__(self, *, reduction: str = "mean", ignore_index: int = -100) -> None:
        super().__init__()
        self.reduction, self.ignore_index = reduction, ignore_index

    def forward(self, logits, target):
        return F.cross_entropy(logits, target, reduction=self.reduction,
                               ignore_index=self.ignore_index)


@pytest.fixture
def user_losses():
    """Two losses registered by a user (one tagged for the demo), unregistered afterwards."""
    register_loss("zz_tagged", display="ZZ tagged", order=99, tags={"demo"})(_PlainCE)
    register_loss("zz_untagged", display="ZZ untagged", order=100)(_PlainCE)
    try:
        yield
    finally:
        LOSSES.unregister("zz_tagged")
        LOSSES.unregister("zz_untagged")


def test_adding_a_loss_touches_no_cli_experiments_or_report_file(demo_configs, user_losses):
    """A loss registered with `tags={"demo"}` is in the demo's --full and digits tables, its
    --loss-arg is accepted; an untagged one is named in the report with the reason."""
    assert applicable_losses()[-1] == "zz_tagged" and "zz_untagged" not in applicable_losses()
    for cfg in (DemoConfig(full=True), DemoConfig(benchmark="digits")):
        jobs = demo_configs(cfg, Path("/x"))
        assert "zz_tagged" in {j.loss for j in jobs}
        assert "zz_untagged" not in {j.loss for j in jobs}
    # the default MNIST-1D size trains the claims' losses only: the new loss is for --full
    assert "zz_tagged" not in {j.loss for j in demo_configs(DemoConfig(), Path("/x"))}
    assert parse_demo_loss_args(["zz_tagged:reduction=sum"], applicable_losses()) == {
        "zz_tagged": {"reduction": "sum"}}
    cfg = DemoConfig(full=True, seeds=(0,))
    assert "ZZ tagged" in intro_text(cfg, demo_configs(cfg, Path("/x")))  # trained
    text = appendix_text(cfg, demo_configs(cfg, Path("/x")))
    assert "ZZ tagged" not in text.split("not trained")[1]
    assert "| ZZ untagged | its registry entry has no `demo` tag |" in text


def test_a_user_loss_trains_through_the_demo_command(user_losses, tmp_path, capsys):
    """The command line's demo trains the tagged loss in this process (its registry is here)."""
    out = tmp_path / "demo"
    assert main(["demo", "--benchmark", "digits", "--losses", "zz_tagged", "--seeds", "0,",
                 "--epochs", "1", "--workers", "1", "--no-progress", "--no-figures",
                 "--out", str(out)]) == 0
    assert "ZZ tagged" in capsys.readouterr().out
    assert (out / "runs" / "zz_tagged" / "seed0" / "results.json").is_file()


def test_benchmarks_are_registered_data():
    assert list_benchmarks("calibration") == ["mnist1d", "digits"]
    assert list_benchmarks() == ["mnist1d", "digits", "uncertainty"]
    m = get_benchmark("mnist1d")
    assert m.recipe == "mnist1d-cnn" and m.profile("quick").epochs == 15
    with pytest.raises(ValueError, match="`benchmark`.*mnist1d, digits"):
        get_benchmark("cifar")
    with pytest.raises(ValueError, match="missing \\['full'\\]"):
        Benchmark(name="x", title="x", recipe="digits-mlp",
                  profiles={"default": Profile(seeds=(0,)), "quick": Profile(seeds=(0,))})


def test_executor_options_are_checked_before_anything_runs(tmp_path, capsys, monkeypatch):
    import torchcal.experiments.ray_executor as ray_executor

    out = tmp_path / "never"
    assert main(["demo", "--ray-address", "auto", "--out", str(out)]) == 2
    assert "`--ray-address` needs `--executor ray`" in capsys.readouterr().err
    monkeypatch.setattr(ray_executor, "ray_available", lambda: False)  # the registered check
    assert main(["demo", "--executor", "ray", "--out", str(out)]) == 2
    assert 'pip install "torchcal[ray]"' in capsys.readouterr().err
    assert not out.exists()


def _toy_unit(spec):
    return {"twice": 2 * spec["x"], "error": "boom" if spec["x"] == 3 else None}


class _ToyKind(BenchmarkKind):
    """A benchmark of its own kind: one unit per seed, a one-line report per unit."""

    def resolve(self, cfg, bench):
        if cfg.losses:
            raise ValueError("no --losses here")
        return dataclasses.replace(cfg, seeds=cfg.seeds or bench.profile(cfg.profile).seeds)

    def plan(self, cfg, bench, out):
        specs = [{"x": s} for s in cfg.seeds]
        return [Job(f"seed {s['x']}", bench.job_fn, s) for s in specs], specs

    def report(self, cfg, bench, out, specs, results, seconds):
        assert (out / LOCK_NAME).is_file()  # written while run_demo owns the directory
        write_report_pages(out, "toy", "# toy\n\n" + "\n".join(
            f"- {s['x']}: {r.get('twice')}" for s, r in zip(specs, results, strict=True)))
        return [r.get("twice") for r in results], [(r["name"], r["error"]) for r in results
                                                   if r["error"]]


def test_a_benchmark_of_another_kind_runs_through_run_demo(tmp_path, monkeypatch):
    """Issue 32 item 1: one framework: a registered benchmark with its own kind gets run_demo's
    fresh directory, lock, executor and runner; its kind makes the jobs from the profile and
    writes report.md and report.html through the report engine."""
    monkeypatch.chdir(tmp_path)
    profiles = {"default": (1,), "quick": (2, 3), "full": (1, 2, 3)}
    register_benchmark(Benchmark(
        name="toy-kind", title="toy", recipe="", job_fn=_toy_unit, kind=_ToyKind(),
        profiles={k: Profile(seeds=v) for k, v in profiles.items()}))
    try:
        assert list_benchmarks("toy-kind") == ["toy-kind"]
        assert "toy-kind" not in list_benchmarks("calibration")
        res = run_demo(DemoConfig(benchmark="toy-kind", quick=True, progress=False),
                       LocalExecutor(workers=1))
        assert res.report == [4, 6] and res.failed == [("seed 3", "boom")]
        assert res.config.seeds == (2, 3) and res.out_dir.parent == tmp_path / "torchcal-demo"
        assert "- 2: 4" in (res.out_dir / "report.md").read_text()
        assert "<li>2: 4</li>" in (res.out_dir / "report.html").read_text()
        assert not (res.out_dir / LOCK_NAME).exists()
        again = run_demo(DemoConfig(benchmark="toy-kind", progress=False, workers=1))
        assert again.out_dir != res.out_dir and again.report == [2]
        with pytest.raises(ValueError, match="no --losses here"):
            run_demo(DemoConfig(benchmark="toy-kind", losses=("ce",), out=tmp_path / "no"))
        assert not (tmp_path / "no").exists()
    finally:
        BENCHMARKS.unregister("toy-kind")


def _fresh(code: str) -> str:
    """The stdout of ``code`` run in a fresh interpreter with this checkout's torchcal."""
    import os
    import subprocess
    import sys

    src = str(Path(__file__).resolve().parents[2] / "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                         text=True)
    return out.stdout.strip()


def test_a_worker_imports_no_benchmark_demo_or_report_module():
    """Issue 43 (2): a demo worker's start-up imports the runner and the job function, not the
    benchmarks (their losses' tables, the report's claims), the demo or the report; its SGD
    does not import torch._dynamo."""
    out = _fresh(
        "import sys, torch, torchcal.experiments.runner, torchcal.experiments.training\n"
        "from torchcal.train.run import SGD\n"
        "SGD([torch.nn.Parameter(torch.zeros(3))], lr=0.1, momentum=0.9)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('torchcal.experiments.',\n"
        "      'torchcal.report', 'torch._dynamo', 'matplotlib', 'sklearn'))))\n")
    assert out == str(["torchcal.experiments.runner", "torchcal.experiments.training"])


@pytest.mark.parametrize("first", ["torchcal.experiments.calibration",
                                   "torchcal.experiments.uncertainty",
                                   "torchcal.experiments.benchmark", "torchcal.experiments"])
def test_the_benchmarks_register_in_one_order_whatever_is_imported_first(first):
    """The built-in benchmarks register on the table's first lookup (the package imports none of
    them), in the order of BUILTIN_MODULES whichever module a program imports first."""
    out = _fresh(f"import {first}\nfrom torchcal.experiments import list_benchmarks\n"
                 "print(list_benchmarks())")
    assert out == str(["mnist1d", "digits", "uncertainty"])


def test_every_public_name_imports_from_the_lazy_package():
    import torchcal.experiments as ex

    for name in ex.__all__:
        assert getattr(ex, name) is not None
    assert set(ex.__all__) <= set(dir(ex))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        ex.not_a_name  # noqa: B018


def test_the_ray_executor_is_registered_without_importing_its_module_first():
    """The lazy package (issue 43 item 2) left ``torchcal demo --executor ray`` refused as an
    unknown choice: the executor table now imports its built-in executors on first lookup, in
    a fresh interpreter that imported only the runner (ray itself stays unimported)."""
    import subprocess
    import sys

    code = ("import sys; from torchcal.experiments.runner import EXECUTORS\n"
            "print(sorted(EXECUTORS.names()), 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    assert out == "['local', 'ray'] False", out


def test_demo_config_names_its_benchmark_benchmark():
    """``DemoConfig.benchmark`` (issue 40: a benchmark, not a data set); the command line
    takes ``--benchmark``."""
    from torchcal.cli import build_parser

    new = DemoConfig(benchmark="digits")
    assert "dataset" not in {f.name for f in dataclasses.fields(DemoConfig)}
    with pytest.raises(TypeError, match="dataset"):
        DemoConfig(dataset="digits")
    assert not hasattr(new, "dataset")
    assert dataclasses.replace(new, seeds=(1,)).benchmark == "digits"
    parser = build_parser()
    assert parser.parse_args(["demo", "--benchmark", "digits"]).benchmark == "digits"


def test_a_benchmark_without_kind_trains_runs_and_the_kinds_are_public():
    """Issue 49: a Benchmark defined in a notebook needs no ``kind=`` (the training runs per
    loss and seed, ``torchcal.experiments.TRAINING_RUNS``, are the default), also in a fresh
    interpreter that imported nothing of the demo; the kinds import from torchcal.experiments."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from torchcal.experiments import Benchmark, Profile\n"
            "demo_before = 'torchcal.experiments.demo' in sys.modules\n"
            "b = Benchmark(name='nb', title='nb', recipe='digits-mlp',\n"
            "              profiles={p: Profile(seeds=(0,)) for p in ('default', 'quick', 'full')})\n"
            "from torchcal.experiments import TRAINING_RUNS\n"
            "print(demo_before, b.kind is TRAINING_RUNS, b.suite)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    assert out == "False True calibration", out
    from torchcal.experiments import TRAINING_RUNS, UNCERTAINTY_SUITE, Benchmark, get_benchmark
    assert get_benchmark("digits").kind is TRAINING_RUNS
    assert get_benchmark("uncertainty").kind is UNCERTAINTY_SUITE
    with pytest.raises(TypeError, match="`kind` to be a BenchmarkKind .*TRAINING_RUNS"):
        Benchmark(name="x", title="x", recipe="", profiles=get_benchmark("digits").profiles,
                  kind="training-runs")

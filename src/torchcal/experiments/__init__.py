"""Experiments as data: benchmarks, and one sweep runner with two executors (layer 6).

A **benchmark** is data (:class:`Benchmark`): its recipe, its sizes (:class:`Profile`
``default`` / ``quick`` / ``full``), the loss tag that selects its losses from the loss
registry, per-loss arguments, the claims its report tests, the repository path of its committed
full run (the verdicts a report quotes are computed from it), its report prose and the job
function of one run.  Benchmarks are registered by name (:func:`register_benchmark`,
:func:`get_benchmark`, :func:`list_benchmarks`) and every one runs through :func:`run_demo`
(one lock on its output directory, a fresh directory by default, the runner below).  The
calibration benchmarks ``mnist1d`` and ``digits`` (``torchcal demo --benchmark NAME``) are defined
in :mod:`torchcal.experiments.calibration`; their kind, :data:`TRAINING_RUNS` (one training
run per loss and seed), is the default of ``Benchmark(kind=...)``.  A benchmark of another kind
(:class:`BenchmarkKind`: how its jobs are made from a profile and how its report is written;
:data:`UNCERTAINTY_SUITE`) is the uncertainty benchmark ``uncertainty`` (``torchcal demo --suite uncertainty``: Kirchhof
et al. 2024's pretrained uncertainty heads and Kendall et al. 2018's multi-task weighting),
defined in :mod:`torchcal.experiments.uncertainty`.

The **runner** executes units of work.  The API other work builds on:

* :class:`Job` ``(name, fn, spec, labels={}, resources=Resources(cpus=1, gpus=0))``: one unit of
  work.  ``fn`` is a module-level function called as ``fn(spec)`` in a worker process or a Ray
  task; it returns a JSON-able dict with ``"error"`` (None on success) and optionally
  ``"skipped"``; it reports its failures instead of raising.  ``labels`` name the job in the
  result the runner writes when its process dies.  The function is pluggable: one training run
  (:func:`~torchcal.experiments.training.run_pack_job`, the one job function of training runs:
  a job built by :func:`pack_job` carries a pack of resolved TrainConfigs,
  :func:`torchcal.train.packs.form_packs`; a run alone is a pack of one), another benchmark's
  unit.
* :func:`run_sweep` ``(jobs, executor=None, *, progress=True, desc="torchcal demo") -> list[dict]``:
  executes the jobs behind one progress bar and returns one result per job, in the jobs' order
  (``name`` and ``seconds`` added to each).  A job that stands for several runs (a packed
  model) returns its per-run results in its own dict (under ``"outcomes"``), names its run
  directories in ``labels`` and asks for the resources of the whole pack.
* Executors (the :class:`~torchcal.experiments.runner.Executor` protocol: ``run(jobs,
  on_done)``), registered by name (:func:`register_executor`, :class:`ExecutorType`;
  ``torchcal demo --executor`` offers each):
  :class:`LocalExecutor` ``(workers=2)``: spawned worker processes of this machine, one thread
  each, or this process when ``workers`` is 1; Ctrl-C stops the workers at once.
  :class:`RayExecutor` ``(address=None | "auto" | "HOST:PORT", workers=2, max_retries=3)``:
  each job a Ray task with its CPU/GPU request, on a running cluster or (``address=None``) a
  local instance started with ``workers`` CPUs; a lost task is retried, then reported by name.
* Packed sweeps (the demo's default): runs that share a model and a recipe train as packs, one
  job per pack (:func:`torchcal.train.packs.form_packs`, :func:`pack_job`).
* Skip and resume rules belong to the job function, so that every executor follows them:
  a training run (:func:`torchcal.train.packs.train_pack`) is skipped when its directory holds its
  evaluated last epoch, resumed from its last checkpoint when unfinished, and trained afresh
  when an *identity* or *schedule* field of its TrainConfig changed (the fields' roles,
  :func:`torchcal.train.config.changed_fields`).

>>> from torchcal.experiments import Job, LocalExecutor, run_sweep
>>> [r["x"] for r in run_sweep([Job("a", dict, {"x": 1}), Job("b", dict, {"x": 2})],
...                            LocalExecutor(workers=1), progress=False)]
[1, 2]
"""

# the public surface: what a user calls (the rest is public in its module: demo, training,
# runner, calibration, uncertainty, uncertainty_report).  Each name is imported from its
# module on first use (module __getattr__), not with the package: a demo worker imports
# torchcal.experiments.runner and .training, and none of the benchmarks, the demo or the report
# (issue 43: its start-up).  The built-in benchmarks register on the first lookup of the table
# (torchcal.experiments.benchmark.BUILTIN_MODULES).
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same names for static readers: type checkers, the API reference
    from .benchmark import (
        Benchmark,
        BenchmarkKind,
        Profile,
        get_benchmark,
        list_benchmarks,
        register_benchmark,
    )
    from .demo import TRAINING_RUNS, DemoConfig, DemoResult, run_demo
    from .ray_executor import RayExecutor
    from .runner import ExecutorType, Job, LocalExecutor, Resources, register_executor, run_sweep
    from .training import pack_job
    from .uncertainty import UNCERTAINTY_SUITE

_PUBLIC = {
    "run_demo": "demo", "DemoConfig": "demo", "DemoResult": "demo",
    "Benchmark": "benchmark", "BenchmarkKind": "benchmark", "Profile": "benchmark",
    "register_benchmark": "benchmark", "get_benchmark": "benchmark",
    "list_benchmarks": "benchmark",
    "Job": "runner", "Resources": "runner", "run_sweep": "runner", "LocalExecutor": "runner",
    "ExecutorType": "runner", "register_executor": "runner",
    "pack_job": "training", "RayExecutor": "ray_executor",
    "TRAINING_RUNS": "demo", "UNCERTAINTY_SUITE": "uncertainty",
}

__all__ = [
    "run_demo", "DemoConfig", "DemoResult", "Benchmark", "BenchmarkKind", "Profile",
    "register_benchmark", "get_benchmark", "list_benchmarks",
    "Job", "Resources", "run_sweep", "pack_job", "LocalExecutor", "RayExecutor",
    "ExecutorType", "register_executor", "TRAINING_RUNS", "UNCERTAINTY_SUITE",
]


def __getattr__(name: str):
    """A public name, imported from its module on first use (then kept in the package)."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # deferred: start-up time (a worker imports none of the benchmarks); importlib, not an
    # import statement: the module is named by the table above
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))

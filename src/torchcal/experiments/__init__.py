"""Experiments as data: benchmarks, and one sweep runner with two executors (layer 6).

A **benchmark** is data (:class:`Benchmark`): its recipe, its sizes (:class:`Profile`
``default`` / ``quick`` / ``full``), the loss tag that selects its losses from the loss
registry, per-loss arguments, the claims its report tests, the repository path of its committed
full run (the verdicts a report quotes are computed from it), its report prose and the job
function of one run.  Benchmarks are registered by name (:func:`register_benchmark`,
:func:`get_benchmark`, :func:`list_benchmarks`); ``torchcal demo --dataset NAME`` runs one
(:func:`run_demo`).  The calibration benchmarks ``mnist1d`` and ``digits`` are defined in
:mod:`torchcal.experiments.calibration`.  The uncertainty benchmark (``torchcal demo --suite
uncertainty``: Kirchhof et al. 2024's pretrained uncertainty heads and Kendall et al. 2018's
multi-task weighting) is defined in :mod:`torchcal.experiments.uncertainty`: its units are
jobs of the same runner (:func:`run_uncertainty_suite`).

The **runner** executes units of work.  The API other work builds on:

* :class:`Job` ``(name, fn, spec, labels={}, resources=Resources(cpus=1, gpus=0))``: one unit of
  work.  ``fn`` is a module-level function called as ``fn(spec)`` in a worker process or a Ray
  task; it returns a JSON-able dict with ``"error"`` (None on success) and optionally
  ``"skipped"``; it reports its failures instead of raising.  ``labels`` name the job in the
  result the runner writes when its process dies.  The function is pluggable: one training run
  (:func:`~torchcal.experiments.training.run_job`, built by :func:`train_job` from a run spec),
  several runs trained as one packed model, another benchmark's run.
* :func:`run_sweep` ``(jobs, executor=None, *, progress=True, desc="torchcal demo") -> list[dict]``:
  executes the jobs behind one progress bar and returns one result per job, in the jobs' order
  (``name`` and ``seconds`` added to each).  A job that stands for several runs (a packed
  model) returns its per-run results in its own dict (e.g. under ``"runs"``), names its run
  directories in ``labels`` and asks for the resources of the whole pack.
* Executors (the :class:`Executor` protocol: ``run(jobs, on_done)``):
  :class:`LocalExecutor` ``(workers=2)``: spawned worker processes of this machine, one thread
  each, or this process when ``workers`` is 1; Ctrl-C stops the workers at once.
  :class:`RayExecutor` ``(address=None | "auto" | "HOST:PORT", workers=2, max_retries=3)``:
  each job a Ray task with its CPU/GPU request, on a running cluster or (``address=None``) a
  local instance started with ``workers`` CPUs; a lost task is retried, then reported by name.
* Packed sweeps (:mod:`torchcal.experiments.packed`, the demo's default): runs that share a
  model and a recipe train as packs, one job per pack (:func:`torchcal.train.train_packed`).
* Skip and resume rules belong to the job function, so that every executor follows them:
  a training run (:mod:`torchcal.experiments.training`) is skipped when its directory holds its
  evaluated last epoch, resumed from its last checkpoint when unfinished, and trained afresh
  when an *identity* or *schedule* field of its TrainConfig changed (the fields' roles,
  :func:`torchcal.train.config.changed_fields`).

>>> from torchcal.experiments import Job, LocalExecutor, run_sweep
>>> [r["x"] for r in run_sweep([Job("a", dict, {"x": 1}), Job("b", dict, {"x": 2})],
...                            LocalExecutor(workers=1), progress=False)]
[1, 2]
"""

from .benchmark import (
    BENCHMARKS,
    Benchmark,
    Profile,
    committed_verdicts,
    get_benchmark,
    list_benchmarks,
    register_benchmark,
    tagged_losses,
)
from .calibration import ADAFOCAL_LAM, CLAIM_LOSSES, DEMO_LOSS_KWARGS, adafocal_note
from .demo import (
    DemoConfig,
    DemoResult,
    appendix_text,
    applicable_losses,
    default_out,
    demo_jobs,
    demo_loss_kwargs,
    intro_text,
    resolve,
    run_demo,
    sweep_jobs,
    verdict_label,
)
from .packed import CPU_PACK_SIZE, expand_results, pack_jobs, run_packed_job
from .ray_executor import RayExecutor, ray_available
from .uncertainty import run_uncertainty_suite
from .runner import (
    EXECUTORS,
    Executor,
    ExecutorType,
    Job,
    LocalExecutor,
    Resources,
    failed_result,
    make_executor,
    register_executor,
    run_sweep,
)
from .training import is_finished, is_stale, resolve_spec, run_job, train_config, train_job

__all__ = [
    "Job", "Resources", "Executor", "LocalExecutor", "RayExecutor", "ray_available", "run_sweep",
    "failed_result", "train_job", "run_job", "train_config", "resolve_spec", "is_stale",
    "is_finished", "EXECUTORS", "ExecutorType", "register_executor", "make_executor",
    "Benchmark", "Profile", "BENCHMARKS", "register_benchmark", "get_benchmark", "list_benchmarks",
    "tagged_losses", "committed_verdicts", "DemoConfig", "DemoResult", "run_demo", "demo_jobs",
    "sweep_jobs", "resolve", "demo_loss_kwargs", "applicable_losses", "default_out", "intro_text",
    "appendix_text", "verdict_label", "CLAIM_LOSSES", "DEMO_LOSS_KWARGS", "ADAFOCAL_LAM", "adafocal_note",
    "run_uncertainty_suite", "pack_jobs", "run_packed_job", "expand_results", "CPU_PACK_SIZE",
]

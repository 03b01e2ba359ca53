"""The training runs of a benchmark: each run a resolved :class:`~torchcal.train.TrainConfig`
(:func:`benchmark_config`), the packs formed once (:func:`torchcal.train.packs.form_packs`),
one :class:`~torchcal.experiments.runner.Job` per pack (:func:`pack_job`) and one job function,
:func:`run_pack_job`, which trains its pack by the one sequence
(:func:`torchcal.train.packs.train_pack`: lock, skip if finished, clear if stale, resume,
train, retry a refused checkpoint, check the results) and returns one
:class:`~torchcal.train.packs.RunOutcome` per run (:func:`outcomes_of` reads them back).

A run's labels (its run directory, loss and seed) are its config's ``out_dir``, ``loss`` and
``seed``.  Workers receive the configs themselves (pickled): a worker process or a Ray task
trains the config it is given and never looks the recipe up, so a recipe registered only in the
parent process (a notebook, a script, ``python -c``, a Ray driver) trains there as it would in
the parent; the recipe is resolved once per run, in the parent.

Which differences between the run directory and the config retrain a run is read from the roles
of TrainConfig's fields (:func:`torchcal.train.config.changed_fields`): a changed *identity* or
*schedule* field trains the run afresh (a fresh run with these settings must give the reported
numbers), a changed *runtime* field does not (:func:`torchcal.train.packs.is_stale`).
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..train import TrainConfig, get_recipe
from ..train.config import grouped_name
from ..train.packs import Pack, RunOutcome, train_pack
from .runner import Job, Resources, set_threads

__all__ = ["benchmark_config", "pack_job", "run_pack_job", "outcomes_of", "PACK_KEY"]

#: The key of a pack job's spec (the :class:`~torchcal.train.packs.Pack`) and of its labels.
PACK_KEY = "pack"


def benchmark_config(recipe: str, *, loss: str, seed: int, run_dir: str,
                     loss_kwargs: Mapping[str, Any] | None = None, epochs: int | None = None,
                     n_bins: int = 15, data_kwargs: Mapping[str, Any] | None = None,
                     overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """The TrainConfig of one benchmark run: the recipe's, with the run's loss, loss arguments,
    seed and run directory, ``epochs`` (None: the recipe's; milestones kept at the recipe's
    fractions), data options over the recipe's, and ``overrides`` (other TrainConfig fields; a
    plug-in group as a dict of its fields over the recipe's); one thread on the CPU, a
    checkpoint every tenth of the epochs, the last epoch evaluated.

    >>> c = benchmark_config("digits-mlp", loss="focal", seed=3, run_dir="runs/focal/seed3",
    ...                      epochs=10)
    >>> c.loss, c.seed, c.epochs, c.checkpoint_every, c.num_threads, c.evaluate
    ('focal', 3, 10, 1, 1, True)

    Raises:
        ValueError: an unknown TrainConfig field in ``overrides`` (naming the field it moved
            to, if any), or ``evaluate=False`` (a benchmark run is evaluated at its last epoch).
    """
    cfg = get_recipe(recipe)
    fields = {f.name for f in dataclasses.fields(cfg)}
    upd: dict[str, Any] = {
        "loss": loss, "loss_kwargs": dict(loss_kwargs or {}), "seed": seed, "out_dir": run_dir,
        "device": "auto", "num_threads": 1, "progress": False,
    }
    if epochs is not None and int(epochs) != cfg.epochs:
        # keep the recipe's schedule shape: milestones at the same fractions of training
        e = int(epochs)
        upd["epochs"] = e
        if not getattr(cfg, "milestone_fractions", None):  # else the trainer scales them
            upd["milestones"] = sorted({max(1, round(m * e / cfg.epochs)) for m in cfg.milestones
                                        if m < cfg.epochs})
    # the benchmark evaluates the last epoch only: no per-epoch test pass, no best checkpoint; a
    # checkpoint every tenth of the epochs (a few ms each): running the sweep again into the
    # same directory resumes an interrupted run from there instead of training it from epoch 0
    for k, v in (("eval_test_every", 0), ("select_best_by", "none"), ("resume", True),
                 ("checkpoint_every", max(1, upd.get("epochs", cfg.epochs) // 10)),
                 ("evaluate", True), ("n_bins", int(n_bins))):
        if k in fields:
            upd[k] = v
    if "data_kwargs" in fields:
        upd["data_kwargs"] = {**dict(cfg.data_kwargs or {}), **dict(data_kwargs or {})}
    upd.update(overrides or {})
    unknown = sorted(set(upd) - fields)
    if unknown:
        moved = {k: grouped_name(TrainConfig, k) for k in unknown}
        hint = "".join(f"; `{k}` is `{w}`" for k, w in moved.items() if w)
        raise ValueError(f"TrainConfig has no field(s) {unknown}{hint}")
    for k, v in upd.items():  # a plug-in group as a dict: its fields over the recipe's
        if isinstance(v, Mapping) and dataclasses.is_dataclass(getattr(cfg, k)):
            upd[k] = dataclasses.replace(getattr(cfg, k), **v)
    out = dataclasses.replace(cfg, **upd)
    if not out.evaluate:
        raise ValueError("Expected the run's `overrides` not to set evaluate=False: a "
                         "benchmark run is evaluated at its last epoch (its results file "
                         f"is what the report reads), got it for {run_dir!r}")
    return out


def _labels(config: TrainConfig) -> dict[str, Any]:
    return {"run_dir": str(config.out_dir), "loss": config.loss, "seed": config.seed}


def pack_job(pack: Pack, *, fn: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
             ) -> Job:
    """The :class:`~torchcal.experiments.runner.Job` of ``pack`` (a run alone is a pack of
    one): named as the pack (``"ce seed 0"``, ``"pack 2 (ce 0, focal 1)"``), executed by
    ``fn`` (default :func:`run_pack_job`) on ``{"pack": pack}``, labelled with its runs (their
    run directories, losses and seeds), asking for one CPU, and one GPU when it trains on
    CUDA."""
    return Job(name=pack.name, fn=fn or run_pack_job, spec={PACK_KEY: pack},
               labels={PACK_KEY: [_labels(c) for c in pack.configs]}, n_runs=len(pack.configs),
               resources=Resources(cpus=1.0, gpus=1.0 if pack.cuda else 0.0))


def run_pack_job(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The job function of a pack (:func:`pack_job`), in a worker process or a Ray task: one
    thread, then :func:`~torchcal.train.packs.train_pack` on ``spec["pack"]``.

    Returns:
        ``{"error": None, "outcomes": [RunOutcome.to_json() per run]}``, or ``{"error",
        "traceback"}`` when the pack could not be trained at all (:func:`outcomes_of` then
        fails each of its runs with that error).
    """
    try:
        set_threads(1)
        outcomes = train_pack(spec[PACK_KEY])
    except Exception as exc:  # reported, the other jobs go on
        return {"error": f"{type(exc).__name__}: {exc}",
                "traceback": "".join(traceback.format_exception(exc))}
    return {"error": None, "outcomes": [o.to_json() for o in outcomes]}


def outcomes_of(jobs: Sequence[Job], results: Sequence[Mapping[str, Any]]) -> list[RunOutcome]:
    """One :class:`~torchcal.train.packs.RunOutcome` per run of ``jobs`` (pack jobs), from a
    sweep's ``results`` (in the order of ``jobs``): a job's own outcomes, or, when the job
    failed as a whole (its worker died, its pack could not be trained), a failed outcome for
    each of its runs with the job's error."""
    out: list[RunOutcome] = []
    for job, r in zip(jobs, results, strict=True):
        if r.get("error") is None and "outcomes" in r:
            out.extend(RunOutcome.from_json(o) for o in r["outcomes"])
        else:
            err = r.get("error") or "the pack reported no runs"
            out.extend(RunOutcome(**lab, error=err, traceback=r.get("traceback"))
                       for lab in job.labels[PACK_KEY])
    return out

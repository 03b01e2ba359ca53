"""Packed sweeps: a sweep's runs that share a model and a recipe trained as packs, one
:class:`~torchcal.experiments.runner.Job` per pack (:mod:`torchcal.train.packed`).

:func:`pack_jobs` turns run specs (:mod:`torchcal.experiments.training`) into jobs: runs whose
TrainConfigs differ only in seed, loss, loss arguments and run directory
(:func:`torchcal.train.packed.pack_groups`) form packs; a run that cannot be packed stays a job
of the benchmark's own job function.  :func:`run_packed_job` follows the rules of
:func:`~torchcal.experiments.training.run_job` for every member (finished runs skipped,
unfinished ones resumed, runs of other settings trained afresh) and reports one result per run
under ``"members"``; :func:`expand_results` turns a sweep's results back into one result per
run (also for a pack whose worker died), so the report reads the runs as before.

Pack sizes: on the CPU a pack holds at most :data:`CPU_PACK_SIZE` runs (measured,
``benchmarks/results/packing.md``) and there are at least as many packs as workers; on a GPU
(a run's ``device`` override ``cuda``) every packable run goes into one pack.
"""

from __future__ import annotations

import contextlib
import math
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .._io import exclusive_lock
from ..errors import CheckpointError
from ..evaluate import evaluate_saved_logits
from ..runs import RunDir
from ..train.checkpoint import remove_stale_run_temp_files
from ..train.packed import pack_groups, train_packed
from .runner import Job, Resources, set_threads
from .training import (
    clear_run_dir,
    is_finished,
    is_stale,
    resolve_spec,
    retrain_reason,
    run_meta,
    train_config,
    train_job,
    warn_untrusted_results,
)

__all__ = ["CPU_PACK_SIZE", "pack_jobs", "run_packed_job", "expand_results"]

#: The most runs of one CPU pack (one thread per worker process); see the module docstring.
CPU_PACK_SIZE = 5


def _labels(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {"run_dir": spec["run_dir"], "loss": spec["loss"], "seed": spec["seed"]}


def pack_jobs(specs: Sequence[Mapping[str, Any]], *,
              fn: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None,
              max_members: int | None = None) -> list[Job]:
    """The jobs of a packed sweep over the run ``specs``.

    The packs depend on the specs alone (never on the executor's workers), so a run's numbers
    do not depend on the workers either: in a pack of a given size a member's computations are
    the same whichever runs share it (a run alone trains unpacked, as with ``--no-pack``).  A
    pack of another size may round differently (the CPU's kernels block the packed batch by
    size), so another selection of runs can move a run's numbers at the float-rounding level.

    Args:
        specs: run specs (:func:`~torchcal.experiments.training.train_config`).
        fn: the job function of a run that is not packed (default ``run_job``).
        max_members: the most runs in one pack (None: :data:`CPU_PACK_SIZE` on the CPU, no
            limit on a GPU).  A CPU sweep has an even number of packs, so that the default two
            workers finish together.
    """
    specs = [resolve_spec(s) for s in specs]  # workers get the resolved TrainConfig dicts
    configs = [train_config(s) for s in specs]
    jobs: list[Job] = []
    for group in pack_groups(configs):
        device = configs[group[0]].device
        cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
        size = max_members or (len(group) if cuda else CPU_PACK_SIZE)
        n_packs = math.ceil(len(group) / size)
        if not cuda:
            n_packs = min(len(group), 2 * math.ceil(n_packs / 2))
        for k in range(n_packs):
            members = group[k::n_packs]  # seed-major specs: each pack mixes losses and seeds
            if len(members) == 1:
                jobs.append(train_job(specs[members[0]], fn=fn))
                continue
            names = ", ".join(f"{specs[i]['loss']} {specs[i]['seed']}" for i in members)
            jobs.append(Job(name=f"pack {len(jobs) + 1} ({names})", fn=run_packed_job,
                            spec={"runs": [dict(specs[i]) for i in members]},
                            labels={"runs": [_labels(specs[i]) for i in members]},
                            n_runs=len(members), resources=Resources(cpus=1.0, gpus=1.0 if cuda else 0.0)))
    return jobs


def _error(out: dict[str, Any], exc: BaseException) -> None:
    out["error"] = f"{type(exc).__name__}: {exc}"
    out["traceback"] = "".join(traceback.format_exception(exc))


def _train_members(runs: list[Mapping[str, Any]], todo: list[int],
                   out: list[dict[str, Any]]) -> None:
    """Train the runs ``todo`` packed; a run whose directory holds a checkpoint of other
    settings (CheckpointError) is cleared and trained afresh, as ``run_job`` does."""
    res = train_packed([train_config(runs[i]) for i in todo])
    retry = [i for i, r in zip(todo, res, strict=True) if isinstance(r, CheckpointError)]
    for i in retry:
        clear_run_dir(Path(runs[i]["run_dir"]), retrain_reason(res[todo.index(i)]))
    if retry:
        again = dict(zip(retry, train_packed([train_config(runs[i]) for i in retry]),
                         strict=True))
        res = [again.get(i, r) for i, r in zip(todo, res, strict=True)]
    for i, r in zip(todo, res, strict=True):
        try:
            if isinstance(r, BaseException):
                raise r
            if not RunDir(runs[i]["run_dir"]).results().is_file():
                evaluate_saved_logits(runs[i]["run_dir"], n_bins=runs[i]["n_bins"],
                                      meta=run_meta(runs[i]))
        except Exception as exc:  # noqa: BLE001 - this run failed, the others are reported
            _error(out[i], exc)


def run_packed_job(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Train the runs ``spec["runs"]`` as one pack and evaluate their saved logits.

    Returns:
        ``{"error": None, "members": [one run_job-style result per run]}`` (``error`` of the
        pack itself only when no member could be reported).
    """
    t0 = time.perf_counter()
    runs = list(spec["runs"])
    out = [{**_labels(s), "error": None, "skipped": False} for s in runs]
    set_threads(1)
    todo = []
    with contextlib.ExitStack() as stack:
        for i, s in enumerate(runs):
            try:
                run_dir, config = Path(s["run_dir"]), train_config(s)
                stack.enter_context(exclusive_lock(run_dir))  # held until evaluated
                remove_stale_run_temp_files(run_dir)
                if is_stale(run_dir, config):
                    clear_run_dir(run_dir)
                elif is_finished(run_dir, config):
                    out[i]["skipped"] = True
                    continue
                else:
                    warn_untrusted_results(run_dir)
                todo.append(i)
            except Exception as exc:  # noqa: BLE001 - reported, the other runs go on
                _error(out[i], exc)
        if todo:
            _train_members(runs, todo, out)
    seconds = (time.perf_counter() - t0) / len(runs)
    for o in out:
        o["seconds"] = seconds
        o["packed"] = len(todo)
    return {"error": None, "members": out}


def expand_results(jobs: Sequence[Job], results: Sequence[Mapping[str, Any]]
                   ) -> list[dict[str, Any]]:
    """One result per run from a sweep's ``results`` (in the order of ``jobs``): a pack's
    ``members``, or, when a pack's job failed as a whole (its worker died), one failed result
    per run of its labels; other results unchanged."""
    flat: list[dict[str, Any]] = []
    for job, r in zip(jobs, results, strict=True):
        if "members" in r:
            flat.extend(dict(m) for m in r["members"])
        elif "runs" in job.labels:
            flat.extend({**m, "error": r.get("error") or "the pack reported no runs",
                         "skipped": False, "seconds": 0.0} for m in job.labels["runs"])
        else:
            flat.append(dict(r))
    return flat

"""Packed sweeps: a sweep's runs that share a model and a recipe trained as packs, one
:class:`~torchcal.experiments.runner.Job` per pack (:mod:`torchcal.train.packed`).

:func:`pack_jobs` turns run specs (:mod:`torchcal.experiments.training`) into jobs: runs whose
TrainConfigs differ only in seed, loss, loss arguments and run directory
(:func:`torchcal.train.packed.pack_groups`) form packs; a run that cannot be packed stays a job
of the benchmark's own job function.  :func:`run_packed_job` trains its pack through the one job sequence of a run alone,
:func:`~torchcal.experiments.training.train_runs` (finished runs skipped, unfinished ones
resumed, runs of other settings trained afresh), and reports one result per run under
``"members"``; :func:`expand_results` turns a sweep's results back into one result per
run (also for a pack whose worker died), so the report reads the runs as before.

Pack sizes: on the CPU a pack holds at most :data:`CPU_PACK_SIZE` runs (measured,
``benchmarks/results/packing.md``) and there are at least as many packs as workers; on a GPU
(a run's ``device`` override ``cuda``) every packable run goes into one pack.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..train.packed import pack_groups
from .runner import Job, Resources, set_threads
from .training import RunSpec, is_cuda, run_spec, train_job, train_runs

__all__ = ["CPU_PACK_SIZE", "pack_jobs", "run_packed_job", "expand_results"]

#: The most runs of one CPU pack (one thread per worker process); see the module docstring.
CPU_PACK_SIZE = 5
# The key of a pack job's runs: in its spec and labels (JSON specs, labels) and in its result.
PACK_KEY = "members"


def pack_jobs(specs: Sequence[RunSpec | Mapping[str, Any]], *,
              fn: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None,
              max_members: int | None = None) -> list[Job]:
    """The jobs of a packed sweep over the run ``specs``: the packs are formed here, once
    (:func:`~torchcal.train.packed.pack_groups`); a worker trains the pack it is given.

    The packs depend on the specs alone (never on the executor's workers), so a run's numbers
    do not depend on the workers either: in a pack of a given size a member's computations are
    the same whichever runs share it (a run alone trains unpacked, as with ``--no-pack``).  A
    pack of another size may round differently (the CPU's kernels block the packed batch by
    size), so another selection of runs can move a run's numbers at the float-rounding level.

    Args:
        specs: run specs (:class:`~torchcal.experiments.training.RunSpec`, or JSON specs
            resolved here once, :func:`~torchcal.experiments.training.run_spec`).
        fn: the job function of a run that is not packed (default ``run_job``).
        max_members: the most runs in one pack (None: :data:`CPU_PACK_SIZE` on the CPU, no
            limit on a GPU).  A CPU sweep has an even number of packs, so that the default two
            workers finish together.
    """
    specs = [run_spec(s) for s in specs]  # workers get the resolved TrainConfig dicts
    jobs: list[Job] = []
    for group in pack_groups([s.config for s in specs]):
        cuda = is_cuda(specs[group[0]].config.device)
        size = max_members or (len(group) if cuda else CPU_PACK_SIZE)
        n_packs = math.ceil(len(group) / size)
        if not cuda:
            n_packs = min(len(group), 2 * math.ceil(n_packs / 2))
        for k in range(n_packs):
            members = [specs[i] for i in group[k::n_packs]]  # seed-major: mixes losses and seeds
            if len(members) == 1:
                jobs.append(train_job(members[0], fn=fn))
                continue
            names = ", ".join(f"{s.loss} {s.seed}" for s in members)
            jobs.append(Job(name=f"pack {len(jobs) + 1} ({names})", fn=run_packed_job,
                            spec={PACK_KEY: [s.to_json() for s in members]},
                            labels={PACK_KEY: [s.labels for s in members]},
                            n_runs=len(members),
                            resources=Resources(cpus=1.0, gpus=1.0 if cuda else 0.0)))
    return jobs


def run_packed_job(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Train the runs ``spec["members"]`` (JSON specs, a pack :func:`pack_jobs` formed) as one
    pack and evaluate them (:func:`~torchcal.experiments.training.train_runs`).

    Returns:
        ``{"error": None, "members": [one run_job-style result per run]}`` (``error`` of the
        pack itself only when no member could be reported).
    """
    t0 = time.perf_counter()
    set_threads(1)
    runs = list(spec[PACK_KEY])
    out: list[dict[str, Any]] = [None] * len(runs)  # type: ignore[list-item]
    resolved: list[RunSpec] = []
    for i, s in enumerate(runs):
        try:
            resolved.append(run_spec(s))
        except Exception as exc:  # noqa: BLE001 - reported, the other runs go on
            out[i] = {"run_dir": s["run_dir"], "loss": s["loss"], "seed": s["seed"],
                      "error": f"{type(exc).__name__}: {exc}", "skipped": False}
    trained = iter(train_runs(resolved) if resolved else [])
    out = [o if o is not None else next(trained) for o in out]
    seconds = (time.perf_counter() - t0) / len(runs)
    packed = next((o["packed"] for o in out if "packed" in o), 0)
    for o in out:
        o["seconds"] = seconds
        o["packed"] = packed
    return {"error": None, "members": out}


def expand_results(jobs: Sequence[Job], results: Sequence[Mapping[str, Any]]
                   ) -> list[dict[str, Any]]:
    """One result per run from a sweep's ``results`` (in the order of ``jobs``): a pack's
    ``members``, or, when a pack's job failed as a whole (its worker died: the runner's result
    then holds the job's labels, ``members`` too, and an ``error``), one failed result per run
    of its labels; other results unchanged."""
    flat: list[dict[str, Any]] = []
    for job, r in zip(jobs, results, strict=True):
        if PACK_KEY not in job.labels:
            flat.append(dict(r))
        elif r.get("error") is None and PACK_KEY in r:
            flat.extend(dict(m) for m in r[PACK_KEY])
        else:
            flat.extend({**m, "error": r.get("error") or "the pack reported no runs",
                         "skipped": False, "seconds": 0.0} for m in job.labels[PACK_KEY])
    return flat


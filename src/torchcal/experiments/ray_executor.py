"""The Ray executor: each job a Ray task, on a running cluster or a local Ray instance.

``pip install "torchcal[ray]"``.  Each :class:`~torchcal.experiments.runner.Job` becomes one
task asking for its resources (``num_cpus``, ``num_gpus``); a task whose worker process or node
is lost is retried by Ray (``max_retries``) and, when the retries are spent, reported by name
as a failed run while the other jobs go on.  The job function itself skips finished runs and
resumes unfinished ones from their last checkpoint, so a retried task continues where its
killed attempt stopped and a finished run is never lost or trained again.

On a cluster every node must see the run directories at the same path (a shared file system:
NFS, Lustre, a mounted bucket with POSIX semantics) and have the same torchcal and torch
installed; see the guide page "Running on a cluster".
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import one_line_warnings
from .runner import ExecutorType, Job, OnDone, call_job, failed_result, register_executor

__all__ = ["RayExecutor", "ray_available"]


def ray_available() -> bool:
    """Whether the optional ``ray`` package can be imported."""
    try:
        import ray  # noqa: F401 - optional dependency (the `ray` extra)
    except ImportError:
        return False
    return True


def _import_ray():
    try:
        import ray  # optional dependency (the `ray` extra)
    except ImportError as exc:
        raise ImportError("The Ray executor needs the `ray` package: pip install "
                          "\"torchcal[ray]\" (or pip install \"ray>=2.9\")") from exc
    return ray


def _ray_task(fn, spec: Mapping[str, Any], name: str, warning_prefix: str) -> dict[str, Any]:
    """One job inside a Ray worker: one-line warnings, then ``fn(spec)`` (errors reported)."""
    warnings.formatwarning = one_line_warnings(warning_prefix)
    return call_job(fn, spec, name)


@dataclass
class RayExecutor:
    """Jobs as Ray tasks.

    Attributes:
        address: ``None``: use the Ray instance this process already joined, else start a local
            one on this machine with ``workers`` CPUs; ``"auto"``: join the cluster this machine
            belongs to (``ray start``); ``"HOST:PORT"``: join that cluster's head node.
        workers: CPUs of a local instance started here (at most this many jobs at once).
        max_retries: how often Ray re-runs a task whose worker process or node died.
        init_kwargs: further arguments of ``ray.init`` (e.g. ``runtime_env``).
        warning_prefix: the ``torchcal COMMAND`` of the tasks' one-line warnings.
    """

    address: str | None = None
    workers: int = 2
    max_retries: int = 3
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    warning_prefix: str = "demo"

    def _init(self, ray) -> bool:
        """Join or start Ray; True when this call started it (then :meth:`run` shuts it down)."""
        if ray.is_initialized():
            return False
        kw = dict(self.init_kwargs)
        kw.setdefault("include_dashboard", False)
        kw.setdefault("log_to_driver", True)
        if self.address is None:
            ray.init(num_cpus=self.workers, **kw)
        else:
            kw.pop("include_dashboard")  # a setting of the cluster, not of a client
            ray.init(address=self.address, **kw)
        return True

    def run(self, jobs: Sequence[Job], on_done: OnDone) -> None:
        ray = _import_ray()
        started = self._init(ray)
        try:
            task = ray.remote(_ray_task)
            refs = {}
            for job in jobs:
                opts = {"num_cpus": job.resources.cpus, "num_gpus": job.resources.gpus,
                        "max_retries": self.max_retries, "retry_exceptions": False,
                        "name": job.name}
                ref = task.options(**opts).remote(job.fn, dict(job.spec), job.name,
                                                  self.warning_prefix)
                refs[ref] = job
            self._wait(ray, refs, on_done)
        finally:
            if started:
                ray.shutdown()

    def _wait(self, ray, refs: dict, on_done: OnDone) -> None:
        """Report each task as it finishes; on Ctrl-C cancel the others (their runs resume)."""
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    job = refs[ref]
                    try:
                        r = ray.get(ref)
                    except ray.exceptions.RayError as exc:  # lost after its retries
                        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                        r = failed_result(job, f"Ray task {job.name!r} failed after "
                                               f"{self.max_retries} retries: "
                                               f"{type(exc).__name__}: {msg}")
                    on_done(job, r)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise


def _missing() -> str:
    return "" if ray_available() else ("needs the `ray` package: pip install \"torchcal[ray]\" "
                                       "(or pip install \"ray>=2.9\")")


register_executor(ExecutorType(
    "ray", lambda *, workers, address=None: RayExecutor(address=address, workers=workers),
    "Ray tasks (pip install \"torchcal[ray]\"; see the guide's cluster page)", _missing))

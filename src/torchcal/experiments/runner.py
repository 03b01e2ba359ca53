"""One sweep runner: a list of :class:`Job` s, executed by an executor, with one progress bar.

A :class:`Job` is the unit of work: a name, a module-level function and its picklable
arguments (``fn(spec) -> dict``), and the resources it asks for.  The runner knows nothing
about training: :func:`torchcal.experiments.training.run_pack_job` trains and evaluates one pack
of runs (a run alone is a pack of one), another benchmark may plug in its own function.

Executors (:class:`LocalExecutor`, :class:`~torchcal.experiments.ray_executor.RayExecutor`)
only decide *where* each job's function runs; each is registered by name with how to make it
from the command line's options (:data:`EXECUTORS`, :func:`register_executor`: adding an
executor is its own module and one registration, and ``torchcal demo --executor`` offers it); skipping finished work and resuming unfinished
work is the job function's business (it reads its run directory), so every executor follows
the same rules and gives the same numbers.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from tqdm.auto import tqdm

from .._registry import Registry
from .._signals import sigterm_interrupts
from ..errors import one_line_warnings

__all__ = ["Resources", "Job", "Executor", "LocalExecutor", "run_sweep", "failed_result",
           "set_threads", "ExecutorType", "EXECUTORS", "register_executor", "make_executor"]

#: ``on_done(job, result)``: what an executor calls once per finished job (in the caller's process).
OnDone = Callable[["Job", dict[str, Any]], None]


@dataclass(frozen=True)
class Resources:
    """What one job asks of the machine that runs it (read by the Ray executor; the local
    executor runs one job per worker process, one thread each)."""

    cpus: float = 1.0
    gpus: float = 0.0


@dataclass(frozen=True)
class Job:
    """One unit of work of a sweep.

    Attributes:
        name: unique within a sweep; shown by the progress bar and in the report of a job that
            died (``"ce seed 0"``).
        fn: a module-level function (pickled by reference into worker processes and Ray tasks)
            called as ``fn(spec)``; it returns a JSON-able dict with at least ``"error"`` (None on
            success) and may add ``"skipped": True`` (nothing was left to do) and anything else
            (``run_dir``, ``loss``, ``seed``, ...).  It reports its own failures in ``"error"``
            instead of raising, so that the other jobs go on.
        spec: the arguments of ``fn`` (picklable: a pack job's holds its TrainConfigs).
        labels: copied into the result the runner writes when the job's process died (so that
            a lost job is still reported by name and run directory).
        resources: CPUs and GPUs one execution needs.
        n_runs: the runs the job trains (a pack: its lanes); the progress bar counts runs.
    """

    name: str
    fn: Callable[[Mapping[str, Any]], dict[str, Any]]
    spec: Mapping[str, Any]
    labels: Mapping[str, Any] = field(default_factory=dict)
    resources: Resources = Resources()
    n_runs: int = 1

    def __call__(self) -> dict[str, Any]:
        """Run ``fn(spec)`` here; the result gets ``name`` and ``seconds`` if ``fn`` gave none."""
        return call_job(self.fn, self.spec, self.name)


def call_job(fn: Callable[[Mapping[str, Any]], dict[str, Any]], spec: Mapping[str, Any],
             name: str) -> dict[str, Any]:
    """``fn(spec)`` with ``name`` and ``seconds`` added; an exception becomes ``"error"``."""
    t0 = time.perf_counter()
    try:
        out = dict(fn(spec))
    except Exception as exc:  # a job function should report its own errors; never lose the sweep
        out = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    out.setdefault("name", name)
    out.setdefault("error", None)
    out.setdefault("seconds", time.perf_counter() - t0)
    return out


def failed_result(job: Job, error: str) -> dict[str, Any]:
    """The result of a job whose process died or whose task was lost: its labels and ``error``."""
    return {**dict(job.labels), "name": job.name, "seconds": 0.0, "error": error,
            "skipped": False}


class Executor(Protocol):
    """Where jobs run: ``run(jobs, on_done)`` calls ``on_done(job, result)`` once per job (in
    this process, in any order) and returns when every job has a result.  Ctrl-C
    (``KeyboardInterrupt``) stops the jobs still running and propagates."""

    def run(self, jobs: Sequence[Job], on_done: OnDone) -> None: ...  # pragma: no cover


def set_threads(n: int = 1) -> None:
    """This process computes on ``n`` threads (``torch`` and the OpenMP/MKL environment), and
    keeps the memory it frees for reuse (:func:`keep_freed_memory`)."""
    os.environ["OMP_NUM_THREADS"] = str(n)
    os.environ["MKL_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # already set in this process
        torch.set_num_interop_threads(n)
    keep_freed_memory()


#: glibc's ``mallopt`` parameters (``malloc.h``) and the size below which a job's allocations
#: come from the heap (and freed ones stay there for the next step) instead of fresh pages.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_HEAP_BYTES = 256 << 20


def keep_freed_memory() -> bool:
    """Serve a job's tensor allocations up to 256 MiB from the heap and keep what it frees
    (glibc ``mallopt``; elsewhere nothing): a training step of a small network allocates and
    frees the same activation buffers every step, and by default glibc maps each large one
    afresh and unmaps it when freed, paying the page faults again (measured, a pack of 4 MNIST-1D
    runs: 2.0 s of 11.6 s in the kernel, 0.75 s of 10.0 s with this).  The process keeps its
    peak memory instead of returning it; True when applied."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _HEAP_BYTES)
                    and libc.mallopt(_M_TRIM_THRESHOLD, 2 * _HEAP_BYTES))
    except (OSError, AttributeError):  # not glibc
        return False


@dataclass
class LocalExecutor:
    """Jobs in worker processes of this machine (``spawn``, one thread each), or in this
    process when ``workers`` is 1 (the caller's threads restored afterwards).

    Ctrl-C: the workers ignore SIGINT and this process terminates them at once (SIGTERM; a run
    writes its files atomically and resumes from its last checkpoint).  SIGTERM to this process
    (``kill PID``, a job scheduler) stops the sweep the same way (``KeyboardInterrupt`` here),
    and a worker whose parent dies without stopping it (``kill -9``) is ended by the kernel
    (Linux: ``PR_SET_PDEATHSIG``), or ends itself at its next job elsewhere: no orphaned worker
    goes on training into the sweep's directory.  A worker that dies (killed, out of memory)
    fails the jobs of the broken pool by name; the next sweep resumes them.

    Attributes:
        workers: worker processes (at most one per job).
        warning_prefix: the ``torchcal COMMAND`` of the workers' one-line warnings.
    """

    workers: int = 2
    warning_prefix: str = "demo"

    def run(self, jobs: Sequence[Job], on_done: OnDone) -> None:
        workers = min(self.workers, len(jobs))
        if workers <= 1:
            with _threads_restored():
                for job in jobs:
                    on_done(job, job())
            return
        ctx = mp.get_context("spawn")
        # the workers start with SIGINT ignored (inherited through exec): a Ctrl-C reaches the
        # whole process group, and only this process handles it, by stopping them
        with _sigint_ignored():
            ex = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init,
                                     initargs=(self.warning_prefix, os.getpid()))
            futs = {ex.submit(_call_in_worker, j.fn, j.spec, j.name): j for j in jobs}
        try:
            with sigterm_interrupts():
                pending = set(futs)
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in done:
                        try:
                            r = fut.result()
                        except BrokenProcessPool as exc:  # a worker died (killed, out of memory)
                            r = failed_result(futs[fut], f"worker process died: {exc}")
                        on_done(futs[fut], r)
        except BaseException:  # Ctrl-C (KeyboardInterrupt), or anything else: stop now
            with _sigint_ignored():  # a second Ctrl-C must not interrupt the stopping
                _stop_workers(ex)
            raise
        ex.shutdown(wait=True)


@dataclass(frozen=True)
class ExecutorType:
    """A registered executor.

    Attributes:
        name: registry name (``torchcal demo --executor NAME``).
        make: ``make(workers=N, address=A) -> Executor`` (``address``: a cluster's address,
            None for none; an executor without clusters refuses one).
        summary: one line for the command line's help.
        missing: ``missing() -> str``: why it cannot run here (an absent optional package,
            with the command that installs it), ``""`` when it can.
    """

    name: str
    make: Callable[..., Executor]
    summary: str = ""
    missing: Callable[[], str] = str


#: The executor table (``torchcal demo --executor``).
#: The modules that register the built-in executors other than ``local`` (imported on the
#: table's first lookup, not with this module: a worker needs none of them).
BUILTIN_EXECUTOR_MODULES = ("torchcal.experiments.ray_executor",)

EXECUTORS: Registry[ExecutorType] = Registry("executor", modules=BUILTIN_EXECUTOR_MODULES)


def register_executor(executor: ExecutorType) -> ExecutorType:
    """Add ``executor`` to :data:`EXECUTORS` under its name; returns it."""
    return EXECUTORS.register(executor.name, executor)


def make_executor(name: str, *, workers: int = 2, address: str | None = None) -> Executor:
    """The registered executor ``name`` with ``workers`` and ``address``; ``ValueError`` for an
    unknown name (naming the registered ones) or one that cannot run here (saying why).

    >>> make_executor("local", workers=1)
    LocalExecutor(workers=1, warning_prefix='demo')
    """
    kind = EXECUTORS.get(name)
    why = kind.missing()
    if why:
        raise ValueError(f"`--executor {name}` {why}")
    return kind.make(workers=workers, address=address)


def _local(*, workers: int, address: str | None = None) -> LocalExecutor:
    if address is not None:
        raise ValueError("`--ray-address` needs `--executor ray` (the local executor joins no "
                         "cluster)")
    return LocalExecutor(workers=workers)


register_executor(ExecutorType("local", _local, "worker processes of this machine (default)"))


def run_sweep(jobs: Sequence[Job], executor: Executor | None = None, *, progress: bool = True,
              desc: str = "torchcal demo") -> list[dict[str, Any]]:
    """Execute ``jobs`` with ``executor`` (default ``LocalExecutor(workers=2)``) behind one
    progress bar (runs done, counted by each job's ``n_runs``, and time left); returns one
    result dict per job, in the jobs' order.

    >>> res = run_sweep([Job("a", dict, {"x": 1})], LocalExecutor(workers=1), progress=False)
    >>> res[0]["x"], res[0]["name"], res[0]["error"]
    (1, 'a', None)
    """
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ValueError(f"Expected `jobs` to have distinct names, got {names}")
    executor = executor if executor is not None else LocalExecutor()
    bar = tqdm(total=sum(j.n_runs for j in jobs), unit="run", desc=desc, disable=not progress, file=sys.stderr,
               smoothing=0.0,
               bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} runs [{elapsed}<{remaining} left]")
    results: dict[str, dict[str, Any]] = {}

    def on_done(job: Job, result: dict[str, Any]) -> None:
        results[job.name] = result
        bar.set_postfix_str(job.name, refresh=False)
        bar.update(job.n_runs)

    try:
        executor.run(list(jobs), on_done)
    finally:
        bar.close()
    missing = [n for n in names if n not in results]
    if missing:  # an executor's bug, never a silently shorter sweep
        raise RuntimeError(f"The executor returned no result for job(s) {missing}")
    return [results[n] for n in names]


@contextlib.contextmanager
def _threads_restored() -> Iterator[None]:
    """The caller's torch threads and OMP/MKL environment restored after the block."""
    threads = torch.get_num_threads()
    env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_PARENT_PID: int | None = None


def _worker_init(warning_prefix: str, parent_pid: int | None = None) -> None:
    """A worker: one thread, SIGINT ignored (the parent stops it), one-line warnings, and ended
    with its parent (:func:`_die_with_parent`)."""
    global _PARENT_PID
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.formatwarning = one_line_warnings(warning_prefix)
    set_threads(1)
    _PARENT_PID = parent_pid
    _die_with_parent(parent_pid)


def _die_with_parent(parent_pid: int | None) -> None:
    """Ask the kernel for SIGTERM when the parent process dies (Linux ``prctl``), and exit now
    if it already has (the request would come too late)."""
    if parent_pid is None:
        return
    if sys.platform.startswith("linux"):
        try:
            import ctypes  # here: Linux only

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - no libc prctl
            pass
    if os.getppid() != parent_pid:
        os._exit(1)


def _call_in_worker(fn: Callable[[Mapping[str, Any]], dict[str, Any]], spec: Mapping[str, Any],
                    name: str) -> dict[str, Any]:
    """:func:`call_job` in a pool worker, after checking that the sweep's process still runs
    (where the kernel cannot end orphaned workers, they end here, before their next job)."""
    if _PARENT_PID is not None and os.getppid() != _PARENT_PID:
        os._exit(1)
    return call_job(fn, spec, name)


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored for the block (main thread only; elsewhere signals cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _stop_workers(ex: ProcessPoolExecutor) -> None:
    """Terminate the pool's workers (SIGTERM: a run's files are written atomically, and the
    next sweep resumes it from its last checkpoint) and wait for them."""
    # Python < 3.14 has no ProcessPoolExecutor.terminate_workers(): its process table
    procs = list((getattr(ex, "_processes", None) or {}).values())
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    ex.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():  # pragma: no cover - did not end on SIGTERM
            proc.kill()
            proc.join(timeout=5)

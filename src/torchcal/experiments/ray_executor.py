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

Failures are reported, never waited out: an address that cannot be reached (nothing listening,
an unknown host, a port out of range) fails before ``ray.init`` in one line, within the
connection timeout (:data:`CONNECT_TIMEOUT`); SIGTERM to the driver stops the tasks as Ctrl-C
does (``KeyboardInterrupt``, the runs resume on the next sweep); and a local instance started
here is followed by a small reaper process that kills what is left of it (workers, raylet, Ray's
agents) as soon as the driver is gone, also when the driver was killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._signals import sigterm_interrupts
from ..errors import TorchcalError, one_line_warnings
from .runner import (
    ExecutorType,
    Job,
    OnDone,
    call_job,
    failed_result,
    register_executor,
)

__all__ = ["RayExecutor", "ray_available", "check_ray_address", "CONNECT_TIMEOUT"]

#: Seconds to wait for a TCP connection to a ``HOST:PORT`` Ray address before giving up.
CONNECT_TIMEOUT = 10.0


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


def check_ray_address(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Raise a one-line error when the Ray address ``HOST:PORT`` cannot be reached.

    ``"auto"`` and ``"local"`` are Ray's to resolve; ``"ray://HOST:PORT"`` (Ray Client) is
    checked as ``HOST:PORT``.  The check is one TCP connection that speaks the first step of
    Ray's protocol (the HTTP/2 greeting of gRPC), so an address with nothing listening, an
    unknown host or a port out of range fails at once, and a server that is not Ray (a web
    server) or does not answer within ``timeout`` seconds fails within ``2 * timeout`` (20 s),
    where ``ray.init`` would retry for many minutes.

    >>> check_ray_address("localhost:99999")
    Traceback (most recent call last):
    ...
    ValueError: Expected the Ray address (--ray-address) to be auto or HOST:PORT with a port in 1..65535, got 'localhost:99999'

    Raises:
        ValueError: ``address`` is not of the form ``HOST:PORT``.
        TorchcalError: nothing accepts a connection at ``HOST:PORT``, or what does is not a
            gRPC server (the reason in the message).
    """
    if address in ("auto", "local"):
        return
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    host = host.strip("[]")  # an IPv6 address in brackets
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError("Expected the Ray address (--ray-address) to be auto or HOST:PORT with "
                         f"a port in 1..65535, got {address!r}")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            problem = _grpc_problem(sock, timeout)
    except OSError as exc:  # refused, unknown host, unreachable, timed out
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise TorchcalError(f"Cannot reach the Ray cluster at {address!r}: {reason} (is its "
                            "head node running, `ray start --head`? Without --ray-address a "
                            "local Ray instance is started)") from None
    if problem:
        raise TorchcalError(f"The server at {address!r} is not a Ray cluster: {problem} (Ray's "
                            "head node answers gRPC, on port 6379 by default, 10001 for "
                            "ray://); check --ray-address")


# HTTP/2's client connection preface and an empty SETTINGS frame: a gRPC server (Ray's GCS and
# Ray Client) answers with its own SETTINGS frame; anything else answers otherwise or not at all
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 0x04


def _grpc_problem(sock: socket.socket, timeout: float) -> str:
    """Speak the first step of Ray's protocol (gRPC over HTTP/2) on a connected socket: ''
    when the server answers with an HTTP/2 SETTINGS frame, else what it did instead, within
    ``timeout`` seconds (so the whole check ends within ``2 * timeout``, where ``ray.init``
    would retry for many minutes)."""
    sock.settimeout(timeout)
    try:
        sock.sendall(_H2_PREFACE)
        head = b""
        while len(head) < 9:
            chunk = sock.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except TimeoutError:
        return f"it did not answer an HTTP/2 (gRPC) greeting within {timeout:g} s"
    except OSError as exc:
        return f"it broke the connection ({exc.strerror or exc})"
    if len(head) == 9 and head[3] == _H2_SETTINGS:
        return ""
    if not head:
        return "it closed the connection on an HTTP/2 (gRPC) greeting"
    text = head.split(b"\r\n")[0].decode("ascii", "replace")
    return f"it answered {text!r}, not HTTP/2 (gRPC)" + (
        " (a web server?)" if head.startswith(b"HTTP/") else "")


def _ray_task(fn, spec: Mapping[str, Any], name: str, warning_prefix: str) -> dict[str, Any]:
    """One job inside a Ray worker: one-line warnings, then ``fn(spec)`` (errors reported)."""
    warnings.formatwarning = one_line_warnings(warning_prefix)
    return call_job(fn, spec, name)


def _proc_table() -> dict[int, tuple[int, str]]:
    """Every process of this machine: ``pid -> (parent pid, start time)`` (Linux ``/proc``)."""
    table = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                table[int(d)] = (int(fields[1]), fields[19])
            except (OSError, IndexError, ValueError):  # ended meanwhile
                continue
    return table


# The reaper: reads "PID START" lines until the driver's end of the pipe closes (the driver
# exited, however it ended), then kills each listed process that still runs (same start time).
_REAPER = """
import os, signal, sys
procs = [line.split() for line in sys.stdin if line.strip()]
for pid, start in procs:
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[19] == start:
                os.kill(int(pid), signal.SIGKILL)
    except (OSError, IndexError):
        pass
"""


class _Reaper:
    """Kills the processes of a local Ray instance when the driver is gone (even by SIGKILL):
    Ray's own clean-up of a killed driver leaves its agents running for about a minute."""

    def __init__(self, before: set[int]):
        self.proc = subprocess.Popen([sys.executable, "-c", _REAPER], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)  # outlives this process's group
        me, table = os.getpid(), _proc_table()
        self.roots = {p for p, (pp, _s) in table.items()
                      if pp == me and p not in before and p != self.proc.pid}
        self.seen: set[int] = set()
        self.track(table)

    def track(self, table: dict[int, tuple[int, str]] | None = None) -> None:
        """Send the reaper every process of the instance not sent yet (workers start later)."""
        table = _proc_table() if table is None else table
        todo, found = list(self.roots), []
        while todo:
            pid = todo.pop()
            if pid in table:
                found.append(pid)
                todo += [c for c, (pp, _s) in table.items() if pp == pid]
        lines = [f"{p} {table[p][1]}\n" for p in found if p not in self.seen]
        self.seen.update(found)
        if lines:
            with contextlib.suppress(OSError):  # the reaper died: nothing to be done
                self.proc.stdin.write("".join(lines).encode())
                self.proc.stdin.flush()

    def close(self) -> None:
        """After ``ray.shutdown``: the reaper kills what is left and ends."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a reaper that hangs
            self.proc.kill()


def _children() -> set[int]:
    """The pids of this process's children (Linux), before ``ray.init`` starts its own."""
    me = os.getpid()
    return {p for p, (pp, _s) in _proc_table().items() if pp == me}


@dataclass
class RayExecutor:
    """Jobs as Ray tasks.

    Attributes:
        address: ``None``: use the Ray instance this process already joined, else start a local
            one on this machine with ``workers`` CPUs; ``"auto"``: join the cluster this machine
            belongs to (``ray start``); ``"HOST:PORT"``: join that cluster's head node
            (checked first by :func:`check_ray_address`: an unreachable one fails at once).
        workers: CPUs of a local instance started here (at most this many jobs at once).
        max_retries: how often Ray re-runs a task whose worker process died (a task lost with
            its node or raylet is reported as lost, with no retry counted).
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
        if self.address is not None:
            check_ray_address(self.address)
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
        """Submit every job as a Ray task and report each as it ends.  Ctrl-C or SIGTERM
        cancels the tasks (their runs resume on the next sweep) and propagates as
        ``KeyboardInterrupt``; a local instance started here is shut down, its processes
        reaped."""
        ray = _import_ray()
        linux = sys.platform.startswith("linux")
        before = _children() if linux else set()
        started = self._init(ray)
        reaper = _Reaper(before) if started and self.address is None and linux else None
        try:
            with sigterm_interrupts():
                task = ray.remote(_ray_task)
                refs = {}
                for job in jobs:
                    opts = {"num_cpus": job.resources.cpus, "num_gpus": job.resources.gpus,
                            "max_retries": self.max_retries, "retry_exceptions": False,
                            "name": job.name}
                    ref = task.options(**opts).remote(job.fn, dict(job.spec), job.name,
                                                      self.warning_prefix)
                    refs[ref] = job
                self._wait(ray, refs, on_done, reaper)
        finally:
            if started:
                ray.shutdown()
            if reaper is not None:
                reaper.close()

    def _wait(self, ray, refs: dict, on_done: OnDone, reaper: _Reaper | None) -> None:
        """Report each task as it finishes; on Ctrl-C cancel the others (their runs resume)."""
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
                if reaper is not None:
                    reaper.track()
                for ref in done:
                    job = refs[ref]
                    try:
                        r = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        r = failed_result(job, self._lost(ray, job, exc))
                    on_done(job, r)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise

    def _lost(self, ray, job: Job, exc: Exception) -> str:
        """Why a task gave no result: retries are counted only where Ray made them (a worker
        process that died on every attempt), not for a task lost with its node or raylet."""
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        what = f"{type(exc).__name__}: {msg}"
        if isinstance(exc, ray.exceptions.WorkerCrashedError):
            return (f"Ray task {job.name!r} failed after {self.max_retries} retries (its worker "
                    f"process died on every attempt): {what}")
        lost = (ray.exceptions.LocalRayletDiedError, ray.exceptions.NodeDiedError)
        if isinstance(exc, lost):
            return (f"Ray task {job.name!r} was lost with its Ray node or raylet (a task is not "
                    f"retried there): {what}")
        return f"Ray task {job.name!r} failed: {what}"


def _missing() -> str:
    return "" if ray_available() else ("needs the `ray` package: pip install \"torchcal[ray]\" "
                                       "(or pip install \"ray>=2.9\")")


register_executor(ExecutorType(
    "ray", lambda *, workers, address=None: RayExecutor(address=address, workers=workers),
    "Ray tasks (pip install \"torchcal[ray]\"; see the guide's cluster page)", _missing))

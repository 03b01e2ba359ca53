"""Issue 33 part 3: the Ray executor never hangs, never leaves work running, never miscounts.

An unreachable ``--ray-address`` fails in one line at once (it used to retry for 335 s); SIGTERM
to the driver stops the tasks and prints the command that resumes (it used to print a C++
"*** SIGTERM received" dump and no hint); a driver killed with SIGKILL leaves no task writing
into ``--out`` after 5 s and no Ray process (its agents used to live on for a minute); a task
lost with its raylet is not reported as "failed after 3 retries" when no retry was made.
Each test starts its own local Ray instance (in a subprocess, or in this process when no other
instance is joined)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the Ray executor needs `ray` (pip install torchcal[ray])")

import torchcal  # noqa: E402
from torchcal.cli import main  # noqa: E402
from torchcal.experiments import Job, RayExecutor, run_sweep  # noqa: E402
from torchcal.experiments.ray_executor import _proc_table  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="process tables read from /proc")
SRC = str(Path(torchcal.__file__).resolve().parents[1])


@pytest.mark.parametrize("address", ["127.0.0.1:1", "notahost:6379", "localhost:99999"])
def test_an_unreachable_address_fails_in_one_line_at_once(tmp_path, capsys, address):
    t0 = time.monotonic()
    rc = main(["demo", "--executor", "ray", "--ray-address", address, "--benchmark", "digits",
               "--losses", "ce", "--seeds", "1", "--epochs", "1", "--no-progress",
               "--no-figures", "--out", str(tmp_path / "out")])
    seconds = time.monotonic() - t0
    err = capsys.readouterr().err.strip()
    assert rc == 2 and seconds < 30, (rc, seconds)
    assert len(err.splitlines()) == 1 and err.startswith("torchcal demo: error: "), err
    assert repr(address) in err


def _descendants(pid: int) -> dict[int, str]:
    """``pid -> start time`` of every process below ``pid``."""
    table, found, todo = _proc_table(), {}, [pid]
    while todo:
        p = todo.pop()
        for c, (pp, start) in table.items():
            if pp == p:
                found[c] = start
                todo.append(c)
    return found


def _running(procs: dict[int, str]) -> list[int]:
    table = _proc_table()
    return [p for p, start in procs.items() if p in table and table[p][1] == start
            and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]


def _files(out: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in out.rglob("*")
            if p.is_file()}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signalled_driver_stops_its_tasks_and_leaves_no_ray_process(tmp_path, sig):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    argv = ["demo", "--executor", "ray", "--workers", "2", "--benchmark", "digits", "--losses",
            "ce", "--seeds", "0,1", "--epochs", "400", "--no-pack", "--no-figures",
            "--no-progress", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "torchcal", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 150
    while not list(out.glob("runs/*/*/log.jsonl")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    ray_procs = _descendants(proc.pid)  # the instance: gcs, raylet, agents, the two tasks
    assert len(ray_procs) >= 4 and list(out.glob("runs/*/*/log.jsonl")), ray_procs
    os.kill(proc.pid, sig)
    t_signal = time.monotonic()
    stdout, stderr = proc.communicate(timeout=60)
    time.sleep(max(0.0, t_signal + 5 - time.monotonic()))
    after_5s = _files(out)
    time.sleep(2)  # an epoch of the runs takes well under a second: a live task would write
    assert _files(out) == after_5s, "tasks went on writing into --out"
    deadline = time.monotonic() + 10
    while _running(ray_procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _running(ray_procs)
    for p in left:  # clean up before failing
        os.kill(p, signal.SIGKILL)
    assert left == [], f"Ray process(es) {left} outlived the driver killed by {sig.name}"
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, stderr[-3000:])
        assert "SIGTERM received" not in stderr, stderr[-3000:]
        hint = [ln for ln in stderr.splitlines() if ln.startswith("torchcal demo: interrupted")]
        assert len(hint) == 1 and re.search(r"torchcal demo .*--out", hint[0]), stderr[-3000:]


def _sleeps(spec):
    Path(spec["started"]).write_text(str(os.getpid()))
    time.sleep(60)
    return {}


def test_a_task_lost_with_its_raylet_is_not_counted_as_retried(tmp_path):
    """The runtime-env agent killed: the raylet dies with it and the task is lost at once; no
    retry was made, so none is reported.  Afterwards no process of the instance is left."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("needs its own Ray instance; this process already joined one")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    started = tmp_path / "started"
    before = set(_descendants(os.getpid()))
    instance: dict[int, str] = {}

    def kill_agent():
        while not started.exists():
            time.sleep(0.05)
        instance.update({p: s for p, s in _descendants(os.getpid()).items() if p not in before})
        for p in instance:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if f.read().startswith(b"ray::RuntimeEnvAgent"):
                    os.kill(p, signal.SIGKILL)

    killer = threading.Thread(target=kill_agent, daemon=True)
    killer.start()
    res = run_sweep([Job("sleeper", _sleeps, {"started": str(started)})],
                    RayExecutor(max_retries=3), progress=False)
    err = res[0]["error"]
    assert err and "'sleeper'" in err and "retries" not in err, err
    assert "lost with its Ray node or raylet" in err
    assert len(instance) >= 4, instance  # gcs, raylet, agents, the task
    deadline = time.monotonic() + 10
    while _running(instance) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running(instance) == [], "processes of the Ray instance outlived ray.shutdown"

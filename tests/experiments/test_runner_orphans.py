"""A sweep killed by a signal to its own process (``kill PID``, ``kill -9 PID``, a scheduler's
SIGTERM) must not leave its worker processes training into the sweep's directory: they end
with it.  (Seen: a ``pkill -f "torchcal demo"`` left both workers of a ``--full`` demo training
for minutes, competing for the cores and writing runs the next demo then skipped.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import torchcal

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="process tables read from /proc")

SRC = str(Path(torchcal.__file__).resolve().parents[1])

SCRIPT = textwrap.dedent('''
    import os, sys, time
    from torchcal.experiments import Job, LocalExecutor, run_sweep

    def job(spec):
        with open(os.path.join(spec["dir"], f"worker-{os.getpid()}"), "w") as f:
            f.write("started")
        time.sleep(120)  # a long run
        with open(os.path.join(spec["dir"], f"finished-{spec['i']}"), "w") as f:
            f.write("finished")
        return {}

    if __name__ == "__main__":
        d = sys.argv[1]
        jobs = [Job(f"j{i}", job, {"dir": d, "i": i}) for i in range(4)]
        run_sweep(jobs, LocalExecutor(workers=2), progress=False)
''')


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_workers_end_with_the_sweep(tmp_path, sig):
    script = tmp_path / "sweep.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("worker-*"))) < 2 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    workers = [int(p.name.split("-")[1]) for p in tmp_path.glob("worker-*")]
    assert len(workers) == 2
    os.kill(proc.pid, sig)  # the sweep's process only, not its process group
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [w for w in workers if _alive(w)]
    for w in alive:  # clean up before failing
        os.kill(w, signal.SIGKILL)
    assert alive == [], f"worker(s) {alive} outlived the sweep killed by {sig.name}"
    assert not list(tmp_path.glob("finished-*"))

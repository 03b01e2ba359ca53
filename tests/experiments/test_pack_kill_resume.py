"""Issue 31: a packed ``demo --quick`` SIGKILLed (its whole process group) at the moment its
members have committed different numbers of checkpoints, then run again, ends with the
uninterrupted run's results.csv: each pack's epoch commits as one (staged checkpoints,
reconciled on resume), so every member resumes in the pack it trained in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import torchcal

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")

SRC = str(Path(torchcal.__file__).resolve().parents[1])

# Imported by every Python process of the demo (its workers too) through PYTHONPATH: after
# TORCHCAL_TEST_KILL_AFTER commits of staged checkpoints in one process, SIGKILL the group.
SITECUSTOMIZE = '''
import os
if os.environ.get("TORCHCAL_TEST_KILL_AFTER"):
    import signal
    import torchcal.train.engine as E
    _orig, _n = E.commit_staged, [0]
    def commit_staged(dirs):
        _orig(dirs)
        _n[0] += 1
        if _n[0] == int(os.environ["TORCHCAL_TEST_KILL_AFTER"]):
            os.killpg(os.getpgid(0), signal.SIGKILL)
    E.commit_staged = commit_staged
'''


def _demo(out: Path, hook: Path, kill_after: int | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join([str(hook), SRC, os.environ.get("PYTHONPATH", "")]))
    env.pop("TORCHCAL_TEST_KILL_AFTER", None)
    if kill_after is not None:
        env["TORCHCAL_TEST_KILL_AFTER"] = str(kill_after)
    return subprocess.run([sys.executable, "-m", "torchcal", "demo", "--quick", "--out", str(out),
                           "--no-progress", "--no-figures", "--device", "cpu"], env=env,
                          start_new_session=True, capture_output=True, text=True, timeout=600)


def _epochs(out: Path) -> list[int]:
    import torch
    return sorted(int(torch.load(p, weights_only=True)["epoch"])
                  for p in out.glob("runs/*/seed*/checkpoints/last.pt"))


def test_a_killed_packed_demo_resumes_to_the_uninterrupted_results(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    whole = _demo(tmp_path / "whole", hook)
    assert whole.returncode == 0, whole.stderr[-2000:]
    # the quick demo's 7 runs train as 2 packs (4 + 3 runs, one per worker), a checkpoint every
    # epoch: the 5th commit is epoch 2's first (4 runs) or second (3 runs) of a pack
    killed = _demo(tmp_path / "again", hook, kill_after=5)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-2000:])
    epochs = _epochs(tmp_path / "again")
    assert 2 in epochs and 1 in epochs, epochs  # members committed different epochs
    again = _demo(tmp_path / "again", hook)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not list((tmp_path / "again").glob("runs/*/seed*/checkpoints/next.pt"))
    assert ((tmp_path / "again" / "results.csv").read_text()
            == (tmp_path / "whole" / "results.csv").read_text())

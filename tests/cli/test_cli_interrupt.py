"""Issue 14 item 7: Ctrl-C.  A subprocess in its own session gets SIGINT on its whole process
group, as a terminal's Ctrl-C does; it must end at once without a traceback and print the
command that continues where it stopped, and that command must continue (not start again)."""

from __future__ import annotations

import glob
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import torchcal
from torchcal.cli import main

pytestmark = [pytest.mark.filterwarnings("ignore:OOD set"),
              pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")]

SRC = str(Path(torchcal.__file__).resolve().parents[1])  # the torchcal under test, for children


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore",
                PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _foreground_sigint() -> None:
    """In the child before exec: SIGINT as in a terminal's foreground job. A shell without job
    control (``cmd &``, ``nohup``, some CI runners) starts its background commands with SIGINT
    ignored, the child would inherit that, and Python then installs no KeyboardInterrupt
    handler: the Ctrl-C under test would do nothing and the run would finish (exit 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(argv):
    return subprocess.Popen([sys.executable, "-m", "torchcal", *argv], env=_env(),
                            start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_foreground_sigint)


def _wait_for(pattern: str, proc: subprocess.Popen, timeout: float = 300) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = glob.glob(pattern)
        if found or proc.poll() is not None:
            return found
        time.sleep(0.01)
    return []


def _ctrl_c(proc: subprocess.Popen, timeout: float = 60) -> tuple[str, float, float]:
    """SIGINT to the process group; (stderr, seconds until the command exited, seconds until
    every process of the group ended)."""
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=timeout)
    exited = time.monotonic() - t0
    while time.monotonic() - t0 < timeout:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"processes of the group still alive {timeout} s after Ctrl-C")
    return err, exited, time.monotonic() - t0


def _interrupt(argv, pattern: str, while_running=None) -> tuple[str, float, float]:
    """Start ``torchcal ARGV``, wait for a file matching ``pattern``, call ``while_running(pid)``,
    press Ctrl-C; check exit status 130 and one line on stderr without a traceback."""
    proc = _start(argv)
    try:
        assert _wait_for(pattern, proc), proc.communicate()
        if while_running is not None:
            while_running(proc.pid)
        err, exited, all_gone = _ctrl_c(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip(), exited, all_gone


def _epochs_logged(run: Path) -> list[str]:
    log = run / "log.jsonl"
    return log.read_text().splitlines() if log.exists() else []


#: Long enough (about 0.04 s per digits epoch on an idle core) that the run cannot finish
#: between its first checkpoint and the Ctrl-C: with 30 / 20 epochs an idle CI machine finished
#: both runs first (exit 0 instead of 130); these leave about 5 s. The continuation trains the rest.
TRAIN_EPOCHS = 200
DEMO_EPOCHS = 150


def _checkpoint_epoch(run: Path) -> int:
    from torchcal.train.checkpoint import load_checkpoint

    return int(load_checkpoint(run / "checkpoints" / "last.pt")["epoch"])


def test_train_ctrl_c_prints_the_resume_command_and_it_continues(tmp_path, capsys):
    run = tmp_path / "run"

    def eval_is_refused(pid):  # the training owns its run: an eval fails at once, naming it
        assert main(["eval", str(run)]) == 2
        assert f"in use by process {pid} (torchcal train" in capsys.readouterr().err

    err, exited, _ = _interrupt(
        ["train", "--recipe", "digits-mlp", "--epochs", str(TRAIN_EPOCHS), "--checkpoint-every", "1",
         "--no-progress", "--num-threads", "1", "--device", "cpu", "--out", str(run)],
        str(run / "checkpoints" / "last.pt"), eval_is_refused)
    print(f"train exited {exited:.2f} s after Ctrl-C")
    hint = f"torchcal train --out {run} --resume"
    assert err.strip().endswith(hint), err
    at = _checkpoint_epoch(run)
    assert 1 <= at < TRAIN_EPOCHS
    before = _epochs_logged(run)[:at]
    # the printed command continues the run from its checkpoint
    assert main(shlex.split(hint)[1:]) == 0
    after = _epochs_logged(run)
    assert len(after) == TRAIN_EPOCHS and after[:at] == before  # the first epochs were not trained again
    assert "for epochs" in capsys.readouterr().out


def test_demo_ctrl_c_stops_the_workers_and_the_same_command_continues(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "--benchmark", "digits", "--losses", "ce", "--seeds", "0,1", "--epochs", str(DEMO_EPOCHS), "--workers", "2",
            "--no-progress", "--no-figures", "--out", str(out)]
    # Ctrl-C while the workers train (a run writes a checkpoint every tenth of its epochs)
    err, exited, all_gone = _interrupt(
        argv, str(out / "runs" / "ce" / "seed*" / "checkpoints" / "last.pt"))
    print(f"demo exited {exited:.2f} s, its workers gone {all_gone:.2f} s after Ctrl-C")
    assert "the same command continues where it stopped" in err, err
    cmd = err.rsplit(": ", 1)[1]
    assert shlex.split(cmd) == ["torchcal", *argv], cmd
    runs = {s: out / "runs" / "ce" / f"seed{s}" for s in (0, 1)}
    # the workers stopped instead of finishing their runs
    assert not all((r / "results.json").exists() for r in runs.values())
    at = {s: _checkpoint_epoch(r) if (r / "checkpoints" / "last.pt").exists() else 0
          for s, r in runs.items()}
    assert any(1 <= a < DEMO_EPOCHS for a in at.values()), at
    before = {s: _epochs_logged(r)[:at[s]] for s, r in runs.items()}
    # the same command (in this process: one worker, the same numbers) continues ...
    same = shlex.split(cmd)[1:]
    same[same.index("--workers") + 1] = "1"
    assert main(same) == 0
    for s, r in runs.items():
        after = _epochs_logged(r)
        assert len(after) == DEMO_EPOCHS and after[:at[s]] == before[s], s  # resumed
        assert json.loads((r / "results.json").read_text())["meta"]["epoch"] == DEMO_EPOCHS
    # ... and once finished, a rerun skips every run (nothing rewritten)
    stamps = {s: (r / "results.json").stat().st_mtime_ns for s, r in runs.items()}
    assert main(same) == 0
    assert stamps == {s: (r / "results.json").stat().st_mtime_ns for s, r in runs.items()}
    capsys.readouterr()

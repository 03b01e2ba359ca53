"""Issue 14 item 1: one process owns a run directory (``torchcal._io.exclusive_lock``).

A second process fails at once with one line naming the holder's pid; a lock left by a killed
process is taken over.  The holder here is a small subprocess taking the same lock the commands
take (a real ``torchcal train`` holding it is checked in test_cli_interrupt.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from torchcal._io import LOCK_NAME, exclusive_lock
from torchcal.cli import main
from torchcal.errors import InUseError


def _holder(directory: Path) -> subprocess.Popen:
    """A process that owns ``directory`` until killed (prints 'locked' once it does).

    It takes the lock as :func:`exclusive_lock` does (``flock`` of ``.torchcal.lock`` holding
    its pid and command line) without importing torch, so that it starts in a fraction of a
    second.
    """
    code = textwrap.dedent(f"""
        import fcntl, json, os, time
        os.makedirs({str(directory)!r}, exist_ok=True)
        fd = os.open(os.path.join({str(directory)!r}, {LOCK_NAME!r}), os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps({{"pid": os.getpid(), "command":
            "torchcal train --recipe digits-mlp --out {directory}"}}).encode())
        print("locked", flush=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=30)


def test_lock_names_the_holder_and_a_killed_holders_lock_is_taken_over(tmp_path):
    run = tmp_path / "run"
    proc = _holder(run)
    try:
        t0 = time.monotonic()
        with pytest.raises(InUseError) as e:
            with exclusive_lock(run):
                pass
        waited = time.monotonic() - t0
        msg = str(e.value)
        assert f"in use by process {proc.pid} (torchcal train --recipe digits-mlp" in msg, msg
        assert str(run) in msg and "\n" not in msg
        print(f"refused after {waited:.3f} s")  # at once: a non-blocking flock
    finally:
        _kill(proc)
    # SIGKILL: no clean-up ran, the lock file with the dead pid is still there ...
    assert json.loads((run / LOCK_NAME).read_text())["pid"] == proc.pid
    # ... and is taken over: the kernel released the flock with its holder
    with exclusive_lock(run):
        assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()
        with exclusive_lock(run):  # re-entrant in one process (train inside the demo's job)
            pass
        assert (run / LOCK_NAME).exists()
    assert not (run / LOCK_NAME).exists()
    assert run.is_dir()  # not created by that call: kept


def test_a_second_process_fails_at_once_for_every_command_writing_into_the_run(tmp_path, capsys):
    from torchcal.logits_file import save_logits

    run = tmp_path / "run"
    (run / "logits").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    rng = np.random.default_rng(0)
    save_logits(run / "logits" / "val.npz", rng.normal(size=(30, 3)).astype(np.float32),
                np.arange(30) % 3)
    proc = _holder(run)
    try:
        for argv in (["train", "--recipe", "digits-mlp", "--epochs", "1", "--no-progress",
                      "--out", str(run), "--resume"],
                     ["eval", str(run)],
                     ["calibrate", str(run), "--out", str(run / "calib.json")],
                     ["uncertainty", "fit", str(run), "--no-progress"],
                     ["uncertainty", "eval", str(run), "--no-progress"]):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and "Traceback" not in err, err
            assert f"in use by process {proc.pid}" in err, (argv, err)
        # nothing was written into the run by the refused commands
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME, "config.json", "logits"]
    finally:
        _kill(proc)


def test_report_and_demo_outputs_are_owned_too(tmp_path, capsys):
    out = tmp_path / "rep"
    proc = _holder(out)
    try:
        assert main(["report", str(tmp_path / "nothing"), "--out", str(out)]) == 2
        assert f"in use by process {proc.pid}" in capsys.readouterr().err
        assert main(["demo", "--out", str(out), "--losses", "ce", "--seeds", "0,",
                     "--epochs", "1", "--no-progress", "--workers", "1"]) == 2
        assert f"in use by process {proc.pid}" in capsys.readouterr().err
    finally:
        _kill(proc)


def test_failed_checks_leave_no_directory(tmp_path, capsys):
    """The lock creates the run directory; a run refused by its checks leaves nothing behind."""
    run = tmp_path / "r"
    assert main(["train", "--recipe", "digits-mlp", "--loss", "focal", "--loss-arg", "gama=2",
                 "--no-progress", "--out", str(run)]) == 2
    assert "gama" in capsys.readouterr().err
    assert not run.exists()


def test_lock_on_a_file_is_one_clear_error(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(NotADirectoryError, match="afile"):
        with exclusive_lock(f):
            pass


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="POSIX")
def test_lock_file_holds_pid_and_command(tmp_path):
    with exclusive_lock(tmp_path / "x") as d:
        info = json.loads((d / LOCK_NAME).read_text())
    assert info["pid"] == os.getpid() and isinstance(info["command"], str)

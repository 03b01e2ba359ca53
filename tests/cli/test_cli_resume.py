"""Issue 14 item 8: ``torchcal train --resume`` says what it did, or exactly what to pass."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

import torchcal
from torchcal._io import LOCK_NAME
from torchcal.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:OOD set")

SRC = str(Path(torchcal.__file__).resolve().parents[1])  # the torchcal under test, for children
FAST = ["--no-progress", "--num-threads", "1", "--device", "cpu"]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_resume_of_a_missing_directory_says_there_is_nothing_to_resume(tmp_path, capsys):
    run = tmp_path / "never"
    assert main(["train", "--out", str(run), "--resume"]) == 2
    err = _one_line(capsys)
    assert "Nothing to resume" in err and "does not exist" in err, err
    assert "--recipe is required" not in err
    assert not run.exists()


def test_run_killed_before_config_json_gets_the_exact_command(tmp_path, capsys):
    run = tmp_path / "early"
    argv = ["train", "--recipe", "digits-mlp", "--epochs", "2", *FAST, "--out", str(run)]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "torchcal", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lock = run / LOCK_NAME
    try:  # kill it as soon as it owns the run directory: before it loads data or writes config
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if lock.exists() and lock.stat().st_size:
                break
            time.sleep(0.002)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert not (run / "config.json").exists(), "killed too late"
    # the README's command cannot know the recipe: it names the exact command to run instead
    assert main(["train", "--out", str(run), "--resume"]) == 2
    err = _one_line(capsys)
    assert "no config.json" in err and "--recipe is required" not in err, err
    cmd = err.rsplit("Run its command again: ", 1)[1]
    assert shlex.split(cmd)[1:] == [*argv, "--resume"], cmd
    assert main(shlex.split(cmd)[1:]) == 0  # ... and that command trains the run
    assert (run / "results.json").is_file()


def test_resume_of_a_finished_run_says_nothing_was_trained(tmp_path, capsys):
    run = tmp_path / "done"
    assert main(["train", "--recipe", "digits-mlp", "--epochs", "2", *FAST,
                 "--out", str(run)]) == 0
    capsys.readouterr()
    files = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    assert main(["train", "--out", str(run), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "nothing was trained" in out and "trained digits-mlp" not in out, out
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == files
    # without results.json (a --no-eval run, or one killed in its final evaluation) the trainer
    # loads the checkpoint, trains nothing, and the summary says so too
    (run / "results.json").unlink()
    assert main(["train", "--out", str(run), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "nothing was trained" in out and "trained digits-mlp" not in out, out


def test_resume_with_recipe_of_a_missing_directory_starts_a_new_run(tmp_path, capsys):
    """`--resume` is "resume if there is anything": with --recipe it trains a new run."""
    run = tmp_path / "new"
    assert main(["train", "--recipe", "digits-mlp", "--epochs", "1", *FAST, "--no-eval",
                 "--out", str(run), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "nothing to resume" in out and "trained digits-mlp" in out, out


def test_resume_of_a_finished_run_with_changed_training_settings_is_refused(tmp_path, capsys):
    """Issue 23: `--resume --reduction sum --grad-clip ...` on a finished run said "nothing was
    trained" (exit 0) although the settings differ from the run's: refused, naming them."""
    run = tmp_path / "done"
    assert main(["train", "--recipe", "digits-mlp", "--epochs", "1", *FAST,
                 "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--reduction", "sum",
                 "--grad-clip", "5"]) == 2
    err = capsys.readouterr().err
    assert "Cannot resume" in err and "reduction='sum'" in err and "grad_clip=5.0" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_kill_between_staging_and_moving_a_checkpoint_is_told_to_resume(tmp_path, capsys):
    """Issue 51's train kill-loop defect: killed after its epoch's ``checkpoints/next.pt`` was
    staged but before it was moved onto ``last.pt``, ``train`` said "no epoch was saved yet"
    and offered the command without ``--resume``; the next start finished the move
    (``reconcile_staged``) and then refused that command ("already holds a run").  The hint
    now finishes the move itself, so it names the kept epoch and the command that goes on."""
    from torchcal._io import replace_verified
    from torchcal.cli import build_parser
    from torchcal.cli.train import _interrupt_hint

    run = tmp_path / "staged"
    argv = ["train", "--recipe", "digits-mlp", "--epochs", "2", *FAST,
            "--data-root", str(tmp_path / "data"), "--out", str(run)]
    assert main([*argv[:4], "1", *argv[5:]]) == 0  # one epoch; then stage it again by hand
    last, staged = run / "checkpoints" / "last.pt", run / "checkpoints" / "next.pt"
    replace_verified(last, staged)  # the state of a kill between the two steps
    assert not last.exists() and staged.exists()
    args = build_parser("train").parse_args(argv)
    args.argv = argv
    hint = _interrupt_hint(args)
    assert hint == f"finished epochs are kept; continue with: torchcal train --out {run} --resume"
    assert last.exists() and not staged.exists()  # the move the next start would have made
    capsys.readouterr()
    assert main(shlex.split(hint.split("continue with: ", 1)[1])[1:]) == 0  # it goes on
    assert (run / "results.json").is_file()

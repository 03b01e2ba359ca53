"""Issue 14 item 13: one CLI.  --loss-arg syntax, eval's device, plain --help, one-line
warnings, --out into an existing directory, percent on the terminal, the (N,) hint."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import torchcal
from torchcal.cli import build_parser, main
from torchcal.cli._args import parse_loss_args_per_loss
from torchcal.cli.train import config_from_args
from torchcal.logits_file import save_logits
from torchcal.results_file import SCHEMA, write_results

SRC = str(Path(torchcal.__file__).resolve().parents[1])  # the torchcal under test, for children


def _train_cfg(*extra):
    return config_from_args(build_parser().parse_args(
        ["train", "--recipe", "digits-mlp", "--out", "/nonexistent/x", *extra]))


# ------------------------------------------------------------------------------ --loss-arg
def test_loss_arg_has_one_syntax_in_train_and_demo(tmp_path, capsys):
    # train: LOSS:KEY=VALUE as in the demo, and KEY=VALUE for its one loss
    for arg in ("focal:gamma=2", "gamma=2"):
        assert _train_cfg("--loss", "focal", "--loss-arg", arg).loss_kwargs == {"gamma": 2}
    assert _train_cfg("--loss-arg", "ce:label_smoothing=0.1").loss_kwargs == {
        "label_smoothing": 0.1}
    with pytest.raises(ValueError, match="does not train 'ce'"):
        _train_cfg("--loss", "focal", "--loss-arg", "ce:gamma=2")
    # demo: KEY=VALUE when --losses names one loss (it reaches that loss: a typo is named)
    out = tmp_path / "demo"
    assert main(["demo", "--losses", "focal", "--loss-arg", "gama=2", "--seeds", "0,",
                 "--epochs", "1", "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "gama" in err and "LOSS:KEY=VALUE" not in err, err
    assert not out.exists()
    # several losses: the loss must be named
    with pytest.raises(ValueError, match="LOSS:KEY=VALUE when several losses"):
        parse_loss_args_per_loss(["gamma=2"], ["ce", "focal"])
    # both --help texts show the same syntax
    for cmd in ("train", "demo"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        assert "--loss-arg [LOSS:]KEY=VALUE" in capsys.readouterr().out, cmd


# ------------------------------------------------------------------------------ --device
def _parsers(p: argparse.ArgumentParser, name: str = "torchcal"):
    yield name, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub_name, sub in a.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def test_eval_defaults_to_device_auto_like_train():
    p = build_parser()
    assert p.parse_args(["eval", "run"]).device == "auto"
    helps = {name: [a.help for a in sub._actions if a.dest == "device"][0]
             for name, sub in _parsers(p) if name in ("torchcal train", "torchcal eval")}
    assert all(h.startswith("'auto'") for h in helps.values()), helps


# ------------------------------------------------------------------------------ --help


def test_no_restructuredtext_in_any_help():
    rst = re.compile(r"``|:(?:class|func|mod|meth|attr|data|obj|exc):`|::$|^\.\. ", re.M)
    seen = 0
    for name, p in _parsers(build_parser()):
        text = p.format_help()
        seen += 1
        bad = rst.search(text)
        assert bad is None, f"{name} --help: {text[max(0, bad.start() - 60):bad.end() + 60]!r}"
    assert seen >= 10  # every command and sub-command


# ------------------------------------------------------------------------------ warnings
def test_warnings_are_one_line_and_only_while_a_command_runs(tmp_path):
    before = (warnings.showwarning, warnings.formatwarning)
    assert main(["data", "list"]) == 0
    assert (warnings.showwarning, warnings.formatwarning) == before  # restored
    code = textwrap.dedent("""
        import sys, warnings
        orig = (warnings.showwarning, warnings.formatwarning)
        import torchcal, torchcal.cli, torchcal.metrics, torchcal.train
        assert (warnings.showwarning, warnings.formatwarning) == orig, "changed at import"
        import torchcal.cli.data as d
        def noisy(args):
            warnings.warn("first line\\n   second line")
            warnings.warn("old name", DeprecationWarning)
            return 0
        d._cmd_list = noisy
        sys.exit(torchcal.cli.main(["data", "list"]))
    """)
    env = dict(os.environ, PYTHONWARNINGS="always",
               PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["torchcal data: warning: first line second line",
                                     "torchcal data: DeprecationWarning: old name"], r.stderr


# ------------------------------------------------------------------------------ --out
def _evaluated_run(d: Path, seed: int) -> Path:
    write_results(d, {"schema": SCHEMA, "meta": {"dataset": "digits", "model": "mlp",
                                                 "loss": "ce", "seed": seed},
                      "temperatures": {"grid_ece": 1.5},
                      "test": {"pre": {"ece": 0.1 * seed, "error": 0.2}, "post": {}}})
    return d


def test_report_out_refreshes_its_own_files_and_refuses_a_run(tmp_path, capsys):
    runs = [_evaluated_run(tmp_path / "runs" / f"s{s}", s) for s in (1, 2)]
    out = tmp_path / "rep"
    assert main(["report", *map(str, runs), "--out", str(out), "--no-figures"]) == 0
    # a figure of an earlier report (of other runs) would stay beside the new report
    (out / "figures").mkdir()
    (out / "figures" / "reliability_old-loss.png").write_bytes(b"\x89PNG")
    (out / "notes.txt").write_text("mine")
    assert main(["report", *map(str, runs), "--out", str(out), "--no-figures"]) == 0
    assert not (out / "figures" / "reliability_old-loss.png").exists()
    assert (out / "notes.txt").read_text() == "mine"  # not the report's: untouched
    assert json.loads((out / "results.json").read_text())["schema"].startswith("torchcal.report")
    capsys.readouterr()
    # a run directory is refused: the report's results.json would replace the run's
    before = (runs[0] / "results.json").read_bytes()
    for cmd in (["report", str(runs[1]), "--out", str(runs[0]), "--no-figures"],
                ["demo", "--losses", "ce", "--seeds", "0,", "--epochs", "1", "--no-progress",
                 "--out", str(runs[0])]):
        assert main(cmd) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "holds a training run" in err, err
        assert (runs[0] / "results.json").read_bytes() == before


# ------------------------------------------------------------------------------ percent
def test_terminal_numbers_are_percent_and_help_says_so(tmp_path, capsys):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(200, 3)).astype(np.float32) * 3
    y = rng.integers(0, 3, 200)
    save_logits(tmp_path / "val.npz", z, y)
    assert main(["calibrate", str(tmp_path / "val.npz"), "--out", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    m = re.search(r"val, 5-fold cross-validated \(held out\): ECE (\d+\.\d\d)% -> "
                  r"(\d+\.\d\d)%, .* error (\d+\.\d\d)%", out)
    assert m, out
    doc = json.loads((tmp_path / "c.json").read_text())
    # the file keeps fractions, the terminal shows the same numbers in percent
    assert float(m.group(1)) == pytest.approx(100 * doc["val"]["pre"]["ece"], abs=0.006)
    assert float(m.group(3)) == pytest.approx(100 * doc["val"]["pre"]["error"], abs=0.006)
    assert doc["val"]["pre"]["error"] < 1
    for cmd in ("train", "eval", "calibrate", "report", "demo", "uncertainty"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "in percent, NLL in nats; the JSON files hold fractions" in text, cmd


# ------------------------------------------------------------------------------ (N,) input
def test_binary_scores_of_shape_n_get_the_stacking_hint(tmp_path, capsys):
    path = tmp_path / "binary.npz"
    np.savez(path, logits=np.linspace(-2, 2, 10).astype(np.float32), labels=np.arange(10) % 2)
    assert main(["calibrate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "(N, 2)" in err and "np.stack" in err, err

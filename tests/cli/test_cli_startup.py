"""Issue 40 item 5 / issue 43 item 2: a command line that starts at once.

``torchcal --version`` and ``--help`` import no benchmark, data set, scikit-learn, matplotlib
(nor torch): only the dispatcher and the bottom layer; a sub-command imports its own module;
``torchcal.errors`` imports no third-party package.  Counted in a fresh interpreter (the
modules this test process already imported would hide them)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import torchcal
from torchcal.cli import COMMAND_HELP, build_parser, chosen_command, command_module

_DUMP = ("import sys, json, runpy\n"
         "sys.argv = ['torchcal'] + json.loads(sys.argv[1])\n"
         "try:\n"
         "    runpy.run_module('torchcal', run_name='__main__')\n"
         "except SystemExit:\n"
         "    pass\n"
         "print('\\nMODULES=' + json.dumps(sorted(sys.modules)))\n")


def _imported(*argv: str) -> list[str]:
    """The modules a fresh ``python -m torchcal ARGV`` has imported when it exits."""
    out = subprocess.run([sys.executable, "-c", _DUMP, json.dumps(list(argv))],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return json.loads(out.rsplit("MODULES=", 1)[1])


def _heavy(mods: list[str]) -> list[str]:
    roots = {"sklearn", "matplotlib", "torch", "scipy", "pandas", "numpy"}
    return [m for m in mods if m.split(".")[0] in roots]


@pytest.mark.parametrize("argv", [("--version",), ("--help",), ()])
def test_version_and_help_import_no_heavy_package(argv):
    mods = _imported(*argv)
    own = [m for m in mods if m.split(".")[0] == "torchcal"]
    assert len(own) <= 15, own
    assert not _heavy(mods), _heavy(mods)
    banned = ("torchcal.experiments", "torchcal.data", "torchcal.posthoc", "torchcal.report",
              "torchcal.train", "torchcal.plot")
    assert not [m for m in own if m.startswith(banned)], own


def test_a_command_imports_its_own_module_only():
    mods = _imported("readme", "--help")
    assert "torchcal.cli.readme" in mods
    others = [f"torchcal.cli.{n}" for n in COMMAND_HELP if n != "readme"]
    assert not [m for m in others if m in mods]


def test_errors_imports_no_third_party_package():
    code = ("import sys; before = set(sys.modules); import torchcal.errors; "
            "print(sorted(m for m in set(sys.modules) - before if not m.startswith('torchcal')"
            " and m.split('.')[0] not in sys.stdlib_module_names))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    assert out == "[]", out


def test_help_lines_match_the_commands_own():
    """The stub help lines of ``torchcal --help`` are the commands' own (no drift)."""
    full = build_parser()
    sub = next(a for a in full._actions if a.__class__.__name__ == "_SubParsersAction")
    shown = {c.dest: c.help for c in sub._choices_actions}
    assert shown == COMMAND_HELP


def test_chosen_command():
    assert chosen_command(["train", "--help"]) == "train"
    assert chosen_command(["-h", "train"]) is None
    assert chosen_command(["--version"]) is None
    assert chosen_command([]) is None
    assert chosen_command(["evl"]) is None
    assert command_module("eval").__name__ == "torchcal.cli.eval"


def test_version_output(capsys):
    from torchcal.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"torchcal {torchcal.__version__}"


def test_a_worker_starts_without_sklearn_or_dynamo():
    """Issue 43 item 2: what a demo worker imports before its first job, and its first SGD step
    and checkpoint of the optimiser, import neither scikit-learn nor ``torch._dynamo``; a
    calibrator used before ``fit`` still raises scikit-learn's ``NotFittedError`` too."""
    code = (
        "import sys, torch, torchcal.experiments.runner, torchcal.experiments.training\n"
        "import torchcal.evaluate, torchcal.posthoc\n"
        "from torchcal.train.run import SGD\n"
        "m = torch.nn.Linear(3, 2)\n"
        "opt = SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)\n"
        "s = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[1])\n"
        "opt.zero_grad(); m(torch.ones(1, 3)).sum().backward(); opt.step(); s.step()\n"
        "opt.load_state_dict(opt.state_dict())\n"
        "print(sorted(m for m in ('sklearn', 'torch._dynamo', 'matplotlib') if m in sys.modules))\n"
        "try:\n"
        "    torchcal.posthoc.TemperatureScaling().transform(torch.zeros(2, 3))\n"
        "except Exception as e:\n"
        "    import sklearn.exceptions, torchcal.errors\n"
        "    print(isinstance(e, sklearn.exceptions.NotFittedError),\n"
        "          isinstance(e, torchcal.errors.NotFittedError))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split("\n")
    assert out[0] == "[]", out
    assert out[1] == "True True", out

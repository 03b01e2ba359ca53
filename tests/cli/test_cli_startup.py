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

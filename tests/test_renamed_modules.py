"""Renamed modules keep their old import path for a while: the old module is a shim that warns
once (``DeprecationWarning``) and serves the new module's public names; nothing in torchcal
imports the old path (``tools/check_architecture.py`` would say so)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# old module -> (new module, a public name both serve)
RENAMED = {
    "torchcal.runs": ("torchcal.run_dir", "RunDir"),
    "torchcal.train.steps": ("torchcal.train.run", "build_run"),
}


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", code],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_old_module_warns_and_serves_the_new_names(old):
    new, name = RENAMED[old]
    proc = _run(f"import importlib\n"
                f"a = importlib.import_module({old!r}); b = importlib.import_module({new!r})\n"
                f"assert a.{name} is b.{name}\n"
                f"assert sorted(a.__all__) == sorted(b.__all__)\n"
                f"importlib.import_module({old!r})\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(f"{old} is deprecated: it was renamed {new}") == 1, proc.stderr


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_new_module_imports_without_a_warning(old):
    new, _ = RENAMED[old]
    proc = _run(f"import warnings; warnings.simplefilter('error')\nimport {new}\n")
    assert proc.returncode == 0, proc.stderr


def test_old_train_steps_serves_private_names_too():
    proc = _run("import torchcal.train.steps as s, torchcal.train.run as r\n"
                "assert s._clone_state is r._clone_state\n")
    assert proc.returncode == 0, proc.stderr


def test_package_attribute_of_the_old_name():
    proc = _run("import torchcal\nprint(torchcal.runs.RunDir.__module__)\n")
    assert proc.returncode == 0 and proc.stdout.strip() == "torchcal.run_dir", proc.stderr
    assert "torchcal.runs is deprecated" in proc.stderr

"""The suite's expected warnings are filtered in pyproject's pytest config by message and
category (issue 33, 5: a test run ended with a 182-line summary of 219 warnings, most of them
expected), and nothing else is: an unexpected warning still reaches the summary."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

_TESTS = '''
import warnings

import torch

from torchcal.losses import MissingValidationWarning
from torchcal.posthoc import TemperatureScaling


def test_expected():
    z = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]])
    TemperatureScaling(method="grid_ece", grid=[0.5, 1.5]).fit(z, torch.tensor([0, 1, 0, 1]))
    TemperatureScaling(method="nll").fit(z, torch.tensor([1, 0, 0, 1]))  # T at its bound
    warnings.warn("independent is deprecated; use to_event instead", DeprecationWarning)
    warnings.warn("AdaFocalLoss need validation statistics, but ...", MissingValidationWarning)


def test_unexpected():
    warnings.warn("TemperatureScaling: something new", RuntimeWarning)
'''


def _run(tmp_path, test: str) -> str:
    (tmp_path / "test_w.py").write_text(_TESTS)
    r = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
                        "--rootdir", str(tmp_path), "-p", "no:randomly", "-p", "no:cacheprovider",
                        "-q", f"{tmp_path / 'test_w.py'}::{test}"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_expected_warnings_are_filtered_and_others_are_not(tmp_path):
    out = _run(tmp_path, "test_expected")
    assert "warnings summary" not in out and "warning" not in out.splitlines()[-1], out
    out = _run(tmp_path, "test_unexpected")
    assert "warnings summary" in out and "TemperatureScaling: something new" in out, out

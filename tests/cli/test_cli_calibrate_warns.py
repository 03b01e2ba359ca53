"""``torchcal calibrate`` says when the calibrator it fitted is worse than none (issue 24): on
the held-out ``--test`` logits for every method, and on the validation logits for the linear
maps; the new methods (matrix, dirichlet, isotonic) fit, print and write a file that reads back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torchcal.evaluate import read_calibration
from torchcal.metrics import ece
from torchcal.posthoc import calibrator_from_dict


def _npz(path: Path, logits: np.ndarray, labels: np.ndarray) -> Path:
    np.savez(path, logits=logits.astype(np.float32), labels=labels.astype(np.int64))
    return path


def _calibrated_split(tmp_path: Path, n: int, c: int, scale: float, seed: int):
    """Logits ``scale * N(0, 1)`` with labels drawn from ``softmax(z / scale)`` (the model is
    right about its uncertainty up to the scale), split in half into val.npz and test.npz."""
    z = np.random.default_rng(seed).normal(size=(n, c)) * scale
    y = torch.multinomial(torch.softmax(torch.tensor(z / scale), 1), 1,
                          generator=torch.Generator().manual_seed(seed)).squeeze(1).numpy()
    h = n // 2
    return (_npz(tmp_path / "val.npz", z[:h], y[:h]), _npz(tmp_path / "test.npz", z[h:], y[h:]),
            z[h:], y[h:])


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": ""}
    return subprocess.run([sys.executable, "-m", "torchcal", "calibrate", *args],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def shifted(tmp_path: Path) -> tuple[Path, Path]:
    """Validation labels are the arg-max (a temperature far below 1 fits), test labels are
    random: the sharpened probabilities are much worse than the uncalibrated ones there."""
    g = np.random.default_rng(0)
    zv = g.normal(size=(300, 5))
    zt = g.normal(size=(300, 5))
    return (_npz(tmp_path / "val.npz", zv, zv.argmax(1)),
            _npz(tmp_path / "test.npz", zt, g.integers(0, 5, 300)))


@pytest.mark.parametrize("method", ["nll", "vector", "dirichlet"])
def test_worse_than_identity_on_test_is_a_warning_line(shifted, method):
    val, test = shifted
    r = _cli(str(val), "--test", str(test), "--method", method)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "worse than the uncalibrated" in ln]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("torchcal calibrate: WorseThanIdentityWarning:"), lines[0]
    assert "scored (held-out)" in lines[0]
    # the numbers of the warning are those printed on the test line
    test_line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("test:"))
    assert "NLL" in test_line


def test_no_warning_when_the_calibrator_helps(tmp_path):
    val, test, _, _ = _calibrated_split(tmp_path, 600, 4, scale=4.0, seed=1)
    r = _cli(str(val), "--test", str(test), "--method", "nll")
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr


@pytest.mark.parametrize("method", ["matrix", "dirichlet", "isotonic"])
def test_new_methods_fit_and_read_back(tmp_path, method):
    val, test, zt, yt = _calibrated_split(tmp_path, 400, 3, scale=3.0, seed=2)
    out = tmp_path / "c.json"
    r = _cli(str(val), "--test", str(test), "--method", method, "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{method}: fit on"), r.stdout
    doc = read_calibration(out)
    cal = calibrator_from_dict(doc["calibrator"])
    # the calibrator read back gives the metrics the command printed and wrote (isotonic may
    # give a label probability 0, so compare ECE: always finite)
    p = torch.as_tensor(cal.predict_proba(torch.tensor(zt, dtype=torch.float32))).double()
    got = float(ece(probs=p, labels=torch.tensor(yt), n_bins=15))
    assert got == pytest.approx(doc["test"]["post"]["ece"], rel=1e-5, abs=1e-9)

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

from torchcal.metrics import ece
from torchcal.posthoc import calibrator_from_dict
from torchcal.results_file import read_calibration


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
    assert r.stdout.startswith(f"{method}: "), r.stdout
    assert ("(chosen by cross-validation); fit on" in r.stdout) == (method != "isotonic")
    doc = read_calibration(out)
    cal = calibrator_from_dict(doc["calibrator"])
    # the calibrator read back gives the metrics the command printed and wrote (isotonic may
    # give a label probability 0, so compare ECE: always finite)
    p = torch.as_tensor(cal.predict_proba(torch.tensor(zt, dtype=torch.float32))).double()
    got = float(ece(probs=p, labels=torch.tensor(yt), n_bins=15))
    assert got == pytest.approx(doc["test"]["post"]["ece"], rel=1e-5, abs=1e-9)


# ------------------------------------------------------------------ issue 33 (1): held-out numbers
def _issue_split(tmp_path: Path, c: int, n: int, seed: int) -> Path:
    """The issue's data (logits 3·N(0, 1), labels drawn from softmax(z / 2)) as val.npz."""
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(n, c, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g).squeeze(1)
    return _npz(tmp_path / "val.npz", z.numpy(), y.numpy())


def test_without_test_the_numbers_are_cross_validated_never_in_sample(tmp_path):
    """`calibrate val.npz --method dirichlet` printed the in-sample NLL 3.47 -> 1.99 as an
    improvement (held out it was worse than none); now the line is the 5-fold cross-validated
    one, equal to a by-hand cross-validation with the penalties the command chose."""
    val = _issue_split(tmp_path, 30, 400, seed=3)
    out = tmp_path / "c.json"
    r = _cli(str(val), "--method", "dirichlet", "--lam", "0.01", "--mu", "0.01", "--out",
             str(out))
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("val"))
    assert line.startswith("  val, 5-fold cross-validated (held out): ECE"), r.stdout
    doc = read_calibration(out)
    assert doc["val_post"] == "5-fold cross-validated (held out)"
    with np.load(val) as f:
        z, y = torch.tensor(f["logits"]).double(), torch.tensor(f["labels"])
    # by hand: each fold calibrated by a fit on the other four, the NLL of the pooled predictions
    from torchcal.posthoc import DirichletCalibration, MemorizedValidationWarning, cv_folds

    folds = cv_folds(len(y), 5)
    logq = torch.empty(len(y), 30, dtype=torch.float64)
    for i, te in enumerate(folds):
        tr = torch.cat(folds[:i] + folds[i + 1:])
        with pytest.warns(MemorizedValidationWarning):  # 930 parameters, 320 samples
            cal = DirichletCalibration(lam=0.01, mu=0.01).fit(z[tr], y[tr])
        logq[te] = torch.log(cal.predict_proba(z[te]).double())
    nll = float(-logq.gather(1, y.unsqueeze(1)).mean())
    assert doc["val"]["post"]["nll"] == pytest.approx(nll, rel=1e-4)
    # held out, the memorising fit is worse than none: the line shows it and a warning says so
    assert doc["val"]["post"]["nll"] > doc["val"]["pre"]["nll"]
    assert "5-fold cross-validated data" in r.stderr and "worse than the uncalibrated" in r.stderr
    # the in-sample numbers stay in the file, named as such, never printed as the result
    assert doc["val"]["in_sample"]["nll"] < doc["val"]["pre"]["nll"]
    assert f"{doc['val']['in_sample']['nll']:.4f}" not in r.stdout


def test_lam_mu_options(tmp_path):
    val = _issue_split(tmp_path, 4, 200, seed=4)
    r = _cli(str(val), "--method", "matrix", "--lam", "2.5", "--mu", "cv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("matrix: lam = 2.5, mu = "), r.stdout
    assert "(chosen by cross-validation)" in r.stdout
    r = _cli(str(val), "--method", "dirichlet", "--lam", "3", "--mu", "0")
    assert r.stdout.startswith("dirichlet: lam = 3, mu = 0; fit on"), r.stdout
    for bad, why in ((["--lam", "-1"], "expected a finite non-negative number, got '-1'"),
                     (["--mu", "auto"], "expected a finite non-negative number, got 'auto'"),
                     (["--method", "nll", "--lam", "1"], "--lam/--mu only with --method matrix")):
        r = _cli(str(val), *(["--method", "dirichlet"] if "--method" not in bad else []), *bad)
        assert r.returncode == 2 and why in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr

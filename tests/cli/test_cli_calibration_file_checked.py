"""The calibration file (``torchcal calibrate --out``) is written only after its calibrator
and metrics are checked, and read back only after its values are checked, not only its
checksum (issue 33, 2): a temperature of 1e-300 or matrix weights of 1e38 loaded and gave NaN
probabilities."""

from __future__ import annotations

import json

import numpy as np
import pytest

from torchcal import posthoc
from torchcal._io import write_verified
from torchcal.cli import main
from torchcal.errors import ResultsFileError
from torchcal.logits_file import save_logits
from torchcal.results_file import read_calibration


@pytest.fixture
def val(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(200, 4)) * 3
    p = np.exp(z / 2) / np.exp(z / 2).sum(1, keepdims=True)  # over-confident by a factor 2
    y = (rng.random((200, 1)) > p.cumsum(1)).sum(1)
    return str(save_logits(tmp_path / "val.npz", z.astype(np.float32), y))


def _calibrate(val, out, method):
    assert main(["calibrate", val, "--method", method, "--lam", "1", "--mu", "1", "--out",
                 str(out)] if method == "matrix" else
                ["calibrate", val, "--method", method, "--out", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize(("method", "edit", "match"), [
    ("nll", lambda c: c.update(temperature=1e-300),
     r"temperature'\]` to be a positive temperature in \[1e-06, 1e\+06\]"),
    ("matrix", lambda c: c["weight"][1].__setitem__(2, 1e38), r"weight'\]\[1\]\[2\]` to lie in"),
])
def test_a_hand_edited_file_with_its_checksum_recomputed_is_refused(val, tmp_path, method,
                                                                    edit, match, capsys):
    out = tmp_path / "c.json"
    doc = _calibrate(val, out, method)
    read_calibration(out)
    edit(doc["calibrator"])
    write_verified(out, json.dumps(doc).encode())  # the checksum agrees: only the values tell
    with pytest.raises(ResultsFileError, match=rf"Calibration file '{out}' holds an unusable "
                                               rf"calibrator: .*{match}.*run torchcal calibrate"):
        read_calibration(out)


def test_an_unusable_fit_never_replaces_a_good_file(val, tmp_path, monkeypatch, capsys):
    out = tmp_path / "c.json"
    _calibrate(val, out, "nll")
    good = out.read_bytes()
    fit = posthoc.TemperatureScaling.fit

    def broken_fit(self, z, y):
        fit(self, z, y)
        self.temperature_ = 1e-300  # what a broken optimiser could leave
        return self

    monkeypatch.setattr(posthoc.TemperatureScaling, "fit", broken_fit)
    capsys.readouterr()
    assert main(["calibrate", val, "--method", "nll", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "", captured.out  # no numbers printed as a result either
    assert captured.err.count("\n") == 1 and "nothing written" in captured.err, captured.err
    assert "TemperatureScaling is unusable" in captured.err
    assert out.read_bytes() == good

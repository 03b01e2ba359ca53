"""Issue 49: a report reads each run's test logits once (they were read three times: the
claims' confidence gaps, the noise floors and figures, the OOD ROC curves), and the claims come
from the caller (the benchmarks' data, torchcal.experiments.claims)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from torchcal.experiments.claims import CLAIMS
from torchcal.logits_file import save_logits
from torchcal.report import aggregate, build
from torchcal.report.build import build_report

RUNS = dict(losses=("ce", "focal", "flsd53"), seeds=2)  # the `runs` fixture (conftest.py)


def test_each_test_logits_file_is_read_once_per_report(runs, tmp_path, monkeypatch):
    for d in runs.glob("*/seed*"):  # an OOD set too: its ROC curve needs the test logits again
        rng = np.random.default_rng(1)
        save_logits(d / "logits" / "ood_noise.npz",
                    rng.normal(size=(50, 5)).astype(np.float32), np.full(50, -1))
    reads: collections.Counter = collections.Counter()
    real = aggregate.load_logits

    def counting(path):
        reads[path.name if path.name != "test.npz" else str(path)] += 1
        return real(path)

    monkeypatch.setattr(aggregate, "load_logits", counting)
    monkeypatch.setattr(build, "load_logits", counting)
    rep = build_report([runs], tmp_path / "rep", claims=CLAIMS)
    tests = {k: v for k, v in reads.items() if k.endswith("test.npz")}
    assert len(tests) == 6 and set(tests.values()) == {1}, reads
    assert reads["ood_noise.npz"] == 6  # each run's OOD logits, once (the ROC curves)
    md = rep.report_md.read_text()
    assert "The papers' claims on this benchmark" in md  # the gaps and claims were computed
    assert "test.pre.conf_minus_acc" in rep.groups[0].mean


def test_claims_true_is_refused_the_claims_come_from_the_caller(runs, tmp_path):
    with pytest.raises(TypeError, match="`claims`"):
        build_report([runs], tmp_path / "rep", claims=True)

"""Report figures (ROC curve numbers against scikit-learn; every figure renders to a PNG) and the
AdaFocal γ-history reader."""

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from sklearn.metrics import roc_curve as sk_roc_curve

from torchcal.report import figures as F
from torchcal.report.build import gamma_history


def test_roc_curve_matches_sklearn_with_ties():
    rng = np.random.default_rng(0)
    s = np.round(rng.normal(size=400), 1)  # many ties
    y = (rng.random(400) < 0.3 + 0.2 * (s > 0)).astype(int)
    fpr, tpr = F.roc_curve(s, y)
    sf, st, _ = sk_roc_curve(y, s, drop_intermediate=False)
    np.testing.assert_allclose(fpr, sf, atol=1e-12)
    np.testing.assert_allclose(tpr, st, atol=1e-12)
    assert np.trapezoid(tpr, fpr) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_every_figure_renders(tmp_path):
    rng = np.random.default_rng(1)
    conf = {"CE": rng.beta(8, 1, 300), "Focal (γ=3)": rng.beta(4, 1, 300)}
    fpr, tpr = F.roc_curve(rng.normal(size=50), rng.integers(0, 2, 50))
    figs = {
        "hist.png": F.confidence_histograms(conf, title="t"),
        "roc.png": F.roc_figure({"CE": (fpr, tpr, 0.7)}, title="t"),
        "gamma.png": F.gamma_history_figure({"seed 0": rng.normal(size=(6, 15)),
                                             "seed 1": rng.normal(size=(6, 15))}, gamma_max=20.0),
    }
    for name, fig in figs.items():
        p = F.save_figure(fig, tmp_path / name)
        assert p.read_bytes()[:4] == b"\x89PNG"
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted(figs)  # no temp files left


@pytest.mark.parametrize("layout", ["per_epoch_dict", "per_epoch_list", "whole_history"])
def test_gamma_history_from_log(tmp_path, layout):
    g = np.arange(12, dtype=float).reshape(4, 3)
    lines = []
    for e in range(4):
        rec = {"epoch": e, "train_loss": 1.0}
        if layout == "per_epoch_dict":
            rec["loss_state"] = {"gammas": g[e].tolist(), "bin_edges": [0, 0.5, 0.9, 1]}
        elif layout == "per_epoch_list":
            rec["gammas"] = g[e].tolist()
        lines.append(rec)
    if layout == "whole_history":
        lines[-1]["adafocal_history"] = [{"gammas": row.tolist()} for row in g]
    (tmp_path / "log.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    np.testing.assert_array_equal(gamma_history(tmp_path), g)


def test_gamma_history_absent_or_from_checkpoint(tmp_path):
    (tmp_path / "log.jsonl").write_text(json.dumps({"epoch": 0, "train_loss": 1.0}) + "\n")
    assert gamma_history(tmp_path) is None
    (tmp_path / "checkpoints").mkdir()
    hist = torch.arange(6.0).reshape(2, 3)
    torch.save({"model": {}, "loss": {"history": hist}}, tmp_path / "checkpoints" / "last.pt")
    np.testing.assert_array_equal(gamma_history(tmp_path), hist.numpy())

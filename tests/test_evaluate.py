"""torchcal.evaluate: logits files, evaluate_logits against direct metric/post-hoc calls and
independent references (ECE from the formula, scikit-learn's ROC AUC / average precision)."""

import json
import math
import os
import zipfile

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from torchcal import metrics
from torchcal.errors import ResultsFileError
from torchcal.evaluate import evaluate_logits, evaluate_saved_logits
from torchcal.logits_file import load_logits, save_logits
from torchcal.posthoc import TemperatureScaling
from torchcal.results_file import (
    METRIC_KEYS,
    SCHEMA,
    TEMPERATURE_METHODS,
    read_results,
    write_results,
)


def synthetic(n, c, seed, scale=3.0):
    """Over-confident logits: labels drawn from softmax(z / scale)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g) * 4.0
    y = torch.multinomial(torch.softmax(z / scale, 1), 1, generator=g).squeeze(1)
    return z, y


def ece_reference(z, y, n_bins=15):
    """Equal-width ECE written from the formula (REFERENCE.md §2), float64, explicit loop over bins."""
    p = torch.softmax(z.double(), 1)
    conf, pred = p.max(1)
    acc = (pred == y).double()
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        m = (conf > lo) & (conf <= hi) if b else (conf <= hi)
        if m.any():
            total += m.double().mean().item() * abs(acc[m].mean().item() - conf[m].mean().item())
    return total


def entropy(z):
    p = torch.softmax(z.double(), 1)
    return -(p * torch.log(p)).sum(1).numpy()


@pytest.fixture(scope="module")
def data():
    zv, yv = synthetic(400, 5, 0)
    zt, yt = synthetic(600, 5, 1)
    zo = torch.randn(300, 5, generator=torch.Generator().manual_seed(2)) * 1.5
    res = evaluate_logits(val_logits=zv, val_labels=yv, test_logits=zt, test_labels=yt,
                          ood_logits={"noise": zo}, meta={"loss": "ce", "seed": 3})
    return zv, yv, zt, yt, zo, res


def test_schema(data):
    *_, res = data
    assert res["schema"] == SCHEMA
    assert res["meta"] == {"loss": "ce", "seed": 3}
    assert set(res["temperatures"]) >= set(TEMPERATURE_METHODS)
    assert set(res["test"]["pre"]) == set(METRIC_KEYS)
    assert set(res["test"]["post"]) == set(res["temperatures"])
    assert set(res["val"]["pre"]) == set(METRIC_KEYS)
    assert set(res["ood"]["noise"]) >= {"auroc_entropy", "auroc_max_prob", "fpr95_entropy",
                                        "aupr_entropy", "post_auroc_entropy"}
    assert res["n"] == {"val": 400, "test": 600}
    assert res["ood"]["noise"]["n"] == 300


def test_pre_metrics_match_direct_calls_and_reference(data):
    zv, yv, zt, yt, zo, res = data
    pre = res["test"]["pre"]
    assert pre["ece"] == pytest.approx(ece_reference(zt, yt), abs=1e-6)
    assert pre["ece"] == pytest.approx(float(metrics.ece(logits=zt, labels=yt)), abs=1e-7)
    assert pre["adaptive_ece"] == pytest.approx(float(metrics.adaptive_ece(logits=zt, labels=yt)), abs=1e-7)
    assert pre["classwise_ece"] == pytest.approx(float(metrics.classwise_ece(logits=zt, labels=yt)), abs=1e-7)
    assert pre["nll"] == pytest.approx(torch.nn.functional.cross_entropy(zt, yt).item(), rel=1e-5)
    assert pre["error"] == pytest.approx((zt.argmax(1) != yt).double().mean().item(), abs=1e-7)
    assert res["val"]["pre"]["ece"] == pytest.approx(ece_reference(zv, yv), abs=1e-6)
    # labels drawn from softmax(z/3): the raw logits are over-confident
    assert res["temperatures"]["grid_ece"] > 1.5


def test_post_metrics_use_each_methods_temperature(data):
    zv, yv, zt, yt, zo, res = data
    for method in TEMPERATURE_METHODS:
        t = TemperatureScaling(method=method).fit(zv, yv).temperature_
        assert res["temperatures"][method] == pytest.approx(t, rel=1e-6)
        post = res["test"]["post"][method]
        assert post["ece"] == pytest.approx(ece_reference(zt / t, yt), abs=1e-6)
        assert post["nll"] == pytest.approx(
            torch.nn.functional.cross_entropy(zt / t, yt).item(), rel=1e-5)
        assert post["error"] == res["test"]["pre"]["error"]  # T keeps the argmax
    assert res["test"]["post"]["grid_ece"]["ece"] < res["test"]["pre"]["ece"]


def test_ood_metrics_against_sklearn(data):
    zv, yv, zt, yt, zo, res = data
    d = res["ood"]["noise"]
    y = np.r_[np.zeros(len(zt)), np.ones(len(zo))]
    s_ent = np.r_[entropy(zt), entropy(zo)]
    s_mp = -np.r_[torch.softmax(zt.double(), 1).amax(1).numpy(), torch.softmax(zo.double(), 1).amax(1).numpy()]
    assert d["auroc_entropy"] == pytest.approx(roc_auc_score(y, s_ent), abs=1e-6)
    assert d["auroc_max_prob"] == pytest.approx(roc_auc_score(y, s_mp), abs=1e-6)
    assert d["aupr_entropy"] == pytest.approx(average_precision_score(y, s_ent), abs=1e-5)
    # FPR on OOD at 95% TPR of in-distribution (ID positive, confidence = -entropy)
    fpr, tpr, _ = roc_curve(1 - y, -s_ent, drop_intermediate=False)
    assert d["fpr95_entropy"] == pytest.approx(fpr[np.argmax(tpr >= 0.95)], abs=1e-6)
    t = res["temperatures"]["grid_ece"]
    s_post = np.r_[entropy(zt / t), entropy(zo / t)]
    assert d["post_auroc_entropy"] == pytest.approx(roc_auc_score(y, s_post), abs=1e-6)


def test_bad_inputs_name_the_argument():
    z, y = synthetic(50, 3, 0)
    with pytest.raises(ValueError, match="`test_logits` to have 3 classes"):
        evaluate_logits(val_logits=z, val_labels=y, test_logits=torch.zeros(5, 4),
                        test_labels=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="`val_labels` to have 50 entries"):
        evaluate_logits(val_logits=z, val_labels=y[:10], test_logits=z, test_labels=y)
    with pytest.raises(ValueError, match=r"`ood_logits\['x'\]`"):
        evaluate_logits(val_logits=z, val_labels=y, test_logits=z, test_labels=y,
                        ood_logits={"x": torch.zeros(4, 2)})
    with pytest.raises(ValueError, match="`test_logits` to be finite"):
        evaluate_logits(val_logits=z, val_labels=y, test_logits=z * float("nan"), test_labels=y)
    with pytest.raises(ValueError, match="`n_bins`"):
        evaluate_logits(val_logits=z, val_labels=y, test_logits=z, test_labels=y, n_bins=0)


def test_logits_roundtrip_and_malformed_files(tmp_path):
    z, y = synthetic(20, 3, 0)
    p = save_logits(tmp_path / "a" / "test.npz", z, y)
    z2, y2 = load_logits(p)
    assert z2.dtype == np.float32 and y2.dtype == np.int64
    np.testing.assert_array_equal(z2, z.numpy())
    np.testing.assert_array_equal(y2, y.numpy())
    assert sorted(os.listdir(tmp_path / "a")) == ["test.npz", "test.npz.sha256"]  # no temp file
    save_logits(tmp_path / "ood.npz", z.double().numpy(), -np.ones(20, dtype=np.int32))
    assert load_logits(tmp_path / "ood.npz")[1].tolist() == [-1] * 20

    with pytest.raises(ResultsFileError, match="missing.npz.*does not exist"):
        load_logits(tmp_path / "missing.npz")
    trunc = tmp_path / "trunc.npz"
    trunc.write_bytes(p.read_bytes()[:100])
    with pytest.raises(ResultsFileError, match="trunc.npz.*malformed or truncated"):
        load_logits(trunc)
    np.savez(tmp_path / "nolabels.npz", logits=z.numpy())
    with pytest.raises(ResultsFileError, match=r"nolabels.npz.*missing array\(s\) \['labels'\]"):
        load_logits(tmp_path / "nolabels.npz")
    np.savez(tmp_path / "shape.npz", logits=z.numpy(), labels=y.numpy()[:5])
    with pytest.raises(ResultsFileError, match="shape.npz.*`labels` 1-D integer with 20"):
        load_logits(tmp_path / "shape.npz")
    np.savez(tmp_path / "dtype.npz", logits=y.numpy()[:, None].repeat(3, 1), labels=y.numpy())
    with pytest.raises(ResultsFileError, match="dtype.npz.*`logits` 2-D floating"):
        load_logits(tmp_path / "dtype.npz")
    with zipfile.ZipFile(tmp_path / "junk.npz", "w") as f:
        f.writestr("x.txt", "hello")
    with pytest.raises(ResultsFileError, match="junk.npz"):
        load_logits(tmp_path / "junk.npz")
    with pytest.raises(ValueError, match="`labels` to be 1-D integers with 20"):
        save_logits(tmp_path / "bad.npz", z, y.float())


def test_results_roundtrip_and_run_dir(tmp_path, data):
    zv, yv, zt, yt, zo, res = data
    path = write_results(tmp_path, res)
    assert path == tmp_path / "results.json"
    text = path.read_text()
    assert "NaN" not in text
    back = read_results(tmp_path)
    for k in METRIC_KEYS:
        a, b = res["test"]["pre"][k], back["test"]["pre"][k]
        assert (math.isnan(a) and math.isnan(b)) or a == b
    assert back["temperatures"] == res["temperatures"]

    run = tmp_path / "run"
    save_logits(run / "logits" / "val.npz", zv, yv)
    save_logits(run / "logits" / "test.npz", zt, yt)
    save_logits(run / "logits" / "ood_noise.npz", zo, -np.ones(len(zo), dtype=np.int64))
    (run / "config.json").write_text(json.dumps({"dataset": "synthetic", "model": "none", "loss": "ce",
                                                 "seed": 3, "lr": 0.1}))
    r2 = evaluate_saved_logits(run)
    assert r2["meta"] == {"dataset": "synthetic", "model": "none", "loss": "ce", "seed": 3}
    assert read_results(run)["test"]["pre"]["ece"] == pytest.approx(res["test"]["pre"]["ece"])
    assert r2["ood"]["noise"]["auroc_entropy"] == pytest.approx(res["ood"]["noise"]["auroc_entropy"])
    import torchcal.evaluate  # the moved-name shim is gone (issue 32: 0.1.0 has no users to keep)

    assert not hasattr(torchcal.evaluate, "evaluate_run_logits")

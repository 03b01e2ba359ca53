"""Correctness labels, evaluate_confidence against slow references from the definitions, and
the score calibrators against the conditions their fits satisfy (independent of the code)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import torchcal.metrics as M
from torchcal.llm import (
    ScoreCalibrator,
    calibrate_options,
    calibrate_scores,
    evaluate_confidence,
    exact_match,
    match_with,
    normalize_answer,
    normalized_match,
    reliability_diagram,
)
from torchcal.posthoc import TemperatureScaling


def _overconfident(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    conf = torch.rand(n, generator=g, dtype=torch.float64) * 0.6 + 0.4
    right = torch.rand(n, generator=g, dtype=torch.float64) < conf ** 3
    return conf, right


def test_matching():
    assert normalize_answer("The  quick, brown FOX!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
    preds = ["Paris", " paris ", "The Paris!", "Lyon", "12"]
    refs = ["Paris", "Paris", ["London", "paris"], "Paris", ["12.0", "12"]]
    assert exact_match(preds, refs).tolist() == [True, False, False, False, True]
    assert exact_match(preds[:2], refs[:2], strip=False).tolist() == [True, False]
    assert normalized_match(preds, refs).tolist() == [True, True, True, False, True]
    close = match_with(["12.04"], ["12"], lambda p, r: abs(float(p) - float(r)) < 0.05)
    assert close.tolist() == [True]
    with pytest.raises(ValueError, match="empty answer set"):
        exact_match(["a"], [[]])
    with pytest.raises(ValueError, match="sequence of 2 references"):
        exact_match(["a", "b"], ["a"])


def test_evaluate_confidence_against_slow_references():
    conf, right = _overconfident(300, 0)
    conf = (conf * 40).round() / 40  # ties, as real scores have
    r = evaluate_confidence(conf, right, n_bins=10)
    c, y = conf.tolist(), [int(v) for v in right]
    n = len(c)
    # ECE: equal-width bins (k/10, (k+1)/10], 0 in the first
    bins: dict[int, list[int]] = {}
    for i, p in enumerate(c):
        bins.setdefault(max(0, math.ceil(p * 10 - 1e-12) - 1), []).append(i)
    ece = sum(len(ix) / n * abs(sum(y[i] for i in ix) / len(ix) - sum(c[i] for i in ix)
                                / len(ix)) for ix in bins.values())
    assert r["ece"] == pytest.approx(ece, abs=1e-6)
    assert r["brier"] == pytest.approx(sum((p - t) ** 2 for p, t in zip(c, y, strict=True)) / n, abs=1e-12)
    two = torch.stack([1 - conf, conf], 1)
    assert r["brier"] == pytest.approx(float(M.brier(probs=two, labels=right.long())) / 2)
    pos = [p for p, t in zip(c, y, strict=True) if t]
    neg = [p for p, t in zip(c, y, strict=True) if not t]
    auc = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))
    assert r["auroc"] == pytest.approx(auc, abs=1e-12)
    # AURC / AUGRC: accept the most confident first; a tied group's errors spread evenly
    order = sorted(range(n), key=lambda i: -c[i])
    err_k, k, risk, grisk = 0.0, 0, [], []
    groups: dict[float, list[int]] = {}
    for i in order:
        groups.setdefault(c[i], []).append(i)
    for p in sorted(groups, reverse=True):
        ix = groups[p]
        e = sum(1 - y[i] for i in ix) / len(ix)
        for _ in ix:
            k += 1
            err_k += e
            risk.append(err_k / k)
            grisk.append(err_k / n)
    assert r["aurc"] == pytest.approx(sum(risk) / n, abs=1e-12)
    assert r["augrc"] == pytest.approx(sum(grisk) / n, abs=1e-12)
    assert r["accuracy"] == pytest.approx(sum(y) / n)


def test_calibrators_satisfy_their_fit_conditions():
    conf, right = _overconfident(600, 1)
    y = right.double()
    s = torch.logit(conf)
    # Platt: the logistic-regression score equations sum (q - y) = 0 and sum (q - y) s = 0
    q = calibrate_scores(conf, right, "platt").predict(conf)
    assert abs(float((q - y).sum())) < 1e-6 and abs(float(((q - y) * s).sum())) < 1e-6
    # beta: the same for its features log p and -log(1 - p)
    q = calibrate_scores(conf, right, "beta").predict(conf)
    for x in (torch.ones_like(conf), conf.log(), -torch.log1p(-conf)):
        assert abs(float(((q - y) * x).sum())) < 1e-6
    # isotonic: non-decreasing in the score, and the fit keeps the mean (pool-adjacent)
    q = calibrate_scores(conf, right, "isotonic").predict(conf)
    o = torch.argsort(conf)
    assert bool((torch.diff(q[o]) >= -1e-12).all())
    assert float(q.mean()) == pytest.approx(float(y.mean()), abs=1e-9)
    # histogram: 6 equal-mass bins of 100 distinct scores each -> each bin's share right
    q = calibrate_scores(conf, right, "histogram", n_bins=6).predict(conf)
    for b in range(6):
        ix = o[b * 100:(b + 1) * 100]
        assert torch.allclose(q[ix], y[ix].mean().expand(100), atol=1e-12)
    # scale="logit": a log-probability score is taken as it is
    lp = conf.log()
    qs = calibrate_scores(lp, right, "platt", scale="logit").predict(lp)
    assert abs(float(((qs - y) * lp).sum())) < 1e-6


def test_calibration_lowers_test_ece_and_round_trips():
    conf, right = _overconfident(4000, 2)
    tc, tr = _overconfident(4000, 3)
    before = evaluate_confidence(tc, tr)["ece"]
    assert before > 0.1
    for method in ("platt", "isotonic", "beta", "histogram"):
        cal = ScoreCalibrator(method).fit(conf, right)
        after = evaluate_confidence(cal.predict(tc), tr)["ece"]
        assert after < 0.04, (method, after)
        back = ScoreCalibrator.from_dict(cal.to_dict())
        assert torch.allclose(back.predict(tc), cal.predict(tc), atol=1e-12)
    out = ScoreCalibrator("platt").fit(conf.numpy(), right.numpy()).predict(tc.numpy())
    assert isinstance(out, np.ndarray)


def test_option_temperature(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(4)
    z = torch.randn(500, 4, generator=g, dtype=torch.float64)
    ans = torch.distributions.Categorical(logits=z / 2.5).sample()  # true temperature 2.5
    lengths = torch.randint(1, 4, (500, 4), generator=g)
    ts = calibrate_options(z * lengths, ans, lengths=lengths)
    ref = TemperatureScaling().fit(z, ans)
    assert ts.temperature_ == pytest.approx(ref.temperature_, rel=1e-6)
    assert 1.8 < ts.temperature_ < 3.5
    monkeypatch.setenv("MPLBACKEND", "Agg")
    conf, right = _overconfident(200, 5)
    fig = reliability_diagram(conf, right, n_bins=10, path=tmp_path / "rel.png")
    assert fig is not None and (tmp_path / "rel.png").stat().st_size > 0


def test_bad_input_one_clear_line():
    with pytest.raises(ValueError, match=r"probabilities in \[0, 1\].*scale='logit'"):
        evaluate_confidence(torch.tensor([0.2, 1.3]), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match=r"probabilities in \[0, 1\]"):
        calibrate_scores(torch.tensor([-2.0, -0.1]), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="NaN/inf"):
        evaluate_confidence(torch.tensor([0.2, float("nan")]), torch.tensor([1, 0]))
    with pytest.raises(ValueError, match=r"`correct` to have shape \(2,\)"):
        evaluate_confidence(torch.tensor([0.2, 0.3]), torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match="`method` to be one of"):
        ScoreCalibrator("temperature")
    with pytest.raises(ValueError, match="K >= 1 options"):
        calibrate_options(torch.zeros(3, 0), torch.zeros(3, dtype=torch.long))
    with pytest.warns(UserWarning, match="AUROC is undefined"):
        r = evaluate_confidence(torch.tensor([0.2, 0.9]), torch.tensor([1, 1]))
    assert math.isnan(r["auroc"])

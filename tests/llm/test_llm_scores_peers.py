"""torchcal.llm's sequence scores and ECE equal LM-Polygraph's and uqlm's numbers saved by
benchmarks/bench_llm_scores_peers.py on the same seeded answers, to 1e-6; no peer is imported
here.  The peers' signs and transforms (LM-Polygraph returns uncertainties, e.g.
``MaximumSequenceProbability = -sum log p``; uqlm's negentropy is ``1 - H / log V``) and bin
conventions (LM-Polygraph: 20 equal-width bins, uqlm: 10, both right-closed with 0 in the
first bin) are those documented in the benchmark and benchmarks/results/llm_scores_peers.md."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import torchcal.llm as L
from torchcal import metrics as M

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "peers" / "llm_scores.json"
EPS = float(np.finfo(np.float64).eps)
CONFS = ("length_normalized_prob", "min_token_prob", "sequence_prob", "p_true")
ESTIMATORS = ("MaximumSequenceProbability", "Perplexity", "MeanTokenEntropy")


def _data(seed, n, t, v):
    """The benchmark's make_data: same generator, same order of draws."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, t + 1, size=n)
    mask = np.arange(t)[None, :] < lengths[:, None]
    temp = rng.uniform(0.3, 4.0, size=n)
    logits = rng.normal(size=(n, t, v)) * temp[:, None, None]
    gumbel = -np.log(-np.log(rng.random(size=(n, t, v))))
    tokens = np.argmax(logits + gumbel, axis=2)
    z_true = 2.0 * rng.normal(size=(n, v))
    u = rng.random(size=n)
    logp = logits - logits.max(axis=2, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(axis=2, keepdims=True))
    lp = np.take_along_axis(logp, tokens[:, :, None], axis=2)[:, :, 0]
    lnp = np.exp(np.where(mask, lp, 0.0).sum(1) / mask.sum(1))
    correct = u < lnp ** 0.7
    edge = np.concatenate([np.arange(21) / 20, np.arange(1, 40, 2) / 40, [0.0, 1.0, 0.5]])
    edge_correct = rng.random(size=edge.size) < 0.6
    return {"mask": mask, "logits": logits, "tokens": tokens, "z_true": z_true,
            "correct": correct, "edge": edge, "edge_correct": edge_correct}


@pytest.fixture(scope="module")
def case():
    fx = json.loads(FIXTURE.read_text())
    d = _data(fx["seed"], fx["n"], fx["t"], fx["v"])
    z = torch.from_numpy(d["logits"])
    mask = torch.from_numpy(d["mask"])
    lp = L.token_log_probs(z, torch.from_numpy(d["tokens"]))
    s = L.confidence_scores(lp, mask, z)
    s["mean_token_entropy"] = L.mean_token_entropy(z, mask)
    s["p_true"] = L.p_true(torch.from_numpy(d["z_true"]), yes_ids=0, no_ids=1, normalize=False)
    return fx["values"], s, d


def _close(ours, saved):
    np.testing.assert_allclose(np.asarray(ours, dtype=np.float64), np.asarray(saved),
                               rtol=0, atol=1e-6)


def test_fixture_matches_the_regenerated_data(case):
    saved, s, d = case
    n = d["mask"].shape[0]
    assert len(saved["polygraph.Perplexity"]) == n
    assert d["mask"].sum(1).min() >= 1 and d["mask"].sum(1).max() > 1  # variable lengths
    assert 0.2 < d["correct"].mean() < 0.9  # ECE over right and wrong answers


def test_polygraph_estimators_are_torchcal_uncertainties(case):
    saved, s, _ = case
    _close(-s["sequence_log_prob"], saved["polygraph.MaximumSequenceProbability"])
    _close(-s["mean_log_prob"], saved["polygraph.Perplexity"])
    _close(s["mean_token_entropy"], saved["polygraph.MeanTokenEntropy"])
    _close(-s["p_true"].log(), saved["polygraph.PTrue"])


def test_uqlm_white_box_scores_are_torchcal_scores(case):
    saved, s, d = case
    _close(s["length_normalized_prob"], saved["uqlm.sequence_probability"])
    _close(s["sequence_prob"], saved["uqlm.sequence_probability_unnormalized"])
    _close(s["min_token_prob"], saved["uqlm.min_probability"])
    v = d["logits"].shape[2]
    _close(1 - s["mean_token_entropy"] / math.log(v), saved["uqlm.mean_token_negentropy"])
    _close(s["p_true"], saved["uqlm.p_true"])


def test_polygraph_ece_20_bins(case):
    saved, s, d = case
    ok = torch.from_numpy(d["correct"])
    for name in CONFS:
        _close(L.evaluate_confidence(s[name], ok, n_bins=20)["ece"],
               saved[f"polygraph.ECE20.{name}"])
    e = L.evaluate_confidence(d["edge"], d["edge_correct"], n_bins=20)["ece"]
    _close(e, saved["polygraph.ECE20.edges"])


def test_polygraph_minmax_normalized_ece(case):
    saved, s, d = case
    ok = torch.from_numpy(d["correct"])
    ues = {"MaximumSequenceProbability": -s["sequence_log_prob"],
           "Perplexity": -s["mean_log_prob"], "MeanTokenEntropy": s["mean_token_entropy"]}
    for name in ESTIMATORS:
        conf = -ues[name]
        conf = (conf - conf.min()) / (conf.max() - conf.min())  # LM-Polygraph's min-max
        _close(conf, saved[f"polygraph.MinMaxNormalizer.{name}"])
        _close(L.evaluate_confidence(conf, ok, n_bins=20)["ece"],
               saved[f"polygraph.ECE20_normalize.{name}"])


def test_uqlm_evaluate_calibration_10_bins(case):
    saved, s, d = case
    ok = torch.from_numpy(d["correct"])
    for name in CONFS:
        c = s[name]
        r = L.evaluate_confidence(c, ok, n_bins=10)
        _close(r["ece"], saved[f"uqlm.ece.{name}"])
        _close(r["brier"], saved[f"uqlm.brier_score.{name}"])
        _close(M.mce(probs=c, labels=ok.long(), n_bins=10, task="binary"),
               saved[f"uqlm.mce.{name}"])
        cc = c.clamp(EPS, 1 - EPS)  # scikit-learn's log_loss clip
        _close(M.nll(probs=torch.stack([1 - cc, cc], 1), labels=ok.long()),
               saved[f"uqlm.log_loss.{name}"])
    _close(L.evaluate_confidence(d["edge"], d["edge_correct"], n_bins=10)["ece"],
           saved["uqlm.ece.edges"])


def _ece_left_closed(conf, correct, n_bins):
    """A slow ECE with left-closed bins [e_k, e_(k+1)) (1.0 in the last bin)."""
    total = 0.0
    for k in range(n_bins):
        lo, hi = k / n_bins, (k + 1) / n_bins
        inb = (conf >= lo) & ((conf < hi) if k < n_bins - 1 else (conf <= hi))
        if inb.any():
            total += inb.mean() * abs(conf[inb].mean() - correct[inb].mean())
    return total


def test_edge_set_tells_the_bin_conventions_apart(case):
    """The saved edge-set ECEs pin the right-closed convention: a left-closed one is off."""
    saved, _, d = case
    for b, key in ((20, "polygraph.ECE20.edges"), (10, "uqlm.ece.edges")):
        left = _ece_left_closed(d["edge"], d["edge_correct"].astype(float), b)
        assert abs(left - saved[key]) > 1e-3

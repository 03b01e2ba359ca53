"""torchcal.llm's sequence scores and ECE against LM-Polygraph's and uqlm's (issue 48, "Peers,
side by side on the same scores") on seeded generated answers.

Inputs (``make_data``, NumPy ``default_rng(SEED)``): N answers of 1..T tokens (mask = the
first ``length`` positions), (N, T, V) logits at varying temperatures, each answer's tokens
drawn from its softmax (Gumbel-max), (N, V) logits of a P(True) prompt (token 0 = "True") and
a correctness label per answer (``rng.random(N) < length-normalised probability ** 0.7``).
Each peer gets the same numbers in the data structures it reads:

* LM-Polygraph: ``stats["greedy_log_likelihoods"]`` (one list of the answer's token
  log-probabilities per answer), ``stats["entropy"]`` computed by its own
  ``EntropyCalculator`` from ``"greedy_log_probs"`` (the answer's (len, V) log-softmax rows)
  and ``stats["p_true"]`` (the log-probability of the "True" token, as its prompt calculator
  reads it).  Its estimators return *uncertainties*:
  ``MaximumSequenceProbability = -sum log p = -sequence_log_prob``,
  ``Perplexity = -mean log p = -mean_log_prob``, ``MeanTokenEntropy = mean_token_entropy``,
  ``PTrue = -log p(True) = -log p_true(normalize=False)``.
  Its ``ue_metrics.ECE`` (default 20 bins) bins the confidence ``-estimator``; with
  ``normalize=True`` it min-max scales that confidence first; ``normalizers.MinMaxNormalizer``
  is the same scaling (clipped).
* uqlm: white-box scorers on its ``logprobs_results`` (per answer, a list of
  ``{"token", "logprob", "top_logprobs": [{"token", "logprob"}, ...]}``, the top list holding
  all V tokens): ``SingleLogprobsScorer``'s ``sequence_probability`` (length-normalised,
  its default) ``= length_normalized_prob``, the same with ``length_normalize=False``
  ``= exp(sequence_log_prob)``, ``min_probability = min_token_prob``;
  ``TopLogprobsScorer(top_k_logprobs=V)``'s ``mean_token_negentropy = 1 - mean_t H_t / log V
  = 1 - mean_token_entropy / log V``; ``WhiteBoxPTrue``'s first-token reading (token "True"
  -> its probability) ``= p_true(normalize=False)``.  Its ``calibration.evaluate_calibration``
  (10 bins) gives ``ece``, ``mce``, ``brier_score`` and ``log_loss``.

Bin conventions.  Both peers use equal-width bins on [0, 1], right-closed ``(e_k, e_{k+1}]``,
with 0 in the first bin (LM-Polygraph: first bin ``[0, e_1]``; uqlm: first lower edge
``-eps``), i.e. torchcal's convention (:func:`torchcal.metrics.ece`, ``task="binary"``, which
:func:`torchcal.llm.evaluate_confidence` calls), with B = 20 (LM-Polygraph) or 10 (uqlm).  Their
edges are ``np.linspace(0, 1, B + 1)``, torchcal's ``k / B``; an edge-value set
(confidences exactly ``k / 20``, 0 and 1) checks that the two agree there too.  torchcal has no
min-max normaliser: ``minmax`` below (two lines) reproduces LM-Polygraph's ``normalize=True``.

Writes benchmarks/results/llm_scores_peers.md and tests/data/peers/llm_scores.json (seed,
sizes, the peers' numbers), which tests/llm/test_llm_scores_peers.py checks torchcal against
without the peers.

Usage (the peers live in a separate venv)::

    PYTHONPATH=src /work/peers-venv/bin/python benchmarks/bench_llm_scores_peers.py
"""

from __future__ import annotations

import importlib.metadata as md
import json
import math
import platform
import warnings
from pathlib import Path

import numpy as np
import torch

import torchcal.llm as L
from torchcal import metrics as M

warnings.filterwarnings("ignore")  # the peers' import-time deprecation chatter

ROOT = Path(__file__).resolve().parents[1]
SEED, N, T, V = 48, 150, 16, 15
EPS = float(np.finfo(np.float64).eps)


def make_data(seed: int = SEED, n: int = N, t: int = T, v: int = V) -> dict:
    """The seeded answers (the test regenerates them with the same code)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, t + 1, size=n)
    mask = np.arange(t)[None, :] < lengths[:, None]
    temp = rng.uniform(0.3, 4.0, size=n)
    logits = rng.normal(size=(n, t, v)) * temp[:, None, None]
    gumbel = -np.log(-np.log(rng.random(size=(n, t, v))))
    tokens = np.argmax(logits + gumbel, axis=2)
    z_true = 2.0 * rng.normal(size=(n, v))
    u = rng.random(size=n)
    # labels from a NumPy length-normalised probability (same code in the test)
    logp = logits - logits.max(axis=2, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(axis=2, keepdims=True))
    lp = np.take_along_axis(logp, tokens[:, :, None], axis=2)[:, :, 0]
    lnp = np.exp(np.where(mask, lp, 0.0).sum(1) / mask.sum(1))
    correct = u < lnp ** 0.7
    edge = np.concatenate([np.arange(21) / 20, np.arange(1, 40, 2) / 40, [0.0, 1.0, 0.5]])
    edge_correct = rng.random(size=edge.size) < 0.6
    return {"lengths": lengths, "mask": mask, "logits": logits, "tokens": tokens,
            "z_true": z_true, "correct": correct, "edge": edge, "edge_correct": edge_correct}


def minmax(x: np.ndarray) -> np.ndarray:
    """LM-Polygraph's ``ECE(normalize=True)`` / ``MinMaxNormalizer`` scaling of a confidence:
    ``(x - min) / (max - min)`` (torchcal has no such normaliser)."""
    return (x - x.min()) / (x.max() - x.min())


def torchcal_values(d: dict) -> dict:
    """torchcal's numbers, keyed like the peers' (signs and transforms applied)."""
    z = torch.from_numpy(d["logits"])
    mask = torch.from_numpy(d["mask"])
    lp = L.token_log_probs(z, torch.from_numpy(d["tokens"]))
    s = L.confidence_scores(lp, mask, z)
    h = L.mean_token_entropy(z, mask)
    pt = L.p_true(torch.from_numpy(d["z_true"]), yes_ids=0, no_ids=1, normalize=False)
    ok = torch.from_numpy(d["correct"])
    out = {
        "polygraph.MaximumSequenceProbability": -s["sequence_log_prob"],
        "polygraph.Perplexity": -s["mean_log_prob"],
        "polygraph.MeanTokenEntropy": h,
        "polygraph.PTrue": -pt.log(),
        "uqlm.sequence_probability": s["length_normalized_prob"],
        "uqlm.sequence_probability_unnormalized": s["sequence_prob"],
        "uqlm.min_probability": s["min_token_prob"],
        "uqlm.mean_token_negentropy": 1 - h / math.log(d["logits"].shape[2]),
        "uqlm.p_true": pt,
    }
    out = {k: v.numpy() for k, v in out.items()}
    confs = {"length_normalized_prob": s["length_normalized_prob"],
             "min_token_prob": s["min_token_prob"], "sequence_prob": s["sequence_prob"],
             "p_true": pt}
    for name, c in confs.items():
        out[f"polygraph.ECE20.{name}"] = L.evaluate_confidence(c, ok, n_bins=20)["ece"]
        r = L.evaluate_confidence(c, ok, n_bins=10)
        out[f"uqlm.ece.{name}"] = r["ece"]
        out[f"uqlm.brier_score.{name}"] = r["brier"]
        out[f"uqlm.mce.{name}"] = float(M.mce(probs=c, labels=ok.long(), n_bins=10,
                                              task="binary"))
        # scikit-learn's log_loss (uqlm's) clips p to [eps, 1 - eps], eps of float64
        cc = c.clamp(EPS, 1 - EPS)
        out[f"uqlm.log_loss.{name}"] = float(M.nll(probs=torch.stack([1 - cc, cc], 1),
                                                   labels=ok.long()))
    for name, ue in (("MaximumSequenceProbability", -s["sequence_log_prob"]),
                     ("Perplexity", -s["mean_log_prob"]), ("MeanTokenEntropy", h)):
        c = torch.from_numpy(minmax(-ue.numpy()))
        out[f"polygraph.ECE20_normalize.{name}"] = L.evaluate_confidence(c, ok, n_bins=20)["ece"]
        out[f"polygraph.MinMaxNormalizer.{name}"] = c.numpy()
    e, eok = torch.from_numpy(d["edge"]), torch.from_numpy(d["edge_correct"])
    out["polygraph.ECE20.edges"] = L.evaluate_confidence(e, eok, n_bins=20)["ece"]
    out["uqlm.ece.edges"] = L.evaluate_confidence(e, eok, n_bins=10)["ece"]
    return out


def polygraph_values(d: dict) -> dict:
    from lm_polygraph.estimators import (
        MaximumSequenceProbability,
        MeanTokenEntropy,
        Perplexity,
        PTrue,
    )
    from lm_polygraph.normalizers.minmax import MinMaxNormalizer
    from lm_polygraph.stat_calculators.entropy import EntropyCalculator
    from lm_polygraph.ue_metrics import ECE

    logp = torch.log_softmax(torch.from_numpy(d["logits"]), dim=2).numpy()
    rows = range(len(d["lengths"]))
    lens = d["lengths"]
    greedy_log_probs = [logp[i, :lens[i]] for i in rows]
    ll = [[float(logp[i, t, d["tokens"][i, t]]) for t in range(lens[i])] for i in rows]
    stats = {"greedy_log_likelihoods": ll, "greedy_log_probs": greedy_log_probs}
    stats.update(EntropyCalculator()(stats, texts=None, model=None))
    stats["p_true"] = torch.log_softmax(torch.from_numpy(d["z_true"]), 1)[:, 0].numpy()
    out = {f"polygraph.{e}": np.asarray(e(stats), dtype=np.float64) for e in
           (MaximumSequenceProbability(), Perplexity(), MeanTokenEntropy(), PTrue())}
    ok = d["correct"].astype(float)
    confs = {"length_normalized_prob": np.exp(-out["polygraph.Perplexity"]),
             "min_token_prob": np.array([math.exp(min(r)) for r in ll]),
             "sequence_prob": np.exp(-out["polygraph.MaximumSequenceProbability"]),
             "p_true": np.exp(-out["polygraph.PTrue"])}
    for name, c in confs.items():  # ECE reads the confidence -ue: pass ue = -conf
        out[f"polygraph.ECE20.{name}"] = float(ECE()(-c, ok))
    for name in ("MaximumSequenceProbability", "Perplexity", "MeanTokenEntropy"):
        ue = out[f"polygraph.{name}"]
        out[f"polygraph.ECE20_normalize.{name}"] = float(ECE(normalize=True)(ue, ok))
        norm = MinMaxNormalizer()
        norm.fit(ue)
        out[f"polygraph.MinMaxNormalizer.{name}"] = np.asarray(norm.transform(ue), np.float64)
    out["polygraph.ECE20.edges"] = float(ECE()(-d["edge"], d["edge_correct"].astype(float)))
    return out


def _uqlm_results(d: dict) -> list:
    logp = torch.log_softmax(torch.from_numpy(d["logits"]), dim=2).numpy()
    tok = d["tokens"]
    res = []
    for i, n in enumerate(d["lengths"]):
        res.append([{"token": f"t{tok[i, t]}", "logprob": float(logp[i, t, tok[i, t]]),
                     "top_logprobs": [{"token": f"t{j}", "logprob": float(logp[i, t, j])}
                                      for j in range(logp.shape[2])]} for t in range(n)])
    return res


def uqlm_values(d: dict) -> dict:
    from uqlm.calibration.evaluate import evaluate_calibration
    from uqlm.utils.results import UQResult
    from uqlm.white_box.p_true import PTrueScorer
    from uqlm.white_box.single_logprobs import SingleLogprobsScorer
    from uqlm.white_box.top_logprobs import TopLogprobsScorer

    res = _uqlm_results(d)
    out = {}
    s = SingleLogprobsScorer().evaluate(res)
    out["uqlm.sequence_probability"] = s["sequence_probability"]
    out["uqlm.min_probability"] = s["min_probability"]
    s = SingleLogprobsScorer(length_normalize=False).evaluate(res)
    out["uqlm.sequence_probability_unnormalized"] = s["sequence_probability"]
    top = TopLogprobsScorer(top_k_logprobs=d["logits"].shape[2]).evaluate(res)
    out["uqlm.mean_token_negentropy"] = top["mean_token_negentropy"]
    lp_true = torch.log_softmax(torch.from_numpy(d["z_true"]), 1)[:, 0].numpy()
    out["uqlm.p_true"] = [PTrueScorer._extract_ptrue_from_logprobs_result(
        [{"token": "True", "logprob": float(x)}]) for x in lp_true]
    out = {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}
    data = {"responses": ["a"] * len(res),
            "length_normalized_prob": out["uqlm.sequence_probability"],
            "min_token_prob": out["uqlm.min_probability"],
            "sequence_prob": out["uqlm.sequence_probability_unnormalized"],
            "p_true": out["uqlm.p_true"]}
    table = evaluate_calibration(UQResult({"data": data, "metadata": {}}),
                                 d["correct"].astype(int), plot=False)
    for name in ("length_normalized_prob", "min_token_prob", "sequence_prob", "p_true"):
        for col in ("ece", "mce", "brier_score", "log_loss"):
            out[f"uqlm.{col}.{name}"] = float(table.loc[name, col])
    edge = evaluate_calibration(UQResult({"data": {"responses": ["a"] * d["edge"].size,
                                                   "edges": d["edge"]}, "metadata": {}}),
                                d["edge_correct"].astype(int), plot=False)
    out["uqlm.ece.edges"] = float(edge.loc["edges", "ece"])
    return out


def _diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def main() -> None:
    d = make_data()
    ours = torchcal_values(d)
    peers = {**polygraph_values(d), **uqlm_values(d)}
    diffs = {k: _diff(ours[k], v) for k, v in peers.items()}
    worst = max(diffs.values())
    versions = {p: md.version(p) for p in ("lm-polygraph", "uqlm", "torch", "numpy",
                                           "scikit-learn")}
    fixture = {
        "seed": SEED, "n": N, "t": T, "v": V, "versions": versions,
        "note": "written by benchmarks/bench_llm_scores_peers.py; inputs are regenerated "
                "from the seed by make_data (NumPy default_rng)",
        "values": {k: (np.asarray(v).tolist() if np.ndim(v) else float(v))
                   for k, v in sorted(peers.items())},
    }
    path = ROOT / "tests" / "data" / "peers" / "llm_scores.json"
    vals = fixture.pop("values")
    body = json.dumps(fixture, indent=1)[:-2] + ',\n "values": {\n' + ",\n".join(
        f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in vals.items()) + "\n }\n}\n"
    assert json.loads(body)["values"] == vals
    path.write_text(body)
    rows = "\n".join(f"| `{k}` | {'(N,)' if np.ndim(peers[k]) else f'{float(peers[k]):.6f}'}"
                     f" | {diffs[k]:.2e} |" for k in sorted(peers))
    md_text = RESULT_TEMPLATE.format(
        versions=", ".join(f"{k} {v}" for k, v in versions.items()),
        python=platform.python_version(), machine=f"{platform.machine()} "
        f"{platform.processor() or platform.system()}", n=N, t=T, v=V, seed=SEED,
        rows=rows, worst=f"{worst:.2e}")
    (ROOT / "benchmarks" / "results" / "llm_scores_peers.md").write_text(md_text)
    print(f"max abs difference over {len(diffs)} quantities: {worst:.3e}")
    for k in sorted(diffs):
        print(f"{diffs[k]:.2e}  {k}")
    assert worst < 1e-6, "a peer disagrees with torchcal beyond 1e-6"


RESULT_TEMPLATE = """# torchcal.llm's scores and ECE against LM-Polygraph and uqlm

Written by `PYTHONPATH=src /work/peers-venv/bin/python benchmarks/bench_llm_scores_peers.py`
(issue 48, "Peers, side by side on the same scores").  Versions: {versions}; Python {python};
machine {machine}, CPU.  The peers' numbers are saved in `tests/data/peers/llm_scores.json`;
`tests/llm/test_llm_scores_peers.py` checks torchcal against them without the peers installed.

**Largest absolute difference, over every quantity below: {worst}** (target 1e-6).

## Data

Seed {seed}, NumPy `default_rng`: N = {n} answers of 1..{t} tokens (variable lengths; the mask
is the first `length` positions), vocabulary V = {v}, logits at temperatures 0.3..4, tokens
drawn from each position's softmax; (N, V) logits of a P(True) prompt ("True" = token 0);
correctness `u < length_normalized_prob ** 0.7`.  An edge set holds the confidences
`k / 20` (k = 0..20), 0, 1 and 0.5 exactly and the mid-bin values `(2k + 1) / 40`, to check
the bin convention at the edges (a left-closed convention gives other numbers on it: test).

## What is compared (peer = transform of torchcal)

| peer | torchcal |
|---|---|
| LM-Polygraph `MaximumSequenceProbability` (`greedy_log_likelihoods`) | `-sequence_log_prob` |
| LM-Polygraph `Perplexity` (`greedy_log_likelihoods`) | `-mean_log_prob` |
| LM-Polygraph `MeanTokenEntropy` (`entropy` from its `EntropyCalculator` on `greedy_log_probs`) | `mean_token_entropy` |
| LM-Polygraph `PTrue` (`p_true` = log-prob of the "True" token) | `-log p_true(normalize=False)` |
| LM-Polygraph `MinMaxNormalizer` (fit and transform on the same uncertainties) | min-max of `-uncertainty` (helper `minmax`) |
| LM-Polygraph `ue_metrics.ECE()` (20 bins) on `-conf` | `evaluate_confidence(conf, correct, n_bins=20)["ece"]` |
| LM-Polygraph `ECE(normalize=True)` on an estimator | `evaluate_confidence(minmax(-ue), correct, n_bins=20)["ece"]` |
| uqlm `SingleLogprobsScorer` `sequence_probability` (length-normalised, default) | `length_normalized_prob` |
| uqlm the same with `length_normalize=False` | `exp(sequence_log_prob)` |
| uqlm `min_probability` | `min_token_prob` |
| uqlm `TopLogprobsScorer(top_k_logprobs=V)` `mean_token_negentropy` | `1 - mean_token_entropy / log V` |
| uqlm `PTrueScorer` first-token reading ("True" -> its probability) | `p_true(normalize=False)` |
| uqlm `evaluate_calibration` `ece`, `mce` (10 bins), `brier_score`, `log_loss` | `evaluate_confidence(n_bins=10)` `ece`, `brier`; `metrics.mce(task="binary", n_bins=10)`; `metrics.nll` of `[1 - p, p]` with `p` clipped to `[eps, 1 - eps]` (scikit-learn's `log_loss` clip, eps of float64; unclipped, a right answer with `sequence_prob` below 1e-16 would differ: 2.2e-2 on a 300-answer draw) |

ECE inputs: the confidences `length_normalized_prob`, `min_token_prob`, `sequence_prob` and
`p_true` (on the peer's side taken from the peer's own outputs: `exp(-Perplexity)`,
`exp(-MaximumSequenceProbability)`, `exp(-PTrue)`, uqlm's scorers; LM-Polygraph has no
minimum-probability estimator, so its `min_token_prob` is `exp(min(greedy_log_likelihoods))`),
and the edge set.

**Bin convention.** LM-Polygraph's ECE (20 bins) and uqlm's (10 bins) both use equal-width
bins on [0, 1], right-closed `(e_k, e_(k+1)]`, with 0 in the first bin, the convention of
`torchcal.metrics.ece(task="binary")` (hence of `torchcal.llm.evaluate_confidence`) with
`n_bins` = 20 or 10.  Their edges are `np.linspace(0, 1, B + 1)`, torchcal's `k / B`; on the
edge set (values exactly `k / 20`) the results agree too.  Both compare the mean confidence
with the share of right answers in each bin, weighted by the bin's share of answers.
torchcal has no min-max normaliser, so LM-Polygraph's `normalize=True` is reproduced by the
two-line `minmax` helper in the benchmark.  Not compared: LM-Polygraph's `QuantileNormalizer`
(an empirical CDF) and `BinnedPCCNormalizer` (equal-mass bins of the uncertainty, fitted with
`scipy.stats.binned_statistic`'s left-closed bins but looked up right-closed, so a value at
or below the first edge, the fit's smallest uncertainty itself, lands in the last bin: on
uncertainties 0..9 with 2 bins, `transform` gives 0 (the last bin's mean) for 0 and 1 for 5,
which was fitted in the second bin), whose conventions `ScoreCalibrator("histogram")` does not
follow; uqlm's `ScoreCalibrator` (scikit-learn's `LogisticRegression` with its default L2
penalty on the raw score, and `IsotonicRegression`), which differs from torchcal's Platt
scaling by design.

## Results (max |peer - torchcal|)

| quantity | peer value | max abs diff |
|---|---|---|
{rows}

## Installation notes

Both install beside torch 2.13.0 (`pip install -c torch-pin.txt lm-polygraph uqlm`).
LM-Polygraph 0.7.0 pulls in transformers, spacy, bitsandbytes, fschat and more; it imports.
uqlm 0.6.7 pins `numpy<2` (Python < 3.13), `pandas<3`, `transformers<5`, `datasets<5`: its
install downgraded numpy to 1.26.4, after which `import lm_polygraph` failed in pyarrow
(`ImportError: pyarrow requires NumPy 2.0 or newer, found 1.26.4`).  The previous versions were
put back (`--no-deps`: numpy 2.4.6, pandas 3.1.1, transformers 5.25.0, datasets 5.2.0,
huggingface_hub 2.4.0, tokenizers 0.23.3, sentence-transformers 6.3.0, fsspec, rich); uqlm's
white-box scorers and calibration module import and run on them, against its declared pins.
"""


if __name__ == "__main__":
    main()

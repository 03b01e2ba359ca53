"""The LLM example (issue 39, item 5): runs without a download in its quick mode, and its
numbers are checked here independently of it: the token-level ECE equals the ECE of the
flattened non-padding tokens, temperature scaling on (N, T, V) logits equals the scaling of
the flattened tokens, and the multiple-choice confidence is the softmax over the options of
their continuations' summed log-probabilities."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

import torchcal.metrics as M
from torchcal.posthoc import TemperatureScaling

ROOT = Path(__file__).resolve().parents[1]


def _example():
    spec = importlib.util.spec_from_file_location("llm_example",
                                                  ROOT / "examples" / "llm_calibration.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_llm_example_quick_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    ex = _example()
    out = ex.main(["--quick", "--out", str(tmp_path)])
    assert (tmp_path / "mc_reliability.png").stat().st_size > 0
    assert out["temperature"] > 1.0  # over-fitted on a small fixed set: over-confident
    assert out["token_nll_ts"] < out["token_nll"]
    assert 0.0 <= out["mc_ece"] <= 1.0 and 0.25 < out["mc_accuracy"] <= 1.0


def test_llm_example_pieces_against_independent_computations():
    ex = _example()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = ex.TinyCausalLM().eval()
    x, y = ex.make_sequences(40, g, noise=0.2)
    assert bool((y == ex.IGNORE).any())  # padding is there
    with torch.no_grad():
        z = model(x)  # (N, T, V)
    keep = y.reshape(-1) != ex.IGNORE
    zf, yf = z.reshape(-1, ex.VOCAB)[keep], y.reshape(-1)[keep]
    assert float(M.ece(logits=z.movedim(-1, 1), labels=y)) == float(M.ece(logits=zf, labels=yf))
    ts, tf = TemperatureScaling().fit(z, y), TemperatureScaling().fit(zf, yf)
    assert ts.temperature_ == tf.temperature_
    assert torch.equal(ts.predict_proba(z).reshape(-1, ex.VOCAB)[keep], tf.predict_proba(zf))
    # multiple choice: one question by hand, option by option
    qs, opts, answer = ex.make_questions(5, g)
    assert bool(((qs[:, 0] + qs[:, 1]) % 10 == opts.gather(1, answer[:, None])[:, 0]).all())
    scores = ex.option_scores(model, qs, opts)
    a, b = (int(v) for v in qs[0])
    for k in range(opts.shape[1]):
        ids = torch.tensor([ex.encode(f"{a}+{b}={int(opts[0, k])};")])
        with torch.no_grad():
            lp = torch.log_softmax(model(ids[:, :-1]).double(), dim=-1)[0]
        ref = float(lp[3, ids[0, 4]] + lp[4, ids[0, 5]])
        assert abs(float(scores[0, k]) - ref) < 1e-9
    conf = torch.softmax(scores, dim=1)
    assert torch.allclose(conf.sum(dim=1), torch.ones(5, dtype=torch.float64))


def test_llm_example_says_when_t_made_a_number_worse():
    """Issue 51 item 4: the multiple-choice ECE went from 0.1002 to 0.1160 after T = 1.966 with
    nothing said; now the line says so, and says nothing when T helped."""
    ex = _example()
    out = {"temperature": 1.5, "token_ece": 0.05, "token_ece_ts": 0.02, "token_nll": 0.9,
           "token_nll_ts": 0.8, "mc_accuracy": 0.6, "mc_ece": 0.1002, "mc_temperature": 1.966,
           "mc_ece_ts": 0.1160}
    token, mc = ex.after_t_lines(out)
    assert mc.endswith("ECE 0.1160 (worse than without T)"), mc
    assert "worse" not in token

"""examples/llm_answers.py (issue 48, item 5): the quick mode runs, and its pieces are checked
independently of it (greedy decoding against a row-by-row loop, the option log-likelihoods
against one forward pass per option, P(True) against its prompt built by hand)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

import torchcal.llm as L

ROOT = Path(__file__).resolve().parents[2]


def _example():
    spec = importlib.util.spec_from_file_location("llm_answers_example",
                                                  ROOT / "examples" / "llm_answers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quick_mode(tmp_path):
    ex = _example()
    out = ex.main(["--quick", "--out", str(tmp_path / "out.json")])
    assert 0.4 <= out["accuracy"] <= 0.9
    t = out["table"]
    assert t["length_normalized_prob"]["auroc"] > 0.6
    assert t["length_normalized_prob"]["isotonic"] < t["length_normalized_prob"]["before"]
    a = out["abstention"]
    assert a["mean_test_error"] <= out["eps"] and a["violations"] <= out["delta"]
    assert out["sets_coverage"] >= 0.85
    assert (tmp_path / "out.json").stat().st_size > 0


def test_pieces_against_independent_computations():
    ex = _example()
    torch.manual_seed(0)
    model = ex.TinyDecoder().eval()
    ab = torch.tensor([[12, 345], [999, 1], [0, 0]])
    prompts = torch.tensor([ex.encode(ex.prompt_text(a, b)) for a, b in ab.tolist()])
    seq, scores = ex.generate(model, prompts)
    for i in range(3):  # greedy decoding of one row alone, stopping at ";"
        ids = prompts[i: i + 1]
        for t in range(ex.MAX_ANSWER):
            with torch.no_grad():
                z = model(ids)[0, -1]
            assert torch.allclose(z, scores[t][i], atol=1e-5)
            nxt = int(z.argmax())
            assert nxt == int(seq[i, ex.PROMPT + t])
            ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
            if nxt == ex.EOS:
                break
    out = L.from_generate(seq, scores, eos_token_id=ex.EOS, pad_token_id=ex.PAD)
    pt = ex.p_true_scores(model, seq, out.mask)
    for i in range(3):
        n = ex.PROMPT + int(out.mask[i].sum())
        ids = torch.cat([seq[i, :n], torch.tensor([ex.QMARK])]).unsqueeze(0)
        with torch.no_grad():
            z = model(ids)[0, -1]
        ref = torch.softmax(z[[ex.YES, ex.NO]].double(), 0)[0]
        assert abs(float(pt[i]) - float(ref)) < 1e-5
    opts = torch.tensor([[357, 358, 1, 0]] * 3)
    ll = ex.option_loglik(model, ab, opts)
    for i, j in ((0, 0), (1, 2), (2, 3)):
        text = ex.prompt_text(*ab[i].tolist()) + f"{int(opts[i, j])};"
        ids = torch.tensor([ex.encode(text)])
        with torch.no_grad():
            lp = torch.log_softmax(model(ids[:, :-1]).double(), -1)[0]
        ref = sum(float(lp[t - 1, ids[0, t]]) for t in range(ex.PROMPT, ids.shape[1]))
        assert abs(float(ll[i, j]) - ref) < 1e-5

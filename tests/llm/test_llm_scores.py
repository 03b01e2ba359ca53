"""torchcal.llm.scores against slow references written from the definitions (explicit Python
loops over answers and tokens here), a hand-worked example of masks and length normalisation,
and one clear line for each bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchcal.llm import (
    confidence_scores,
    from_generate,
    length_normalized_prob,
    mean_log_prob,
    mean_token_entropy,
    min_token_prob,
    option_probs,
    p_true,
    parse_verbal_confidence,
    sequence_log_prob,
    token_log_probs,
)


def _random_answers(seed: int = 0, n: int = 7, t: int = 9, v: int = 11):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, t, v, generator=g, dtype=torch.float64) * 2
    tokens = torch.randint(0, v, (n, t), generator=g)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    return logits, tokens, mask


def _ref_token_logp(logits, tokens):
    """log p of each token, one softmax per position in Python."""
    n, t, _ = logits.shape
    out = [[0.0] * t for _ in range(n)]
    for i in range(n):
        for j in range(t):
            row = [float(x) for x in logits[i, j]]
            m = max(row)
            lse = m + math.log(sum(math.exp(x - m) for x in row))
            out[i][j] = row[int(tokens[i, j])] - lse
    return out


def test_scores_against_slow_references():
    logits, tokens, mask = _random_answers()
    lp = token_log_probs(logits, tokens)
    ref = _ref_token_logp(logits, tokens)
    assert np.allclose(lp.numpy(), np.array(ref), atol=1e-12)
    # put garbage where the mask is False: it must never be read
    lp_dirty = torch.where(mask, lp, torch.full_like(lp, float("nan")))
    s = confidence_scores(lp_dirty, mask, logits=logits)
    for i in range(logits.shape[0]):
        kept = [ref[i][j] for j in range(logits.shape[1]) if mask[i, j]]
        total = sum(kept)
        assert math.isclose(float(s["sequence_log_prob"][i]), total, abs_tol=1e-12)
        assert math.isclose(float(s["mean_log_prob"][i]), total / len(kept), abs_tol=1e-12)
        assert math.isclose(float(s["length_normalized_prob"][i]),
                            math.exp(total / len(kept)), rel_tol=1e-12)
        assert math.isclose(float(s["min_token_prob"][i]), min(math.exp(x) for x in kept),
                            rel_tol=1e-12)
        ents = []
        for j in range(logits.shape[1]):
            if mask[i, j]:
                row = [float(x) for x in logits[i, j]]
                m = max(row)
                z = sum(math.exp(x - m) for x in row)
                ps = [math.exp(x - m) / z for x in row]
                ents.append(-sum(p * math.log(p) for p in ps))
        assert math.isclose(float(s["neg_mean_entropy"][i]), -sum(ents) / len(ents),
                            rel_tol=1e-10)


def test_hand_worked_masks_and_length_normalisation():
    # answer 0: tokens with p = 0.5, 0.25 (then padding); answer 1: p = 0.8, 0.5, 0.5, 0.1
    p = torch.tensor([[0.5, 0.25, 1.0, 1.0], [0.8, 0.5, 0.5, 0.1]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    lp = p.log()
    # sums: log(0.125) and log(0.02); means: log(0.125)/2, log(0.02)/4
    assert torch.allclose(sequence_log_prob(lp, mask).exp(),
                          torch.tensor([0.125, 0.02], dtype=torch.float64))
    assert torch.allclose(length_normalized_prob(lp, mask),
                          torch.tensor([0.125 ** 0.5, 0.02 ** 0.25], dtype=torch.float64))
    assert torch.allclose(mean_log_prob(lp, mask),
                          torch.tensor([math.log(0.125) / 2, math.log(0.02) / 4],
                                       dtype=torch.float64))
    # the shorter answer is less probable in total, more probable per token ...
    assert float(sequence_log_prob(lp, mask)[0]) > float(sequence_log_prob(lp, mask)[1])
    # ... and the min over the *answer* ignores the padded 1.0 entries (and vice versa)
    assert min_token_prob(lp, mask).tolist() == pytest.approx([0.25, 0.1])
    # 0/1 integers and NumPy work the same
    assert torch.equal(mean_log_prob(lp.numpy(), mask.int().numpy()), mean_log_prob(lp, mask))


def test_from_generate_mask_pad_and_eos():
    # prompt of 2 tokens; 5 generated; eos = 9, pad = 8; V = 10
    seq = torch.tensor([[1, 2, 3, 4, 9, 8, 8],     # answer 3 4 <eos>
                        [1, 2, 5, 5, 5, 5, 5],     # never ended
                        [1, 2, 9, 8, 8, 8, 8]])    # ended at once
    g = torch.Generator().manual_seed(3)
    scores = [torch.randn(3, 10, generator=g) for _ in range(5)]
    scores[4][0, 8] = -math.inf  # a processed score may rule padding out: never read
    out = from_generate(seq, scores, eos_token_id=9, pad_token_id=8)
    assert out.mask.tolist() == [[True, True, True, False, False], [True] * 5,
                                 [True, False, False, False, False]]
    out2 = from_generate(seq, tuple(scores), eos_token_id=[9], pad_token_id=8, include_eos=False)
    assert out2.mask.tolist()[0] == [True, True, False, False, False]
    # a row ending at once has no answer token without its end: refused downstream
    with pytest.raises(ValueError, match="empty answer"):
        mean_log_prob(out2.log_probs, out2.mask)
    # log-probs: one softmax per step, by hand
    for i in range(3):
        for t in range(5):
            if out.mask[i, t]:
                ref = torch.log_softmax(scores[t][i].double(), 0)[seq[i, 2 + t]]
                assert abs(float(out.log_probs[i, t]) - float(ref)) < 1e-12
    assert torch.isfinite(out.log_probs).all()
    # stacked (N, T, V) scores equal the tuple
    same = from_generate(seq, torch.stack(scores, 1), eos_token_id=9, pad_token_id=8)
    assert torch.equal(same.log_probs, out.log_probs)
    # pad distinct from eos and no eos given: pads are masked
    out3 = from_generate(seq, scores, pad_token_id=8)
    assert out3.mask.tolist()[0] == [True, True, True, False, False]


def test_p_true_and_option_probs_against_references():
    g = torch.Generator().manual_seed(5)
    z = torch.randn(6, 12, generator=g, dtype=torch.float64)
    yes, no = [3, 7], [1]
    got = p_true(z, yes, no)
    raw = p_true(z, yes, no, normalize=False)
    for i in range(6):
        e = [math.exp(float(x)) for x in z[i]]
        py, pn = e[3] + e[7], e[1]
        assert math.isclose(float(got[i]), py / (py + pn), rel_tol=1e-12)
        assert math.isclose(float(raw[i]), py / sum(e), rel_tol=1e-12)
    ll = -torch.rand(5, 4, generator=g, dtype=torch.float64) * 10
    lengths = torch.randint(1, 6, (5, 4), generator=g)
    for probs, div in ((option_probs(ll), None), (option_probs(ll, lengths=lengths), lengths)):
        for q in range(5):
            s = [float(ll[q, k]) / (1 if div is None else int(div[q, k])) for k in range(4)]
            tot = sum(math.exp(x) for x in s)
            assert probs[q].tolist() == pytest.approx([math.exp(x) / tot for x in s], rel=1e-12)
    letters = option_probs(z, option_token_ids=[0, 4, 5])
    assert torch.allclose(letters, torch.softmax(z[:, [0, 4, 5]], 1))


def test_parse_verbal_confidence_grammar():
    texts = ["Answer: 12. Confidence: 80%", "0.3", "I'm 90 percent sure", "confidence: high",
             "no idea", "Confidence: 7/10", "CONFIDENCE LEVEL IS 65", "150%", "High.",
             "The answer is 50%. Confidence: 0.9", "confidence: very low", "75", "", "3/4"]
    v, bad = parse_verbal_confidence(texts)
    expected = [0.8, 0.3, 0.9, 0.8, None, 0.7, 0.65, None, 0.8, 0.9, 0.1, 0.75, None, 0.75]
    for i, e in enumerate(expected):
        if e is None:
            assert math.isnan(float(v[i])), texts[i]
        else:
            assert float(v[i]) == pytest.approx(e), texts[i]
    assert bad == [4, 7, 12]
    v2, bad2 = parse_verbal_confidence(["confidence: meh", "meh"], words={"meh": 0.45})
    assert v2.tolist() == [0.45, 0.45] and bad2 == []


def test_bad_input_one_clear_line():
    lp = -torch.rand(3, 4)
    with pytest.raises(ValueError, match=r"`mask` to have shape \(3, 4\)"):
        mean_log_prob(lp, torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"empty answer\(s\) at rows \[1\]"):
        mean_log_prob(lp, torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="log-probabilities"):
        sequence_log_prob(torch.rand(3, 4) + 0.5, torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="`mask` to be bool"):
        mean_log_prob(lp, torch.full((3, 4), 0.5))
    with pytest.raises(ValueError, match="empty answer set"):
        option_probs(torch.zeros(3, 0))
    with pytest.raises(ValueError, match="disjoint"):
        p_true(torch.zeros(2, 5), [1, 2], [2])
    with pytest.raises(ValueError, match=r"`mask` to have shape"):
        mean_token_entropy(torch.zeros(2, 3, 4), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="`tokens` to have shape"):
        token_log_probs(torch.zeros(2, 3, 4), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="one string"):
        parse_verbal_confidence("80%")
    with pytest.raises(ValueError, match="probabilities in"):
        parse_verbal_confidence(["x"], words={"sure": 2.0})

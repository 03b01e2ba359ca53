"""Ensemble scores (predictive / expected entropy, mutual information, disagreement) and the
OOD scores energy, max-logit and mutual information, against float64 NumPy references written
from the definitions (no torchcal code)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchcal.metrics as M


def np_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def np_entropy(p):
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(p), 0.0).sum(axis=-1)


def reference(z):
    """(pbar, PE, EE, MI, disagreement) of (S, N, C) logits, float64 NumPy, loops over members."""
    probs = [np_softmax(z[s].astype(np.float64)) for s in range(z.shape[0])]
    pbar = sum(probs) / len(probs)
    pe = np_entropy(pbar)
    ee = sum(np_entropy(p) for p in probs) / len(probs)
    ens = pbar.argmax(axis=1)
    dis = sum((z[s].argmax(axis=1) != ens).astype(np.float64) for s in range(z.shape[0])) / len(probs)
    return pbar, pe, ee, pe - ee, dis


@pytest.mark.parametrize("shape", [(5, 40, 7), (1, 3, 2), (3, 1, 4)])
def test_scores_equal_numpy(shape):
    z = (3 * torch.randn(*shape, generator=torch.Generator().manual_seed(1))).float()
    pbar, pe, ee, mi, dis = reference(z.numpy())
    for fn, want in [(M.predictive_entropy, pe), (M.expected_entropy, ee),
                     (M.mutual_information, mi), (M.disagreement, dis)]:
        got = fn(member_logits=z)
        assert got.dtype == torch.float64 and got.shape == (shape[1],)
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(M.pooled_log_probs(member_logits=z).exp().numpy(), pbar,
                               rtol=0, atol=1e-12)
    if shape[0] == 1:  # one member: no epistemic part, no disagreement
        assert float(M.mutual_information(member_logits=z).abs().max()) < 1e-12
        assert float(M.disagreement(member_logits=z).max()) == 0.0


def test_hand_worked_example():
    # members p1 = (1/2, 1/2), p2 = (1, 0) (masked class): pbar = (3/4, 1/4)
    z = torch.tensor([[[0.0, 0.0]], [[0.0, float("-inf")]]], dtype=torch.float64)
    h = -(0.75 * np.log(0.75) + 0.25 * np.log(0.25))
    assert float(M.predictive_entropy(member_logits=z)) == pytest.approx(h, abs=1e-15)
    assert float(M.expected_entropy(member_logits=z)) == pytest.approx(np.log(2) / 2, abs=1e-15)
    assert float(M.mutual_information(member_logits=z)) == pytest.approx(h - np.log(2) / 2,
                                                                         abs=1e-15)
    assert float(M.disagreement(member_logits=z)) == 0.0  # both members' argmax is class 0


def test_bad_member_logits():
    with pytest.raises(ValueError, match=r"`member_logits` to be 3-D of shape \(S, N, C\).*"
                                         r"got shape \(4, 3\)"):
        M.predictive_entropy(member_logits=torch.zeros(4, 3))
    with pytest.raises(TypeError, match="`member_logits` to have a floating dtype"):
        M.disagreement(member_logits=torch.zeros(2, 4, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one member and one sample"):
        M.expected_entropy(member_logits=torch.zeros(0, 4, 3))
    with pytest.raises(ValueError, match="at least 2 classes"):
        M.mutual_information(member_logits=torch.zeros(2, 4, 1))
    with pytest.raises(ValueError, match="free of NaN and \\+inf"):
        M.mutual_information(member_logits=torch.full((2, 4, 3), float("nan")))
    with pytest.raises(ValueError, match="every class masked"):
        M.mutual_information(member_logits=torch.full((2, 4, 3), float("-inf")))


def test_energy_and_max_logit_ood_scores():
    g = torch.Generator().manual_seed(2)
    zi, zo = 4 * torch.randn(30, 5, generator=g), torch.randn(20, 5, generator=g)
    a = np.concatenate([zi.numpy(), zo.numpy()]).astype(np.float64)
    m = a.max(axis=1)
    energy = -(m + np.log(np.exp(a - m[:, None]).sum(axis=1)))
    for score, want in [("energy", energy), ("max_logit", -m)]:
        s, y = M.ood_scores(id_logits=zi, ood_logits=zo, score=score)
        np.testing.assert_allclose(s.numpy(), want, rtol=0, atol=1e-12)
        assert y.tolist() == [False] * 30 + [True] * 20
        # AUROC: P(OOD score > ID score) + 1/2 ties, by brute force over pairs
        pairs = (want[30:, None] > want[None, :30]) + 0.5 * (want[30:, None] == want[None, :30])
        assert float(M.ood_auroc(id_logits=zi, ood_logits=zo, score=score)) == pytest.approx(
            pairs.mean(), abs=1e-12)
    # energy uses the logits' scale: shifting a row changes it, not the entropy
    shifted = zi + 5.0
    assert not torch.allclose(M.ood_scores(id_logits=shifted, ood_logits=zo, score="energy")[0],
                              M.ood_scores(id_logits=zi, ood_logits=zo, score="energy")[0])


def test_mutual_information_ood_score():
    g = torch.Generator().manual_seed(3)
    zi = 3 * torch.randn(1, 25, 4, generator=g) + 0.1 * torch.randn(4, 25, 4, generator=g)
    zo = torch.randn(4, 15, 4, generator=g)  # members disagree more
    s, y = M.ood_scores(id_logits=zi, ood_logits=zo, score="mutual_information")
    want = np.concatenate([reference(zi.numpy())[3], reference(zo.numpy())[3]])
    np.testing.assert_allclose(s.numpy(), want, rtol=0, atol=1e-12)
    assert float(M.ood_auroc(id_logits=zi, ood_logits=zo, score="mutual_information")) > 0.9
    with pytest.raises(ValueError, match="same number of classes, got 4 and 3"):
        M.ood_scores(id_logits=zi, ood_logits=zo[..., :3], score="mutual_information")

"""fit_head / evaluate_head / recall@1 / zero-shot transfer, on a frozen digits classifier."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from torchcal.metrics import r_auroc
from torchcal.uncertainty import (
    EmbeddingCache,
    UncertaintyHead,
    evaluate_head,
    fit_head,
    predict_uncertainty,
    recall_at_1_correct,
    zero_shot_transfer,
)


def _identity_head() -> UncertaintyHead:
    """A 1-D head computing softplus(leaky_relu(e)) + 1e-6: strictly increasing in e."""
    head = UncertaintyHead(1, width=1, depth=1)
    with torch.no_grad():
        for m in head.modules():
            if isinstance(m, nn.Linear):
                m.weight.fill_(1.0)
                m.bias.fill_(0.0)
    return head


def _data_with_uncertainty(score, correct):
    """(embeddings, logits, labels) whose classifier is right exactly where ``correct``."""
    n = correct.shape[0]
    labels = torch.zeros(n, dtype=torch.long)
    logits = torch.zeros(n, 2)
    logits[:, 0] = torch.where(correct, 1.0, -1.0)
    return score[:, None].float(), logits, labels


def test_r_auroc_perfect_reversed_random():
    g = torch.Generator().manual_seed(0)
    n = 4000
    correct = torch.rand(n, generator=g) < 0.7
    head = _identity_head()
    # perfect: every wrong prediction more uncertain than every right one
    perfect = torch.where(correct, 0.0, 1.0) + 0.1 * torch.rand(n, generator=g)
    res = evaluate_head(head, _data_with_uncertainty(perfect, correct), recall=False)
    assert res["r_auroc_correct"] == 1.0
    assert res["accuracy"] == pytest.approx(float(correct.double().mean()))
    res = evaluate_head(head, _data_with_uncertainty(-perfect, correct), recall=False)
    assert res["r_auroc_correct"] == 0.0
    res = evaluate_head(head, _data_with_uncertainty(torch.rand(n, generator=g), correct),
                        recall=False)
    assert abs(res["r_auroc_correct"] - 0.5) < 0.04
    # against the pair-counting definition on a small case
    u = torch.tensor([0.3, 0.1, 0.9, 0.5, 0.5])
    c = torch.tensor([True, True, False, True, False])
    pairs = [(1.0 if u[i] < u[j] else 0.5 if u[i] == u[j] else 0.0)
             for i in range(5) for j in range(5) if c[i] and not c[j]]
    assert float(r_auroc(uncertainty=u, correct=c)) == pytest.approx(sum(pairs) / len(pairs))


def test_r_auroc_nan_when_one_class():
    head = _identity_head()
    correct = torch.ones(10, dtype=torch.bool)
    res = evaluate_head(head, _data_with_uncertainty(torch.rand(10), correct), recall=False)
    assert res["accuracy"] == 1.0 and math.isnan(res["r_auroc_correct"])


def _recall_reference(z, y):
    z = nn.functional.normalize(z.double(), dim=1)
    out = []
    for i in range(z.shape[0]):
        best, arg = -2.0, -1
        for j in range(z.shape[0]):
            if j != i:
                s = float(z[i] @ z[j])
                if s > best:
                    best, arg = s, j
        out.append(bool(y[arg] == y[i]))
    return torch.tensor(out)


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_recall_at_1_matches_brute_force(chunk):
    g = torch.Generator().manual_seed(1)
    z = torch.randn(60, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (60,), generator=g)
    assert torch.equal(recall_at_1_correct(z, y, chunk_size=chunk), _recall_reference(z, y))
    # a duplicated point is its copy's nearest neighbour, never its own
    zz = torch.cat([z[:1], z[:1], z[1:]])
    yy = torch.cat([y[:1], 1 - y[:1].clamp(max=1), y[1:]])
    assert not bool(recall_at_1_correct(zz, yy)[0])


def test_recall_bad_input():
    with pytest.raises(ValueError, match="`embeddings`"):
        recall_at_1_correct(torch.randn(1, 3), torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match="`labels`"):
        recall_at_1_correct(torch.randn(4, 3), torch.zeros(3, dtype=torch.long))


def _jitter(x, generator=None):
    return x + 0.3 * torch.randn(x.shape, generator=generator, device=x.device)


@pytest.fixture(scope="module")
def digits_caches(tmp_path_factory, digits_backbone):
    model, splits = digits_backbone
    root = tmp_path_factory.mktemp("caches")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        head_cache = EmbeddingCache.build(root / "head", model, splits["head"], augment=_jitter,
                                          n_passes=4)
        test_cache = EmbeddingCache.build(root / "test", model, splits["test"])
    finally:
        torch.set_num_threads(n)
    return head_cache, test_cache


def test_head_fitted_on_digits_ranks_errors_on_held_out_digits(digits_caches, digits_backbone):
    head_cache, test_cache = digits_caches
    fit = fit_head(head_cache, epochs=20, batch_size=64, width=128, progress=False)
    assert len(fit.epoch_losses) == 20
    assert fit.epoch_losses[-1] < fit.epoch_losses[0]
    assert not fit.head.training
    res = evaluate_head(fit.head, test_cache)
    assert res["n"] == 597
    assert 0.4 < res["accuracy"] < 0.8  # the noisy digits classifier makes many mistakes
    assert res["r_auroc_correct"] > 0.6
    assert res["r_auroc_recall"] > 0.6
    assert set(res["baselines"]) == {"max_prob", "entropy", "embedding_norm"}
    # evaluate_head agrees with the metric computed by hand from the cache
    emb, logits, labels = test_cache.tensors()
    u = predict_uncertainty(fit.head, emb)
    correct = logits.argmax(1) == labels
    assert res["r_auroc_correct"] == pytest.approx(float(r_auroc(uncertainty=u, correct=correct)))
    rc = recall_at_1_correct(emb, labels)
    assert res["recall_at_1"] == pytest.approx(float(rc.double().mean()))
    assert res["r_auroc_recall"] == pytest.approx(float(r_auroc(uncertainty=u, correct=rc)))
    # the url code's embed-norm baseline: 1 / ||z||, by hand
    norm_u = 1 / torch.linalg.vector_norm(emb.double(), dim=1)
    assert res["baselines"]["embedding_norm"]["r_auroc_recall"] == pytest.approx(
        float(r_auroc(uncertainty=norm_u, correct=rc)))
    assert "r_auroc_correct" in res["baselines"]["embedding_norm"]


def test_zero_shot_transfer_uses_recall_only(digits_caches, digits_backbone):
    head_cache, test_cache = digits_caches
    model, splits = digits_backbone
    fit = fit_head(head_cache, epochs=2, batch_size=64, width=32, progress=False)
    x, y = splits["test"]
    flipped = x.reshape(-1, 8, 8).flip(2).reshape(-1, 64)  # mirrored digits: another domain
    with torch.no_grad():
        other = (model.forward_features(flipped), model(flipped), y)
    out = zero_shot_transfer(fit.head, {"mirrored": other, "test": test_cache})
    assert set(out) == {"mirrored", "test"}
    for r in out.values():
        assert "r_auroc_correct" not in r and "accuracy" not in r
        assert 0.0 <= r["r_auroc_recall"] <= 1.0
    direct = evaluate_head(fit.head, other, classifier=False)
    assert out["mirrored"] == direct
    assert out["test"]["r_auroc_recall"] == pytest.approx(
        evaluate_head(fit.head, test_cache)["r_auroc_recall"])


def test_fit_is_deterministic_and_continues_a_given_head(digits_caches):
    head_cache, _ = digits_caches
    a = fit_head(head_cache, epochs=2, batch_size=128, width=16, seed=3, progress=True)
    b = fit_head(head_cache, epochs=2, batch_size=128, width=16, seed=3, progress=False)
    assert a.epoch_losses == b.epoch_losses
    for p, q in zip(a.head.parameters(), b.head.parameters(), strict=True):
        assert torch.equal(p, q)
    before = [p.clone() for p in a.head.parameters()]
    c = fit_head(head_cache, head=a.head, epochs=1, batch_size=128)
    assert c.head is a.head
    assert any(not torch.equal(p, q) for p, q in zip(before, c.head.parameters(), strict=True))


def test_fit_uses_adamw_with_a_cosine_schedule_and_shows_progress(digits_caches, monkeypatch,
                                                                   capsys):
    """The published recipe: AdamW (lr 1e-3 per 256 samples, weight decay 1e-4), cosine decay
    over all steps; the lr in force at every step is recorded and checked against the formula."""
    head_cache, _ = digits_caches
    made = []

    class SpyAdamW(torch.optim.AdamW):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.lrs = []
            made.append(self)

        def step(self, closure=None):
            self.lrs.append(self.param_groups[0]["lr"])
            return super().step(closure)

    monkeypatch.setattr(torch.optim, "AdamW", SpyAdamW)
    n = len(head_cache)  # 2400 rows: 9 full batches of 256 and one of 96 per epoch
    assert n == 2400
    fit_head(head_cache, epochs=2, batch_size=256, width=16, progress=True)
    (opt,) = made
    assert opt.param_groups[0]["weight_decay"] == 1e-4
    total = 2 * 10
    expected = [1e-3 * (1 + math.cos(math.pi * k / total)) / 2 for k in range(total)]
    assert opt.lrs == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert "uncertainty head" in capsys.readouterr().err  # the tqdm bar
    fit_head(head_cache, epochs=1, batch_size=128, width=16, progress=False)
    assert made[1].lrs[0] == pytest.approx(5e-4)  # lr scales with the batch size
    assert len(made[1].lrs) == 19  # 18 x 128 + a final even batch of 96
    assert capsys.readouterr().err == ""  # progress=False: no bar


def test_fit_bad_arguments(digits_caches):
    head_cache, _ = digits_caches
    with pytest.raises(ValueError, match="`batch_size`"):
        fit_head(head_cache, batch_size=33)
    with pytest.raises(ValueError, match="`epochs`"):
        fit_head(head_cache, epochs=0)
    with pytest.raises(ValueError, match="`lr`"):
        fit_head(head_cache, lr=-1.0)
    with pytest.raises(ValueError, match="in_features"):
        fit_head(head_cache, head=UncertaintyHead(5))
    z = torch.randn(6, 3)
    with pytest.raises(ValueError, match="`logits`"):
        fit_head((z, None, torch.zeros(6, dtype=torch.long)))
    with pytest.raises(ValueError, match="`labels`"):
        fit_head((z, torch.randn(6, 2), torch.tensor([0, 1, 2, 0, 1, 0])))
    with pytest.raises(TypeError, match="EmbeddingCache"):
        fit_head(z)


def test_max_prob_baseline_never_ties_on_confident_rows():
    """The max-prob baseline ranks confident rows apart (issue 39): ``1 - softmax.amax`` in
    float64 is exactly 0 from a margin of about 37, so rows with margins 40, 45 and 50 tied;
    the score is ``-log max p`` from the logits, in the same order as ``1 - max p``."""
    from torchcal.uncertainty.fit import _baseline_scores

    z = torch.zeros(5, 3, dtype=torch.float64)
    z[:, 0] = torch.tensor([40.0, 45.0, 50.0, 5.0, 2.0])
    s = _baseline_scores(torch.ones(5, 2), z, torch.device("cpu"))["max_prob"]
    assert s.dtype == torch.float64 and s.shape == (5,)
    assert len(set(s.tolist())) == 5  # no ties
    # the same order as 1 - max p (margins 2 and 5, where float64 resolves it)
    ref = 1 - torch.softmax(z, 1).amax(1)
    assert torch.argsort(s)[-2:].tolist() == torch.argsort(ref)[-2:].tolist()
    # -log max p = log(1 + 2 exp(-m)) by hand for a top logit m over two zeros
    hand = [math.log1p(2 * math.exp(-m)) for m in (40.0, 45.0, 50.0, 5.0, 2.0)]
    assert s.tolist() == pytest.approx(hand, rel=1e-12, abs=0)

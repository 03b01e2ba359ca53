"""UncertaintyHead and ranking_loss: hand-worked values, brute-force reference, stop-gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchcal.uncertainty import UncertaintyHead, per_sample_cross_entropy, ranking_loss


def _reference_ranking_loss(u, t, margin=0.1):
    """Straight from the formula, one pair at a time in plain Python floats."""
    u, t = u.tolist(), t.tolist()
    terms = []
    for i in range(0, len(u), 2):
        s = 1.0 if t[i] > t[i + 1] else -1.0
        terms.append(max(0.0, -s * (u[i] - u[i + 1]) + margin))
    return sum(terms) / len(terms)


def test_ranking_loss_hand_worked():
    # pair (0,1): l_a > l_b -> s=+1, u_a - u_b = -0.5 -> max(0, 0.5 + 0.1) = 0.6
    # pair (2,3): l_a < l_b -> s=-1, u_a - u_b = +0.4 -> max(0, 0.4 + 0.1) = 0.5
    # pair (4,5): tie       -> s=-1, u_a - u_b = -0.3 -> max(0, -0.3 + 0.1) = 0
    # pair (6,7): l_a > l_b -> s=+1, u_a - u_b = 0.05 -> max(0, -0.05 + 0.1) = 0.05
    u = torch.tensor([0.5, 1.0, 0.9, 0.5, 0.2, 0.5, 0.35, 0.3], dtype=torch.float64)
    t = torch.tensor([3.0, 1.0, 0.1, 2.0, 1.0, 1.0, 2.0, 1.0], dtype=torch.float64)
    expected = (0.6 + 0.5 + 0.0 + 0.05) / 4
    assert ranking_loss(u, t).item() == pytest.approx(expected, abs=1e-12)
    # margin 0: only pairs in the wrong order cost anything
    assert ranking_loss(u, t, margin=0.0).item() == pytest.approx((0.5 + 0.4) / 4, abs=1e-12)


def test_ranking_loss_tie_counts_as_minus_one():
    u = torch.tensor([0.0, 1.0], dtype=torch.float64)
    t = torch.tensor([1.0, 1.0], dtype=torch.float64)
    # s = -1: max(0, (0 - 1) + 0.1) = 0   (with s=+1 it would be 1.1)
    assert ranking_loss(u, t).item() == 0.0
    assert ranking_loss(u.flip(0), t).item() == pytest.approx(1.1)


@pytest.mark.parametrize("n", [2, 6, 64])
def test_ranking_loss_matches_reference(n):
    g = torch.Generator().manual_seed(n)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    t = torch.randint(0, 3, (n,), generator=g).double()  # many ties
    assert ranking_loss(u, t, margin=0.25).item() == pytest.approx(
        _reference_ranking_loss(u, t, 0.25), abs=1e-12
    )
    # (N, 1) column input gives the same value
    assert ranking_loss(u[:, None], t[:, None], margin=0.25).item() == pytest.approx(
        _reference_ranking_loss(u, t, 0.25), abs=1e-12
    )


def test_ranking_loss_gradient_and_detached_target():
    u = torch.tensor([0.2, 0.5, 0.9, 0.1], requires_grad=True)
    t = torch.tensor([2.0, 1.0, 0.0, 1.0], requires_grad=True)
    ranking_loss(u, t).backward()
    # pair 1 active with s=+1: dL/du_a = -1/2, dL/du_b = +1/2; pair 2 active with s=-1: +1/2, -1/2
    torch.testing.assert_close(u.grad, torch.tensor([-0.5, 0.5, 0.5, -0.5]))
    assert t.grad is None


@pytest.mark.parametrize("n", [0, 1, 3, 7])
def test_ranking_loss_rejects_odd_or_empty_batch(n):
    with pytest.raises(ValueError, match="even"):
        ranking_loss(torch.rand(n), torch.rand(n))


def test_ranking_loss_bad_input():
    with pytest.raises(ValueError, match="`target_loss`"):
        ranking_loss(torch.rand(4), torch.rand(6))
    with pytest.raises(ValueError, match="`uncertainty`"):
        ranking_loss(torch.rand(4, 2), torch.rand(4))
    with pytest.raises(TypeError, match="`uncertainty`"):
        ranking_loss(torch.arange(4), torch.rand(4))
    with pytest.raises(ValueError, match="`margin`"):
        ranking_loss(torch.rand(4), torch.rand(4), margin=-0.1)


def test_head_architecture_and_positivity():
    head = UncertaintyHead(10)
    linears = [m for m in head.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(10, 512), (512, 512), (512, 1)]
    assert sum(isinstance(m, nn.LeakyReLU) for m in head.modules()) == 2
    assert isinstance(list(head.modules())[-1], nn.Softplus)
    # force a hugely negative pre-activation: output stays >= 1e-6
    with torch.no_grad():
        linears[-1].bias.fill_(-1e4)
    u = head(torch.randn(5, 10))
    assert u.shape == (5,)
    assert bool((u >= 1e-6).all())
    assert UncertaintyHead(3, width=4, depth=1).mlp[0].out_features == 4


def test_head_bad_arguments():
    with pytest.raises(ValueError, match="`in_features`"):
        UncertaintyHead(0)
    with pytest.raises(ValueError, match="`depth`"):
        UncertaintyHead(4, depth=0)
    with pytest.raises(ValueError, match="`features`"):
        UncertaintyHead(4)(torch.randn(3, 5))
    with pytest.raises(TypeError, match="`features`"):
        UncertaintyHead(4)(torch.ones(3, 4, dtype=torch.long))


def _backbone_and_classifier():
    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Linear(6, 8), nn.ReLU())
    fc = nn.Linear(8, 3)
    return backbone, fc


def test_stop_gradient_head_alone_leaves_backbone_grads_none():
    backbone, fc = _backbone_and_classifier()
    head = UncertaintyHead(8, width=16)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    feats = backbone(x)
    loss = ranking_loss(head(feats), per_sample_cross_entropy(fc(feats), y))
    loss.backward()
    assert all(p.grad is None for p in backbone.parameters())
    assert all(p.grad is None for p in fc.parameters())
    assert all(p.grad is not None for p in head.parameters())
    assert any(bool(p.grad.abs().sum() > 0) for p in head.parameters())


def test_stop_gradient_joint_loss_leaves_classifier_gradients_unchanged():
    backbone, fc = _backbone_and_classifier()
    head = UncertaintyHead(8, width=16)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))

    def grads(with_head: bool):
        for p in [*backbone.parameters(), *fc.parameters()]:
            p.grad = None
        feats = backbone(x)
        logits = fc(feats)
        loss = nn.functional.cross_entropy(logits, y)
        if with_head:
            loss = loss + 10.0 * ranking_loss(head(feats), per_sample_cross_entropy(logits, y))
        loss.backward()
        return [p.grad.clone() for p in [*backbone.parameters(), *fc.parameters()]]

    for a, b in zip(grads(False), grads(True), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_per_sample_cross_entropy_matches_formula():
    logits = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 1, 2, 3, 0, 1])
    ce = per_sample_cross_entropy(logits, y)
    ref = -(logits.exp() / logits.exp().sum(1, keepdim=True)).log()[torch.arange(6), y]
    torch.testing.assert_close(ce, ref.detach())
    assert not ce.requires_grad


def test_save_load_head_round_trip_and_corruption(tmp_path):
    from torchcal.errors import CheckpointError
    from torchcal.uncertainty import load_head, save_head

    torch.manual_seed(1)
    head = UncertaintyHead(6, width=8, depth=3)
    path = tmp_path / "sub" / "head.pt"
    save_head(head, path, meta={"epochs": 3})
    again, meta = load_head(path)
    assert (again.in_features, again.width, again.depth) == (6, 8, 3)
    assert meta == {"epochs": 3}
    x = torch.randn(4, 6)
    torch.testing.assert_close(again(x), head(x))
    # no temp files left; the head's SHA-256 beside it
    assert sorted(p.name for p in path.parent.iterdir()) == ["head.pt", "head.pt.sha256"]
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(CheckpointError, match="does not match its SHA-256"):
        load_head(path)
    path.with_name("head.pt.sha256").unlink()  # a head of an older torchcal: no SHA-256 file
    with pytest.warns(UserWarning, match="without an integrity check"), \
            pytest.raises(CheckpointError, match="corrupt"):
        load_head(path)
    torch.save({"format": "other"}, path)
    with pytest.warns(UserWarning), \
            pytest.raises(CheckpointError, match="not a torchcal uncertainty head"):
        load_head(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_head(tmp_path / "none.pt")


def test_ranking_loss_is_scale_free_in_the_target_and_shift_invariant_in_u():
    g = torch.Generator().manual_seed(5)
    u = torch.rand(32, generator=g, dtype=torch.float64)
    t = torch.rand(32, generator=g, dtype=torch.float64)
    base = ranking_loss(u, t)
    # only the order of the targets within each pair matters
    assert ranking_loss(u, 1000 * t + 7).item() == pytest.approx(base.item(), abs=1e-12)
    assert ranking_loss(u, t.exp()).item() == pytest.approx(base.item(), abs=1e-12)
    assert ranking_loss(u + 3.0, t).item() == pytest.approx(base.item(), abs=1e-12)
    # swapping both members of every pair leaves the loss unchanged (except exact ties)
    swap = torch.arange(32).view(-1, 2).flip(1).reshape(-1)
    assert ranking_loss(u[swap], t[swap]).item() == pytest.approx(base.item(), abs=1e-12)

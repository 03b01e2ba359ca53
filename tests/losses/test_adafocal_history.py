"""AdaFocal's history (issue 43): one preallocated tensor written in place by an update, saved
as one tensor, so a checkpoint's cost does not grow with the updates."""

from __future__ import annotations

import io

import pytest
import torch

from torchcal.losses import AdaFocalLoss


def _updated(n: int, n_bins: int = 4) -> AdaFocalLoss:
    gen = torch.Generator().manual_seed(n)
    loss = AdaFocalLoss(n_bins=n_bins)
    for _ in range(n):
        loss.update(logits=torch.randn(200, 3, generator=gen) * 3,
                    labels=torch.randint(0, 3, (200,), generator=gen))
    return loss


def test_the_history_is_one_tensor_in_the_state():
    """Whatever the updates, the extra state holds one (updates, 4B + 1) tensor whose rows are
    the per-update dicts of ``history`` (γ and edges after the update, gaps, counts)."""
    for n in (0, 1, 70):  # 70: past the first capacity of 64 rows
        loss = _updated(n)
        h = loss.get_extra_state()["history"]
        assert isinstance(h, torch.Tensor) and h.shape == (n, 17) and h.dtype == torch.float64
        assert len(loss.history) == n
        for row, entry in zip(h, loss.history, strict=True):
            assert torch.equal(row[:4], entry["gammas"]) and torch.equal(row[4:9],
                                                                         entry["bin_edges"])
            assert torch.equal(row[9:13], entry["gaps"])
            assert entry["counts"].dtype == torch.int64 and entry["counts"].sum() == 200
    assert torch.equal(loss.history[-1]["gammas"], loss.gammas)
    assert torch.equal(loss.history[-1]["bin_edges"], loss.bin_edges)
    snap = loss.get_extra_state()["history"]
    loss.update(logits=torch.randn(200, 3), labels=torch.randint(0, 3, (200,)))
    assert snap.shape[0] == 70 and len(loss.history) == 71  # a copy, not a view


def test_an_update_makes_no_host_copy(monkeypatch):
    loss = _updated(2)
    z, y = torch.randn(100, 3), torch.randint(0, 3, (100,))

    def no_host_copy(self, *a, **kw):
        raise AssertionError("an update copied to the host")

    monkeypatch.setattr(torch.Tensor, "cpu", no_host_copy)
    loss.update(logits=z, labels=y)
    monkeypatch.undo()
    assert len(loss.history) == 3


def test_round_trip_and_the_older_list_format():
    a = _updated(3)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = AdaFocalLoss(n_bins=4)
    b.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(a.history_tensor, b.history_tensor)
    old = AdaFocalLoss(n_bins=4)  # a checkpoint of torchcal before: a list of dicts
    sd = dict(a.state_dict())
    sd["_extra_state"] = {"history": a.history}
    old.load_state_dict(sd)
    assert torch.equal(old.history_tensor, a.history_tensor)
    b.update(logits=torch.randn(50, 3), labels=torch.randint(0, 3, (50,)))
    assert len(b.history) == 4 and torch.equal(b.history[:3][2]["gammas"], a.history[2]["gammas"])
    with pytest.raises(ValueError, match="'history' tensor"):
        b.set_extra_state({"history": "x"})
    with pytest.raises(ValueError, match="dict of tensors"):
        b.set_extra_state({"history": [{"gammas": torch.zeros(4)}]})
    with pytest.raises(ValueError, match="finite"):
        b.set_extra_state({"history": torch.full((1, 17), float("nan"))})
    a.reset()
    assert a.history == [] and a.history_tensor.shape == (0, 17)

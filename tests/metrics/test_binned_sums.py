"""The per-bin sums behind every binned metric and the trainer's ECE: the CPU path
(``bincount``) and the sync-free path of other devices (``index_add_``) agree exactly."""

from __future__ import annotations

import torch

from torchcal.metrics.binning import (
    _binned_sums_bincount,
    _binned_sums_index_add,
    binned_sums,
)


def test_both_paths_give_the_same_sums():
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(5000, generator=g)
    idx = (conf * 15).long().clamp(max=14)
    correct = torch.rand(5000, generator=g) < 0.7
    cpu = binned_sums(idx, conf, correct, 15)
    assert torch.equal(cpu, _binned_sums_bincount(idx, conf, correct, 15))
    assert torch.equal(cpu, _binned_sums_index_add(idx, conf, correct, 15))
    # against a loop over the bins
    for b in range(15):
        m = idx == b
        assert cpu[0, b] == m.sum() and cpu[2, b] == (correct & m).sum()
        assert torch.allclose(cpu[1, b], conf[m].double().sum(), rtol=1e-12, atol=0)
    empty = torch.zeros(0, dtype=torch.long)
    for f in (_binned_sums_bincount, _binned_sums_index_add):
        assert torch.equal(f(empty, torch.zeros(0), empty.bool(), 4),
                           torch.zeros(3, 4, dtype=torch.float64))

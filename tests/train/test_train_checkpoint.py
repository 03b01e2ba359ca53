"""Checkpoint files (atomic, weights_only, corruption), RNG states as tensors, DDP sharding helpers."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from torchcal.errors import CheckpointError
from torchcal.train.checkpoint import (
    load_checkpoint,
    restore_rng_state,
    rng_state_tensors,
    save_checkpoint,
)
from torchcal.train.distributed import (
    DistEnv,
    epoch_permutation,
    epoch_seed,
    gather_padded,
    shard_indices,
)


def test_checkpoint_round_trip_with_weights_only(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, [2, 5])
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    sched.step()
    p = save_checkpoint(tmp_path / "c" / "last.pt", {
        "model": model.state_dict(), "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(), "epoch": 3, "config": {"a": [1, 2], "b": None},
        "rng": rng_state_tensors()})
    # only the final file and its SHA-256 remain (no temp files)
    assert sorted(x.name for x in p.parent.iterdir()) == ["last.pt", "last.pt.sha256"]
    raw = torch.load(p, weights_only=True)  # the contract: loadable with weights_only
    assert raw["epoch"] == 3
    st = load_checkpoint(p)
    m2 = torch.nn.Linear(3, 2)
    m2.load_state_dict(st["model"])
    assert torch.equal(m2.weight, model.weight)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
    o2.load_state_dict(st["optimizer"])
    s2 = torch.optim.lr_scheduler.MultiStepLR(o2, [2, 5])
    s2.load_state_dict(st["scheduler"])
    assert s2.last_epoch == 1 and s2.milestones[2] == 1 and s2.milestones[3] == 0


@pytest.mark.filterwarnings("ignore:Checkpoint .* has no")
def test_missing_corrupt_and_foreign_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")
    p = save_checkpoint(tmp_path / "last.pt", {"model": {}, "epoch": 1, "config": {}})
    data = p.read_bytes()
    (tmp_path / "trunc.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(tmp_path / "trunc.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(tmp_path / "garbage.pt")
    torch.save({"weights": torch.zeros(1)}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="not a torchcal checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")


def test_rng_states_round_trip_through_a_file(tmp_path):
    random.random()
    np.random.normal()  # noqa: NPY002  (sets the cached Gaussian)
    state = rng_state_tensors()
    assert all(isinstance(v, torch.Tensor) for k, v in state.items() if k != "cuda")
    save_checkpoint(tmp_path / "r.pt", {"model": {}, "epoch": 0, "config": {}, "rng": state})
    expect = (torch.rand(3), np.random.rand(3), np.random.normal(), random.random(),  # noqa: NPY002
              random.gauss(0, 1))
    torch.manual_seed(123)
    np.random.seed(5)  # noqa: NPY002
    random.seed(7)
    restore_rng_state(load_checkpoint(tmp_path / "r.pt")["rng"])
    got = (torch.rand(3), np.random.rand(3), np.random.normal(), random.random(),  # noqa: NPY002
           random.gauss(0, 1))
    assert torch.equal(expect[0], got[0])
    np.testing.assert_array_equal(expect[1], got[1])
    assert expect[2:] == got[2:]


def test_epoch_order_depends_only_on_seed_and_epoch():
    a = epoch_permutation(100, seed=3, epoch=7)
    torch.rand(10)  # consuming global RNG state changes nothing
    assert torch.equal(a, epoch_permutation(100, seed=3, epoch=7))
    assert not torch.equal(a, epoch_permutation(100, seed=3, epoch=8))
    assert not torch.equal(a, epoch_permutation(100, seed=4, epoch=7))
    assert sorted(a.tolist()) == list(range(100))
    assert len({epoch_seed(s, e) for s in range(5) for e in range(50)}) == 250


@pytest.mark.parametrize("n,world", [(10, 2), (11, 2), (7, 3), (3, 4), (1, 2)])
def test_sharding_matches_distributed_sampler(n, world):
    from torch.utils.data import DistributedSampler

    idx = torch.arange(n)
    shards = [shard_indices(idx, r, world) for r in range(world)]
    for r, (s, n_valid) in enumerate(shards):
        ref = list(DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=False))
        assert s.tolist() == ref
        assert n_valid == sum(1 for p in range(r, len(ref) * world, world) if p < n)
    # every sample is covered exactly once by the unpadded parts
    covered = sorted(v for s, k in shards for v in s[:k].tolist())
    assert covered == list(range(n))
    # the gather reorders and drops the padding (simulated all_gather)
    per = shards[0][0].numel()
    stacked = torch.stack([s.float() for s, _ in shards], dim=1).reshape(-1)[:n]
    assert stacked.tolist() == list(range(n)) and per * world >= n


def test_gather_padded_single_process_is_a_slice():
    x = torch.arange(12.0).reshape(6, 2)
    assert torch.equal(gather_padded(x, 4, DistEnv()), x[:4])

"""torchcal.ensemble: ensembles from logits and run directories (pooling = mean of the
members' probabilities, checked in NumPy) and MC dropout (dropout sampling, BatchNorm and
every other module in eval mode, modes restored, seeded)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchcal.metrics as M
from torchcal.ensemble import from_logits, from_run_dirs, mc_dropout
from torchcal.errors import ResultsFileError
from torchcal.logits_file import save_logits
from torchcal.run_dir import RunDir


def members(s=3, n=50, c=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [3 * torch.randn(n, c, generator=g) for _ in range(s)], torch.randint(0, c, (n,), generator=g)


def test_from_logits_pools_the_mean_probability():
    zs, y = members()
    ens = from_logits(zs, labels=y)
    pbar = np.mean([np.exp(z.double().numpy()) / np.exp(z.double().numpy()).sum(1, keepdims=True)
                    for z in zs], axis=0)
    np.testing.assert_allclose(ens.probs.numpy(), pbar, rtol=0, atol=1e-12)
    assert ens.logits.dtype == torch.float64 and ens.size == 3
    # the pooled logits are a model's logits for every metric
    assert float(M.nll(logits=ens.logits, labels=y)) == pytest.approx(
        -np.log(pbar[np.arange(50), y.numpy()]).mean(), abs=1e-12)
    scores = ens.scores()
    assert set(scores) == {"predictive_entropy", "expected_entropy", "mutual_information",
                           "disagreement"}
    torch.testing.assert_close(scores["mutual_information"],
                               M.mutual_information(member_logits=torch.stack(zs)))
    # an (S, N, C) array gives the same ensemble
    torch.testing.assert_close(from_logits(torch.stack(zs).numpy()).logits, ens.logits)


def test_from_logits_errors():
    zs, y = members()
    with pytest.raises(ValueError, match=r"shape of member 0 \(50, 4\), got \(49, 4\) for member 2"):
        from_logits([zs[0], zs[1], zs[2][:49]])
    with pytest.raises(ValueError, match="at least one member"):
        from_logits([])
    with pytest.raises(ValueError, match="`labels` to have 50 entries"):
        from_logits(zs, labels=y[:10])
    with pytest.raises(ValueError, match=r"one name per member \(3\), got 2"):
        from_logits(zs, names=["a", "b"])


def test_from_run_dirs(tmp_path):
    zs, y = members()
    dirs = []
    for i, z in enumerate(zs):
        run = RunDir(tmp_path / f"seed{i}")
        save_logits(run.logits("test"), z, y)
        dirs.append(run.path)
    ens = from_run_dirs(dirs, "test")
    torch.testing.assert_close(ens.member_logits, torch.stack(zs))
    assert ens.labels.tolist() == y.tolist()
    assert ens.names == tuple(str(d) for d in dirs)
    # an OOD set's placeholder labels (-1) give an ensemble without labels
    for d, z in zip(dirs, zs):
        save_logits(RunDir(d).logits("ood_noise"), z[:10], torch.full((10,), -1))
    ood = from_run_dirs(dirs, "ood_noise")
    assert ood.labels is None and ood.member_logits.shape == (3, 10, 4)
    # a run whose samples differ is named
    save_logits(RunDir(tmp_path / "other").logits("test"), zs[0], (y + 1) % 4)
    with pytest.raises(ValueError, match="labels of '.*other' differ from those of '.*seed0'"):
        from_run_dirs([dirs[0], tmp_path / "other"])
    with pytest.raises(ResultsFileError, match="does not exist"):
        from_run_dirs([dirs[0]], "val")
    with pytest.raises(ValueError, match="at least one run directory"):
        from_run_dirs([])


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(),
                                  nn.Dropout(0.5), nn.Linear(16, 3))

    def forward(self, x):
        return self.body(x)


def test_mc_dropout_samples_dropout_only():
    torch.manual_seed(0)
    net = Net()
    net.body[1].running_mean.normal_()  # running stats differ from any batch's
    net.body[1].running_var.uniform_(0.5, 2.0)
    stats = net.body[1].running_mean.clone()
    x = torch.randn(20, 6)
    z = mc_dropout(net, x, samples=8, seed=1)
    assert z.shape == (8, 20, 3)
    assert net.training and all(m.training for m in net.modules())  # modes restored
    torch.testing.assert_close(net.body[1].running_mean, stats)  # BatchNorm not updated
    # the samples differ (dropout on) ...
    assert float((z[0] - z[1]).abs().max()) > 1e-3
    # ... and each is the eval-mode network with one dropout mask: with p = 0 all equal eval
    net.body[3].p = 0.0
    net.eval()
    want = net(x)
    net.train()
    torch.testing.assert_close(mc_dropout(net, x, samples=2, seed=1)[1], want)
    assert net.training
    net.body[3].p = 0.5
    # seeded: reproducible, and the caller's RNG is untouched
    state = torch.get_rng_state()
    torch.testing.assert_close(mc_dropout(net, x, samples=8, seed=1), z)
    assert torch.equal(torch.get_rng_state(), state)


def test_mc_dropout_over_a_loader_and_its_errors():
    torch.manual_seed(0)
    net = Net().eval()
    x, y = torch.randn(25, 6), torch.randint(0, 3, (25,))
    z = mc_dropout(net, DataLoader(TensorDataset(x, y), batch_size=10), samples=4, seed=0)
    assert z.shape == (4, 25, 3) and not net.training
    no_dropout = nn.Sequential(nn.Linear(6, 3))
    with pytest.raises(ValueError, match="`model` to contain a dropout module .* found none in "
                                         "Sequential"):
        mc_dropout(no_dropout, x)
    with pytest.raises(ValueError, match="`samples`"):
        mc_dropout(net, x, samples=0)
    with pytest.raises(ValueError, match="at least one batch"):
        mc_dropout(net, [])
    with pytest.raises(TypeError, match="batch of `x_or_loader` to be a tensor .* got str at batch 0"):
        mc_dropout(net, ["a"])

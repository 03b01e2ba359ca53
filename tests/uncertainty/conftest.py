"""A small frozen classifier on noisy scikit-learn digits, shared by the uncertainty tests."""

from __future__ import annotations

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn


class DigitsMLP(nn.Module):
    """64 -> 64 -> 32 (embedding) -> 10, with the torchcal model interface."""

    num_features = 32

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.fc = nn.Linear(32, 10)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.reshape(x.shape[0], -1).float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.forward_features(x))


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models: one intra-op thread is much faster on a shared 2-core machine (restored)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def digits_backbone():
    """See :func:`make_digits_backbone`."""
    return make_digits_backbone()


def make_digits_backbone():
    """One thread inside (restored), see ``_one_thread``.

    ``(model, splits)``: an MLP trained briefly on 600 noisy digits; ``splits`` holds
    ``"clf"`` (its training data), ``"head"`` (600 other samples to fit a head on) and
    ``"test"`` (the remaining 597), each an ``(x, y)`` pair; input noise makes ~1/3 errors."""
    d = load_digits()
    g = torch.Generator().manual_seed(0)
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(x), generator=g)
    x, y = x[perm], y[perm]
    x = x + 0.5 * torch.randn(x.shape, generator=g)
    splits = {"clf": (x[:600], y[:600]), "head": (x[600:1200], y[600:1200]),
              "test": (x[1200:], y[1200:])}
    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = DigitsMLP()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        xc, yc = splits["clf"]
        for _ in range(25):
            for i in range(0, 600, 100):
                loss = nn.functional.cross_entropy(model(xc[i:i + 100]), yc[i:i + 100])
                opt.zero_grad()
                loss.backward()
                opt.step()
    torch.set_num_threads(n_threads)
    model.eval()
    for p in model.parameters():
        p.grad = None
        p.requires_grad_(False)
    return model, splits

"""fit_head and EmbeddingCache.build take their settings as one frozen options object
(HeadFitOptions, CacheOptions; issue 40 item 6) or, as before, as keywords, which win over the
options; a keyword that is no setting is refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from torchcal.uncertainty import CacheOptions, EmbeddingCache, HeadFitOptions, fit_head


def _data(n=64, d=8, c=3):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, d, generator=g), torch.randn(n, c, generator=g), torch.arange(n) % c


def _weights(fit):
    return [p.detach().clone() for p in fit.head.parameters()]


def test_fit_head_options_give_the_keyword_forms_result():
    settings = dict(epochs=2, batch_size=16, lr=2e-3, margin=0.2, width=16, depth=1, seed=3)
    by_kw = fit_head(_data(), progress=False, **settings)
    by_options = fit_head(_data(), options=HeadFitOptions(**settings), progress=False)
    assert by_kw.epoch_losses == by_options.epoch_losses
    assert all(torch.equal(a, b) for a, b in zip(_weights(by_kw), _weights(by_options),
                                                 strict=True))
    other = fit_head(_data(), options=HeadFitOptions(**settings), seed=4, progress=False)
    assert other.epoch_losses != by_kw.epoch_losses  # the keyword wins over the options


def test_fit_head_refuses_what_is_no_setting():
    with pytest.raises(TypeError, match=r"fit_head\(\) got an unexpected keyword argument 'epoch'"):
        fit_head(_data(), epoch=2, progress=False)
    with pytest.raises(TypeError, match="Expected `options` of fit_head.. to be a HeadFitOptions"):
        fit_head(_data(), options={"epochs": 2}, progress=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        HeadFitOptions().epochs = 3
    assert HeadFitOptions().batch_size == 256 and HeadFitOptions().lr is None  # the defaults


class _Backbone(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.fc = torch.nn.Linear(4, 6), torch.nn.Linear(6, 3)

    def forward_features(self, x):
        return self.body(x.float())

    def forward(self, x):
        return self.fc(self.forward_features(x))


def test_cache_options_give_the_keyword_forms_cache(tmp_path):
    model, x, y = _Backbone(), torch.randn(20, 4), torch.arange(20) % 3
    scale = 2.0

    def transform(t):
        return t * scale

    settings = dict(transform=transform, batch_size=7, data_id={"name": "toy"}, seed=1)
    by_kw = EmbeddingCache.build(tmp_path / "kw", model, (x, y), **settings)
    by_options = EmbeddingCache.build(tmp_path / "opt", model, (x, y),
                                      options=CacheOptions(**settings))
    assert by_kw.manifest["identity"] == by_options.manifest["identity"]
    assert all(torch.equal(a, b) for a, b in zip(by_kw.tensors(), by_options.tensors(),
                                                 strict=True))
    with pytest.warns(UserWarning, match="rebuilding"):  # the keyword wins: another identity
        other = EmbeddingCache.build(tmp_path / "opt", model, (x, y),
                                     options=CacheOptions(**settings), data_id={"name": "b"})
    assert other.manifest["identity"] != by_kw.manifest["identity"]


def test_cache_build_refuses_what_is_no_setting(tmp_path):
    model, x, y = _Backbone(), torch.randn(4, 4), torch.arange(4) % 3
    with pytest.raises(TypeError, match=r"EmbeddingCache.build\(\) got an unexpected keyword "
                                        r"argument 'passes'"):
        EmbeddingCache.build(tmp_path / "c", model, (x, y), passes=2)
    assert not (tmp_path / "c").exists()

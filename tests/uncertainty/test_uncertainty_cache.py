"""EmbeddingCache: round trip, reuse, stale detection, corruption rejection, atomic build."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from torchcal._io import write_verified
from torchcal.errors import TorchcalError
from torchcal.uncertainty import (
    CacheError,
    EmbeddingCache,
    StaleCacheError,
    data_identity,
    model_identity,
)


class ArrayData(torch.utils.data.Dataset):
    """Stand-in for torchcal.data.ArrayDataset (.data, .labels tensors)."""

    def __init__(self, data, labels):
        self.data, self.labels = data, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.data[i], self.labels[i]


class Counting:
    """An ``embed`` override that counts the batches it sees."""

    def __init__(self, fail_after=None):
        self.calls = 0
        self.fail_after = fail_after

    def __call__(self, model, x):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("backbone crashed")
        z = model.forward_features(x)
        return z, model.fc(z)


def _small(digits_backbone, n=100):
    model, splits = digits_backbone
    x, y = splits["test"]
    return model, x[:n], y[:n]


def _files(path):
    return {n: path / f"{n}.npy" for n in ("embeddings", "logits", "labels")}


def test_round_trip_matches_direct_computation(tmp_path, digits_backbone):
    model, x, y = _small(digits_backbone)
    cache = EmbeddingCache.build(tmp_path / "c", model, (x, y), batch_size=32)
    with torch.no_grad():
        z = model.forward_features(x)
        logits = model(x)
    assert len(cache) == 100 and cache.dim == 32 and cache.num_classes == 10
    assert cache.n_samples == 100 and cache.n_passes == 1
    assert isinstance(cache.embeddings, np.memmap)
    emb, lg, lab = cache.tensors()
    torch.testing.assert_close(emb, z)
    torch.testing.assert_close(lg, logits)
    assert torch.equal(lab, y)
    # reopening from disk gives the same, and batches in order cover every row once
    again = EmbeddingCache(tmp_path / "c")
    got = [b for b in again.batches(30)]
    assert [b[0].shape[0] for b in got] == [30, 30, 30, 10]
    torch.testing.assert_close(torch.cat([b[0] for b in got]), z)
    assert torch.equal(torch.cat([b[2] for b in got]), y)
    # shuffled batches: a permutation of the rows, reproducible from the seed
    sh = list(again.batches(32, shuffle=True, seed=3, drop_last=True))
    assert len(sh) == 3
    lab_sh = torch.cat([b[2] for b in sh])
    emb_sh = torch.cat([b[0] for b in sh])
    assert lab_sh.shape == (96,)
    rows = [int(torch.nonzero((z == e).all(1))[0]) for e in emb_sh]
    assert len(set(rows)) == 96
    assert torch.equal(lab_sh, y[rows])
    assert torch.equal(lab_sh, torch.cat([b[2] for b in again.batches(32, shuffle=True, seed=3,
                                                                      drop_last=True)]))
    man = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert man["schema"] == "torchcal.embedding_cache/1"
    assert man["arrays"]["embeddings"]["shape"] == [100, 32]
    assert man["arrays"]["labels"]["dtype"] == "int64"
    assert man["identity"]["backbone"] == model_identity(model)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_data_sources_agree(tmp_path, digits_backbone):
    model, x, y = _small(digits_backbone, 40)
    ref = EmbeddingCache.build(tmp_path / "pair", model, (x.numpy(), y.numpy())).tensors()
    ds = ArrayData(x, y)
    for name, data in [("array", ds),
                       ("loader", torch.utils.data.DataLoader(ds, batch_size=7)),
                       ("dataset", torch.utils.data.Subset(ds, range(40)))]:
        got = EmbeddingCache.build(tmp_path / name, model, data, batch_size=16).tensors()
        for a, b in zip(ref, got, strict=True):
            torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="shuffle=False"):
        EmbeddingCache.build(tmp_path / "bad", model,
                             torch.utils.data.DataLoader(ds, batch_size=7, shuffle=True))


def test_valid_cache_is_reused_without_running_the_backbone(tmp_path, digits_backbone):
    model, x, y = _small(digits_backbone)
    first = Counting()
    EmbeddingCache.build(tmp_path / "c", model, (x, y), batch_size=50, embed=first)
    assert first.calls == 2
    second = Counting()
    cache = EmbeddingCache.build(tmp_path / "c", model, (x, y), batch_size=50, embed=second)
    assert second.calls == 0
    assert len(cache) == 100


def test_stale_cache_detected_error_or_rebuild(tmp_path, digits_backbone):
    model, x, y = _small(digits_backbone)
    path = tmp_path / "c"
    EmbeddingCache.build(path, model, (x, y))
    other = type(model)()  # same class, other weights
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        other.fc.bias.add_(1.0)
    assert model_identity(other) != model_identity(model)
    with pytest.raises(StaleCacheError, match="backbone"):
        EmbeddingCache.build(path, other, (x, y), on_stale="error")
    with pytest.raises(StaleCacheError, match="data"):
        EmbeddingCache.build(path, model, (x + 1, y), on_stale="error")
    with pytest.raises(StaleCacheError, match="n_passes"):
        EmbeddingCache.open(path, expect=EmbeddingCache.identity_of(model, (x, y), n_passes=2))
    assert issubclass(StaleCacheError, TorchcalError)
    with pytest.warns(UserWarning, match="stale"):
        rebuilt = EmbeddingCache.build(path, other, (x, y), on_stale="rebuild")
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.tensors()[1], other(x))
    assert EmbeddingCache(path).identity["backbone"] == model_identity(other)


def _flip_byte(path, offset_from_end=5):
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corruption_is_rejected(tmp_path, digits_backbone):
    model, x, y = _small(digits_backbone)
    path = tmp_path / "c"
    EmbeddingCache.build(path, model, (x, y))
    files = _files(path)
    pristine = {k: p.read_bytes() for k, p in files.items()}
    man_text = (path / "manifest.json").read_text()

    _flip_byte(files["embeddings"])  # silent bit flip: only the checksum sees it
    with pytest.raises(CacheError, match="does not match its SHA-256 in manifest.json"):
        EmbeddingCache(path)
    files["embeddings"].write_bytes(pristine["embeddings"])

    files["logits"].write_bytes(pristine["logits"][:-100])  # truncated
    with pytest.raises(CacheError, match="corrupted or modified.*rebuild the cache"):
        EmbeddingCache(path)
    with pytest.raises(CacheError, match="truncated"):
        EmbeddingCache(path, verify=False)
    files["logits"].write_bytes(pristine["logits"])

    man = json.loads(man_text)
    man["arrays"]["labels"]["shape"] = [99]
    (path / "manifest.json").write_text(json.dumps(man))  # an edited manifest: its SHA-256
    with pytest.raises(CacheError, match="manifest.*does not match its SHA-256"):
        EmbeddingCache(path, verify=False)
    write_verified(path / "manifest.json", json.dumps(man).encode())  # edited and re-hashed
    with pytest.raises(CacheError, match="manifest says"):
        EmbeddingCache(path, verify=False)
    write_verified(path / "manifest.json", man_text[:-20].encode())
    with pytest.raises(CacheError, match="manifest.*not valid JSON"):
        EmbeddingCache(path)
    write_verified(path / "manifest.json", man_text.encode())

    os.remove(files["labels"])
    with pytest.raises(CacheError, match="missing labels.npy"):
        EmbeddingCache(path)
    with pytest.raises(CacheError, match="does not exist"):
        EmbeddingCache(tmp_path / "nowhere")

    # building over a corrupt cache: rejected with on_stale="error", rebuilt otherwise
    with pytest.raises(CacheError):
        EmbeddingCache.build(path, model, (x, y), on_stale="error")
    with pytest.warns(UserWarning, match="rebuilding"):
        cache = EmbeddingCache.build(path, model, (x, y))
    assert torch.equal(cache.tensors()[2], y)
    EmbeddingCache(path)  # verifies


def test_failed_build_leaves_nothing_and_keeps_old_cache(tmp_path, digits_backbone):
    model, x, y = _small(digits_backbone)
    path = tmp_path / "c"
    with pytest.raises(RuntimeError, match="crashed"):
        EmbeddingCache.build(path, model, (x, y), batch_size=20, embed=Counting(fail_after=2))
    assert list(tmp_path.iterdir()) == []
    EmbeddingCache.build(path, model, (x, y), batch_size=20)
    before = {k: p.read_bytes() for k, p in _files(path).items()}
    with pytest.raises(RuntimeError, match="crashed"), pytest.warns(UserWarning, match="stale"):
        EmbeddingCache.build(path, model, (x + 1, y), batch_size=20, embed=Counting(fail_after=2))
    assert {k: p.read_bytes() for k, p in _files(path).items()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]
    EmbeddingCache(path)


def test_augmented_passes(tmp_path, digits_backbone):
    model, x, y = _small(digits_backbone, 50)

    def jitter(x, generator=None):
        return x + 0.1 * torch.randn(x.shape, generator=generator, device=x.device)

    a = EmbeddingCache.build(tmp_path / "a", model, (x, y), augment=jitter, n_passes=3, seed=1)
    b = EmbeddingCache.build(tmp_path / "b", model, (x, y), augment=jitter, n_passes=3, seed=1)
    assert len(a) == 150 and a.n_samples == 50 and a.n_passes == 3
    ea, la, ya = a.tensors()
    torch.testing.assert_close(ea, b.tensors()[0])  # reproducible from the seed
    assert torch.equal(ya, y.repeat(3))  # pass-major rows
    assert not torch.allclose(ea[:50], ea[50:100])  # the passes differ
    with torch.no_grad():
        clean = model.forward_features(x)
    assert not torch.allclose(ea[:50], clean)
    assert a.identity["augment"].endswith("jitter")
    with pytest.warns(UserWarning, match="identical copies"):
        EmbeddingCache.build(tmp_path / "c", model, (x, y), n_passes=2)


def test_build_leaves_model_untouched(tmp_path, digits_backbone):
    model, x, y = _small(digits_backbone, 20)
    model.train()
    for p in model.parameters():
        p.grad = None
    before = model_identity(model)
    EmbeddingCache.build(tmp_path / "c", model, (x, y))
    assert model.training  # mode restored
    model.eval()
    assert model_identity(model) == before
    assert all(p.grad is None for p in model.parameters())


def test_backbone_runs_in_eval_mode_under_no_grad(tmp_path, digits_backbone):
    model, x, y = _small(digits_backbone, 40)
    seen = []

    def embed(m, xb):
        seen.append((torch.is_grad_enabled(), m.training))
        z = m.forward_features(xb)
        return z, m.fc(z)

    model.train()
    try:
        with torch.enable_grad():
            EmbeddingCache.build(tmp_path / "c", model, (x, y), batch_size=16, embed=embed)
    finally:
        model.eval()
    assert seen == [(False, False)] * 3


def test_identity_helpers(digits_backbone):
    model, x, y = _small(digits_backbone, 20)
    clone = type(model)()
    clone.load_state_dict(model.state_dict())
    assert model_identity(clone) == model_identity(model)
    assert data_identity((x, y)) == data_identity((x.clone(), y.clone()))
    assert data_identity((x, y))["sha256"] != data_identity((x, y.flip(0)))["sha256"]
    assert data_identity((x, y), data_id="v2")["data_id"] == "v2"


def test_bad_arguments(tmp_path, digits_backbone):
    model, x, y = _small(digits_backbone, 20)
    with pytest.raises(ValueError, match="`n_passes`"):
        EmbeddingCache.build(tmp_path / "c", model, (x, y), n_passes=0)
    with pytest.raises(ValueError, match="`on_stale`"):
        EmbeddingCache.build(tmp_path / "c", model, (x, y), on_stale="ignore")
    with pytest.raises(TypeError, match="`data`"):
        EmbeddingCache.build(tmp_path / "c", model, 42)
    with pytest.raises(TypeError, match="forward_features"):
        EmbeddingCache.build(tmp_path / "c", torch.nn.Linear(64, 3), (x, y))
    with pytest.raises(ValueError, match="labels"):
        EmbeddingCache.build(tmp_path / "c", model, (x, y[:5]))
    (tmp_path / "file").write_text("x")
    with pytest.raises(CacheError, match="manifest"):
        EmbeddingCache(tmp_path)


def test_failed_publish_restores_the_old_cache(tmp_path, digits_backbone, monkeypatch):
    import torchcal.uncertainty.cache as cache_mod

    model, x, y = _small(digits_backbone, 30)
    path = tmp_path / "c"
    EmbeddingCache.build(path, model, (x, y))
    before = {k: p.read_bytes() for k, p in _files(path).items()}
    real_replace = os.replace

    def failing_replace(src, dst):
        if ".c.tmp-" in str(src):  # moving the finished new cache into place
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(cache_mod.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"), pytest.warns(UserWarning, match="stale"):
        EmbeddingCache.build(path, model, (x + 1, y))
    monkeypatch.undo()
    assert {k: p.read_bytes() for k, p in _files(path).items()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]
    EmbeddingCache(path)

"""Artifacts are written only after their values are checked, and read back only after their
values are checked, not only their checksums (issue 33, 2): the embedding cache (row counts,
data identity, finite values, labels in range) and the uncertainty head (finite parameters).
The command-line cases (``uncertainty fit --lr 1e30``) are in test_uncertainty_cli.py."""

from __future__ import annotations

import io
import json
import warnings

import numpy as np
import pytest
import torch

from torchcal._io import sha256_file, write_verified
from torchcal.errors import CheckpointError
from torchcal.uncertainty import CacheError, EmbeddingCache, UncertaintyHead, load_head, save_head
from torchcal.uncertainty.head import HEAD_FORMAT


def _small(digits_backbone, n=100):
    model, splits = digits_backbone
    x, y = splits["test"]
    return model, x[:n], y[:n]


def _rewrite(path, name, arr, **manifest_changes):
    """Replace one array of the cache at ``path`` and re-hash everything (what an attacker or
    a buggy tool does): the manifest's SHA-256 entries and its own checksum file agree."""
    np.save(path / f"{name}.npy", arr)
    man = json.loads((path / "manifest.json").read_text())
    man["arrays"][name]["shape"] = list(arr.shape)
    man["arrays"][name]["sha256"] = sha256_file(path / f"{name}.npy")
    man.update(manifest_changes)
    write_verified(path / "manifest.json", json.dumps(man).encode())


def _cut(path, rows):
    for name in ("embeddings", "logits", "labels"):
        _rewrite(path, name, np.load(path / f"{name}.npy")[:rows], rows=rows, n_samples=rows)


def test_a_cache_cut_and_rehashed_is_refused_not_reused(tmp_path, digits_backbone):
    """An embedding cache cut to 10 rows and re-hashed was reused (the head's upstream R-AUROC
    fell 0.692 -> 0.544, no warning): the row count must match the data identity it records."""
    model, x, y = _small(digits_backbone)
    path = tmp_path / "c"
    EmbeddingCache.build(path, model, (x, y))
    _cut(path, 10)
    with pytest.raises(CacheError, match=r"inconsistent: it holds 10 samples of data whose "
                                         r"identity records 100"):
        EmbeddingCache(path)
    with pytest.warns(UserWarning, match="inconsistent.*rebuilding"):
        cache = EmbeddingCache.build(path, model, (x, y))
    assert len(cache) == 100
    # rows that disagree with samples x passes
    _rewrite(path, "labels", np.load(path / "labels.npy"), rows=50)
    with pytest.raises(CacheError, match="50 rows for 100 samples x 1 passes"):
        EmbeddingCache(path)


@pytest.mark.parametrize(("name", "edit", "match"), [
    ("embeddings", lambda a: a.__setitem__((3, 0), np.nan), "'embeddings' holds 1 NaN/Inf"),
    ("logits", lambda a: a.__setitem__((0, 1), np.inf), "'logits' holds 1 NaN/Inf"),
    ("labels", lambda a: a.__setitem__(5, -7), r"'labels' go down to -7 \(expected class "
                                               r"indices >= 0, or -1 for unknown\)"),
])
def test_impossible_values_rehashed_are_refused(tmp_path, digits_backbone, name, edit, match):
    model, x, y = _small(digits_backbone)
    path = tmp_path / "c"
    EmbeddingCache.build(path, model, (x, y))
    arr = np.array(np.load(path / f"{name}.npy"))
    edit(arr)
    _rewrite(path, name, arr)
    with pytest.raises(CacheError, match=match):
        EmbeddingCache(path)
    EmbeddingCache(path, verify=False)  # the unverified fast path opens it (as documented)


def test_a_backbone_giving_nan_builds_nothing_and_keeps_the_old_cache(tmp_path, digits_backbone):
    model, x, y = _small(digits_backbone)
    path = tmp_path / "c"
    EmbeddingCache.build(path, model, (x, y))
    before = (path / "embeddings.npy").read_bytes()

    def nan_embed(m, xb):
        z = m.forward_features(xb)
        return z * float("nan"), m.fc(z)

    with pytest.raises(CacheError, match=r"not built .*'embeddings' holds .* NaN/Inf.*unchanged"), \
            pytest.warns(UserWarning, match="stale: its data differ"):
        EmbeddingCache.build(path, model, (x + 1, y), embed=nan_embed)
    assert (path / "embeddings.npy").read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".c.tmp-")]


def test_a_head_with_nan_parameters_is_not_written(tmp_path):
    good = UncertaintyHead(8, width=4)
    path = tmp_path / "head.pt"
    save_head(good, path, {"note": "good"})
    before = path.read_bytes()
    bad = UncertaintyHead(8, width=4)
    with torch.no_grad():
        next(bad.parameters())[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=r"not written .*'mlp\.0\.weight' \(1 of 32 "
                                              r"values\) is NaN/Inf.*unchanged"):
        save_head(bad, path)
    assert path.read_bytes() == before
    assert load_head(path)[1] == {"note": "good"}


def test_a_head_file_with_nan_parameters_and_a_matching_checksum_is_refused(tmp_path):
    head = UncertaintyHead(8, width=4)
    state = {"format": HEAD_FORMAT, "in_features": 8, "width": 4, "depth": 2,
             "state_dict": {k: v.clone() for k, v in head.state_dict().items()}, "meta": {}}
    state["state_dict"]["mlp.0.bias"][1] = float("inf")
    buf = io.BytesIO()
    torch.save(state, buf)
    path = tmp_path / "head.pt"
    write_verified(path, buf.getvalue())  # the checksum agrees: only the values tell
    with pytest.raises(CheckpointError, match=r"malformed: its parameter 'mlp\.0\.bias' .* "
                                              r"NaN/Inf; fit the head again"):
        load_head(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state["state_dict"]["mlp.0.bias"][1] = 0.0
        buf = io.BytesIO()
        torch.save(state, buf)
        write_verified(path, buf.getvalue())
        load_head(path)

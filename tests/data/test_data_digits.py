"""The embedded noisy-digits benchmark and its OOD set."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from torchcal.data import load_digits_ood, load_digits_splits, load_ood, load_splits


@pytest.fixture(scope="module")
def clean():
    x, y = load_digits(return_X_y=True)
    return x / 16.0, y


def test_sizes_stratification_and_copies(clean):
    x, y = clean
    s = load_digits_splits(seed=0)
    n_tr, n_va, n_te = 1077, 180, 540
    assert (len(s.train), len(s.val), len(s.test)) == (n_tr, 5 * n_va, 5 * n_te)
    assert s.train.data.dtype == torch.float32 and s.train.data.shape[1] == 64
    assert s.mean is None and s.std is None and not s.augment and s.num_classes == 10
    # Copies of an image are adjacent and share the label.
    assert torch.equal(s.test.labels[::5].repeat_interleave(5), s.test.labels)
    # Stratified: class proportions in every split within one image of the overall ones.
    overall = np.bincount(y) / len(y)
    for ds, n in ((s.train, n_tr), (s.val[::1], n_va), (s.test, n_te)):
        labels = ds.labels.numpy() if hasattr(ds, "labels") else ds[1].numpy()
        counts = np.bincount(labels[:: (1 if n == n_tr else 5)], minlength=10)
        assert np.all(np.abs(counts - overall * n) <= 1.5)
    # Each noisy copy = a clean image + noise of std 0.5: recover the clean image set.
    clean_te = s.test.data[::5].double().numpy()
    mean_of_copies = s.test.data.double().numpy().reshape(n_te, 5, 64).mean(1)
    # Match each test image to its nearest clean digit: the noise-averaged copies are close.
    d = ((mean_of_copies[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    nearest = d.argmin(1)
    np.testing.assert_array_equal(y[nearest], s.test.labels[::5].numpy())
    resid = s.test.data.double().numpy().reshape(n_te, 5, 64) - x[nearest][:, None, :]
    assert abs(resid.std() - 0.5) < 0.01 and abs(resid.mean()) < 0.01
    # Copies of one image have independent noise.
    assert not np.allclose(clean_te, s.test.data[1::5].double().numpy())


def test_noise_free_is_exact_and_disjoint(clean):
    x, y = clean
    s = load_digits_splits(seed=3, noise_std=0.0, n_copies=2)
    rows = {tuple(np.round(r * 16).astype(int)) for r in s.train.data.double().numpy()}
    test_rows = {tuple(np.round(r * 16).astype(int)) for r in s.test.data.double().numpy()}
    all_rows = {tuple(np.round(r * 16).astype(int)) for r in x}
    assert rows <= all_rows and test_rows <= all_rows
    assert len(s.train) + len(s.val) // 2 + len(s.test) // 2 == len(y)


def test_seed_determinism():
    a, b, c = load_digits_splits(seed=1), load_digits_splits(seed=1), load_digits_splits(seed=2)
    assert torch.equal(a.train.data, b.train.data) and torch.equal(a.test.labels, b.test.labels)
    assert not torch.equal(a.test.data, c.test.data)
    via = load_splits("digits", seed=1, noise_std=0.5)
    assert torch.equal(via.val.data, a.val.data)


def test_val_fraction_and_bad_args():
    s = load_splits("digits", seed=0, val_fraction=0.2, n_copies=1)
    assert len(s.val) == 360 and len(s.test) == 540
    with pytest.raises(ValueError, match="`noise_std`"):
        load_digits_splits(noise_std=-1)
    with pytest.raises(ValueError, match="`n_copies`"):
        load_digits_splits(n_copies=0)
    with pytest.raises(ValueError, match="`split`"):
        load_digits_splits(split=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="`seed`"):
        load_digits_splits(seed=-1)


def test_ood_set():
    a = load_digits_ood(seed=0, n=200)
    assert a.data.shape == (200, 64) and a.data.dtype == torch.float32
    assert (a.labels == -1).all()
    assert torch.equal(a.data, load_ood("digits_ood", seed=0, n=200).data)
    assert not torch.equal(a.data, load_digits_ood(seed=1, n=200).data)
    clean = load_digits_ood(seed=0, n=200, noise_std=0.0).data
    assert clean.min() == 0 and clean.max() == 1  # min-max scaled to the digits' range
    resid = a.data - clean
    assert abs(resid.std().item() - 0.5) < 0.02
    # Patches are not flat: they carry structure.
    assert clean.std(1).mean() > 0.15

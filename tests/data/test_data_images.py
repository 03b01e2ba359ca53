"""SVHN (.mat), Tiny-ImageNet (official zip with real JPEGs) and the ImageNet class folders."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.io import savemat

from torchcal.data import load_ood, load_splits
from torchcal.data.fake import write_fake_imagenet_folder, write_fake_tinyimagenet
from torchcal.data.imagenet import ImageFolderDataset, random_resized_crop_box
from torchcal.errors import ChecksumError, DataNotFoundError


def test_svhn_mat_layout_and_label_10(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (32, 32, 3, 12), dtype=np.uint8)
    y = np.array([10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1], dtype=np.uint8).reshape(-1, 1)
    savemat(tmp_path / "test_32x32.mat", {"X": x, "y": y})
    savemat(tmp_path / "train_32x32.mat", {"X": x, "y": y})
    with pytest.raises(ChecksumError, match="SVHN test set"):
        load_ood("svhn", tmp_path)
    ood = load_ood("svhn", tmp_path, verify=False)
    assert ood.data.shape == (12, 3, 32, 32) and ood.data.dtype == torch.uint8
    assert (ood.labels == -1).all()
    ds = load_ood("svhn", tmp_path, verify=False, keep_labels=True)
    assert ds.labels.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    # X[h, w, c, n] -> data[n, c, h, w]
    assert ds.data[4, 2, 7, 9].item() == x[7, 9, 2, 4]
    s = load_splits("svhn", tmp_path, verify=False)
    assert (len(s.train), len(s.val), len(s.test)) == (11, 1, 12)
    with pytest.raises(DataNotFoundError, match="test_32x32.mat.*ufldl"):
        load_ood("svhn", tmp_path / "none")


def test_tinyimagenet_zip(tmp_path):
    write_fake_tinyimagenet(tmp_path, n_classes=3, n_train=6, n_val=2)
    with pytest.raises(ChecksumError):
        load_splits("tinyimagenet", tmp_path, per_class=2)
    s = load_splits("tinyimagenet", tmp_path, verify=False, per_class=2, seed=1)
    assert (len(s.train), len(s.val), len(s.test)) == (12, 6, 6)
    assert s.num_classes == 3 and s.input_shape == (3, 64, 64) and s.augment
    assert s.train.data.dtype == torch.uint8 and s.train.data.shape[1:] == (3, 64, 64)
    assert torch.bincount(s.val.labels).tolist() == [2, 2, 2]  # per class held out
    # Class index = position in the sorted wnids (wnids.txt is not sorted).
    wnids = s.info["wnids"]
    assert wnids == sorted(wnids)
    # Test labels follow val_annotations.txt; pixels are the decoded JPEGs.
    with zipfile.ZipFile(tmp_path / "tiny-imagenet-200.zip") as zf:
        ann = zf.read("tiny-imagenet-200/val/val_annotations.txt").decode().splitlines()
        first = ann[0].split("\t")
        img = np.asarray(Image.open(io.BytesIO(zf.read(f"tiny-imagenet-200/val/images/{first[0]}"))).convert("RGB"))
    assert s.test.labels[0].item() == wnids.index(first[1])
    np.testing.assert_array_equal(s.test.data[0].permute(1, 2, 0).numpy(), img)
    # Grey-scale JPEGs become 3 equal channels.
    grey = s.train.data[(s.train.data[:, 0] == s.train.data[:, 1]).flatten(1).all(1)]
    assert len(grey) >= 1
    # Seeded hold-out: the same seed gives the same split, another seed another one.
    s2 = load_splits("tinyimagenet", tmp_path, verify=False, per_class=2, seed=1, cache=True)
    assert torch.equal(s2.val.data, s.val.data)
    s3 = load_splits("tinyimagenet", tmp_path, verify=False, per_class=2, seed=1, cache=True)
    assert (tmp_path / "tiny-imagenet-200" / "torchcal-cache.npz").exists()
    assert torch.equal(s3.train.data, s.train.data)
    s4 = load_splits("tinyimagenet", tmp_path, verify=False, per_class=2, seed=2)
    assert not torch.equal(s4.val.data, s.val.data)
    with pytest.raises(ValueError, match="`per_class`"):
        load_splits("tinyimagenet", tmp_path, verify=False, per_class=6)


def test_tinyimagenet_missing(tmp_path):
    with pytest.raises(DataNotFoundError, match="tiny-imagenet-200.zip.*cs231n"):
        load_splits("tinyimagenet", tmp_path)


def test_imagenet_folders(tmp_path):
    write_fake_imagenet_folder(tmp_path, n_classes=2, n_train=10, n_val=2, size=(48, 40))
    s = load_splits("imagenet", tmp_path, image_size=32, resize_size=36)
    assert (len(s.train), len(s.val), len(s.test)) == (18, 2, 4) and s.num_classes == 2
    assert not s.augment and s.mean == (0.485, 0.456, 0.406)
    x, y = s.test[3]
    assert x.shape == (3, 32, 32) and x.dtype == torch.uint8 and y.item() == 1
    # Evaluation transform by hand: resize the shorter side (W=40) to 36 -> 36x43, centre crop.
    path = s.test.samples[3][0]
    im = Image.open(path).convert("RGB").resize((36, 43), Image.BILINEAR)
    ref = np.asarray(im)[6:38, 2:34]  # top = round((43-32)/2) = 6 (banker's: 5.5 -> 6), left = 2
    np.testing.assert_array_equal(x.permute(1, 2, 0).numpy(), ref)
    torch.manual_seed(0)
    a = s.train[0][0]
    torch.manual_seed(0)
    assert torch.equal(a, s.train[0][0]) and a.shape == (3, 32, 32)
    loader = torch.utils.data.DataLoader(s.train, batch_size=6)
    xb, yb = next(iter(loader))
    assert xb.shape == (6, 3, 32, 32) and yb.dtype == torch.int64
    with pytest.raises(DataNotFoundError, match="train/<wnid>"):
        load_splits("imagenet", tmp_path / "none")
    with pytest.raises(DataNotFoundError, match="No images"):
        (tmp_path / "empty" / "c").mkdir(parents=True)
        ImageFolderDataset(tmp_path / "empty", train=False)


def test_random_resized_crop_box_bounds():
    g = torch.Generator().manual_seed(0)
    for w, h in [(100, 80), (30, 300), (500, 20)]:
        for _ in range(50):
            left, t, r, b = random_resized_crop_box(w, h, generator=g)
            assert 0 <= left < r <= w and 0 <= t < b <= h
            area = (r - left) * (b - t) / (w * h)
            assert area <= 1.0

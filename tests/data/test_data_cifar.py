"""CIFAR-10/100 and CIFAR-10-C loading from files written in the official formats."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from torchcal.data import load_ood, load_splits, split_indices
from torchcal.data.cifar import load_cifar, read_cifar_pickle
from torchcal.data.fake import fake_images, write_fake_cifar, write_fake_cifar10c
from torchcal.errors import ChecksumError, DataNotFoundError


def _manual_cifar10(root, n_train=50, n_test=10):
    """An independent writer: the layout of the official archive, written by hand."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (n_train, 3072), dtype=np.uint8)
    y = rng.integers(0, 10, n_train)
    for i, part in enumerate(np.array_split(np.arange(n_train), 5)):
        with open(folder / f"data_batch_{i + 1}", "wb") as f:
            pickle.dump({"data": x[part], "labels": y[part].tolist()}, f, protocol=2)
    xt = rng.integers(0, 256, (n_test, 3072), dtype=np.uint8)
    yt = rng.integers(0, 10, n_test)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": xt, b"labels": yt.tolist()}, f)
    return x, y, xt, yt


def test_cifar10_pixels_labels_and_split(tmp_path):
    x, y, xt, yt = _manual_cifar10(tmp_path)
    s = load_splits("cifar10", tmp_path)
    assert (len(s.train), len(s.val), len(s.test)) == (45, 5, 10)
    assert s.train.data.dtype == torch.uint8 and s.train.data.shape[1:] == (3, 32, 32)
    assert s.num_classes == 10 and s.augment and s.input_shape == (3, 32, 32)
    assert s.mean == (0.4914, 0.4822, 0.4465) and s.std == (0.2023, 0.1994, 0.2010)
    # The split of the papers' code: np.random.seed(1); np.random.shuffle(list(range(n))).
    idx = list(range(50))
    np.random.seed(1)  # noqa: NPY002  (the papers use the legacy global API)
    np.random.shuffle(idx)  # noqa: NPY002
    imgs = x.reshape(50, 3, 32, 32)
    np.testing.assert_array_equal(s.val.data.numpy(), imgs[idx[:5]])
    np.testing.assert_array_equal(s.val.labels.numpy(), y[idx[:5]])
    np.testing.assert_array_equal(s.train.data.numpy(), imgs[idx[5:]])
    np.testing.assert_array_equal(s.test.data.numpy(), xt.reshape(10, 3, 32, 32))
    np.testing.assert_array_equal(s.test.labels.numpy(), yt)
    # Channel layout: row-major 1024 R, then G, then B values.
    assert s.test.data[0, 1, 0, 0].item() == xt[0, 1024]


def test_split_sizes_and_determinism():
    tr, va = split_indices(50000, 0.1, seed=1)
    assert len(tr) == 45000 and len(va) == 5000
    assert len(np.intersect1d(tr, va)) == 0
    tr2, va2 = split_indices(50000, 0.1, seed=1)
    np.testing.assert_array_equal(va, va2)
    _, va3 = split_indices(50000, 0.1, seed=2)
    assert not np.array_equal(va, va3)
    assert [len(v) for v in split_indices(7, 0.1)] == [6, 1]  # any size works
    with pytest.raises(ValueError, match="`val_fraction`"):
        split_indices(10, 1.5)


@pytest.mark.parametrize("name,k", [("cifar10", 10), ("cifar100", 100)])
def test_archive_extracted_and_loaded(tmp_path, name, k):
    arc = write_fake_cifar(tmp_path, name, n_train=60, n_test=12)
    with pytest.raises(ChecksumError, match="published MD5"):
        load_splits(name, tmp_path)  # not the official archive
    s = load_splits(name, tmp_path, verify=False)
    assert s.num_classes == k and (len(s.train), len(s.val), len(s.test)) == (54, 6, 12)
    labels = np.arange(12) % k
    np.testing.assert_array_equal(s.test.labels.numpy(), labels)
    np.testing.assert_array_equal(
        s.test.data.numpy(), fake_images(labels, 32, 10, k).transpose(0, 3, 1, 2))
    # Second call reads the extracted folder (archive no longer needed).
    arc.unlink()
    assert len(load_splits(name, tmp_path).train) == 54
    _, _, classes = load_cifar(name, tmp_path)
    assert classes[:2] == ["class0", "class1"]


def test_missing_data_message(tmp_path):
    with pytest.raises(DataNotFoundError) as e:
        load_splits("cifar10", tmp_path / "nowhere")
    msg = str(e.value)
    assert "cifar-10-python.tar.gz" in msg and "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz" in msg
    assert "cifar-10-batches-py" in msg and "nowhere" in msg and "download=True" in msg


def test_malicious_pickle_refused(tmp_path):
    # {"data": builtins.print("pwned")} as protocol-2 opcodes, written by hand: pickling the
    # print object would name whatever replaced it in this process (ray swaps builtins.print)
    p = tmp_path / "evil"
    p.write_bytes(b"\x80\x02}X\x04\x00\x00\x00datacbuiltins\nprint\nX\x05\x00\x00\x00pwned\x85Rs.")
    with pytest.raises(ValueError, match=r"'.*evil' refused: it asks for (__builtin__|builtins)\.print"):
        read_cifar_pickle(p)


def _truncate(path, keep):
    data = path.read_bytes()
    path.write_bytes(data[:keep])


@pytest.mark.parametrize("case", ["truncated", "payload", "empty"])
def test_bad_cifar_batch_is_one_line_naming_the_file(tmp_path, capsys, case):
    """A truncated batch file (UnpicklingError / EOFError inside) or one carrying a payload:
    one line naming the file from `torchcal train`, no traceback, nothing run."""
    from torchcal.cli import main

    _manual_cifar10(tmp_path / "data")
    bad = tmp_path / "data" / "cifar-10-batches-py" / "data_batch_3"
    if case == "truncated":
        _truncate(bad, 1000)
    elif case == "empty":
        _truncate(bad, 0)
    else:
        bad.write_bytes(_payload(tmp_path / "pwned"))
    with pytest.raises(ValueError, match=str(bad)):
        load_splits("cifar10", tmp_path / "data")
    code = main(["train", "--recipe", "cifar10-resnet110", "--model", "small_cnn", "--epochs", "1",
                 "--data-root", str(tmp_path / "data"), "--out", str(tmp_path / "run"),
                 "--no-progress", "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(bad) in err and ("refused" if case == "payload" else "truncated or corrupt") in err
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "run").exists()


def _payload(target):
    class Evil:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {target}",))

    return pickle.dumps({"data": Evil()}, protocol=2)


def test_unknown_names_and_keywords(tmp_path):
    with pytest.raises(ValueError, match="Unknown data set 'cifar1'.*cifar10"):
        load_splits("cifar1", tmp_path)
    with pytest.raises(ValueError, match="Unexpected keyword.*bogus"):
        load_splits("cifar10", tmp_path, bogus=1)
    with pytest.raises(ValueError, match="Unknown OOD set"):
        load_ood("mnist", tmp_path)


def test_cifar10c_severity_blocks(tmp_path):
    write_fake_cifar10c(tmp_path, ("gaussian_noise", "fog"), n=20)
    raw = np.load(tmp_path / "CIFAR-10-C" / "gaussian_noise.npy")
    labels = np.load(tmp_path / "CIFAR-10-C" / "labels.npy")
    assert raw.shape == (100, 32, 32, 3)
    for sev in (1, 5):
        ds = load_ood("cifar10c", tmp_path, severity=sev)
        assert ds.data.shape == (20, 3, 32, 32) and ds.data.dtype == torch.uint8
        np.testing.assert_array_equal(ds.data.numpy(), raw[(sev - 1) * 20: sev * 20].transpose(0, 3, 1, 2))
        np.testing.assert_array_equal(ds.labels.numpy(), labels[(sev - 1) * 20: sev * 20])
    assert not torch.equal(load_ood("cifar10c", tmp_path, corruption="fog").data,
                           load_ood("cifar10c", tmp_path).data)
    with pytest.raises(ValueError, match="`severity`"):
        load_ood("cifar10c", tmp_path, severity=6)
    with pytest.raises(ValueError, match="corruption"):
        load_ood("cifar10c", tmp_path, corruption="rain")
    with pytest.raises(DataNotFoundError, match="CIFAR-10-C.tar"):
        load_ood("cifar10c", tmp_path / "empty")


def test_stratified_holdout_counts_and_determinism():
    from torchcal.data import stratified_holdout

    labels = np.repeat(np.arange(4), [10, 7, 9, 12])
    np.random.default_rng(0).shuffle(labels)
    kept, held = stratified_holdout(labels, 3, seed=1)
    assert np.bincount(labels[held]).tolist() == [3, 3, 3, 3]
    assert np.bincount(labels[kept]).tolist() == [7, 4, 6, 9]
    assert sorted(kept.tolist() + held.tolist()) == list(range(len(labels)))
    k2, h2 = stratified_holdout(labels, 3, seed=1)
    np.testing.assert_array_equal(h2, held)
    assert not np.array_equal(stratified_holdout(labels, 3, seed=2)[1], held)
    # The held-out samples of a class are uniformly chosen: over many seeds every sample of
    # class 1 (7 samples, 3 held) is held out about 3/7 of the time.
    idx1 = np.flatnonzero(labels == 1)
    freq = np.mean([np.isin(idx1, stratified_holdout(labels, 3, seed=s)[1]) for s in range(400)], 0)
    assert np.all(np.abs(freq - 3 / 7) < 0.1)
    with pytest.raises(ValueError, match="`per_class`"):
        stratified_holdout(labels, 7)

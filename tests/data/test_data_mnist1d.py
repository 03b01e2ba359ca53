"""MNIST-1D: the package's generator behind a cache, the caller's RNG states, the splits, the OOD
set, the registry entries and an end-to-end ``torchcal train --recipe mnist1d-cnn``."""

# ruff: noqa: NPY002  (the subject here is NumPy's legacy global generator)
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from mnist1d.data import get_dataset_args, make_dataset

from torchcal.cli import main
from torchcal.data import list_datasets, list_ood_sets, load_ood, load_splits
from torchcal.data import mnist1d as m1d
from torchcal.data.mnist1d import (
    generate_mnist1d,
    load_mnist1d_ood,
    load_mnist1d_splits,
    mnist1d_cache_path,
)
from torchcal.train import get_recipe


def _package(num_samples: int, seed: int, shuffle_seq: bool = False):
    """The package's own data set, ``x`` then ``x_test`` (the reference)."""
    state = np.random.get_state(), random.getstate()
    args = get_dataset_args()
    args.num_samples, args.seed, args.shuffle_seq = num_samples, seed, shuffle_seq
    d = make_dataset(args)
    np.random.set_state(state[0])
    random.setstate(state[1])
    return np.concatenate([d["x"], d["x_test"]]), np.concatenate([d["y"], d["y_test"]])


def test_generate_equals_the_package_and_is_deterministic(tmp_path):
    x, y = generate_mnist1d(60, seed=3, root=tmp_path)
    xr, yr = _package(60, 3)
    assert x.dtype == np.float32 and y.dtype == np.int64 and x.shape == (60, 40)
    np.testing.assert_array_equal(x, xr.astype(np.float32))
    np.testing.assert_array_equal(y, yr)
    assert np.bincount(y).tolist() == [6] * 10
    x2, y2 = generate_mnist1d(60, seed=3, cache=False)
    np.testing.assert_array_equal(x2, x)
    np.testing.assert_array_equal(y2, y)
    x3, _ = generate_mnist1d(60, seed=4, cache=False)
    assert not np.allclose(x3, x)


def test_splits_are_consecutive_rows_of_one_generated_set(tmp_path):
    s = load_mnist1d_splits(tmp_path, seed=5, n_train=23, n_val=11, n_test=17)  # 51 -> 60 drawn
    xr, yr = _package(60, 5)
    assert (len(s.train), len(s.val), len(s.test)) == (23, 11, 17)
    x = torch.cat([s.train.data, s.val.data, s.test.data]).numpy()
    y = torch.cat([s.train.labels, s.val.labels, s.test.labels]).numpy()
    np.testing.assert_array_equal(x, xr[:51].astype(np.float32))
    np.testing.assert_array_equal(y, yr[:51])
    assert s.name == "mnist1d" and s.num_classes == 10 and s.input_shape == (40,)
    assert s.mean is None and s.std is None and not s.augment
    assert s.info["num_samples"] == 60 and s.info["sizes"] == {"train": 23, "val": 11, "test": 17}


def test_cache_hit_miss_and_mismatch(tmp_path, monkeypatch):
    path = mnist1d_cache_path(30, 1, tmp_path)
    assert not path.exists()
    x, y = generate_mnist1d(30, seed=1, root=tmp_path)  # miss: generated and written
    assert path.is_file()
    with np.load(path) as z:
        assert json.loads(str(z["args"]))["num_samples"] == 30 and len(str(z["sha256"])) == 64

    calls = []
    real = m1d._make
    monkeypatch.setattr(m1d, "_make", lambda *a: calls.append(a) or real(*a))
    x2, _ = generate_mnist1d(30, seed=1, root=tmp_path)  # hit: not generated
    assert calls == [] and np.array_equal(x2, x)

    # Tampered content (hash no longer matches): regenerated, with a warning.
    with np.load(path) as z:
        parts = {k: z[k] for k in z.files}
    parts["x"] = parts["x"] + np.float32(1.0)
    np.savez(path, **parts)
    with pytest.warns(UserWarning, match="content hash"):
        x3, y3 = generate_mnist1d(30, seed=1, root=tmp_path)
    assert len(calls) == 1 and np.array_equal(x3, x) and np.array_equal(y3, y)
    generate_mnist1d(30, seed=1, root=tmp_path)  # the rewritten file is valid again
    assert len(calls) == 1

    # An unreadable file: regenerated too.
    path.write_bytes(b"not an npz file")
    with pytest.warns(UserWarning, match="unreadable"):
        x4, _ = generate_mnist1d(30, seed=1, root=tmp_path)
    assert len(calls) == 2 and np.array_equal(x4, x)

    # cache=False: neither read nor written.
    generate_mnist1d(40, seed=1, root=tmp_path, cache=False)
    assert len(calls) == 3 and not mnist1d_cache_path(40, 1, tmp_path).exists()


def test_cache_key_separates_seeds_sizes_and_shuffle(tmp_path):
    paths = {mnist1d_cache_path(n, s, tmp_path, shuffle_seq=sh)
             for n in (10, 20) for s in (0, 1) for sh in (False, True)}
    assert len(paths) == 8


@pytest.mark.parametrize("hit", [False, True])
def test_callers_rng_states_restored(tmp_path, hit):
    if hit:
        generate_mnist1d(20, seed=7, root=tmp_path)
    def draws():
        return np.random.normal(), np.random.rand(3).tolist(), random.random()

    np.random.seed(123)
    random.seed(123)
    np.random.normal()  # leaves a cached Gaussian in the state
    expected = draws()
    np.random.seed(123)
    random.seed(123)
    np.random.normal()
    generate_mnist1d(20, seed=7, root=tmp_path)
    assert draws() == expected


def test_rng_states_restored_when_the_generator_fails(monkeypatch):
    import mnist1d.data

    def failing(args):
        mnist1d.data.set_seed(args.seed)
        raise RuntimeError("boom")

    monkeypatch.setattr(mnist1d.data, "make_dataset", failing)
    np.random.seed(9)
    random.seed(9)
    expected = np.random.rand(), random.random()
    np.random.seed(9)
    random.seed(9)
    with pytest.raises(RuntimeError, match="boom"):
        generate_mnist1d(10, seed=1, cache=False)
    assert (np.random.rand(), random.random()) == expected


def test_ood_is_the_packages_shuffled_variant(tmp_path):
    ood = load_mnist1d_ood(tmp_path, seed=2, n=25)
    xr, _ = _package(30, 2, shuffle_seq=True)
    np.testing.assert_array_equal(ood.data.numpy(), xr[:25].astype(np.float32))
    assert ood.labels.tolist() == [-1] * 25
    assert torch.equal(load_ood("mnist1d_shuffled", tmp_path, seed=2, n=25).data, ood.data)


def test_registry_entries(tmp_path):
    assert "mnist1d" in list_datasets() and "mnist1d_shuffled" in list_ood_sets()
    s = load_splits("mnist1d", tmp_path, seed=0, n_train=10, n_val=10, n_test=10)
    assert (len(s.train), len(s.val), len(s.test)) == (10, 10, 10)
    with pytest.raises(ValueError, match="Unexpected keyword.*noise_std.*accepted: n_train"):
        load_splits("mnist1d", tmp_path, noise_std=0.1)
    with pytest.raises(ValueError, match="Unexpected keyword.*n_train.*accepted: n, cache"):
        load_ood("mnist1d_shuffled", tmp_path, n_train=5)


def test_data_list_shows_mnist1d(capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "mnist1d" in out and "mnist1d_shuffled" in out


@pytest.mark.parametrize("call,match", [
    (lambda r: load_mnist1d_splits(r, n_train=0), "`n_train` to be a positive integer, got 0"),
    (lambda r: load_mnist1d_splits(r, n_test=2.5), "`n_test` to be a positive integer"),
    (lambda r: load_mnist1d_splits(r, seed=-1), "`seed` to be a non-negative integer"),
    (lambda r: load_mnist1d_splits(r, seed=2**32), "`seed` to be below 2\\*\\*32"),
    (lambda r: generate_mnist1d(15, root=r), "`num_samples` to be a multiple of 10, got 15"),
    (lambda r: generate_mnist1d(True, root=r), "`num_samples` to be a positive integer"),
    (lambda r: load_mnist1d_ood(r, n=0), "`n` to be a positive integer"),
])
def test_bad_arguments(tmp_path, call, match):
    with pytest.raises(ValueError, match=match):
        call(tmp_path)
    assert not (tmp_path / "mnist1d").exists()


def test_recipe_is_the_cifar_setting():
    cfg = get_recipe("mnist1d-cnn")
    cifar = get_recipe("cifar10-resnet50")
    assert (cfg.dataset, cfg.model, cfg.loss) == ("mnist1d", "mnist1d_cnn", "ce")
    for field in ("epochs", "batch_size", "lr", "momentum", "weight_decay", "milestones",
                  "lr_gamma", "grad_clip", "reduction", "select_best_by"):
        assert getattr(cfg, field) == getattr(cifar, field), field
    assert cfg.data_seed == 42 and cfg.milestone_fractions is None


@pytest.mark.filterwarnings("ignore:The validation NLL is minimised:RuntimeWarning")  # 2 epochs
def test_train_recipe_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    run = tmp_path / "run"
    argv = ["train", "--recipe", "mnist1d-cnn", "--loss", "ce", "--seed", "0", "--out", str(run),
            "--data-root", str(tmp_path / "data"), "--epochs", "2", "--no-progress",
            "--data-arg", "n_train=60", "--data-arg", "n_val=30", "--data-arg", "n_test=40",
            "--model-arg", "width=8", "--device", "cpu", "--num-threads", "1"]
    assert main(argv) == 0
    res = json.loads((run / "results.json").read_text())
    assert res["n"] == {"val": 30, "test": 40} and res["num_classes"] == 10
    assert res["meta"]["dataset"] == "mnist1d" and res["meta"]["recipe"] == "mnist1d-cnn"
    assert res["temperatures"]["grid_ece"] > 0 and 0 <= res["test"]["pre"]["error"] <= 1
    assert "mnist1d_shuffled" in res["ood"] and (run / "logits" / "ood_mnist1d_shuffled.npz").is_file()
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["data_kwargs"] == {"n_train": 60, "n_val": 30, "n_test": 40}
    assert mnist1d_cache_path(130, 42, tmp_path / "data").is_file()

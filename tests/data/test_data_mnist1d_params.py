"""torchcal's copy of the MNIST-1D transform chain: its signals equal the package's bit for bit,
and the parameters it records are the ones that made each signal."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mnist1d.data import get_dataset_args, make_dataset

from torchcal.data import load_mnist1d_splits, load_splits
from torchcal.data.mnist1d_params import (
    PARAM_NAMES,
    generate_mnist1d_with_params,
    load_mnist1d_param_splits,
    mnist1d_params_cache_path,
    mnist1d_templates,
)


def _package(n: int, seed: int, **over) -> tuple[np.ndarray, np.ndarray]:
    args = get_dataset_args()
    args.num_samples, args.seed = n, seed
    for k, v in over.items():
        setattr(args, k, v)
    d = make_dataset(args)
    return np.concatenate([d["x"], d["x_test"]]), np.concatenate([d["y"], d["y_test"]])


@pytest.mark.parametrize("n,seed,over", [
    (200, 0, {}),
    (5000, 42, {}),  # the package's default data set
    (300, 3, {"corr_noise_scale": 0.6, "iid_noise_scale": 0.1, "shear_scale": 2.0}),
    (100, 1, {"shuffle_seq": True}),
    (50, 7, {"max_translation": 10, "padding": [20, 30]}),
])
def test_signals_equal_the_package_bit_for_bit(n, seed, over):
    x, y = _package(n, seed, **over)
    x2, y2, params = generate_mnist1d_with_params(n, seed, over)
    assert x2.dtype == x.dtype == np.float64
    assert np.array_equal(x2, x) and np.array_equal(y2, y)
    assert sorted(params) == sorted(PARAM_NAMES)
    assert all(v.shape == (n,) for v in params.values())


def test_global_random_states_restored():
    np.random.seed(5)
    before = np.random.rand()
    np.random.seed(5)
    generate_mnist1d_with_params(20, 0)
    assert np.random.rand() == before


def test_templates_equal_the_package():
    from mnist1d.data import get_templates

    x, t = mnist1d_templates()
    ref = get_templates()
    assert np.array_equal(x, ref["x"]) and np.array_equal(t, ref["t"])


def _replay(label: int, p: dict, settings: dict | None = None) -> np.ndarray:
    """One signal rebuilt independently from its recorded parameters with the package's own
    steps (a scalar loop over mnist1d.transform's functions, no randomness), before the
    data set's standardisation."""
    from mnist1d.transform import interpolate

    x, _ = mnist1d_templates()
    s = {"padding": [36, 60], "template_len": 12}
    new = np.concatenate([x[label] + 1e-8, np.zeros(int(p["padding"]))])
    new = interpolate(new, s["template_len"] + s["padding"][-1])
    new *= p["scale"]
    k = int(p["translation"])
    new = np.concatenate([new[-k:], new[:-k]])
    return new


def test_recorded_parameters_rebuild_the_signal_shape():
    """The translation, padding and scale recorded for a signal place its noise-free part:
    the non-zero (template) positions of the replayed dilated signal are where the generator's
    signal had no correlated noise, i.e. the recorded draws are the ones used."""
    n = 60
    x, y, params = generate_mnist1d_with_params(n, 11, {"corr_noise_scale": 0.0,
                                                        "iid_noise_scale": 0.0,
                                                        "shear_scale": 0.0})
    from mnist1d.transform import interpolate

    # with every noise and the shear off, the signal is the replayed template subsampled to 40
    # points, then standardised by the set's mean and std: undo that with a per-set fit
    raw = np.stack([interpolate(_replay(int(y[i]), {k: v[i] for k, v in params.items()}), 40)
                    for i in range(n)])
    std = raw.std()
    assert np.allclose((raw - raw.mean()) / std, x, atol=1e-12)
    assert np.all(params["corr_noise_rms"] == 0) and np.all(params["shear"] == 0)


def test_parameter_ranges_follow_the_settings():
    _, _, p = generate_mnist1d_with_params(500, 0)
    assert p["padding"].min() >= 36 and p["padding"].max() <= 60
    assert set(np.unique(p["translation"])) <= set(range(48))
    assert np.all(np.abs(p["scale"] - 1) <= 0.2) and np.all(np.abs(p["shear"]) <= 0.375)
    _, _, q = generate_mnist1d_with_params(500, 0, {"shear_scale": 2.0})
    assert np.allclose(q["shear"], p["shear"] * 2.0 / 0.75)  # same draws, another scale


def test_splits_all_classes_equal_load_mnist1d_splits(tmp_path):
    a = load_mnist1d_param_splits(tmp_path, 42, 100, 50, 80)
    b = load_mnist1d_splits(tmp_path, 42, 100, 50, 80)
    for name in ("train", "val", "test"):
        assert torch.equal(getattr(a, name).data, getattr(b, name).data)
        assert torch.equal(getattr(a, name).labels, getattr(b, name).labels)


def test_class_subset_renumbers_and_is_cached(tmp_path):
    s = load_mnist1d_param_splits(tmp_path, 3, 40, 10, 30, classes="5-9")
    assert s.num_classes == 5 and s.info["classes"] == [5, 6, 7, 8, 9]
    full_x, full_y, full_p = generate_mnist1d_with_params(s.info["num_samples"], 3)
    rows = np.flatnonzero(full_y >= 5)[:80]
    got = torch.cat([s.train.data, s.val.data, s.test.data])
    assert torch.equal(got, torch.from_numpy(full_x[rows].astype(np.float32)))
    assert torch.equal(torch.cat([s.train.labels, s.val.labels, s.test.labels]),
                       torch.from_numpy(full_y[rows] - 5))
    assert torch.equal(s.test.params["translation"],
                       torch.from_numpy(full_p["translation"][rows[50:]]))
    path = mnist1d_params_cache_path(s.info["num_samples"], 3, {}, tmp_path)
    assert path.is_file()
    path.write_bytes(b"not a zip")  # any unreadable cache is stale: regenerated with a warning
    with pytest.warns(UserWarning, match="unreadable"):
        again = load_mnist1d_param_splits(tmp_path, 3, 40, 10, 30, classes="5-9")
    assert torch.equal(again.test.data, s.test.data)


def test_subset_keeps_params_aligned(tmp_path):
    s = load_mnist1d_param_splits(tmp_path, 0, 20, 10, 10)
    sub = s.train.subset([3, 1])
    assert torch.equal(sub.params["shear"], s.train.params["shear"][[3, 1]])


def test_load_splits_routes_param_keywords(tmp_path):
    s = load_splits("mnist1d", tmp_path, seed=1, n_train=20, n_val=10, n_test=10,
                    classes=[0, 1], shear_scale=2.0)
    assert s.num_classes == 2 and s.info["generator"]["shear_scale"] == 2.0
    assert hasattr(s.train, "params")


@pytest.mark.parametrize("kw,match", [
    ({"classes": "0-10"}, "classes"), ({"classes": [1, 1]}, "classes"),
    ({"generator": {"shear_scale": -1}}, "shear_scale"),
    ({"generator": {"bogus": 1}}, "bogus"), ({"n_train": 0}, "n_train"),
])
def test_bad_arguments(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        load_mnist1d_param_splits(tmp_path, **kw)

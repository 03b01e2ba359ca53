"""Conformal prediction sets: the finite-sample coverage bound over repeated random splits,
the sets against a slow per-sample construction, set sizes, and the estimator contract."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from torchcal.posthoc import ConformalClassifier, calibrator_from_dict
from torchcal.posthoc.conformal import conformal_rank

METHODS = ["lac", "aps", "raps"]




@pytest.fixture(scope="module")
def pool():
    """A miscalibrated 10-class model: labels drawn from softmax(z / 2)."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(4000, 10, generator=g, dtype=torch.float64) * 3
    y = torch.multinomial(torch.softmax(z / 2, dim=1), 1, generator=g).squeeze(1)
    return z, y


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("alpha", [0.1, 0.05])
def test_coverage_is_within_the_finite_sample_bound_over_random_splits(pool, method, alpha):
    """Exchangeable splits: E[coverage] lies in [1 - alpha, 1 - alpha + 1 / (n + 1)]."""
    z, y = pool
    n_cal, repeats = 500, 100
    g = torch.Generator().manual_seed(1)
    cover, sizes = [], []
    for _ in range(repeats):
        perm = torch.randperm(z.shape[0], generator=g)
        cal, test = perm[:n_cal], perm[n_cal:]
        cp = ConformalClassifier(method=method, alpha=alpha).fit(z[cal], y[cal])
        cover.append(cp.coverage(z[test], y[test]))
        sizes.append(cp.mean_set_size(z[test]))
    mean, se = float(np.mean(cover)), float(np.std(cover)) / math.sqrt(repeats)
    assert 1 - alpha - 3 * se <= mean <= 1 - alpha + 1 / (n_cal + 1) + 3 * se
    assert 1 <= np.mean(sizes) < 10  # informative sets
    print(f"{method} alpha={alpha}: coverage {mean:.4f} +- {se:.4f}, "
          f"mean set size {np.mean(sizes):.3f}")


def test_lac_gives_the_smallest_sets_and_aps_adapts(pool):
    z, y = pool
    fitted = {m: ConformalClassifier(method=m).fit(z[:2000], y[:2000]) for m in METHODS}
    sizes = {m: cp.mean_set_size(z[2000:]) for m, cp in fitted.items()}
    assert sizes["lac"] <= sizes["aps"] and sizes["lac"] <= sizes["raps"]
    # APS sets grow with the model's uncertainty: larger for the flatter half of the samples
    p = torch.softmax(z[2000:], 1)
    flat = p.max(1).values < p.max(1).values.median()
    sets = fitted["aps"].predict_sets(z[2000:])
    assert sets[flat].sum(1).double().mean() > sets[~flat].sum(1).double().mean() + 0.5


def slow_sets(z, q, method, lam=0.01, k_reg=5):
    """Prediction sets written out per sample and class from the score definitions."""
    out = []
    for row in torch.softmax(z, 1).tolist():
        order = sorted(range(len(row)), key=lambda k: (-row[k], k))
        chosen = []
        for k in range(len(row)):
            if method == "lac":
                s = 1 - row[k]
            else:
                rank = order.index(k) + 1
                s = math.fsum(row[j] for j in order[:rank])
                if method == "raps":
                    s += lam * max(0, rank - k_reg)
            chosen.append(s <= q)
        out.append(chosen)
    return torch.tensor(out)


@pytest.mark.parametrize("method", METHODS)
def test_sets_and_threshold_match_a_slow_reference(pool, method):
    z, y = pool
    cp = ConformalClassifier(method=method, alpha=0.2, lam=0.05, k_reg=2).fit(z[:300], y[:300])
    scores = []
    for row, label in zip(torch.softmax(z[:300], 1).tolist(), y[:300].tolist(), strict=True):
        order = sorted(range(len(row)), key=lambda k: (-row[k], k))
        rank = order.index(label) + 1
        if method == "lac":
            scores.append(1 - row[label])
        else:
            s = math.fsum(row[j] for j in order[:rank])
            scores.append(s + (0.05 * max(0, rank - 2) if method == "raps" else 0.0))
    k = math.ceil(301 * 0.8)
    assert cp.quantile_ == pytest.approx(sorted(scores)[k - 1], abs=1e-12)
    got = cp.predict_sets(z[300:400])
    assert got.dtype == torch.bool and got.shape == (100, 10)
    assert torch.equal(got, slow_sets(z[300:400], cp.quantile_, method, 0.05, 2))


def test_conformal_rank_is_exact():
    assert conformal_rank(99, 0.1) == 90  # float arithmetic gives ceil(90.00000000000001) = 91
    assert conformal_rank(9, 0.1) == 9
    assert conformal_rank(500, 0.05) == math.ceil(501 * 0.95)


def test_too_few_calibration_samples_give_full_sets_with_a_warning():
    z = torch.randn(8, 3, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    with pytest.warns(RuntimeWarning, match="too few for alpha=0.1.*At least 9 samples"):
        cp = ConformalClassifier(alpha=0.1).fit(z, y)
    assert cp.quantile_ == math.inf and cp.predict_sets(z).all()
    back = calibrator_from_dict(json.loads(json.dumps(cp.to_dict())))
    assert back.quantile_ == math.inf


def test_numpy_in_numpy_out_round_trip_and_bad_input(pool):
    z, y = pool
    cp = ConformalClassifier(method="raps").fit(z[:500].numpy(), y[:500].numpy())
    sets = cp.predict_sets(z[500:600].numpy())
    assert isinstance(sets, np.ndarray) and sets.dtype == np.bool_
    back = calibrator_from_dict(json.loads(json.dumps(cp.to_dict())))
    assert np.array_equal(back.predict_sets(z[500:600].numpy()), sets)
    with pytest.raises(ValueError, match="10 classes"):
        cp.predict_sets(torch.randn(3, 4))
    for kwargs, match in (({"method": "naive"}, "`method` to be one of"),
                          ({"alpha": 0}, "`alpha` to be a number in \\(0, 1\\)"),
                          ({"alpha": 1.5}, "`alpha`"), ({"lam": -1}, "`lam`"),
                          ({"k_reg": 0}, "`k_reg`")):
        with pytest.raises(ValueError, match=match):
            ConformalClassifier(**kwargs)

"""Temperature scaling: recovery of a known temperature, exactness of the grid search against
the metrics, grid conventions (exact decimals, ties), serialisation and bad input."""

from __future__ import annotations

import json
import math
from decimal import Decimal

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from torchcal import metrics
from torchcal.errors import NotFittedError
from torchcal.posthoc import (
    METHODS,
    TemperatureScaling,
    calibrator_from_dict,
    default_grid,
    fit_temperatures,
    temperature_grid_scores,
)
from torchcal.posthoc import temperature as temperature_mod


def draw(t_star: float, n: int, c: int = 10, seed: int = 0, scale: float = 3.0):
    """Logits z and labels drawn from softmax(z / t_star): t_star is the true temperature."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g, dtype=torch.float64) * scale
    y = torch.multinomial(torch.softmax(z / t_star, dim=1), 1, generator=g).squeeze(1)
    return z.float(), y


@pytest.fixture(scope="module", params=[0.5, 1.0, 2.5], ids=lambda t: f"T*={t}")
def known(request):
    t_star = request.param
    zv, yv = draw(t_star, 10_000, seed=1)
    zt, yt = draw(t_star, 10_000, seed=2)
    temps = fit_temperatures(zv, yv)
    return t_star, zv, yv, zt, yt, temps


@pytest.fixture(scope="module")
def fitted(known):
    """One calibrator per method: "nll" fitted here, the grid ones restored from the shared
    ``fit_temperatures`` pass (their equality with separate fits is tested on smaller data)."""
    _, zv, yv, _, _, temps = known
    out = {"nll": TemperatureScaling().fit(zv, yv)}
    for m in METHODS[1:]:
        out[m] = TemperatureScaling.from_dict(
            {"type": "TemperatureScaling", "version": 1, "method": m, "grid": None,
             "n_bins": 15, "temperature": temps[m]})
    return out


@pytest.fixture(scope="module")
def scores(known):
    _, zv, yv, _, _, _ = known
    return temperature_grid_scores(zv, yv)


# ----------------------------------------------------------------------------- recovery


def test_nll_recovers_the_true_temperature(known, fitted):
    t_star, zv, yv, _, _, temps = known
    t = fitted["nll"].temperature_
    assert abs(t - t_star) <= 0.05 * t_star
    assert temps["nll"] == t
    # the grid NLL search lands on a neighbour of the continuous optimum
    assert abs(temps["grid_nll"] - t) <= 0.05 + 1e-12


def test_nll_optimum_is_a_stationary_point(known):
    _, zv, yv, _, _, temps = known
    z = zv.double()
    y = yv
    t = temps["nll"]

    def f(tt):
        return F.cross_entropy(z / tt, y).item()

    h = 1e-4 * t
    assert f(t) <= f(t - h) + 1e-12 and f(t) <= f(t + h) + 1e-12
    assert abs((f(t + h) - f(t - h)) / (2 * h)) < 1e-7


def test_nll_temperature_matches_scipy_bounded_minimisation(known):
    """Independent optimiser: scipy's bounded Brent search on the float64 NLL over log T."""
    from scipy.optimize import minimize_scalar

    _, zv, yv, _, _, temps = known
    z = zv.double()

    def f(u):
        return F.cross_entropy(z / math.exp(u), yv).item()

    res = minimize_scalar(f, bounds=(math.log(0.05), math.log(20)), method="bounded",
                          options={"xatol": 1e-9})
    assert res.success
    assert temps["nll"] == pytest.approx(math.exp(res.x), rel=1e-6)
    assert f(math.log(temps["nll"])) <= res.fun + 1e-12


def test_post_temperature_ece_is_lower_when_miscalibrated(known):
    t_star, zv, yv, zt, yt, temps = known
    if t_star == 1.0:
        pytest.skip("already calibrated")
    for split_z, split_y in ((zv, yv), (zt, yt)):
        pre = metrics.ece(logits=split_z, labels=split_y)
        for method in ("grid_ece", "nll"):
            post = metrics.ece(logits=split_z / temps[method], labels=split_y)
            assert post < 0.5 * pre, (method, float(pre), float(post))
        pre_a = metrics.adaptive_ece(logits=split_z, labels=split_y)
        post_a = metrics.adaptive_ece(logits=split_z / temps["grid_adaece"], labels=split_y)
        assert post_a < 0.5 * pre_a


def test_grid_methods_choose_the_minimum_of_the_metric(known, scores):
    _, zv, yv, _, _, temps = known
    grid = default_grid()
    for method, crit in (("grid_ece", "ece"), ("grid_adaece", "adaptive_ece"),
                         ("grid_nll", "nll")):
        s = scores[crit].tolist()
        i = grid.index(temps[method])
        assert s[i] == min(s)
        assert all(v > s[i] for v in s[:i])  # the smallest T among the minima


def test_accuracy_never_changes_under_temperature(known, fitted):
    _, zv, yv, zt, yt, temps = known
    pred = zt.argmax(dim=1)
    for ts in fitted.values():
        assert torch.equal(ts.predict_proba(zt).argmax(dim=1), pred)
        assert torch.equal(ts.transform(zt).argmax(dim=1), pred)


def test_fit_temperatures_returns_the_four_methods(known, fitted):
    _, _, _, _, _, temps = known
    assert list(temps) == ["grid_ece", "grid_adaece", "grid_nll", "nll"]
    assert fitted["nll"].temperature_ == temps["nll"]
    assert all(type(t) is float for t in temps.values())


def test_fit_temperatures_matches_separate_fits():
    z, y = draw(2.5, 3000, seed=19)
    temps = fit_temperatures(z, y, n_bins=10)
    for method in METHODS:
        assert TemperatureScaling(method=method, n_bins=10).fit(z, y).temperature_ == temps[method]


# ----------------------------------------------------------------------------- exactness


def _quantised(n, c, seed, dtype):
    """Logits on a coarse lattice: many tied confidences and values on bin edges."""
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(n, c, generator=g) * 2).round() / 2
    y = torch.randint(0, c, (n,), generator=g)
    return z.to(dtype), y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["smooth", "quantised"])
def test_grid_ece_equals_metrics_ece_bit_for_bit(dtype, kind):
    if kind == "smooth":
        z, y = draw(1.7, 1000, c=7, seed=3)
        z = z.to(dtype)
    else:
        z, y = _quantised(1000, 4, 4, dtype)
    grid = default_grid()
    s = temperature_grid_scores(z, y, criteria=("ece", "adaptive_ece"))
    assert s["ece"].dtype == torch.float64 and s["ece"].shape == (100,)
    out = torch.promote_types(dtype, torch.float32)
    for i in [*range(0, 100, 7), 10, 99]:  # a spread of T, in several chunks of the search
        t = grid[i]
        e = metrics.ece(logits=z / t, labels=y)
        a = metrics.adaptive_ece(logits=z / t, labels=y)
        assert torch.equal(s["ece"][i].to(out), e), (t, s["ece"][i].item(), e.item())
        assert torch.equal(s["adaptive_ece"][i].to(out), a), (t, s["adaptive_ece"][i].item())


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(2, 60), c=st.integers(2, 6), n_bins=st.integers(1, 20),
    grid=st.lists(st.floats(0.05, 20.0), min_size=1, max_size=6),
    seed=st.integers(0, 2**16), lattice=st.booleans(),
)
def test_grid_scores_equal_the_metrics_property(n, c, n_bins, grid, seed, lattice):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g) * 3
    if lattice:
        z = z.round()
    y = torch.randint(0, c, (n,), generator=g)
    s = temperature_grid_scores(z, y, grid=grid, n_bins=n_bins)
    for i, t in enumerate(grid):
        zt = z / t
        assert torch.equal(s["ece"][i].float(), metrics.ece(logits=zt, labels=y, n_bins=n_bins))
        assert torch.equal(s["adaptive_ece"][i].float(),
                           metrics.adaptive_ece(logits=zt, labels=y, n_bins=n_bins))
        assert s["nll"][i].item() == pytest.approx(
            F.cross_entropy(zt.double(), y).item(), rel=1e-5, abs=1e-6)


def test_grid_ece_equals_a_slow_float64_reference():
    """Independent of the metrics module: the ECE formula written out per T and per bin."""
    z, y = _quantised(600, 3, 5, torch.float64)
    grid = [0.3, 1.0, 2.2, 7.5]
    s = temperature_grid_scores(z, y, grid=grid, n_bins=10, criteria=("ece",))["ece"]
    for i, t in enumerate(grid):
        p = torch.softmax(z / t, dim=1)
        conf, pred = p.max(dim=1)
        total = 0.0
        for b in range(10):
            lo, hi = b / 10, (b + 1) / 10
            m = (conf > lo) & (conf <= hi) if b > 0 else (conf <= hi)
            if m.any():
                total += m.sum().item() * abs(
                    pred[m].eq(y[m]).double().mean().item() - conf[m].mean().item())
        assert s[i].item() == pytest.approx(total / len(y), abs=1e-12)


def test_grid_nll_matches_cross_entropy_even_where_softmax_underflows():
    z, y = draw(1.0, 800, c=5, seed=6)
    z[:5] = torch.tensor([60.0, 0.0, 0.0, 0.0, 0.0])  # wrong with a huge margin:
    y[:5] = 1  # p_y = exp(-600) underflows at T = 0.1 in float32
    grid = [0.1, 0.5, 1.0, 3.0]
    s = temperature_grid_scores(z, y, grid=grid, criteria=("nll",))["nll"]
    assert torch.isfinite(s).all()
    for i, t in enumerate(grid):
        ref = F.cross_entropy(z.double() / t, y).item()
        assert s[i].item() == pytest.approx(ref, rel=1e-6)
        assert s[i].item() == pytest.approx(metrics.nll(logits=z / t, labels=y).item(), rel=1e-5)


def test_chunking_over_temperatures_does_not_change_results(monkeypatch):
    z, y = draw(2.0, 300, c=6, seed=7)
    full = temperature_grid_scores(z, y)
    monkeypatch.setattr(temperature_mod, "_CHUNK_ELEMENTS", 300 * 6 * 3)  # 3 temperatures
    chunked = temperature_grid_scores(z, y)
    monkeypatch.setattr(temperature_mod, "_CHUNK_ELEMENTS", 1)  # one at a time
    single = temperature_grid_scores(z, y)
    for k in full:
        assert torch.equal(full[k], chunked[k]) and torch.equal(full[k], single[k])


def test_grid_search_is_vectorised_over_temperatures(monkeypatch):
    """All 100 temperatures go through one softmax and one binned sum per chunk, not a Python
    loop of per-temperature metric calls."""
    calls = {"softmax": [], "bins": []}
    real_softmax, real_bins = temperature_mod._softmax_into, temperature_mod._binned_ece_rows

    def softmax(x, out):
        calls["softmax"].append(x.shape[0])
        return real_softmax(x, out)

    def bins(idx, *args):
        calls["bins"].append(idx.shape[0])
        return real_bins(idx, *args)

    monkeypatch.setattr(temperature_mod, "_softmax_into", softmax)
    monkeypatch.setattr(temperature_mod, "_binned_ece_rows", bins)
    z, y = draw(2.0, 400, c=10, seed=20)
    TemperatureScaling(method="grid_ece").fit(z, y)
    assert calls == {"softmax": [100], "bins": [100]}
    calls["softmax"].clear(), calls["bins"].clear()
    monkeypatch.setattr(temperature_mod, "_CHUNK_ELEMENTS", 400 * 10 * 40)  # 40 per chunk
    TemperatureScaling(method="grid_adaece").fit(z, y)
    assert calls == {"softmax": [40, 40, 20], "bins": [40, 40, 20]}


def test_half_precision_logits_are_upcast():
    z, y = draw(2.0, 500, c=4, seed=8)
    zh = z.half()
    s_half = temperature_grid_scores(zh, y)
    s_float = temperature_grid_scores(zh.float(), y)
    for k in s_half:
        assert torch.equal(s_half[k], s_float[k])
    ts = TemperatureScaling(method="grid_ece").fit(zh, y)
    assert ts.transform(zh).dtype == torch.float16


# ----------------------------------------------------------------------------- grid conventions


def test_default_grid_is_exact_decimals():
    grid = default_grid()
    assert len(grid) == 100
    for k, t in enumerate(grid, start=1):
        assert t == float(Decimal(k) / Decimal(10))
        assert Decimal(repr(t)) == Decimal(k) / Decimal(10)
    assert grid[2] == 0.3 and grid[2] != 0.1 * 3  # 0.30000000000000004 is not on the grid
    assert grid[10] == 1.1 and repr(grid[10]) == "1.1"


def test_fitted_grid_temperature_is_the_exact_grid_entry():
    z, y = draw(1.1, 4000, seed=9)
    for method in ("grid_ece", "grid_adaece", "grid_nll"):
        t = TemperatureScaling(method=method).fit(z, y).temperature_
        assert type(t) is float
        assert t in default_grid()
        assert Decimal(repr(t)) * 10 == int(Decimal(repr(t)) * 10)  # one decimal, exactly


def test_ties_pick_the_smallest_temperature():
    # Scores constant over T: zero-logit rows (uniform at every T) and rows with a margin of
    # 1000 (confidence exactly 1.0 for every T <= 10, in float32).
    z = torch.zeros(40, 3)
    z[:20, 0] = 1000.0
    y = torch.zeros(40, dtype=torch.long)
    y[30:] = 2
    descending = sorted(default_grid(), reverse=True)
    for method in ("grid_ece", "grid_adaece", "grid_nll"):
        ts = TemperatureScaling(method=method, grid=descending).fit(z, y)
        assert len(set(ts.grid_scores_)) == 1  # a genuine tie over the whole grid
        assert ts.temperature_ == 0.1
    temps = fit_temperatures(z, y, grid=[5.0, 2.0, 3.0, 2.0])
    assert temps["grid_ece"] == temps["grid_adaece"] == temps["grid_nll"] == 2.0


def test_tie_rule_on_given_scores():
    scores = torch.tensor([0.3, 0.1, 0.2, 0.1, 0.1], dtype=torch.float64)
    temps = [0.5, 2.0, 1.0, 0.7, 4.0]
    assert temperature_mod._argmin_smallest(scores, temps, "ece") == 0.7


def test_custom_grid_and_order():
    z, y = draw(2.5, 3000, seed=10)
    grid = [4.0, 0.5, 2.5, 1.0]
    ts = TemperatureScaling(method="grid_nll", grid=grid).fit(z, y)
    assert ts.temperature_ == 2.5
    assert len(ts.grid_scores_) == 4 and ts.grid_scores_[2] == min(ts.grid_scores_)
    # the constructor stores the grid as given (scikit-learn's clone needs that); fit and
    # to_dict read it as floats
    np_grid = np.array([1, 2, 3])
    ts = TemperatureScaling(method="grid_nll", grid=np_grid)
    assert ts.grid is np_grid
    assert ts.fit(z, y).to_dict()["grid"] == [1.0, 2.0, 3.0]


# ----------------------------------------------------------------------------- contract, I/O


def test_fit_returns_self_and_transform_is_division():
    z, y = draw(2.0, 500, seed=11)
    ts = TemperatureScaling(method="grid_ece")
    assert ts.fit(z, y) is ts
    assert torch.equal(ts.transform(z), z / ts.temperature_)
    assert torch.equal(ts.predict_proba(z), torch.softmax(z / ts.temperature_, dim=1))
    assert torch.equal(ts.fit_transform(z, y), z / ts.temperature_)
    assert "grid_ece" in repr(ts)


def test_numpy_input_gives_numpy_output_and_keeps_dtype():
    z, y = draw(2.0, 500, seed=12)
    ts = TemperatureScaling().fit(z.numpy(), y.numpy())
    t = TemperatureScaling().fit(z, y).temperature_
    assert ts.temperature_ == t
    out = ts.transform(z.double().numpy())
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    np.testing.assert_array_equal(out, (z.double() / t).numpy())
    q = ts.predict_proba(z.numpy())
    assert isinstance(q, np.ndarray) and q.dtype == np.float32
    assert isinstance(ts.transform(z), torch.Tensor)  # torch in, torch out
    assert fit_temperatures(z.numpy(), y.numpy()) == fit_temperatures(z, y)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    z, y = draw(2.0, 2000, seed=13)
    cpu = fit_temperatures(z, y)
    gpu = fit_temperatures(z.cuda(), y.cuda())
    assert gpu["nll"] == pytest.approx(cpu["nll"], rel=1e-6)
    ts = TemperatureScaling().fit(z.cuda(), y.cuda())
    assert ts.transform(z.cuda()).device.type == "cuda"


def test_to_dict_round_trip_through_json():
    z, y = draw(2.5, 2000, seed=14)
    for method in METHODS:
        ts = TemperatureScaling(method=method, n_bins=10).fit(z, y)
        d = json.loads(json.dumps(ts.to_dict()))
        back = TemperatureScaling.from_dict(d)
        assert back.temperature_ == ts.temperature_
        assert (back.method, back.n_bins, back.grid) == (method, 10, None)
        assert torch.equal(back.predict_proba(z), ts.predict_proba(z))
        assert calibrator_from_dict(d).temperature_ == ts.temperature_
    ts = TemperatureScaling(method="grid_ece", grid=[0.5, 1.5]).fit(z, y)
    assert TemperatureScaling.from_dict(json.loads(json.dumps(ts.to_dict()))).grid == (0.5, 1.5)


def test_from_dict_rejects_bad_dicts():
    d = TemperatureScaling().fit(*draw(2.0, 200, seed=15)).to_dict()
    with pytest.raises(ValueError, match="type"):
        TemperatureScaling.from_dict({**d, "type": "VectorScaling"})
    with pytest.raises(ValueError, match="temperature"):
        TemperatureScaling.from_dict({k: v for k, v in d.items() if k != "temperature"})
    with pytest.raises(ValueError, match="positive"):
        TemperatureScaling.from_dict({**d, "temperature": -1.0})
    with pytest.raises(ValueError, match="finite"):
        TemperatureScaling.from_dict({**d, "temperature": float("nan")})
    with pytest.raises(ValueError, match="version"):
        TemperatureScaling.from_dict({**d, "version": 99})
    with pytest.raises(ValueError, match="type"):
        calibrator_from_dict({"type": "Nope"})


def test_unfitted_use_raises_not_fitted():
    ts = TemperatureScaling()
    z = torch.randn(4, 3)
    for call in (lambda: ts.transform(z), lambda: ts.predict_proba(z), ts.to_dict):
        with pytest.raises(NotFittedError, match="not fitted"):
            call()
    assert not ts.is_fitted


# ----------------------------------------------------------------------------- NLL optimiser


def test_nll_on_separable_data_warns_and_returns_the_lower_bound():
    z = torch.tensor([[3.0, 0.0], [0.0, 3.0], [2.0, 0.0]])
    y = torch.tensor([0, 1, 0])
    with pytest.warns(RuntimeWarning, match="Every validation prediction is correct"):
        t = TemperatureScaling().fit(z, y).temperature_
    assert t == temperature_mod.NLL_BOUNDS[0]


def test_nll_with_inverted_logits_warns_at_the_upper_bound():
    z = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([1, 0, 1, 1])  # 3 of 4 labels disagree with the logits
    with pytest.warns(RuntimeWarning, match="search bound T = 100"):
        t = TemperatureScaling().fit(z, y).temperature_
    assert t == temperature_mod.NLL_BOUNDS[1]


def test_nll_failure_reports_the_optimisers_reason(monkeypatch):
    monkeypatch.setattr(temperature_mod, "_NLL_MAX_ITER", 1)
    with pytest.raises(RuntimeError, match=r"did not converge in 1 iterations \(T in \["):
        TemperatureScaling().fit(*draw(2.0, 100, seed=16))


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("logits", "labels", "exc", "match"),
    [
        (torch.randn(5, 3), torch.zeros(4, dtype=torch.long), ValueError, "labels.*5 entries"),
        (torch.randn(5, 3), torch.tensor([0, 1, 2, 3, 0]), ValueError, r"labels.*\[0, 2\]"),
        (torch.randn(5, 3), torch.tensor([0, 1, 2, -1, 0]), ValueError, "labels"),
        (torch.tensor([[0.0, float("nan")], [1.0, 0.0]]), torch.tensor([0, 1]), ValueError,
         "logits.*finite"),
        (torch.tensor([[0.0, float("inf")], [1.0, 0.0]]), torch.tensor([0, 1]), ValueError,
         "logits.*finite"),
        (torch.randn(1, 3), torch.tensor([0]), ValueError, "at least 2 validation samples"),
        (torch.randn(0, 3), torch.zeros(0, dtype=torch.long), ValueError, "non-empty"),
        (torch.randn(5), torch.zeros(5, dtype=torch.long), ValueError, "2-D"),
        (torch.randn(5, 1), torch.zeros(5, dtype=torch.long), ValueError, "at least 2 classes"),
        (torch.ones(5, 3, dtype=torch.long), torch.zeros(5, dtype=torch.long), TypeError,
         "floating"),
        (torch.randn(5, 3), torch.zeros(5), TypeError, "labels.*integer"),
        (torch.randn(5, 3), torch.zeros(5, 1, dtype=torch.long), ValueError, "labels.*1-D"),
        ("abc", torch.zeros(5, dtype=torch.long), TypeError, "logits"),
    ],
)
@pytest.mark.parametrize("method", METHODS)
def test_bad_fit_input(logits, labels, exc, match, method):
    with pytest.raises(exc, match=match):
        TemperatureScaling(method=method).fit(logits, labels)
    with pytest.raises(exc, match=match):
        fit_temperatures(logits, labels)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"grid": []}, ValueError, "grid.*empty"),
        ({"grid": [1.0, 0.0]}, ValueError, r"grid.*positive.*0\.0 at index 1"),
        ({"grid": [-0.5]}, ValueError, "grid.*positive"),
        ({"grid": [1.0, float("nan")]}, ValueError, "grid.*positive finite"),
        ({"grid": [1.0, float("inf")]}, ValueError, "grid.*positive finite"),
        ({"grid": 2.0}, TypeError, "grid"),
        ({"grid": [[1.0, 2.0]]}, TypeError, "grid"),
        ({"grid": ["a"]}, TypeError, "grid"),
        ({"method": "ece"}, ValueError, "method.*grid_ece"),
        ({"n_bins": 0}, ValueError, "n_bins.*positive integer"),
        ({"n_bins": 2.5}, ValueError, "n_bins"),
    ],
)
def test_bad_settings(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        TemperatureScaling(**kwargs)


def test_bad_grid_and_criteria_in_functions():
    z, y = draw(1.0, 50, seed=17)
    with pytest.raises(ValueError, match="grid.*empty"):
        fit_temperatures(z, y, grid=[])
    with pytest.raises(ValueError, match="grid.*positive"):
        temperature_grid_scores(z, y, grid=[0.5, -1.0])
    with pytest.raises(ValueError, match="criteria"):
        temperature_grid_scores(z, y, criteria=("mce",))
    with pytest.raises(ValueError, match="n_bins"):
        fit_temperatures(z, y, n_bins=0)


def test_overflowing_scaled_logits_are_reported():
    z = torch.tensor([[1e38, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match=r"logits / T.*overflows"):
        TemperatureScaling(method="grid_ece").fit(z, torch.tensor([0, 1]))


def test_transform_rejects_bad_logits():
    ts = TemperatureScaling().fit(*draw(2.0, 200, seed=18))
    with pytest.raises(ValueError, match="finite"):
        ts.transform(torch.tensor([[0.0, math.nan]]))
    with pytest.raises(ValueError, match="2-D"):
        ts.predict_proba(torch.zeros(3))

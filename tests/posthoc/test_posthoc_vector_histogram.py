"""Vector scaling and top-label histogram binning: fits against independent computations,
the estimator contract, serialisation and bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchcal import metrics
from torchcal.errors import NotFittedError
from torchcal.posthoc import (
    HistogramBinning,
    TemperatureScaling,
    VectorScaling,
    calibrator_from_dict,
)


def draw_biased(n: int, c: int = 6, seed: int = 0, t_star: float = 2.0):
    """Labels drawn from softmax(z / t_star + bias): per-class miscalibration that vector
    scaling can undo and temperature scaling cannot."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g, dtype=torch.float64) * 3
    bias = torch.linspace(-1.0, 1.0, c, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / t_star + bias, dim=1), 1, generator=g).squeeze(1)
    return z.float(), y


@pytest.fixture(scope="module")
def biased():
    z, y = draw_biased(4000, seed=1)
    return z, y, VectorScaling().fit(z, y), TemperatureScaling().fit(z, y)


# ----------------------------------------------------------------------------- vector scaling


def test_vector_scaling_reduces_nll_at_least_as_much_as_temperature(biased):
    z, y, vs, ts = biased
    nll_pre = F.cross_entropy(z.double(), y).item()
    nll_ts = F.cross_entropy(ts.transform(z).double(), y).item()
    nll_vs = F.cross_entropy(vs.transform(z).double(), y).item()
    assert nll_vs <= nll_ts + 1e-9 < nll_pre
    assert nll_vs < nll_ts - 1e-3  # the class bias is something only vector scaling can fix


@pytest.mark.parametrize("t_star", [0.5, 2.5])
def test_vector_scaling_never_worse_than_temperature_without_bias(t_star):
    g = torch.Generator().manual_seed(3)
    z = torch.randn(2000, 5, generator=g) * 2
    y = torch.multinomial(torch.softmax(z / t_star, dim=1), 1, generator=g).squeeze(1)
    vs = VectorScaling().fit(z, y)
    ts = TemperatureScaling().fit(z, y)
    assert F.cross_entropy(vs.transform(z).double(), y) <= F.cross_entropy(
        ts.transform(z).double(), y) + 1e-9
    # with no class bias the fitted scales stay close to 1/T and the biases close to 0
    assert torch.allclose(vs.weight_, torch.full((5,), 1 / ts.temperature_, dtype=torch.float64),
                          atol=0.1)


def test_vector_scaling_is_a_stationary_point_of_the_nll(biased):
    z, y, vs, _ = biased
    w = vs.weight_.clone().requires_grad_(True)
    b = vs.bias_.clone().requires_grad_(True)
    loss = F.cross_entropy(z.double() * w + b, y)
    gw, gb = torch.autograd.grad(loss, (w, b))
    assert gw.abs().max() < 1e-6 and gb.abs().max() < 1e-6


def test_vector_scaling_transform_formula_and_dtypes(biased):
    z, y, vs, _ = biased
    ref = z.double() * vs.weight_ + vs.bias_
    assert torch.equal(vs.transform(z.double()), ref)
    out = vs.transform(z)
    assert out.dtype == torch.float32
    assert torch.allclose(out.double(), ref, atol=1e-5)
    p = vs.predict_proba(z)
    assert torch.allclose(p.sum(1), torch.ones(len(z)), atol=1e-6)
    assert vs.fit(z, y) is vs and vs.n_classes_ == 6


def test_vector_scaling_round_trip_through_json(biased):
    z, _, vs, _ = biased
    d = json.loads(json.dumps(vs.to_dict()))
    back = VectorScaling.from_dict(d)
    assert torch.equal(back.weight_, vs.weight_) and torch.equal(back.bias_, vs.bias_)
    assert torch.equal(back.transform(z), vs.transform(z))
    assert isinstance(calibrator_from_dict(d), VectorScaling)
    with pytest.raises(ValueError, match="bias"):
        VectorScaling.from_dict({**d, "bias": d["bias"][:-1]})
    with pytest.raises(ValueError, match="weight"):
        VectorScaling.from_dict({**d, "weight": [1.0, "x"] + d["weight"][2:]})


def test_vector_scaling_rejects_a_different_class_count(biased):
    _, _, vs, _ = biased
    with pytest.raises(ValueError, match="6 classes"):
        vs.transform(torch.randn(3, 4))


def test_vector_scaling_out_of_budget_raises_with_the_reason():
    z, y = draw_biased(500, c=4, seed=9)
    with pytest.raises(RuntimeError, match=r"L-BFGS used its budget \(\d+ iterations.*"
                                           r"max_iter=3\).*gradient still .*increase `max_iter`"):
        VectorScaling(max_iter=3).fit(z, y)
    VectorScaling().fit(z, y)  # the default budget converges


def test_vector_scaling_warns_about_classes_absent_from_validation():
    z, y = draw_biased(1500, c=5, seed=10)
    keep = (y != 0) & (y != 3)
    with pytest.warns(RuntimeWarning, match=r"2 class\(es\) never occur.*\(0, 3\)"):
        vs = VectorScaling().fit(z[keep], y[keep])
    # the absent classes' biases run off towards -inf: the warning is about something real
    assert vs.bias_[0] < vs.bias_[1:3].min() - 5 and vs.bias_[3] < vs.bias_[4] - 5
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        VectorScaling().fit(z, y)  # every class present: no warning


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cls", [VectorScaling, HistogramBinning])
def test_cuda_fit_and_predict_match_cpu(cls):
    z, y = draw_biased(2000, c=4, seed=11)
    cpu = cls().fit(z, y)
    gpu = cls().fit(z.cuda(), y.cuda())
    q = gpu.predict_proba(z.cuda())
    assert q.device.type == "cuda"
    assert torch.allclose(q.cpu(), cpu.predict_proba(z), atol=1e-4)
    assert cpu.predict_proba(z.cuda()).device.type == "cuda"  # fitted on CPU, used on CUDA


# ----------------------------------------------------------------------------- histogram binning


def _slow_hb_reference(z, y, n_bins):
    """Equal-mass top-label histogram binning written from the definition, one bin at a time."""
    p = torch.softmax(z, dim=1)
    conf, pred = p.max(dim=1)
    s = torch.sort(conf).values
    n = len(conf)
    edges = [s[max(k * n // n_bins - 1, 0)].item() for k in range(1, n_bins)]
    bins = torch.tensor([sum(e < c for e in edges) for c in conf.tolist()])
    values = []
    for b in range(n_bins):
        m = bins == b
        values.append(pred[m].eq(y[m]).double().mean().item() if m.any() else math.nan)
    return edges, values


def test_histogram_binning_matches_a_slow_reference():
    z, y = draw_biased(600, c=4, seed=4)
    hb = HistogramBinning(n_bins=8).fit(z, y)
    edges, values = _slow_hb_reference(z, y, 8)
    assert hb.edges_.tolist() == pytest.approx(edges, abs=0)
    assert hb.bin_values_.tolist() == pytest.approx(values, abs=1e-15)
    # prediction on the validation set: the top class gets its bin's accuracy
    q = hb.predict_proba(z)
    conf, pred = torch.softmax(z, dim=1).max(dim=1)
    bins = torch.tensor([sum(e < c for e in edges) for c in conf.tolist()])
    top = q.gather(1, pred[:, None]).squeeze(1).double()
    assert torch.allclose(top, torch.tensor(values, dtype=torch.float64)[bins], atol=1e-7)
    assert torch.allclose(q.sum(1), torch.ones(len(z)), atol=1e-6)
    # the other classes keep their relative sizes where that leaves the top class the largest
    # (issue 39: otherwise they are evened out just enough; the arg-max never changes)
    p = torch.softmax(z, dim=1)
    mask = torch.ones_like(p, dtype=torch.bool).scatter(1, pred[:, None], False)
    ratio = (q[mask] / p[mask]).view(len(z), -1)
    prop = (1 - top[:, None]) * p[mask].view(len(z), -1).double() / (1 - conf[:, None].double())
    free = (prop.max(dim=1).values < top).float() > 0
    assert free.float().mean() > 0.5  # the case is exercised
    assert torch.allclose(ratio[free], ratio[free][:, :1].expand_as(ratio[free]), rtol=1e-4)
    assert torch.equal(q.argmax(dim=1), pred)


def test_histogram_binning_reduces_top_label_ece():
    z, y = draw_biased(4000, c=5, seed=5, t_star=2.5)
    zt, yt = draw_biased(4000, c=5, seed=6, t_star=2.5)
    for binning in ("equal_mass", "equal_width"):
        hb = HistogramBinning(n_bins=10, binning=binning).fit(z, y)
        pre = metrics.ece(logits=zt, labels=yt)
        post = metrics.ece(probs=hb.predict_proba(zt), labels=yt)
        assert post < 0.5 * pre, (binning, float(pre), float(post))


def test_histogram_binning_equal_width_edges_and_empty_bins():
    z = torch.tensor([[3.0, 0.0], [0.0, 3.0], [0.1, 0.0], [4.0, 0.0]])
    y = torch.tensor([0, 0, 1, 0])
    hb = HistogramBinning(n_bins=4, binning="equal_width").fit(z, y)
    assert hb.edges_.tolist() == [0.25, 0.5, 0.75]
    # confidences 0.953 (right), 0.953 (wrong), 0.525 (wrong), 0.982 (right): bins 3, 3, 2, 3;
    # bins (0, .25] and (.25, .5] are empty
    v = hb.bin_values_.tolist()
    assert math.isnan(v[0]) and math.isnan(v[1]) and v[2] == 0.0 and v[3] == 2 / 3
    # a confidence in an empty bin is left unchanged
    zq = torch.tensor([[0.0, 0.0], [0.2, 0.0]])  # 0.5 -> bin 1 (empty); 0.55 -> bin 2
    q = hb.predict_proba(zq)
    assert torch.allclose(q[0], torch.tensor([0.5, 0.5]), atol=1e-5)
    # bin 2's accuracy 0 cannot be a top-1 probability: raised to 1/2 (+ a margin), the
    # arg-max kept (before issue 39: [0, 1], the prediction flipped)
    assert torch.allclose(q[1], torch.tensor([0.5, 0.5]), atol=1e-5)
    assert q.argmax(dim=1).tolist() == [0, 0]
    d = json.loads(json.dumps(hb.to_dict()))
    assert d["values"][0] is None
    back = HistogramBinning.from_dict(d)
    assert torch.equal(back.predict_proba(z), hb.predict_proba(z))


def test_histogram_binning_spreads_mass_when_the_others_are_zero():
    z = torch.tensor([[200.0, 0.0, 0.0], [0.0, 200.0, 0.0], [200.0, 0.0, 0.0],
                      [0.0, 0.0, 200.0]])
    y = torch.tensor([0, 0, 0, 2])
    hb = HistogramBinning(n_bins=1).fit(z, y)  # one bin, accuracy 3/4
    q = hb.predict_proba(z)
    expected = torch.tensor([[3 / 4, 1 / 8, 1 / 8], [1 / 8, 3 / 4, 1 / 8], [3 / 4, 1 / 8, 1 / 8],
                             [1 / 8, 1 / 8, 3 / 4]])
    assert torch.allclose(q, expected)
    assert torch.allclose(torch.softmax(hb.transform(z), dim=1), q)


def test_histogram_binning_transform_is_finite_log_probability():
    z = torch.tensor([[3.0, 0.0], [0.0, 3.0]])
    hb = HistogramBinning(n_bins=1).fit(z, torch.tensor([1, 0]))  # accuracy 0
    out = hb.transform(z)
    assert torch.isfinite(out).all()
    assert torch.allclose(torch.softmax(out, dim=1), hb.predict_proba(z))


def test_histogram_binning_round_trip_and_bad_dicts():
    z, y = draw_biased(500, c=3, seed=7)
    hb = HistogramBinning(n_bins=5).fit(z, y)
    d = json.loads(json.dumps(hb.to_dict()))
    back = calibrator_from_dict(d)
    assert isinstance(back, HistogramBinning)
    assert torch.equal(back.predict_proba(z), hb.predict_proba(z))
    with pytest.raises(ValueError, match="edges.*4 entries"):
        HistogramBinning.from_dict({**d, "edges": d["edges"][:2]})
    with pytest.raises(ValueError, match="sorted"):
        HistogramBinning.from_dict({**d, "edges": d["edges"][::-1]})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        HistogramBinning.from_dict({**d, "values": [2.0] * 5})
    with pytest.raises(ValueError, match="binning"):
        HistogramBinning.from_dict({**d, "binning": "quantile"})


def test_histogram_binning_numpy_input_and_dtype():
    z, y = draw_biased(300, c=3, seed=8)
    hb = HistogramBinning(n_bins=4).fit(z.numpy(), y.numpy())
    q = hb.predict_proba(z.numpy())
    assert isinstance(q, np.ndarray) and q.dtype == np.float32  # NumPy in, NumPy out
    q = torch.from_numpy(q)
    assert torch.equal(q, HistogramBinning(n_bins=4).fit(z, y).predict_proba(z))
    q64 = torch.from_numpy(hb.predict_proba(z.double().numpy()))
    assert q64.dtype == torch.float64
    # float64 confidences may cross a (float32) edge: only samples on an edge can move bins
    on_edge = (q64.float() - q).abs().max(dim=1).values > 1e-6
    assert on_edge.sum() <= 4


# ----------------------------------------------------------------------------- shared contract


CALIBRATORS = [VectorScaling, HistogramBinning, TemperatureScaling]


@pytest.mark.parametrize("cls", CALIBRATORS)
def test_estimator_contract(cls):
    """Constructor stores settings only; fit returns self and sets attributes ending in `_`;
    transform / predict_proba / fit_transform agree; NumPy and torch inputs give the same."""
    z, y = draw_biased(800, c=4, seed=12)
    cal = cls()
    before = set(vars(cal))
    assert not any(k.endswith("_") for k in before) and not cal.is_fitted
    assert cal.fit(z, y) is cal and cal.is_fitted
    learned = set(vars(cal)) - before
    assert learned and all(k.endswith("_") for k in learned)
    zt = draw_biased(300, c=4, seed=13)[0]
    q = cal.predict_proba(zt)
    assert q.shape == (300, 4) and q.dtype == torch.float32
    assert torch.allclose(q.sum(1), torch.ones(300), atol=1e-6)
    assert torch.allclose(torch.softmax(cal.transform(zt), dim=1), q, atol=1e-6)
    assert torch.equal(cls().fit_transform(z, y), cal.transform(z))
    from_np = cls().fit(z.numpy(), y.numpy())
    assert np.array_equal(from_np.predict_proba(zt.numpy()), q.numpy())
    assert repr(cal).startswith(f"{cls.__name__}(")


@pytest.mark.parametrize("cls", CALIBRATORS)
def test_unfitted_calibrators_raise(cls):
    cal = cls()
    z = torch.randn(4, 3)
    for call in (lambda: cal.transform(z), lambda: cal.predict_proba(z), cal.to_dict):
        with pytest.raises(NotFittedError, match=f"{cls.__name__}.*not fitted"):
            call()


@pytest.mark.parametrize("cls", CALIBRATORS)
@pytest.mark.parametrize(
    ("logits", "labels", "match"),
    [
        (torch.randn(5, 3), torch.zeros(4, dtype=torch.long), "labels.*5 entries"),
        (torch.randn(5, 3), torch.tensor([0, 1, 2, 3, 0]), "labels"),
        (torch.tensor([[0.0, math.nan], [1.0, 0.0]]), torch.tensor([0, 1]), "finite"),
        (torch.tensor([[0.0, -math.inf], [1.0, 0.0]]), torch.tensor([0, 1]), "finite"),
        (torch.randn(1, 3), torch.tensor([0]), "at least 2 validation samples"),
    ],
)
def test_bad_fit_input(cls, logits, labels, match):
    with pytest.raises(ValueError, match=match):
        cls().fit(logits, labels)


@pytest.mark.parametrize(
    ("cls", "kwargs", "match"),
    [
        (VectorScaling, {"max_iter": 0}, "max_iter"),
        (HistogramBinning, {"n_bins": 0}, "n_bins"),
        (HistogramBinning, {"binning": "quantile"}, "binning"),
    ],
)
def test_bad_settings(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


@pytest.mark.parametrize("cls", CALIBRATORS)
def test_from_dict_checks_the_type(cls):
    with pytest.raises(ValueError, match="type"):
        cls.from_dict({"type": "Something", "version": 1})
    with pytest.raises(TypeError, match="dict"):
        cls.from_dict([1, 2])

"""The regression calibrators' contract: dense and (N, T) layouts with mask / ignore_value equal
the fit on the kept elements, integer sample weights equal repeated rows, scikit-learn's clone /
get_params / set_params, the JSON round trip, NumPy in -> NumPy out, and one clear line for
bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from torchcal.errors import NotFittedError
from torchcal.regression import (
    Gaussian,
    IsotonicRecalibration,
    QuantileRecalibration,
    Quantiles,
    SigmaScaling,
)

LEVELS = [0.1, 0.5, 0.9]


def dense(shape, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(shape, generator=g, dtype=torch.float64)
    sd = torch.exp(0.3 * torch.randn(shape, generator=g, dtype=torch.float64))
    y = mu + sd * torch.randn(shape, generator=g, dtype=torch.float64)
    return Gaussian(mu.to(dtype), (0.25 * sd ** 2).to(dtype)), y.to(dtype)


def fitted_state(cal):
    if isinstance(cal, SigmaScaling):
        return [torch.tensor(cal.scale_)]
    if isinstance(cal, IsotonicRecalibration):
        return [cal.knots_x_, cal.knots_y_]
    return [cal.shifts_]


def assert_same_fit(a, b):
    for x, y in zip(fitted_state(a), fitted_state(b), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def to_input(cal, pred):
    """QuantileRecalibration is given Quantiles (the others a Gaussian)."""
    return pred.quantiles(LEVELS) if isinstance(cal, QuantileRecalibration) else pred


def select(pred, keep):
    return Gaussian(pred.mean[keep], pred.var[keep])


CALIBRATORS = [SigmaScaling, IsotonicRecalibration, QuantileRecalibration]


@pytest.mark.parametrize("cls", CALIBRATORS)
def test_dense_mask_equals_the_flattened_kept_elements(cls):
    pred, y = dense((6, 9, 11), 0)
    mask = torch.rand((6, 9, 11), generator=torch.Generator().manual_seed(1)) > 0.3
    a = cls().fit(to_input(cls(), pred), y, mask=mask)
    b = cls().fit(to_input(cls(), select(pred, mask)), y[mask])
    assert_same_fit(a, b)
    # ignore_value: the sentinel's elements dropped, the same fit
    y0 = torch.where(mask, y, torch.zeros_like(y))
    assert_same_fit(cls().fit(to_input(cls(), pred), y0, ignore_value=0.0), b)
    out = a.transform(to_input(cls(), pred))
    expected = (6, 9, 11) if cls is SigmaScaling else (6, 9, 11, len(
        LEVELS if cls is QuantileRecalibration else a._levels()))
    assert tuple((out.var if cls is SigmaScaling else out.values).shape) == expected


@pytest.mark.parametrize("cls", CALIBRATORS)
def test_sequence_layout_and_float32_keep_dtype(cls):
    pred, y = dense((40, 25), 2, dtype=torch.float32)  # (N, T)
    cal = cls().fit(to_input(cls(), pred), y, mask=torch.arange(25).expand(40, -1) < 20)
    out = cal.transform(to_input(cls(), pred))
    t = out.var if cls is SigmaScaling else out.values
    assert t.dtype == torch.float32 and t.shape[:2] == (40, 25)


@pytest.mark.parametrize("cls", CALIBRATORS)
def test_integer_sample_weight_equals_repeated_rows(cls):
    pred, y = dense((300,), 3)
    k = torch.randint(0, 4, (300,), generator=torch.Generator().manual_seed(4))
    a = cls().fit(to_input(cls(), pred), y, sample_weight=k.double().numpy())
    rep = torch.repeat_interleave(torch.arange(300), k)
    b = cls().fit(to_input(cls(), select(pred, rep)), y[rep])
    assert_same_fit(a, b)
    if cls is not SigmaScaling:
        assert a.pinball_after_ == pytest.approx(b.pinball_after_, rel=1e-12)


@pytest.mark.parametrize("cls", CALIBRATORS)
def test_clone_get_params_set_params(cls):
    from sklearn.base import clone

    pred, y = dense((200,), 5)
    kwargs = {} if cls is SigmaScaling else {"levels": LEVELS}
    cal = cls(**kwargs).fit(pred, y)
    assert cal.get_params() == kwargs
    c = clone(cal)
    assert type(c) is cls and c.get_params() == kwargs and not c.is_fitted
    with pytest.raises(NotFittedError, match="not fitted"):
        c.transform(pred)
    assert_same_fit(c.fit(pred, y), cal)
    if cls is not SigmaScaling:
        cal.set_params(levels=[0.2, 0.8])  # a changed setting drops the fitted state
        assert not cal.is_fitted and cal.get_params() == {"levels": [0.2, 0.8]}
        with pytest.raises(ValueError, match="`levels`"):
            cal.set_params(levels=[0.8, 0.2])


@pytest.mark.parametrize("cls", CALIBRATORS)
def test_to_dict_from_dict_json_round_trip(cls):
    pred, y = dense((300,), 6)
    cal = cls().fit(to_input(cls(), pred), y)
    d = json.loads(json.dumps(cal.to_dict(), allow_nan=False))
    back = cls.from_dict(d)
    assert_same_fit(back, cal)
    test, _ = dense((50,), 7)
    a, b = cal.transform(to_input(cls(), test)), back.transform(to_input(cls(), test))
    assert torch.equal(a.var, b.var) if cls is SigmaScaling else torch.equal(a.values, b.values)
    with pytest.raises(ValueError, match=r"d\['type'\]"):
        cls.from_dict({**d, "type": "Other"})


def test_infinite_shift_round_trips_as_none():
    q = Quantiles(torch.tensor([[0.0, 1.0]] * 5), [0.5, 0.9])
    with pytest.warns(Warning):
        qr = QuantileRecalibration().fit(q, torch.arange(5.0))
    d = json.loads(json.dumps(qr.to_dict(), allow_nan=False))
    assert d["shifts"] == [2.0, None]
    assert torch.equal(QuantileRecalibration.from_dict(d).shifts_, qr.shifts_)


def test_numpy_in_numpy_out():
    g = torch.Generator().manual_seed(8)
    mu, sd = np.zeros(100), np.ones(100)
    y = torch.randn(100, generator=g, dtype=torch.float64).numpy() * 2
    pred = Gaussian(mu, std=sd)
    ss = SigmaScaling().fit(pred, y)
    out = ss.transform(pred)
    assert isinstance(out._ref, np.ndarray) and out.var.dtype == torch.float64
    iso = IsotonicRecalibration().fit(pred, y)
    assert isinstance(iso.cdf(pred, y), np.ndarray)
    assert isinstance(iso.quantiles(pred)._ref, np.ndarray)
    qp = Quantiles(np.stack([mu - 1, mu + 1], -1), [0.2, 0.8])
    assert isinstance(QuantileRecalibration().fit(qp, y).transform(qp)._ref, np.ndarray)


def one_line(exc_info, *words):
    msg = str(exc_info.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_bad_input_gets_one_clear_line():
    pred, y = dense((20,), 9)
    q = pred.quantiles(LEVELS)
    cases = [
        (lambda: SigmaScaling().fit(Gaussian(pred.mean, torch.zeros(20)), y), ValueError,
         ("`var` > 0",)),
        (lambda: SigmaScaling().fit(q, y), TypeError, ("`pred`", "Quantiles")),
        (lambda: SigmaScaling().fit(pred, y[:10]), ValueError, ("`target`", "(20,)")),
        (lambda: SigmaScaling().fit(pred, torch.where(y > 0, np.nan, y)), ValueError,
         ("`target`", "NaN")),
        (lambda: SigmaScaling().fit(pred, y, sample_weight=-torch.ones(20)), ValueError,
         ("`sample_weight`", ">= 0")),
        (lambda: SigmaScaling().fit(pred, y, sample_weight=torch.ones(3)), ValueError,
         ("`sample_weight`", "shape")),
        (lambda: SigmaScaling().fit(pred, y, sample_weight=torch.zeros(20)), ValueError,
         ("`sample_weight`", "zero")),
        (lambda: SigmaScaling().fit(Gaussian(y, torch.ones(20)), y), ValueError, ("residual",)),
        (lambda: IsotonicRecalibration(levels=[0.5, 1.5]), ValueError, ("`levels`", "(0, 1)")),
        (lambda: IsotonicRecalibration(levels="a"), TypeError, ("`levels`",)),
        (lambda: QuantileRecalibration().fit(pred, y), ValueError, ("`levels` setting",)),
        (lambda: QuantileRecalibration(levels=[0.2, 0.8]).fit(q, y), ValueError,
         ("levels",)),
        (lambda: QuantileRecalibration().fit(q, y).transform(pred.quantiles([0.2, 0.8])),
         ValueError, ("fitted levels",)),
        (lambda: QuantileRecalibration().fit(y, y), TypeError, ("`pred`", "Tensor")),
        (lambda: SigmaScaling().transform(pred), NotFittedError, ("not fitted",)),
        (lambda: SigmaScaling.from_dict({"type": "SigmaScaling", "version": 1, "scale": -1}),
         ValueError, ("d['scale']",)),
        (lambda: QuantileRecalibration.from_dict({
            "type": "QuantileRecalibration", "version": 1, "levels": None,
            "fitted_levels": [0.1, 0.9], "shifts": [1.0]}), ValueError, ("d['shifts']",)),
    ]
    for fn, exc, words in cases:
        with pytest.raises(exc) as info:
            fn()
        one_line(info, *words)

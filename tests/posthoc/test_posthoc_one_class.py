"""Fitting any calibrator on labels of one class is an error (issue 24, 6): they used to
predict probability 1 for that class (Dirichlet and matrix scaling only warned about a
temperature bound, isotonic said nothing)."""

from __future__ import annotations

import pytest
import torch
from test_posthoc_contract import ALL as CALIBRATORS

from torchcal.posthoc import ConformalClassifier, fit_temperatures


def data(c):
    g = torch.Generator().manual_seed(0)
    return torch.randn(50, c, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("cls", CALIBRATORS)
@pytest.mark.parametrize("label", [0, 1])
def test_one_class_labels_raise(cls, label):
    z = data(2)
    with pytest.raises(ValueError, match=r"`labels` of at least 2 different classes.*all "
                                         rf"equal to {label}"):
        cls().fit(z, torch.full((50,), label))


def test_one_class_labels_raise_in_fit_temperatures_too():
    with pytest.raises(ValueError, match="at least 2 different classes"):
        fit_temperatures(data(3), torch.zeros(50, dtype=torch.int64))


@pytest.mark.parametrize("cls", CALIBRATORS)
def test_two_classes_are_enough(cls):
    y = torch.zeros(50, dtype=torch.int64)
    y[:20] = 1
    cls().fit(data(2), y)


def test_conformal_prediction_accepts_one_class():
    # coverage is a statement about the calibration scores, whatever their classes
    ConformalClassifier().fit(data(3), torch.zeros(50, dtype=torch.int64))

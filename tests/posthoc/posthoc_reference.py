"""Data and reference computations shared by the post-hoc tests (and bench_posthoc.py)."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.calibration import CalibratedClassifierCV
from sklearn.frozen import FrozenEstimator


def draw(n, c, seed, t_star=2.0, scale=3.0):
    """float64 logits z and labels from softmax(z / t_star + bias): miscalibrated in
    temperature and per class."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g, dtype=torch.float64) * scale
    bias = torch.linspace(-1.0, 1.0, c, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / t_star + bias, dim=1), 1, generator=g).squeeze(1)
    return z, y


class _Probabilities(ClassifierMixin, BaseEstimator):
    """A 'classifier' whose features are its own predicted probabilities."""

    def fit(self, x, y):
        self.classes_ = np.unique(y)
        return self

    def predict_proba(self, x):
        return x

    def predict(self, x):
        return self.classes_[np.argmax(x, axis=1)]


def sklearn_isotonic(p_fit, y_fit, p_test):
    """scikit-learn's CalibratedClassifierCV(method="isotonic") on fixed probabilities."""
    est = _Probabilities().fit(p_fit, y_fit)
    cal = CalibratedClassifierCV(FrozenEstimator(est), method="isotonic").fit(p_fit, y_fit)
    return cal.predict_proba(p_test)

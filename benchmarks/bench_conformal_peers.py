"""Conformal prediction sets against MAPIE (issue 24, 5): coverage and mean set size of
torchcal's LAC / APS / RAPS (randomised or not, with or without the top label forced in) and of
MAPIE's ``SplitConformalClassifier`` (``lac``, ``aps``, ``raps``; ``include_last_label`` True,
its default, and ``"randomized"``) on the same logits and the same calibration/test split.

Data: (1) a logistic regression on scikit-learn's digits (10 classes; logits on a held-out
half), (2) ``--classes`` synthetic classes (logits ~ 3·N(0, 1), labels from softmax(z / 2)).
MAPIE needs an estimator: a "prefit" one whose ``predict_proba`` is ``softmax`` of the
logits it is given as features.  Needs ``pip install mapie`` (the ``bench`` extra).

Usage::

    python benchmarks/bench_conformal_peers.py [--alpha 0.1] [--classes 100] [--repeats 5]
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch
from scipy.special import softmax
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

from torchcal.posthoc import ConformalClassifier


class Softmax(ClassifierMixin, BaseEstimator):
    """A fitted 'classifier' whose features are logits."""

    def __init__(self, n_classes: int = 10) -> None:
        self.n_classes = n_classes

    def fit(self, x, y):
        self.classes_ = np.arange(self.n_classes)
        self.n_features_in_ = x.shape[1]
        return self

    def predict_proba(self, x):
        return softmax(x, axis=1)

    def predict(self, x):
        return np.argmax(x, axis=1)


def digits_logits():
    x, y = load_digits(return_X_y=True)
    rs = np.random.RandomState(0)
    perm = rs.permutation(len(y))
    tr, rest = perm[:600], perm[600:]
    clf = LogisticRegression(max_iter=2000, C=0.05).fit(x[tr] / 16, y[tr])
    return clf.decision_function(x[rest] / 16), y[rest]


def synthetic_logits(c: int, n: int = 6000):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(n, c, generator=g, dtype=torch.float64) * 3
    y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g).squeeze(1)
    return z.numpy(), y.numpy()


TORCHCAL = {
    "lac": dict(method="lac"),
    "aps (default: randomised, top label in)": dict(method="aps"),
    "aps randomised, empty sets allowed": dict(method="aps", include_top_label=False),
    "aps deterministic, empty sets allowed (old)": dict(method="aps", randomized=False,
                                                       include_top_label=False),
    "raps (default: k_reg, lam chosen)": dict(method="raps"),
    "raps deterministic, k_reg=5, lam=0.01 (old)": dict(method="raps", randomized=False,
                                                       include_top_label=False, lam=0.01,
                                                       k_reg=5),
}
MAPIE = {"lac": ("lac", {}), "aps include_last_label=True (default)": ("aps", {}),
         "aps randomized": ("aps", {"include_last_label": "randomized"}),
         "raps include_last_label=True": ("raps", {}),
         "raps randomized": ("raps", {"include_last_label": "randomized"})}


def run(z, y, alpha, repeats, name):
    from mapie.classification import SplitConformalClassifier
    c = z.shape[1]
    rows: dict[str, list[tuple[float, float]]] = {}
    for r in range(repeats):
        perm = np.random.RandomState(r).permutation(len(y))
        cal, test = perm[: len(y) // 2], perm[len(y) // 2:]
        for label, kw in TORCHCAL.items():
            cp = ConformalClassifier(alpha=alpha, random_state=r, **kw).fit(z[cal], y[cal])
            rows.setdefault("torchcal " + label, []).append(
                (cp.coverage(z[test], y[test]), cp.mean_set_size(z[test])))
        for label, (score, params) in MAPIE.items():
            m = SplitConformalClassifier(estimator=Softmax(c).fit(z, y),
                                         confidence_level=1 - alpha, conformity_score=score,
                                         prefit=True, random_state=r)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m.conformalize(z[cal], y[cal])
                sets = m.predict_set(z[test], conformity_score_params=params or None)[1][:, :, 0]
            rows.setdefault("MAPIE " + label, []).append(
                (float(sets[np.arange(len(test)), y[test]].mean()), float(sets.sum(1).mean())))
    print(f"\n{name}: C = {c}, {len(y) // 2} calibration / {len(y) - len(y) // 2} test, "
          f"alpha = {alpha}, {repeats} random splits (mean)")
    for label, vals in rows.items():
        cov, size = np.mean(vals, axis=0)
        print(f"  {label:52s} coverage {cov:.4f}  mean set size {size:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    z, y = digits_logits()
    run(z, y, a.alpha, a.repeats, "digits, logistic regression")
    z, y = synthetic_logits(a.classes)
    run(z, y, a.alpha, a.repeats, "synthetic")


if __name__ == "__main__":
    main()

"""Selective prediction: the risk-coverage curve, AURC, E-AURC, AUGRC and the risk at a
coverage, against float64 NumPy references written from the definitions (loops over k), with
tied uncertainties checked against the average over every order of the ties.

TorchUncertainty (the peer with AURC / E-AURC / AUGRC) is not importable in this environment
(it is not installed and pins its own torch), so no peer comparison runs here.  Its metrics
integrate the curves numerically (trapezoid over the coverages), where these take the mean
over the N coverages k/N (the definition of the issue and of Geifman et al.'s E-AURC code);
the two differ by O(1/N).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import torchcal.metrics as M


def risk_curve_of_order(correct_in_order):
    """Risk among the first k, k = 1..N, of samples taken in the given order (plain loop)."""
    out, errors = [], 0
    for k, c in enumerate(correct_in_order, 1):
        errors += 0 if c else 1
        out.append(errors / k)
    return np.array(out)


def tie_averaged_curve(u, c):
    """The mean risk curve over every order of the tied uncertainties (exhaustive)."""
    groups = [[i for i in range(len(u)) if u[i] == v] for v in sorted(set(u))]
    curves = []
    for perms in itertools.product(*[itertools.permutations(g) for g in groups]):
        order = [i for p in perms for i in p]
        curves.append(risk_curve_of_order([c[i] for i in order]))
    return np.mean(curves, axis=0)


CASES = [
    ([0.1, 0.2, 0.3, 0.4], [1, 1, 0, 1]),
    ([0.3, 0.1, 0.3, 0.2, 0.3, 0.1, 0.5], [0, 1, 1, 0, 1, 1, 0]),  # ties of 3 and 2
    ([1.0, 1.0, 1.0], [0, 1, 1]),
    ([2, 0, 1, 1, 0], [1, 1, 0, 1, 0]),  # integer uncertainties
]


@pytest.mark.parametrize("u,c", CASES)
def test_curve_and_areas_equal_the_definitions(u, c):
    n = len(u)
    ref = tie_averaged_curve(u, c)
    curve = M.risk_coverage_curve(uncertainty=torch.tensor(u), correct=torch.tensor(c))
    np.testing.assert_allclose(curve.coverage.numpy(), np.arange(1, n + 1) / n, rtol=0, atol=0)
    np.testing.assert_allclose(curve.risk.numpy(), ref, rtol=0, atol=1e-12)
    aurc = ref.mean()
    best = risk_curve_of_order(sorted(c, reverse=True)).mean()  # every correct one first
    errors_k = ref * np.arange(1, n + 1)
    ut, ct = torch.tensor(u), torch.tensor(c)
    assert float(M.aurc(uncertainty=ut, correct=ct)) == pytest.approx(aurc, abs=1e-12)
    assert float(M.e_aurc(uncertainty=ut, correct=ct)) == pytest.approx(aurc - best, abs=1e-12)
    assert float(M.augrc(uncertainty=ut, correct=ct)) == pytest.approx(
        (errors_k / n).mean(), abs=1e-12)
    for cov in (0.01, 0.3, 0.5, 2 / 3, 1.0):
        k = max(1, math.ceil(cov * n - 1e-9))
        assert float(M.risk_at_coverage(uncertainty=ut, correct=ct, coverage=cov)) == \
            pytest.approx(ref[k - 1], abs=1e-12)


def test_random_data_and_sample_order():
    g = np.random.default_rng(0)
    u = g.integers(0, 20, 500).astype(np.float32)  # many ties
    c = g.random(500) < 0.7
    perm = g.permutation(500)
    for fn in (M.aurc, M.e_aurc, M.augrc):
        a = fn(uncertainty=u, correct=c)
        b = fn(uncertainty=u[perm], correct=c[perm])
        assert float(a) == pytest.approx(float(b), abs=1e-12)
    # a perfect ranking has E-AURC 0; the reversed one the largest
    perfect = np.where(c, 0.0, 1.0)
    assert float(M.e_aurc(uncertainty=perfect, correct=c)) == pytest.approx(0.0, abs=1e-15)
    assert float(M.e_aurc(uncertainty=-perfect, correct=c)) > 0.3


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"`coverage` .*\(0, 1\]"):
        M.risk_at_coverage(uncertainty=[0.1, 0.2], correct=[1, 0], coverage=0.0)
    with pytest.raises(ValueError, match="`correct` to have shape \\(2,\\)"):
        M.e_aurc(uncertainty=[0.1, 0.2], correct=[1, 0, 1])
    with pytest.raises(ValueError, match="`uncertainty` to be 1-D"):
        M.augrc(uncertainty=[[0.1, 0.2]], correct=[1, 0])


def test_risk_at_coverage_counts_float_coverages_exactly():
    # 0.7 * 10 = 7.000000000000001 in floating point: 7 samples accepted, not 8
    u = torch.arange(10.0)
    c = torch.tensor([1] * 7 + [0] * 3)
    assert float(M.risk_at_coverage(uncertainty=u, correct=c, coverage=0.7)) == 0.0
    assert float(M.risk_at_coverage(uncertainty=u, correct=c, coverage=0.71)) == 1 / 8

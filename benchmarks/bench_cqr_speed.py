"""CQR fit + predict at N = 10^6 calibration and 10^6 test points on the CPU: torchcal's
ConformalRegressor(score="cqr") against MAPIE's prefit ConformalizedQuantileRegressor
(symmetric_correction=True, the same score), in the same run, alternating, from the same NumPy
predictions (float64).

    PYTHONPATH=src /work/peers-venv/bin/python benchmarks/bench_cqr_speed.py \
        | tee benchmarks/results/cqr_speed.txt
"""

from __future__ import annotations

import os
import platform
import statistics
import time

import numpy as np
import torch

from torchcal.conformal import ConformalRegressor
from torchcal.regression import Quantiles

N = 1_000_000
ALPHA = 0.1
REPEATS = 15


def main() -> None:
    # one thread each: NumPy's elementwise operations and np.partition (MAPIE's) are
    # single-threaded, and torch's two threads on a 2-core machine busy with anything else spin
    # against each other (10x slower elementwise kernels measured here under load)
    torch.set_num_threads(1)
    import mapie
    from mapie.regression import ConformalizedQuantileRegressor
    from sklearn.base import BaseEstimator, RegressorMixin

    class Lookup(RegressorMixin, BaseEstimator):
        """A prefit model whose input is the row index (MAPIE needs estimators)."""

        def __init__(self, values=None):
            self.values = values

        def fit(self, X, y=None):
            self.values_ = np.asarray(self.values)
            self.fitted_ = True
            return self

        def predict(self, X):
            return self.values_[X[:, 0].astype(np.int64)]

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, 2 * N)
    sd = 0.2 + x ** 2
    y = np.sin(4 * x) + sd * rng.normal(size=2 * N)
    mu = np.sin(4 * x)
    lo, hi = mu - 1.3 * sd, mu + 1.3 * sd
    idx = np.arange(2 * N, dtype=np.float64).reshape(-1, 1)
    levels = [ALPHA / 2, 1 - ALPHA / 2]

    def run_torchcal():
        cal = Quantiles(np.stack([lo[:N], hi[:N]], 1), levels)
        cr = ConformalRegressor(ALPHA, score="cqr").fit(cal, y[:N])
        return cr.predict_interval(Quantiles(np.stack([lo[N:], hi[N:]], 1), levels))

    ests = [Lookup(lo).fit(None), Lookup(hi).fit(None), Lookup(mu).fit(None)]

    def run_mapie():
        m = ConformalizedQuantileRegressor(ests, confidence_level=1 - ALPHA, prefit=True)
        m.conformalize(idx[:N], y[:N])
        return m.predict_interval(idx[N:], symmetric_correction=True)[1]

    a, b = run_torchcal(), run_mapie()  # warm-up, and the same intervals
    diff = max(np.abs(a[0] - b[:, 0, 0]).max(), np.abs(a[1] - b[:, 1, 0]).max())
    times = {"torchcal": [], "mapie": []}
    for _ in range(REPEATS):
        for name, fn in (("torchcal", run_torchcal), ("mapie", run_mapie)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    tc, mp = statistics.median(times["torchcal"]), statistics.median(times["mapie"])
    print(f"machine: {platform.machine()} {platform.processor() or ''}, "
          f"{os.cpu_count()} cores; torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), MAPIE {mapie.__version__}, NumPy "
          f"{np.__version__}, Python {platform.python_version()}")
    print(f"CQR fit + predict, N = {N:,} calibration + {N:,} test points, alpha = {ALPHA}, "
          f"float64, {REPEATS} alternating runs each (median)")
    print(f"max |torchcal - MAPIE| interval bound = {diff:.2e}")
    print("torchcal runs (s): " + ", ".join(f"{t:.3f}" for t in times["torchcal"]))
    print("MAPIE runs (s):    " + ", ".join(f"{t:.3f}" for t in times["mapie"]))
    print(f"torchcal {tc:.3f} s, MAPIE {mp:.3f} s: ratio torchcal / MAPIE = {tc / mp:.2f}x "
          f"(target <= 0.5x)")


if __name__ == "__main__":
    main()

"""Post-hoc calibration benchmark: the vectorised temperature grid search against a Python loop.

1. ``TemperatureScaling(method="grid_ece").fit`` (all 100 temperatures 0.1..10.0, vectorised
   over T in memory-bounded chunks) against the baseline a user would write: a loop of 100
   ``torchcal.metrics.ece(logits=z / T, labels=y)`` calls and an arg-min.  Both are timed
   alternately in each repeat; the median ratio (loop / vectorised) is reported, and the two
   are checked to agree exactly (same chosen T, bit-identical ECE at every T).
2. The same for ``grid_adaece`` against 100 ``adaptive_ece`` calls.
3. ``TemperatureScaling(method="nll").fit`` wall time (safeguarded Newton on 1/T, float64),
   against a baseline torch L-BFGS on log T (float64,
   strong Wolfe, as Guo et al.'s reference code but in log space).
4. ``fit_temperatures`` (all four methods, one shared grid pass) wall time.
5. (``--new-sizes``, default 5000x10) the other calibrators' fit times, each against its
   reference where one is installed, on the same data and checked to agree:
   ``IsotonicCalibration`` against scikit-learn's ``CalibratedClassifierCV(method="isotonic")``,
   ``PlattScaling`` / ``BetaCalibration`` against netcal (two classes), and the fit times of
   ``MatrixScaling``, ``DirichletCalibration`` and ``ConformalClassifier``.

Usage::

    python benchmarks/bench_posthoc.py [--sizes 50000x100,5000x10] [--new-sizes 5000x10]
                                       [--repeats 3] [--threads 0]
"""

from __future__ import annotations

import argparse
import importlib
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch


def make_data(n: int, c: int, t_star: float = 2.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g) * 4
    y = torch.multinomial(torch.softmax(z / t_star, dim=1), 1, generator=g).squeeze(1)
    return z, y


def loop_grid(metric, z, y, grid, n_bins):
    vals = [metric(logits=z / t, labels=y, n_bins=n_bins) for t in grid]
    best = min(float(v) for v in vals)
    return min(t for t, v in zip(grid, vals, strict=True) if float(v) == best), vals


def lbfgs_log_t(z, y):
    """Baseline NLL fit: torch L-BFGS on log T (float64, strong Wolfe)."""
    z64 = z.double()
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=1.0, max_iter=100, tolerance_grad=1e-10,
                            tolerance_change=1e-14, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(z64 / log_t.exp(), y)
        loss.backward()
        return loss

    opt.step(closure)
    return math.exp(float(log_t.detach())), opt.state[log_t]["func_evals"]


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run(n: int, c: int, repeats: int, n_bins: int) -> int:
    from torchcal import metrics
    from torchcal.posthoc import TemperatureScaling, default_grid, fit_temperatures

    z, y = make_data(n, c)
    grid = list(default_grid())
    print(f"N={n} C={c} float32 logits, {len(grid)} temperatures, n_bins={n_bins}, "
          f"torch threads={torch.get_num_threads()}")

    for method, metric in (("grid_ece", metrics.ece), ("grid_adaece", metrics.adaptive_ece)):
        ratios, t_vec, t_loop = [], [], []
        for _ in range(repeats):
            tv, ts = timed(lambda m=method: TemperatureScaling(method=m, n_bins=n_bins).fit(z, y))
            tl, (t_best, vals) = timed(lambda m=metric: loop_grid(m, z, y, grid, n_bins))
            t_vec.append(tv)
            t_loop.append(tl)
            ratios.append(tl / tv)
        exact = ts.temperature_ == t_best and all(
            torch.equal(torch.tensor(s, dtype=torch.float64).to(v.dtype), v)
            for s, v in zip(ts.grid_scores_, vals, strict=True))
        print(f"  {method:12s} vectorised {statistics.median(t_vec):7.3f} s | loop of 100 "
              f"{metric.__name__} calls {statistics.median(t_loop):7.3f} s | median ratio "
              f"{statistics.median(ratios):5.2f}x | T={ts.temperature_} | identical to the loop: "
              f"{exact}")
        if not exact:
            print("  MISMATCH between the vectorised search and the loop")
            return 1

    nll_times, base_times, ratios, evals = [], [], [], []
    for _ in range(repeats):
        tn, ts = timed(lambda: TemperatureScaling(method="nll").fit(z, y))
        tb, (t_base, n_eval) = timed(lambda: lbfgs_log_t(z, y))
        nll_times.append(tn)
        base_times.append(tb)
        ratios.append(tb / tn)
        evals.append(n_eval)
    print(f"  {'nll':12s} fit {statistics.median(nll_times):7.3f} s (T={ts.temperature_:.6f}) | "
          f"torch L-BFGS on log T {statistics.median(base_times):7.3f} s "
          f"(T={t_base:.6f}, {evals[-1]} evaluations) | median ratio "
          f"{statistics.median(ratios):5.2f}x")

    tf, temps = timed(lambda: fit_temperatures(z, y, n_bins=n_bins))
    print(f"  fit_temperatures (all four) {tf:7.3f} s: "
          + ", ".join(f"{k}={v:.4g}" for k, v in temps.items()))
    return 0


def _median_time(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        t, out = timed(fn)
        times.append(t)
    return statistics.median(times), out


def run_new(n: int, c: int, repeats: int) -> None:
    from torchcal.posthoc import (
        BetaCalibration,
        ConformalClassifier,
        DirichletCalibration,
        IsotonicCalibration,
        MatrixScaling,
        PlattScaling,
    )

    # the tests' scikit-learn reference (CalibratedClassifierCV on fixed probabilities)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "posthoc"))
    from posthoc_reference import sklearn_isotonic

    z, y = make_data(n, c)
    z64 = z.double()
    print(f"N={n} C={c}: the other calibrators (median of {repeats})")
    for name, make in (("MatrixScaling(reg='none')", lambda: MatrixScaling(reg="none")),
                       ("MatrixScaling(lam=mu=0.01)", lambda: MatrixScaling(lam=0.01, mu=0.01)),
                       ("MatrixScaling() (cv)", MatrixScaling),
                       ("Dirichlet(lam=mu=0.01)", lambda: DirichletCalibration(lam=0.01,
                                                                               mu=0.01)),
                       ("DirichletCalibration() (cv)", DirichletCalibration)):
        t, _ = _median_time(lambda m=make: m().fit(z, y), repeats)
        print(f"  {name:28s} fit {t:7.3f} s")
    p_np, y_np = torch.softmax(z64, 1).numpy(), y.numpy()
    t_ours, q = _median_time(lambda: IsotonicCalibration().fit(z64, y).predict_proba(z64),
                             repeats)
    t_ref, q_ref = _median_time(lambda: sklearn_isotonic(p_np, y_np, p_np), repeats)
    print(f"  {'IsotonicCalibration':28s} fit+predict {t_ours:7.3f} s | scikit-learn "
          f"CalibratedClassifierCV {t_ref:7.3f} s | ratio {t_ours / t_ref:5.2f} | max |diff| "
          f"{np.abs(q.numpy() - q_ref).max():.1e}")
    t, cp = _median_time(lambda: ConformalClassifier(method="aps").fit(z, y), repeats)
    t_sets, _ = _median_time(lambda: cp.predict_sets(z), repeats)
    print(f"  {'ConformalClassifier(aps)':28s} fit {t:7.3f} s, predict_sets {t_sets:7.3f} s, "
          f"mean set size {cp.mean_set_size(z):.2f}")
    try:
        netcal = importlib.import_module("netcal.scaling")
    except ImportError:
        print("  (netcal is not installed: Platt / beta comparison skipped)")
        return
    g = torch.Generator().manual_seed(1)
    s = torch.rand(n, generator=g, dtype=torch.float64) * 0.96 + 0.02
    yb = (torch.rand(n, generator=g, dtype=torch.float64) < s ** 2).long()
    zb = torch.stack([torch.zeros_like(s), torch.log(s) - torch.log1p(-s)], dim=1)
    for ours_cls, ref_cls in ((PlattScaling, netcal.LogisticCalibration),
                              (BetaCalibration, netcal.BetaCalibration)):
        t_ours, cal = _median_time(lambda c=ours_cls: c().fit(zb, yb), repeats)

        def ref_fit(r=ref_cls):
            m = r(method="mle")
            m.fit(s.numpy(), yb.numpy())
            return m

        t_ref, ref = _median_time(ref_fit, repeats)
        diff = np.abs(cal.predict_proba(zb)[:, 1].numpy() - ref.transform(s.numpy())).max()
        print(f"  {ours_cls.__name__:28s} fit {t_ours:7.3f} s | netcal {ref_cls.__name__} "
              f"{t_ref:7.3f} s | ratio {t_ours / t_ref:5.2f} | max |diff| {diff:.1e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="50000x100,5000x10",
                    help="comma-separated NxC problem sizes (default: the issue's 50000x100 "
                         "and a CIFAR-10-sized validation set 5000x10)")
    ap.add_argument("--new-sizes", default="5000x10",
                    help="NxC sizes for the other calibrators (empty: skip them)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n-bins", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for size in args.sizes.split(","):
        n, c = (int(v) for v in size.lower().split("x"))
        rc = run(n, c, args.repeats, args.n_bins)
        if rc:
            return rc
    for size in filter(None, args.new_sizes.split(",")):
        n, c = (int(v) for v in size.lower().split("x"))
        run_new(n, c, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

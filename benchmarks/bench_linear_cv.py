"""Matrix scaling and Dirichlet calibration at their defaults (ODIR, ``lam`` and ``mu`` by
5-fold cross-validation) against no calibration and temperature scaling on held-out data
(issue 33, 1): many classes, few calibration samples.

Data (the issue's): logits ``3·N(0, 1)`` of C classes, labels drawn from ``softmax(z / 2)``;
N = 1,500 calibration samples and 10,000 held-out samples per seed (the generator seeded with
the seed and the seed + 1,000).  For each case and seed it prints the held-out NLL of no
calibration, of temperature scaling (NLL), of each default calibrator and of the same
calibrator with the former defaults (``lam = mu = 0.01``; matrix scaling unregularised), the
chosen ``lam``/``mu`` and the fit times (1 thread).

Usage::

    python benchmarks/bench_linear_cv.py [--cases 50x1500,100x1500] [--seeds 0,1,2,3,4]
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import torch.nn.functional as F

from torchcal.posthoc import DirichletCalibration, MatrixScaling, TemperatureScaling


def draw(c: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The issue's data: logits 3·N(0, 1), labels drawn from softmax(z / 2)."""
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(n, c, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z / 2, 1), 1, generator=g).squeeze(1)
    return z, y


def timed_nll(cal, z, y, zt, yt) -> tuple[float, float]:
    t = time.perf_counter()
    cal.fit(z, y)
    return -cal.score(zt, yt), time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="50x1500,100x1500")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    a = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # the former defaults warn (that is the point)
    print(f"torch {torch.__version__}, 1 thread; held-out NLL on 10,000 samples")
    print("| C | N | seed | none | TS | method | default (lam, mu) | fit s | former default "
          "| fit s | default <= none |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for case in a.cases.split(","):
        c, n = (int(v) for v in case.split("x"))
        for seed in (int(s) for s in a.seeds.split(",")):
            z, y = draw(c, n, seed)
            zt, yt = draw(c, 10_000, seed + 1_000)
            none = float(F.cross_entropy(zt, yt))
            ts = -TemperatureScaling(method="nll").fit(z, y).score(zt, yt)
            for name, cls, former in (
                    ("dirichlet", DirichletCalibration, dict(lam=0.01, mu=0.01)),
                    ("matrix", MatrixScaling, dict(reg="none"))):
                cal = cls()
                nll, dt = timed_nll(cal, z, y, zt, yt)
                old, dt_old = timed_nll(cls(**former), z, y, zt, yt)
                print(f"| {c} | {n} | {seed} | {none:.4f} | {ts:.4f} | {name} | {nll:.4f} "
                      f"({cal.lam_:g}, {cal.mu_:g}) | {dt:.1f} | {old:.4f} | {dt_old:.1f} | "
                      f"{'yes' if nll <= none else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()

"""VectorScaling's L-BFGS stops at the tolerance it accepts (issue 43, item 3).

Before: ``torch.optim.LBFGS(tolerance_grad=1e-10)`` while the fit is accepted at a gradient of
``GRAD_TOL = 1e-6``, so L-BFGS ran on to its evaluation budget.  After: ``tolerance_grad =
GRAD_TOL``.  Both are measured side by side in one run (process CPU time, 1 thread): the
"before" run patches L-BFGS back to 1e-10.  Printed: CPU seconds, objective evaluations, the
after/before ratio, and the change of the validation and held-out NLL.

    PYTHONPATH=src python benchmarks/bench_lbfgs_tolerance.py [--n 5000] [--c 100] [--repeats 1]
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import torch.nn.functional as F

from torchcal.posthoc import VectorScaling


def problem(n: int, c: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Over-confident logits with a class-dependent bias (vector scaling has work to do)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, c, (2 * n,), generator=g)
    bias = torch.randn(c, generator=g)
    z = 2.5 * (torch.randn(2 * n, c, generator=g) + 2.0 * F.one_hot(y, c)) + bias
    return z[:n], y[:n], z[n:], y[n:]


class _Counting:
    """Counts the L-BFGS objective evaluations (closure calls) of one fit."""

    def __init__(self, tolerance_grad: float | None) -> None:
        self.tolerance_grad = tolerance_grad
        self.evals = 0

    def __enter__(self) -> _Counting:
        self._orig = torch.optim.LBFGS
        outer = self

        class LBFGS(self._orig):  # type: ignore[misc, valid-type]
            def __init__(self, params, **kw):
                if outer.tolerance_grad is not None:
                    kw["tolerance_grad"] = outer.tolerance_grad
                super().__init__(params, **kw)

            def step(self, closure):
                def counted():
                    outer.evals += 1
                    return closure()
                return super().step(counted)

        torch.optim.LBFGS = LBFGS
        return self

    def __exit__(self, *exc: object) -> None:
        torch.optim.LBFGS = self._orig


def fit(zv, yv, tolerance_grad: float | None) -> tuple[VectorScaling, float, int]:
    with _Counting(tolerance_grad) as counter, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.process_time()
        vs = VectorScaling().fit(zv, yv)
        cpu = time.process_time() - t0
    return vs, cpu, counter.evals


def nll(vs: VectorScaling, z: torch.Tensor, y: torch.Tensor) -> float:
    return float(F.cross_entropy(vs.transform(z.double()), y))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--c", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    zv, yv, zt, yt = problem(args.n, args.c)
    rows = []
    for _ in range(args.repeats):  # interleaved, so load on the machine hits both alike
        before = fit(zv, yv, 1e-10)
        after = fit(zv, yv, None)
        rows.append((before, after))
    print(f"VectorScaling, N = {args.n:,}, C = {args.c}, 1 thread, process CPU time")
    print(f"{'':>8} {'before (1e-10)':>16} {'after (GRAD_TOL)':>18} {'after/before':>13}")
    for (vb, cb, eb), (va, ca, ea) in rows:
        print(f"{'CPU s':>8} {cb:16.2f} {ca:18.2f} {ca / cb:13.3f}")
        print(f"{'evals':>8} {eb:16d} {ea:18d} {ea / eb:13.3f}")
        dv = nll(va, zv, yv) - nll(vb, zv, yv)
        dt = nll(va, zt, yt) - nll(vb, zt, yt)
        print(f"validation NLL {nll(vb, zv, yv):.12f} -> {nll(va, zv, yv):.12f} "
              f"(change {dv:+.2e}); held-out NLL change {dt:+.2e}")


if __name__ == "__main__":
    main()

"""Calibration benchmark: the seed papers' claims checked on the demo's benchmarks.

Runs ``torchcal demo`` on MNIST-1D (the default) and on noisy digits (``--benchmark digits``), or
reads existing demo directories (``--from DIR``, repeatable, any benchmark), and prints per data
set the main table, the over/under-confidence table and PASS/FAIL for each claim of
:data:`torchcal.experiments.claims.CLAIMS` (the claims of Mukhoti et al. 2020, Ghosh et al. 2022,
Lin et al. 2025 and Tao et al. 2023, tested per seed by the report layer): PASS when the claim
holds on every tested seed, FAIL otherwise (with "holds on k of n seeds"), "not tested" when a
loss the claim needs was not trained.

Usage::

    python benchmarks/bench_calibration.py --from torchcal-demo/20260101-120000   # seconds
    python benchmarks/bench_calibration.py --quick          # both data sets, --quick demos
    python benchmarks/bench_calibration.py [--benchmark mnist1d] [--full] [--workers 2]

Returns 1 when any tested claim fails (the verdicts are measurements, not targets).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from torchcal.report.aggregate import group_runs, load_runs
from torchcal.report.claims import add_confidence_gaps, check_claims, claim_table, direction_table
from torchcal.report.tables import main_table


def _check(root: Path) -> tuple[int, int]:
    """Print the tables and claims of one demo directory; returns (failed, tested) claims."""
    loaded = load_runs([root / "runs" if (root / "runs").is_dir() else root])
    for p, m in loaded.errors:
        print(f"skipped {p}: {m}", file=sys.stderr)
    if not loaded.runs:
        print(f"FAIL  no evaluated run under {root}")
        return 1, 1
    add_confidence_gaps(loaded.runs)
    groups = group_runs(loaded.runs)
    failed = tested = 0
    for ds_model in sorted({(g.dataset, g.model) for g in groups}):
        gs = [g for g in groups if (g.dataset, g.model) == ds_model]
        print(f"\n=== {ds_model[0]} / {ds_model[1]} ({root}) ===\n")
        print(main_table(gs).to_text())
        print(direction_table(gs).to_text())
        for r in check_claims(gs):
            if not r.n:
                print(f"  n/a   {r.claim.key}: {r.verdict}")
                continue
            tested += 1
            failed += not r.passed
            print(f"  {'PASS' if r.passed else 'FAIL'}  {r.claim.key}: {r.verdict}. "
                  f"{r.claim.source.split(',')[0]}: {r.claim.text}")
            print("        " + claim_table(r).to_text().replace("\n", "\n        ").rstrip())
    return failed, tested


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="from_dirs", action="append", default=None, metavar="DIR",
                    help="an existing demo output directory (repeatable); no training")
    ap.add_argument("--benchmark", action="append", choices=("mnist1d", "digits"), default=None,
                    help="benchmark(s) to run (default: both)")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="the --quick demos (a smoke test)")
    size.add_argument("--full", action="store_true", help="the --full demos")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None, help="parent of the demo output directories")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    roots = [Path(d) for d in args.from_dirs or []]
    if not roots:
        from torchcal.experiments import DemoConfig, run_demo

        for ds in args.benchmark or ["mnist1d", "digits"]:
            out = Path(args.out) / ds if args.out else None
            res = run_demo(DemoConfig(benchmark=ds, workers=args.workers, out=out, quick=args.quick,
                                      full=args.full))
            print(f"{ds}: demo wall time {res.seconds:.0f} s, report {res.report.report_md}")
            roots.append(res.out_dir)
    failed = tested = 0
    for root in roots:
        f, t = _check(root)
        failed, tested = failed + f, tested + t
    print(f"\n{tested - failed}/{tested} tested claims PASS (on every seed); "
          f"total {time.perf_counter() - t0:.0f} s")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

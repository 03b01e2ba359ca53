"""``torchcal demo --suite uncertainty``: parse, run the suite of
:mod:`torchcal.experiments.uncertainty`, print where its report is."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..experiments.uncertainty import run_uncertainty_suite

__all__ = ["cmd_uncertainty_suite"]


def cmd_uncertainty_suite(args: argparse.Namespace, executor=None) -> int:
    """Run the uncertainty suite with the demo's --quick / --full / --seeds / --workers /
    --out; refuse the calibration benchmark's options."""
    for opt in ("epochs", "losses", "adafocal_lam", "data_arg", "train_arg",
                "loss_arg"):
        if getattr(args, opt, None) not in (None, [], False):
            raise ValueError(f"Expected no --{opt.replace('_', '-')} with --suite uncertainty "
                             "(an option of the calibration benchmark)")
    profile = "quick" if args.quick else "full" if args.full else "default"
    out = Path(args.out) if args.out else Path("torchcal-demo") / f"uncertainty-{profile}"
    args.demo_out = out
    seeds = None
    if args.seeds is not None:
        seeds = tuple(args.seeds)
    argv = list(getattr(args, "argv", None) or ["demo", "--suite", "uncertainty"])
    summary = run_uncertainty_suite(profile, out, seeds=seeds, workers=args.workers,
                                    executor=executor, progress=not args.no_progress,
                                    command=shlex.join(["torchcal", *argv]))
    text = (out / "report.md").read_text()
    start = text.index("## The papers' claims on this benchmark")
    print(text[start:text.index("\n## ", start + 3)].strip())
    print(f"\nreport: {out / 'report.md'}  ({summary['seconds']:.0f} s, profile {profile})")
    failed = [u for u in summary["units"] if u.get("error")]
    if failed:
        print(f"torchcal demo: {len(failed)} unit(s) failed, see the report", file=sys.stderr)
        return 1
    return 0

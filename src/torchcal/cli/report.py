"""``torchcal report``: evaluated run directories -> tables and figures."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._args import positive_int as _positive_int

__all__ = ["register", "cmd_report"]


def _print_tail(rep, out_dir: Path) -> None:
    print()
    print(rep.text)
    print(f"Report: {rep.report_md}")
    print(f"        {rep.report_html} (figures embedded)")
    print(f"Every number: {out_dir / 'results.json'}, {out_dir / 'results.csv'}")


def cmd_report(args: argparse.Namespace) -> int:
    from ..report.build import build_report  # matplotlib: not at `torchcal --help` time

    rep = build_report(args.run_dirs, args.out, title=args.title, n_bins=args.n_bins,
                       figures=not args.no_figures)
    for _path, msg in rep.errors:
        print(f"torchcal report: error: {msg}", file=sys.stderr)
    _print_tail(rep, Path(args.out))
    return 1 if rep.errors else 0


def register(subparsers) -> None:
    """Add ``report`` to the ``torchcal`` command line."""
    p = subparsers.add_parser(
        "report", help="aggregate evaluated runs into tables and figures",
        description="Aggregate evaluated runs (directories holding results.json, searched "
                    "recursively) into report.md, report.html, figures and results.json/csv; "
                    "runs are grouped by data set, model and loss, mean ± std over seeds.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories or results.json files")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--title", default="torchcal report")
    p.add_argument("--n-bins", type=_positive_int, default=15, help="bins of the figures (default 15)")
    p.add_argument("--no-figures", action="store_true", help="tables only")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=cmd_report)

"""``torchcal report``: evaluated run directories -> tables and figures.

An ``--out`` that already holds a report is refreshed: the new figures are drawn aside and
replace the earlier report's figures in one commit with the pages (the new one may draw other
groups, and a stale figure would sit beside the new report), so a kill or a full disk leaves
the old report or the new one, never a mix.  An ``--out`` that holds a training run (``config.json``,
``checkpoints/``, ``log.jsonl``, or a ``results.json`` that is not a report's) is refused, since
the report's ``results.json`` would replace the run's.  ``torchcal demo --out`` does the same.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._io import exclusive_lock
from ..report.build import build_report, prepare_report_dir
from ..train.config import config_identity
from ._args import PERCENT_NOTE, add_figure_options, figure_settings
from ._args import positive_int as _positive_int

__all__ = ["register", "cmd_report", "print_tail"]



def print_tail(rep, out_dir: Path) -> None:
    """Print a built report's text and where its files are (after ``torchcal report`` and
    ``torchcal demo``)."""
    print()
    print(rep.text)
    print(f"Report: {rep.report_md}")
    print(f"        {rep.report_html} (figures embedded)")
    print(f"Every number: {out_dir / rep.results_json.name}, {out_dir / rep.results_csv.name}")


def cmd_report(args: argparse.Namespace) -> int:
    out = Path(args.out)
    with exclusive_lock(out, what="Output directory"):  # one report writer at a time
        prepare_report_dir(out)
        rep = build_report(args.run_dirs, out, title=args.title, n_bins=args.n_bins,
                           **figure_settings(args), checkpoint=args.checkpoint,
                           mix_checkpoints=args.mix_checkpoints, identity_of=config_identity)
    for _path, msg in rep.errors:
        print(f"torchcal report: error: {msg}", file=sys.stderr)
    print_tail(rep, Path(args.out))
    return 1 if rep.errors else 0


def _interrupt_hint(args: argparse.Namespace) -> str:
    """After Ctrl-C or SIGTERM: which report ``--out`` holds, and the command to run again."""
    from . import again_command  # deferred: the package imports this module's register

    kept = ("one whole report (pages and figures of the same run)"
            if (Path(args.out) / "report.md").is_file() else "no report")
    return f"{args.out} holds {kept}; run it again: {again_command(args)}"


def register(subparsers) -> None:
    """Add ``report`` to the ``torchcal`` command line."""
    p = subparsers.add_parser(
        "report", help="aggregate evaluated runs into tables and figures",
        description="Aggregate evaluated runs (directories holding results.json, searched "
                    "recursively) into report.md, report.html, figures and results.json/csv; "
                    "runs are grouped by data set, model and loss, mean ± std over seeds; only "
                    "runs of one identity (every training setting but the seed) are seeds of "
                    "one group, the others are kept apart and named with the settings that "
                    "differ.",
        epilog="An --out holding an earlier report is refreshed (its old figures removed); one "
               "holding a training run is refused. " + PERCENT_NOTE)
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories or results.json files")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--title", default="torchcal report")
    p.add_argument("--n-bins", type=_positive_int, default=15, help="bins of the figures (default 15)")
    add_figure_options(p)
    p.add_argument("--checkpoint", choices=("last", "best"), default="last",
                   help="which evaluation of each run: the last epoch's results.json (default) "
                        "or results-best.json (`torchcal eval RUN --checkpoint best`)")
    p.add_argument("--mix-checkpoints", action="store_true",
                   help="allow a table to hold runs evaluated from different checkpoints "
                        "(refused otherwise; the Runs table names each group's checkpoint)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=cmd_report, interrupt_hint=_interrupt_hint)

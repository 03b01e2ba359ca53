"""``torchcal readme README SOURCE...``: regenerate the generated blocks of a README (or a docs
page) from committed results, each SOURCE named relative to the README as its block's marker
names it:

* a demo's ``results.csv`` -> the front table (:func:`torchcal.report.front.replace_front_table`);
* the uncertainty suite's ``suite_results.json`` -> its block
  (:func:`torchcal.experiments.uncertainty_report.readme_block`).

A test keeps the repository's README equal to its committed runs; after a new run, this command
regenerates it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .._io import atomic_write_text, read_json
from ..experiments.uncertainty_report import readme_block, replace_readme_block
from ..report.front import replace_front_table

__all__ = ["register", "cmd_readme", "regenerate"]


def regenerate(text: str, source: str, base: Path) -> str:
    """``text`` with the block generated from ``source`` (relative to ``base``) replaced."""
    path = base / source
    if source.endswith(".csv"):
        return replace_front_table(text, source, path.read_text(encoding="utf-8"))
    if source.endswith(".json"):
        summary = read_json(path, what="Suite results file")
        if not isinstance(summary, dict) or summary.get("schema") != "torchcal.uncertainty_suite/1":
            raise ValueError(f"Expected {source!r} to be a suite_results.json of "
                             "`torchcal demo --suite uncertainty`")
        return replace_readme_block(text, readme_block(summary, source))
    raise ValueError(f"Expected each SOURCE to be a demo's results.csv or the uncertainty "
                     f"suite's suite_results.json, got {source!r}")


def cmd_readme(args: argparse.Namespace) -> int:
    readme = Path(args.readme)
    text = readme.read_text(encoding="utf-8")
    for source in args.sources:
        text = regenerate(text, source, readme.parent)
    atomic_write_text(readme, text)
    for source in args.sources:
        print(f"{readme}: regenerated from {source}")
    return 0


def register(subparsers) -> None:
    """Add ``readme`` to the ``torchcal`` command line."""
    p = subparsers.add_parser(
        "readme", help="regenerate a README's generated blocks from committed results",
        description=__doc__.split("\n\n")[0].replace("``", "`"))
    p.add_argument("readme", metavar="README", help="the Markdown file holding the blocks")
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="results.csv (front table) or suite_results.json (uncertainty block), "
                        "relative to README")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.set_defaults(func=cmd_readme)

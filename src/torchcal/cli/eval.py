"""``torchcal eval``: a run's checkpoint -> saved logits and ``results.json``.

Example::

    torchcal eval runs/c10-r50-focal --checkpoint best
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from ..report.tables import worse_than
from ..run_dir import CHECKPOINTS, logits_dirname, results_filename
from ..train.evaluation import evaluate_checkpoint
from ._args import PERCENT_NOTE, pct
from ._args import fmt as _fmt

__all__ = ["register"]


def _cmd_eval(args: argparse.Namespace) -> int:
    res = evaluate_checkpoint(args.run_dir, checkpoint=args.checkpoint, data_root=args.data_root,
                       device=args.device, batch_size=args.batch_size)
    pre, post = res["test"]["pre"], res["test"]["post"].get("grid_ece", {})
    t = res["temperatures"].get("grid_ece", float("nan"))
    before, after = (math.nan if d.get("ece") is None else 100 * d["ece"] for d in (pre, post))
    worse = " (worse after T)" if worse_than(after, before, 2) else ""  # as printed
    print(f"{args.run_dir} ({args.checkpoint}): test error {pct(pre.get('error'))}, "
          f"ECE {pct(pre.get('ece'))} -> {pct(post.get('ece'))} (T={t:.2f}){worse}, "
          f"AdaECE {pct(pre.get('adaptive_ece'))}, NLL {_fmt(pre.get('nll'))}")
    for name, d in res.get("ood", {}).items():
        print(f"  OOD {name}: AUROC(entropy) {pct(d.get('auroc_entropy'))}")
    run = Path(args.run_dir)
    print(f"wrote {run / results_filename(args.checkpoint)} and "
          f"{run / logits_dirname(args.checkpoint)}/")
    return 0


def _interrupt_hint(args: argparse.Namespace) -> str:
    """After Ctrl-C or SIGTERM: what the run directory holds, and the command to run again."""
    from . import again_command  # deferred: the package imports this module's register

    res = Path(args.run_dir) / results_filename(args.checkpoint)
    kept = (f"{res.name} and its logits are whole files" if res.is_file()
            else f"no {res.name} written")
    return f"{kept}; run it again: {again_command(args)}"


def register(subparsers: Any) -> None:
    """Add ``eval`` to the ``torchcal`` command line."""
    F = argparse.RawDescriptionHelpFormatter
    e = subparsers.add_parser(
        "eval", formatter_class=F, help="evaluate a run's checkpoint into logits and results.json",
        description="Load RUN_DIR/checkpoints/<checkpoint>.pt, save validation/test/OOD logits "
                    "to RUN_DIR/logits/*.npz\nand every metric before and after temperature "
                    "scaling to RUN_DIR/results.json. --checkpoint best writes\n"
                    "RUN_DIR/logits-best/ and RUN_DIR/results-best.json instead, so that it never "
                    "replaces the last\nepoch's results (`torchcal report --checkpoint best` "
                    "reads them).",
        epilog="example:\n  torchcal eval runs/c10 --checkpoint best --data-root ~/data\n\n"
               "RUN_DIR is locked while this writes into it (a training of it must have ended).\n"
               + PERCENT_NOTE)
    e.add_argument("run_dir", metavar="RUN_DIR", help="a torchcal train run directory")
    e.add_argument("--checkpoint", choices=CHECKPOINTS, default="last",
                   help="which checkpoint: the last epoch's (default, as the papers report; "
                        "results.json) or the best by validation metric (results-best.json)")
    e.add_argument("--data-root", help="data directory (default: the one the run used)")
    e.add_argument("--device", default="auto",
                   help="'auto' (CUDA if available, the default, as in train), 'cpu', 'cuda', "
                        "'cuda:N'")
    e.add_argument("--batch-size", type=int, default=None, help="prediction batch size")
    e.add_argument("--debug", action="store_true", help="show tracebacks")
    e.set_defaults(func=_cmd_eval, interrupt_hint=_interrupt_hint)

"""``torchcal report`` and ``torchcal demo`` sub-commands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["register", "parse_seeds", "parse_demo_loss_args", "cmd_report", "cmd_demo"]


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"5"`` -> seeds 0..4; ``"1,2,7"`` -> those seeds (a trailing comma makes one seed a list).

    >>> parse_seeds("3"), parse_seeds("4,9"), parse_seeds("7,")
    ((0, 1, 2), (4, 9), (7,))
    """
    try:
        if "," in text:
            seeds = tuple(int(s) for s in text.split(",") if s.strip())
        else:
            n = int(text)
            if n < 1:
                raise ValueError
            seeds = tuple(range(n))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seeds (e.g. 5) or a comma-separated list (e.g. 0,3,7), got {text!r}"
        ) from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected distinct seeds, got {text!r}")
    return seeds


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite non-negative number, got {text!r}")
    return v


def _print_tail(rep, out_dir: Path) -> None:
    print()
    print(rep.text)
    print(f"Report: {rep.report_md}")
    print(f"        {rep.report_html} (figures embedded)")
    print(f"Every number: {out_dir / 'results.json'}, {out_dir / 'results.csv'}")


def cmd_report(args: argparse.Namespace) -> int:
    from .build import build_report

    rep = build_report(args.run_dirs, args.out, title=args.title, n_bins=args.n_bins,
                       figures=not args.no_figures)
    for _path, msg in rep.errors:
        print(f"torchcal report: error: {msg}", file=sys.stderr)
    _print_tail(rep, Path(args.out))
    return 1 if rep.errors else 0


def parse_demo_loss_args(items: list[str] | None) -> dict[str, dict]:
    """``["focal:gamma=2", "ls:alpha=0.1"]`` -> ``{"focal": {"gamma": 2}, "ls": {"alpha": 0.1}}``.

    >>> parse_demo_loss_args(["focal:gamma=2", "focal:x=a", "adafocal:lam=1"])
    {'focal': {'gamma': 2, 'x': 'a'}, 'adafocal': {'lam': 1}}
    """
    from ..train.cli import parse_loss_args

    out: dict[str, dict] = {}
    for item in items or []:
        loss, sep, kv = item.partition(":")
        if not sep or not loss.strip():
            raise ValueError(f"Expected `--loss-arg` as LOSS:KEY=VALUE, got {item!r}")
        out.setdefault(loss.strip(), {}).update(parse_loss_args([kv]))
    return out


def cmd_demo(args: argparse.Namespace) -> int:
    from ..train.cli import parse_loss_args
    from .demo import DemoConfig, run_demo

    cfg = DemoConfig(
        seeds=args.seeds,
        epochs=args.epochs,
        losses=tuple(s.strip() for s in args.losses.split(",") if s.strip()) if args.losses else None,
        workers=args.workers,
        out=Path(args.out) if args.out else None,
        noise_std=args.noise_std,
        n_bins=args.n_bins,
        adafocal_lam=args.adafocal_lam,
        loss_kwargs=parse_demo_loss_args(args.loss_arg),
        data_kwargs=parse_loss_args(args.data_arg, "--data-arg"),
        overrides=parse_loss_args(args.train_arg, "--train-arg"),
        progress=not args.no_progress,
        quick=args.quick,
        figures=not args.no_figures,
    )
    res = run_demo(cfg)
    _print_tail(res.report, res.out_dir)
    print(f"Wall time: {res.seconds:.0f} s for {len(res.report.groups)} loss(es) x "
          f"{len(res.config.seeds)} seed(s) with {res.config.workers} worker(s).")
    if res.failed:
        print(f"torchcal demo: {len(res.failed)} run(s) failed, see the report", file=sys.stderr)
        return 1
    return 0


def register(subparsers) -> None:
    """Add ``report`` and ``demo`` to the ``torchcal`` command line."""
    from .demo import ADAFOCAL_LAM

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

    d = subparsers.add_parser(
        "demo", help="train every calibration loss on noisy digits and report (CPU, no download)",
        description="The embedded benchmark: an MLP on scikit-learn's digits with Gaussian pixel "
                    "noise, trained with every calibration loss for several seeds in parallel "
                    "worker processes, evaluated before and after temperature scaling, reported "
                    "in the papers' table format with figures.")
    d.add_argument("--quick", action="store_true", help="2 seeds x 30 epochs (well under a minute)")
    d.add_argument("--seeds", type=parse_seeds, default=None,
                   help="number of seeds (5: seeds 0..4, the default) or a list such as 0,3,7")
    d.add_argument("--epochs", type=_positive_int, default=None, help="epochs (default: recipe's 100)")
    d.add_argument("--losses", default=None,
                   help="comma-separated registry names (default: every applicable loss)")
    d.add_argument("--workers", type=_positive_int, default=2, help="worker processes (default 2)")
    d.add_argument("--out", default=None, metavar="DIR",
                   help="output directory (default: a fresh directory under ./torchcal-demo/)")
    d.add_argument("--noise-std", type=_nonneg_float, default=0.5, help="pixel noise std (default 0.5)")
    d.add_argument("--adafocal-lam", type=_nonneg_float, default=ADAFOCAL_LAM,
                   help=f"AdaFocal's λ (default {ADAFOCAL_LAM:g}, see the report)")
    d.add_argument("--n-bins", type=_positive_int, default=15, help="bins of every binned metric")
    d.add_argument("--data-arg", action="append", metavar="KEY=VALUE",
                   help="data set option, repeatable: n_copies=5 (noisy copies of each "
                        "validation/test image), split=[0.6,0.1,0.3]")
    d.add_argument("--train-arg", action="append", metavar="KEY=VALUE",
                   help="training setting of the digits-mlp recipe (a TrainConfig field), "
                        "repeatable: lr=0.05, momentum=0.9, weight_decay=5e-4, batch_size=64, "
                        "milestone_fractions=[0.5,0.75], lr_gamma=0.1, "
                        "model_kwargs={\"hidden\":[256,256]}")
    d.add_argument("--loss-arg", action="append", metavar="LOSS:KEY=VALUE",
                   help="a loss hyperparameter, repeatable: focal:gamma=2, ls:alpha=0.1")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    d.add_argument("--no-figures", action="store_true", help="tables only")
    d.add_argument("--debug", action="store_true", help="show tracebacks")
    d.set_defaults(func=cmd_demo)

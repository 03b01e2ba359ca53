"""``torchcal demo``: the parser and the printing of the embedded benchmarks.

The benchmarks (the calibration benchmarks, MNIST-1D by default or noisy digits, chosen by
``--benchmark``; ``--suite uncertainty``: the uncertainty benchmark), their sizes, report prose
and the sweep runner live in :mod:`torchcal.experiments`; this module turns the command line
into a :class:`~torchcal.experiments.DemoConfig` and an executor, calls
:func:`~torchcal.experiments.run_demo` (for every benchmark) and prints the result.

Ctrl-C stops the runs at once (worker processes or Ray tasks); the same command with the same
``--out`` continues where it stopped (finished runs skipped, unfinished ones resumed).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from .._signals import sigterm_interrupts
from ..experiments import DemoConfig, get_benchmark, list_benchmarks, run_demo
from ..experiments.benchmark import data_options_help, size_help
from ..experiments.demo import TRAINING_RUNS, applicable_losses, debug_env, default_out
from ..experiments.runner import EXECUTORS, make_executor
from ._args import (
    PERCENT_NOTE,
    add_figure_options,
    figure_settings,
    parse_loss_args,
    parse_loss_args_per_loss,
)
from ._args import nonneg_float as _nonneg_float
from ._args import positive_int as _positive_int
from .report import print_tail

__all__ = [ "register", "parse_seeds",
           "parse_demo_loss_args", "cmd_demo"]


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


def parse_demo_loss_args(items: list[str] | None,
                         losses: Sequence[str] | None = None) -> dict[str, dict]:
    """``["focal:gamma=2", "ls:alpha=0.1"]`` -> ``{"focal": {"gamma": 2}, "ls": {"alpha": 0.1}}``.

    The syntax of ``torchcal train --loss-arg``: ``LOSS:KEY=VALUE``, or ``KEY=VALUE`` when
    ``losses`` holds one loss (:func:`~torchcal.cli._args.parse_loss_args_per_loss`).  Without
    ``losses`` any loss name is accepted (``run_demo`` checks them).

    >>> parse_demo_loss_args(["focal:gamma=2", "focal:x=a", "adafocal:lam=1"])
    {'focal': {'gamma': 2, 'x': 'a'}, 'adafocal': {'lam': 1}}
    >>> parse_demo_loss_args(["gamma=2"], ["focal"])
    {'focal': {'gamma': 2}}
    """
    if losses is None:  # any LOSS: prefix is accepted here
        losses = [i.partition(":")[0].strip() for i in items or [] if ":" in i.partition("=")[0]]
    return parse_loss_args_per_loss(items, list(losses))


def _interrupt_hint(args: argparse.Namespace) -> str:
    """After Ctrl-C: the command that continues the demo (with --out when it was not given)."""
    out = getattr(args, "demo_out", None)
    argv = list(getattr(args, "argv", None) or ["demo"])
    if out is None:
        return "nothing was trained yet"
    if args.out is None:
        argv += ["--out", str(out)]
    return (f"finished runs are kept in {out}; the same command continues where it stopped "
            f"(finished runs are skipped, unfinished ones resume): {shlex.join(['torchcal', *argv])}")


def _executor(args: argparse.Namespace):
    """The registered executor ``--executor`` (:data:`torchcal.experiments.runner.EXECUTORS`)."""
    return make_executor(args.executor, workers=args.workers, address=args.ray_address)


def _overrides(args: argparse.Namespace) -> dict:
    """``--train-arg`` settings with ``--device`` (one of the two names the device)."""
    overrides = parse_loss_args(args.train_arg, "--train-arg")
    if "device" in overrides and args.device is not None:
        raise ValueError("give the device once: `--device` or `--train-arg device=...`")
    overrides["device"] = overrides.get("device", args.device or "auto")
    return overrides


def _print_verdicts(rep) -> None:
    """The claims' verdicts, last on the screen (the report's first section, one line each)."""
    if rep.verdicts:
        label = f" ({rep.verdict_label})" if rep.verdict_label else ""
        print(f"\nThe papers' claims on this run{label}; the report's first section has "
              "each seed's numbers:")
        for line in rep.verdicts:
            print(f"- {line}")


def _command(args: argparse.Namespace) -> str:
    """The command line of this demo, with ``--out`` when it was not given (the command that
    continues it names its directory); a report may quote it."""
    argv = list(getattr(args, "argv", None) or ["demo"])
    if args.out is None:
        argv += ["--out", str(args.demo_out)]
    return shlex.join(["torchcal", *argv])


def cmd_demo(args: argparse.Namespace) -> int:
    """``torchcal demo``: SIGTERM at any phase (start-up, the sweep, the report, the figures)
    stops it as Ctrl-C does, printing the command that continues; a failed run is one line,
    its traceback only with ``--debug``."""
    with sigterm_interrupts(), debug_env(getattr(args, "debug", False)):
        return _cmd_demo(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    suite = getattr(args, "suite", "calibration")
    benchmark = args.benchmark if suite == "calibration" else suite
    losses = tuple(s.strip() for s in args.losses.split(",") if s.strip()) if args.losses else None
    # the output directory is fixed first, so that the hint after Ctrl-C or SIGTERM names it
    args.demo_out = Path(args.out) if args.out else default_out()
    executor = _executor(args)
    cfg = DemoConfig(
        benchmark=benchmark, full=args.full, seeds=args.seeds, epochs=args.epochs,
        losses=losses, workers=args.workers, out=args.demo_out,
        n_bins=args.n_bins, adafocal_lam=args.adafocal_lam,
        loss_kwargs=parse_demo_loss_args(args.loss_arg, losses or applicable_losses()),
        data_kwargs=parse_loss_args(args.data_arg, "--data-arg"),
        overrides=_overrides(args),
        progress=not args.no_progress, quick=args.quick, **figure_settings(args),
        pack=not args.no_pack, command=_command(args),
    )
    res = run_demo(cfg, executor)
    kind = get_benchmark(benchmark).kind
    if kind is TRAINING_RUNS:  # the calibration benchmarks: the report's tail, wall time, claims
        print_tail(res.report, res.out_dir)
        print(f"Wall time: {res.seconds:.0f} s (start-up and report writing included) for "
              f"{sum(g.predictor == 'run' for g in res.report.groups)} loss(es) x "
              f"{len(res.config.seeds)} seed(s) with {res.config.workers} worker(s).")
        _print_verdicts(res.report)
    else:
        print(kind.summary(res))
    if res.failed:
        print(f"torchcal demo: {len(res.failed)} {kind.unit}(s) failed, see the report; once "
              "fixed, the same command runs them again (finished runs are skipped): "
              f"{_command(args)}", file=sys.stderr)
        return 1
    return 0


def register(subparsers) -> None:
    """Add ``demo`` to the ``torchcal`` command line."""
    h = size_help()
    calibration = list_benchmarks("calibration")
    d = subparsers.add_parser(
        "demo", help="train the calibration losses on MNIST-1D (or noisy digits), test the "
                     "papers' claims and report (CPU, no download)",
        description=h["description"],
        epilog="Ctrl-C stops the workers at once and prints the command that continues the "
               "demo where it stopped (the same command, with --out). " + PERCENT_NOTE)
    suites = ["calibration"] + [n for n in list_benchmarks() if n not in calibration]
    d.add_argument("--suite", choices=suites, default="calibration",
                   help="calibration (default): the calibration losses' benchmark below; "
                        "uncertainty: Kirchhof et al. 2024's pretrained uncertainty heads and "
                        "Kendall et al. 2018's multi-task weighting on MNIST-1D, 3 seeds "
                        "(--quick: a 1-seed smoke test; --full: every arm, 5 seeds)")
    d.add_argument("--benchmark", choices=calibration,
                   default="mnist1d",
                   help="the benchmark (default mnist1d): " + "; ".join(
                       f"{n}: {get_benchmark(n).title}" for n in calibration))
    size = d.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=h["quick"])
    size.add_argument("--full", action="store_true", help=h["full"])
    d.add_argument("--seeds", type=parse_seeds, default=None, help=h["seeds"])
    d.add_argument("--epochs", type=_positive_int, default=None, help=h["epochs"])
    d.add_argument("--losses", default=None, help=h["losses"])
    d.add_argument("--workers", type=_positive_int, default=2,
                   help="worker processes (default 2); with --executor ray and no "
                        "--ray-address, the CPUs of the local Ray instance")
    d.add_argument("--executor", choices=EXECUTORS.names(), default="local",
                   help="where the runs train: " + "; ".join(
                       f"{n}: {EXECUTORS.get(n).summary}" for n in EXECUTORS.names()))
    d.add_argument("--ray-address", default=None, metavar="auto|HOST:PORT",
                   help="with --executor ray: the running cluster to join (default: a local "
                        "Ray instance on this machine); the --out directory must be on storage "
                        "every node sees")
    d.add_argument("--out", default=None, metavar="DIR",
                   help="output directory (default: a fresh directory under ./torchcal-demo/); "
                        "the directory of an earlier demo is continued: finished runs are "
                        "skipped, unfinished ones resumed, the report rewritten")
    d.add_argument("--adafocal-lam", type=_nonneg_float, default=None,
                   help="AdaFocal's λ (default: the benchmark's; the paper's 1 on MNIST-1D, "
                        "0.1 on digits, see the report)")
    d.add_argument("--n-bins", type=_positive_int, default=15, help="bins of every binned metric")
    d.add_argument("--data-arg", action="append", metavar="KEY=VALUE",
                   help="an option of the benchmark's data set, repeatable (its registered "
                        "options: " + data_options_help() + ")")
    d.add_argument("--train-arg", action="append", metavar="KEY=VALUE",
                   help="training setting of the recipe (a TrainConfig field), "
                        "repeatable: lr=0.05, momentum=0.9, weight_decay=5e-4, batch_size=64, "
                        "milestone_fractions=[0.5,0.75], lr_gamma=0.1, "
                        "model_kwargs={\"hidden\":[256,256]}")
    d.add_argument("--loss-arg", action="append", metavar="[LOSS:]KEY=VALUE",
                   help="a loss hyperparameter, repeatable: focal:gamma=2, ls:alpha=0.1 (as in "
                        "`torchcal train`); KEY=VALUE alone when --losses names one loss")
    d.add_argument("--device", default=None, metavar="auto|cpu|cuda|cuda:N",
                   help="where the runs train, as `torchcal train --device`: 'auto' (the "
                        "default: CUDA when available, else the CPU), 'cpu', 'cuda', 'cuda:N'")
    d.add_argument("--no-pack", action="store_true",
                   help="train every run as its own model (default: the runs train in packs "
                        "of a few runs, one vmapped model each, equal to float rounding; "
                        "see the guide's packed training page)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_figure_options(d)
    d.add_argument("--debug", action="store_true", help="show tracebacks")
    d.set_defaults(func=cmd_demo, interrupt_hint=_interrupt_hint)

"""The ``torchcal`` command line: ``train | eval | calibrate | report | demo | uncertainty | data``.

Each sub-command lives beside the code it drives and exposes ``register(subparsers)`` which
adds its parser and sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and
returning an exit code).  User mistakes raise :class:`torchcal.errors.TorchcalError` (or a
ValueError/OSError from argument checks or unusable paths) and are printed as one line, exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import TorchcalError

# module path -> registers these sub-commands
_SUBCOMMAND_MODULES = (
    "torchcal.train.cli",        # train, eval, calibrate
    "torchcal.report.cli",       # demo, report
    "torchcal.uncertainty.cli",  # uncertainty fit | eval
    "torchcal.data.cli",         # data list | check | download
)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="torchcal",
        description="Train calibrated classifiers, measure calibration, calibrate post hoc.",
    )
    parser.add_argument("--version", action="version", version=f"torchcal {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for modname in _SUBCOMMAND_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:  # a sub-command not built yet
            if exc.name != modname:
                raise
            continue
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("torchcal: interrupted", file=sys.stderr)
        return 130
    except (TorchcalError, OSError, ValueError) as exc:  # OSError: e.g. --out names a file
        if getattr(args, "debug", False):
            raise
        print(f"torchcal {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

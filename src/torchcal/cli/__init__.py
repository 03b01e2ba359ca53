"""The ``torchcal`` command line: ``train | eval | calibrate | report | demo | uncertainty | data``.

The command-line layer: the only package that uses argparse, and the only one allowed to import
every other layer (``train``, ``report``, ...).  Each sub-command is a module here
(:mod:`torchcal.cli.train`, ``eval``, ``calibrate``, ``report``, ``demo``, ``uncertainty``,
``data``) that exposes ``register(subparsers)``, which adds its parser and sets ``func`` (a
callable taking the parsed ``argparse.Namespace`` and returning an exit code); argument types
shared between them are in :mod:`torchcal.cli._args`.  User mistakes raise :class:`torchcal.errors.TorchcalError` (or a
ValueError/OSError from argument checks or unusable paths) and are printed as one line, exit status 2.
While a command runs, warnings are printed as one line (``torchcal CMD: warning: ...``, no source
line); the library itself leaves the warnings module alone.  Ctrl-C ends a command with exit
status 130 and one line saying how to continue (a sub-command sets ``interrupt_hint``).
"""

from __future__ import annotations

import argparse
import sys
import warnings

from .. import __version__
from ..errors import TorchcalError
from . import calibrate, data, demo, readme, report, train, uncertainty
from . import eval as eval_
from ._args import Parser, one_line_warnings

__all__ = ["main", "build_parser"]

# the sub-commands, in the order of `torchcal --help`
_SUBCOMMANDS = (train, eval_, calibrate, report, demo, uncertainty, data, readme)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="torchcal",
        description="Train calibrated classifiers, measure calibration, calibrate post hoc.",
    )
    parser.add_argument("--version", action="version", version=f"torchcal {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _SUBCOMMANDS:
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    args.argv = argv  # the command line, for the hint after Ctrl-C
    format_warning = warnings.formatwarning
    warnings.formatwarning = one_line_warnings(args.command)  # the display only, restored below
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        hint = getattr(args, "interrupt_hint", None)
        msg = hint(args) if hint is not None else None
        print(f"torchcal {args.command}: interrupted" + (f"; {msg}" if msg else ""),
              file=sys.stderr)
        return 130
    except (TorchcalError, OSError, ValueError) as exc:  # OSError: e.g. --out names a file
        if getattr(args, "debug", False):
            raise
        print(f"torchcal {args.command}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = format_warning


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

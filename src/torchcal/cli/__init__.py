"""The ``torchcal`` command line: ``train | eval | calibrate | report | demo | uncertainty | data``.

The command-line layer: the only package that uses argparse, and the only one allowed to import
every other layer (``train``, ``report``, ...).  Each sub-command is a module here
(:mod:`torchcal.cli.train`, ``eval``, ``calibrate``, ``report``, ``demo``, ``uncertainty``,
``data``) that exposes ``register(subparsers)``, which adds its parser and sets ``func`` (a
callable taking the parsed ``argparse.Namespace`` and returning an exit code); argument types
shared between them are in :mod:`torchcal.cli._args`.  Only the module of the command that runs
is imported (:data:`COMMAND_HELP` holds the names and help lines of ``torchcal --help``), so
``torchcal --version`` and ``--help`` start at once.  User mistakes raise :class:`torchcal.errors.TorchcalError` (or a
ValueError/OSError from argument checks or unusable paths) and are printed as one line, exit status 2;
any other exception too (:func:`describe_failure`: memory exhaustion with the size asked, anything
else as an unexpected error); ``--debug`` shows the traceback instead.
While a command runs, warnings are printed as one line (``torchcal CMD: warning: ...``, no source
line); the library itself leaves the warnings module alone.  Ctrl-C (SIGINT) and SIGTERM end
every command alike (:func:`~torchcal._signals.sigterm_interrupts`): the file being written is finished or rolled
back (torchcal's writers are atomic), one line names what was kept and the exact command that
continues (a sub-command sets ``interrupt_hint``; without one: the same command again), and the
exit status is 128 + the signal number (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import signal
import sys
import warnings

from .. import __version__
from .._signals import forget_handled_interrupt, interrupt_signal, sigterm_interrupts
from ..errors import TorchcalError, one_line_warnings
from ._args import Parser

__all__ = ["main", "build_parser", "describe_failure", "COMMAND_HELP"]

#: The sub-commands, in the order of ``torchcal --help``: name -> the line ``torchcal --help``
#: shows (each module's ``register`` gives the same, checked by tests/cli/test_cli_startup.py).
#: A command's module (``torchcal.cli.NAME``) is imported only when that command runs or its
#: help is shown, so ``torchcal --version`` / ``--help`` import no benchmark, data set,
#: scikit-learn or matplotlib, and the demo's help is built from the registries only then.
COMMAND_HELP = {
    "train": "train a classifier with a calibration loss",
    "eval": "evaluate a run's checkpoint into logits and results.json",
    "calibrate": "fit a post-hoc calibrator on saved logits",
    "report": "aggregate evaluated runs into tables and figures",
    "demo": "train the calibration losses on MNIST-1D (or noisy digits), test the papers' "
            "claims and report (CPU, no download)",
    "uncertainty": "pretrained uncertainty heads on a trained classifier (fit | eval)",
    "data": "list, check and download the data sets",
    "readme": "regenerate a README's generated blocks from committed results",
}


def command_module(name: str):
    """The module of sub-command ``name`` (``torchcal.cli.train``), imported now."""
    return importlib.import_module(f"{__name__}.{name}")


def chosen_command(argv: list[str]) -> str | None:
    """The sub-command an argument list runs: its first word when that names a command (the
    top-level options ``-h`` / ``--version`` take no value, so a command is always first);
    None otherwise (no command, an option, a misspelled command: argparse reports those).

    >>> chosen_command(["demo", "--quick"]), chosen_command(["--version"]), chosen_command(["trian"])
    ('demo', None, None)
    """
    return argv[0] if argv and argv[0] in COMMAND_HELP else None


_ALLOC = re.compile(r"tried to allocate (\d+) bytes|Tried to allocate ([\d.]+ [KMGTP]?i?B)")


def _size(n_bytes: int) -> str:
    """``40000000000000`` -> ``'36.4 TiB (40,000,000,000,000 bytes)'``."""
    v, unit = float(n_bytes), "bytes"
    for u in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if v < 1024:
            break
        v, unit = v / 1024, u
    return f"{v:.1f} {unit} ({n_bytes:,} bytes)" if unit != "bytes" else f"{n_bytes:,} bytes"


def describe_failure(exc: BaseException) -> str:
    """One line for any exception a command ends with: a user mistake
    (:class:`~torchcal.errors.TorchcalError`, ``ValueError``, ``OSError``) as its message;
    memory exhaustion as "out of memory" with the size asked; anything else as its type and
    message, pointing to ``--debug`` for the traceback.

    >>> describe_failure(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried "
    ...                               "to allocate 3200000000000 bytes. Error code 12"))
    'out of memory: an array of 2.9 TiB (3,200,000,000,000 bytes) was asked for; use fewer classes, samples or a smaller --width / --batch-size, or a machine with more memory'
    >>> describe_failure(KeyError("w"))
    "unexpected KeyError: 'w' (a bug: run again with --debug for the traceback and report it)"
    """
    text = " ".join(str(exc).split())
    m = _ALLOC.search(text)
    if isinstance(exc, MemoryError) or m or "out of memory" in text.lower():
        size = (_size(int(m.group(1))) if m and m.group(1) else m.group(2) if m else "")
        asked = f"an array of {size} was asked for" if size else "an allocation failed"
        return (f"out of memory: {asked}; use fewer classes, samples or a smaller --width / "
                "--batch-size, or a machine with more memory")
    if isinstance(exc, (TorchcalError, OSError, ValueError)):  # OSError: e.g. --out is a file
        return text
    return (f"unexpected {type(exc).__name__}: {text or 'no message'} (a bug: run again with "
            "--debug for the traceback and report it)")


def build_parser(commands: str | tuple[str, ...] | None = tuple(COMMAND_HELP)
                 ) -> argparse.ArgumentParser:
    """The ``torchcal`` parser.  ``commands``: the sub-commands whose parsers are built in full
    (their modules imported, their options added; default: all of them); each other one is a
    stub that only lists its name and help line (enough for ``--help``, ``--version`` and
    "did you mean" for a misspelled command)."""
    full = (commands,) if isinstance(commands, str) else tuple(commands or ())
    parser = Parser(
        prog="torchcal",
        description="Train calibrated classifiers, measure calibration, calibrate post hoc.",
    )
    parser.add_argument("--version", action="version", version=f"torchcal {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, line in COMMAND_HELP.items():
        if name in full:
            command_module(name).register(sub)
        else:
            sub.add_parser(name, help=line, add_help=False)
    return parser


def _interrupted(args: argparse.Namespace, exc: KeyboardInterrupt) -> int:
    """Print the one line of an interrupted command; its exit status (128 + the signal)."""
    signum = interrupt_signal(exc)
    try:
        name = signal.Signals(signum).name
    except ValueError:  # pragma: no cover - not a signal of this platform
        name = f"signal {signum}"
    hint = getattr(args, "interrupt_hint", None)
    msg: str | None = "every file written is whole; run it again: " + again_command(args)
    if hint is not None:
        with contextlib.suppress(Exception):  # a failing hint must not hide the interruption
            msg = hint(args)  # None: print nothing (a torchrun worker other than rank 0)
    if msg:
        prog = f"torchcal {args.command}".strip()
        print(f"{prog}: interrupted by {name}; {msg}", file=sys.stderr)
    return 128 + signum


def again_command(args: argparse.Namespace) -> str:
    """The command line that ran (``args.argv``), quoted for a shell: the command that
    continues a command whose work is redone from its inputs."""
    import shlex  # deferred: only after an interruption

    return shlex.join(["torchcal", *(getattr(args, "argv", None) or [args.command])])


def _parsed_after_interrupt(argv: list[str]) -> argparse.Namespace:
    """The command line of a command interrupted while it started, parsed again (so that its
    own hint names what it keeps); a bare namespace when that fails too."""
    with contextlib.suppress(BaseException):  # noqa: BLE001 - the interruption is reported anyway
        with contextlib.redirect_stderr(io.StringIO()):  # argparse's complaints are not the news
            args = build_parser(chosen_command(argv)).parse_args(argv)
        if getattr(args, "func", None):
            args.argv = argv
            return args
    return argparse.Namespace(command=chosen_command(argv) or "", argv=argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    format_warning = warnings.formatwarning
    args: argparse.Namespace | None = None
    try:
        # from the first line: a SIGTERM while the command's modules load interrupts it too
        with sigterm_interrupts():
            parser = build_parser(chosen_command(argv))
            args = parser.parse_args(argv)
            if not getattr(args, "func", None):
                parser.print_help()
                return 2
            args.argv = argv  # the command line, for the hint after Ctrl-C
            warnings.formatwarning = one_line_warnings(args.command)  # the display only
            return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:
        forget_handled_interrupt()  # handled here: the exit status is 128 + the signal
        if args is None or not getattr(args, "func", None):  # still starting: nothing written
            args = _parsed_after_interrupt(argv)
        return _interrupted(args, exc)
    except Exception as exc:  # the last line of defence: one line, the traceback with --debug
        if args is None or getattr(args, "debug", False):
            raise
        print(f"torchcal {args.command}: error: {describe_failure(exc)}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = format_warning


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

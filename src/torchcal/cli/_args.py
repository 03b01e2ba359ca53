"""Argument types and small helpers shared by the ``torchcal`` sub-commands.

The ``type=`` callables raise :class:`argparse.ArgumentTypeError`, which argparse prints as a
usage error naming the option.

Numbers on the terminal: calibration errors, error rates, accuracies and AUROCs are printed in
percent with a ``%`` sign (:func:`pct`, as the report's tables), NLL in nats (:func:`fmt`);
files (``results.json``, ``calib.json``, ...) always hold fractions.  Options that are shares
(``--val-fraction``, ``split=``) are fractions.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import re
import sys
from typing import Any, NoReturn

from .._registry import unknown_name
from ..errors import one_line_warnings  # noqa: F401 - the commands' import of it

__all__ = ["Parser", "positive_int", "even_int", "positive_float", "nonneg_float", "parse_loss_args",
           "parse_loss_args_per_loss", "fmt", "pct", "PERCENT_NOTE", "plain_text",
           "one_line_warnings", "add_figure_options", "figure_settings"]

#: The sentence the commands' --help epilogs use for the units of printed numbers.
PERCENT_NOTE = ("Printed ECE, error and AUROC values are in percent, NLL in nats; "
                "the JSON files hold fractions.")


_INVALID_CHOICE = re.compile(r"^argument (?P<arg>[^:]+): invalid choice: '?(?P<value>.*?)'? "
                             r"\(choose from (?P<choices>.*)\)$")


def choice_hint(message: str) -> str:
    """argparse's "invalid choice" message as torchcal's, with "did you mean" (difflib); other
    messages unchanged.

    >>> choice_hint("argument COMMAND: invalid choice: 'trian' (choose from 'train', 'eval')")
    "Unknown command 'trian'; did you mean 'train'?"
    >>> choice_hint("argument --amp: invalid choice: 'bf61' (choose from 'off', 'bf16')")
    "argument --amp: Unknown choice 'bf61'; did you mean 'bf16'?"
    """
    m = _INVALID_CHOICE.match(message)
    if not m:
        return message
    choices = [c.strip().strip("'\"") for c in m.group("choices").split(",")]
    arg = m.group("arg")
    if arg.isupper():  # a positional such as COMMAND: "Unknown command 'trian'; ..."
        return unknown_name(arg.lower(), m.group("value"), choices)
    return f"argument {arg}: " + unknown_name("choice", m.group("value"), choices)


class Parser(argparse.ArgumentParser):
    """argparse with torchcal's one-line errors: ``torchcal CMD: error: MESSAGE (see `torchcal
    CMD --help`)`` instead of a usage block, and "did you mean" for an invalid choice (the
    sub-parsers are of this class too)."""

    _argv: list[str] = []  # the command line being parsed (set by the top-level parse_args)

    def error(self, message: str) -> NoReturn:
        if message.startswith("the following arguments are required"):
            message = self._unknown_flags() or message  # a typo first: it may be the cause
        print(f"{self.prog}: error: {choice_hint(message)} (see `{self.prog} --help`)",
              file=sys.stderr)
        sys.exit(2)

    def _unknown_flags(self) -> str:
        """The error for the first ``--option`` of the command line that neither this
        parser nor an abbreviation of one of its options takes ('' if none)."""
        options = [o for a in self._actions for o in a.option_strings]
        for token in Parser._argv:
            flag = token.split("=", 1)[0]
            if flag.startswith("--") and flag != "--" and not any(
                    o.startswith(flag) for o in options):
                return unknown_option([flag], options)
        return ""

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        """argparse's ``parse_args``, but an unknown option is reported by the (sub-)command
        it was given to, with the nearest option of that command and its ``--help``
        (argparse reports it from the top-level parser: ``torchcal: error: unrecognized
        arguments``)."""
        Parser._argv = list(sys.argv[1:] if args is None else args)
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._chosen(ns)
            parser.error(unknown_option(extras, [o for a in parser._actions
                                                 for o in a.option_strings]))
        return ns

    def _chosen(self, ns: argparse.Namespace) -> argparse.ArgumentParser:
        """The deepest sub-command parser ``ns`` went through (``torchcal uncertainty fit``)."""
        parser: argparse.ArgumentParser = self
        while True:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            name = getattr(ns, subs[0].dest, None) if subs else None
            if name not in (subs[0].choices if subs else {}):
                return parser
            parser = subs[0].choices[name]


def unknown_option(extras: list[str], options: list[str]) -> str:
    """The error for arguments no option takes: the first unknown option with the nearest
    ones (difflib), or the stray values.

    >>> unknown_option(["--lossss", "x"], ["--loss", "--lr", "--help"])
    "Unknown option '--lossss'; did you mean '--loss'?"
    >>> unknown_option(["--zzz=1"], ["--loss"])
    "Unknown option '--zzz'"
    >>> unknown_option(["a", "b"], ["--loss"])
    'unexpected argument(s): a b'
    """
    flag = next((e.split("=", 1)[0] for e in extras if e.startswith("-") and e != "-"), None)
    if flag is None:
        return f"unexpected argument(s): {' '.join(extras)}"
    if difflib.get_close_matches(flag, options, n=1, cutoff=0.6):
        return unknown_name("option", flag, options)
    return f"Unknown option {flag!r}"


def positive_int(text: str) -> int:
    """An integer >= 1.

    >>> positive_int("3")
    3
    """
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def even_int(text: str) -> int:
    """A positive even integer (a batch of pairs)."""
    v = positive_int(text)
    if v % 2:
        raise argparse.ArgumentTypeError(f"expected an even batch size (pairs), got {text!r}")
    return v


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def nonneg_float(text: str) -> float:
    """A finite number >= 0.

    >>> nonneg_float("0.5")
    0.5
    """
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a finite non-negative number, got {text!r}")
    return v


def parse_loss_args(items: list[str] | None, option: str = "--loss-arg") -> dict[str, Any]:
    """``["gamma=3", "lam=0.1", "name=x"]`` -> ``{"gamma": 3, "lam": 0.1, "name": "x"}``.

    Values are read as JSON when they parse (numbers, true/false, null, lists), else as strings.

    >>> parse_loss_args(["gamma=3", "alpha=0.05", "flag=true", "kind=pytorch"])
    {'gamma': 3, 'alpha': 0.05, 'flag': True, 'kind': 'pytorch'}
    """
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, val = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise ValueError(f"Expected `{option}` as KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(val)
        except json.JSONDecodeError:
            out[key] = val
    return out


def parse_loss_args_per_loss(items: list[str] | None, losses: list[str] | tuple[str, ...],
                             option: str = "--loss-arg") -> dict[str, dict[str, Any]]:
    """``--loss-arg`` items as ``{loss: {key: value}}``: the syntax of ``train`` and ``demo``.

    An item is ``LOSS:KEY=VALUE``; ``KEY=VALUE`` (no loss named) is allowed when one loss is
    trained.  ``LOSS`` must be one of ``losses``.  Values are read as in :func:`parse_loss_args`.

    >>> parse_loss_args_per_loss(["focal:gamma=2", "ls:alpha=0.1"], ["focal", "ls"])
    {'focal': {'gamma': 2}, 'ls': {'alpha': 0.1}}
    >>> parse_loss_args_per_loss(["gamma=2", "focal:name=a:b"], ["focal"])
    {'focal': {'gamma': 2, 'name': 'a:b'}}
    """
    out: dict[str, dict[str, Any]] = {}
    for item in items or []:
        head = item.partition("=")[0]
        if ":" in head:
            loss, _, kv = item.partition(":")
            loss = loss.strip()
            if loss not in losses:
                raise ValueError(f"Expected `{option}` to name a trained loss "
                                 f"({', '.join(losses)}), got {item!r}: the command does not "
                                 f"train {loss!r}")
        elif len(losses) == 1:
            loss, kv = losses[0], item
        else:
            raise ValueError(f"Expected `{option}` as LOSS:KEY=VALUE when several losses are "
                             f"trained ({', '.join(losses)}), got {item!r}")
        out.setdefault(loss, {}).update(parse_loss_args([kv], option))
    return out


def pct(v: Any) -> str:
    """A fraction (ECE, error, AUROC) for a summary line, in percent: ``n/a`` when missing.

    >>> pct(0.12345), pct(None), pct(float("nan"))
    ('12.35%', 'n/a', 'n/a')
    """
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{100 * v:.2f}%"


_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")


def plain_text(doc: str) -> str:
    """A docstring's reStructuredText as plain text for ``--help``: inline literals lose their
    double backquotes, roles keep the last part of their target, ``Examples::`` ends in one colon.

    >>> plain_text("Run ``fit`` with :class:`~torchcal.uncertainty.UncertaintyHead`. Example::")
    'Run fit with UncertaintyHead. Example:'
    """
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], doc)
    return text.replace("``", "").replace("::", ":")


def fmt(v: Any) -> str:
    """A metric for a summary line: 4 decimals, ``n/a`` for a missing or non-finite value.

    >>> fmt(0.12345), fmt(None), fmt(float("nan"))
    ('0.1235', 'n/a', 'n/a')
    """
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.4f}"


def add_figure_options(parser: argparse.ArgumentParser) -> None:
    """The report's figure options, the same for ``torchcal demo`` and ``torchcal report``
    (read back by :func:`figure_settings`)."""
    parser.add_argument("--no-figures", action="store_true", help="tables only")
    parser.add_argument(
        "--figures", choices=("default", "all", "none"), default="default",
        help="which figures: default: every loss at once (reliability overview, confidence, "
             "OOD ROC, AdaFocal's γ); all: also each loss's reliability diagrams before and after "
             "temperature scaling (PNG by matplotlib, many times the default figures' CPU); "
             "none: as --no-figures")
    parser.add_argument(
        "--figure-format", choices=("svg", "png"), default="svg",
        help="format of the default figures: svg (default: written directly, a few "
             "percent of matplotlib's CPU) or png (matplotlib); --figures all's "
             "per-loss pairs are PNG either way")


def figure_settings(args: argparse.Namespace) -> dict[str, str]:
    """``figures`` and ``figure_format`` of the options :func:`add_figure_options` added."""
    return {"figures": "none" if args.no_figures else args.figures,
            "figure_format": args.figure_format}

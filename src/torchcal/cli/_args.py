"""Argument types and small helpers shared by the ``torchcal`` sub-commands.

The ``type=`` callables raise :class:`argparse.ArgumentTypeError`, which argparse prints as a
usage error naming the option.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

__all__ = ["positive_int", "even_int", "positive_float", "nonneg_float", "parse_loss_args", "fmt"]


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


def fmt(v: Any) -> str:
    """A metric for a summary line: 4 decimals, ``n/a`` for a missing or non-finite value.

    >>> fmt(0.12345), fmt(None), fmt(float("nan"))
    ('0.1235', 'n/a', 'n/a')
    """
    return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.4f}"

"""JSON: conversion to plain JSON (:func:`to_jsonable`, :func:`json_text`,
:func:`atomic_write_json`) and the one bounded reader of the JSON torchcal reads back
(:func:`read_json`, via :func:`~torchcal._io.bounded.read_bytes_bounded` and
:func:`parse_json`): only regular files of bounded size, with bounded nesting and integer
length and no NaN/Infinity.

The one module of :mod:`torchcal._io` that imports numpy and torch (tensors and arrays to
JSON; the vectorised nesting depth).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import RefusedJSONValueError as _Refused
from .atomic import atomic_write_text
from .bounded import read_bytes_bounded
from .verified import read_verified

__all__ = [
    "to_jsonable",
    "json_text",
    "atomic_write_json",
    "parse_json",
    "read_json",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT_DIGITS",
]

#: Largest JSON file :func:`read_json` reads (results, configs, manifests, calibrations).
MAX_JSON_BYTES = 16 << 20
#: Deepest nesting of arrays and objects :func:`parse_json` accepts.
MAX_JSON_DEPTH = 64
#: Most digits of a JSON integer :func:`parse_json` accepts (Python refuses > 4300 anyway).
MAX_JSON_INT_DIGITS = 64
_STRING_RE = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


def to_jsonable(x: Any) -> Any:
    """Plain-JSON version of ``x``: NaN/Inf -> None, tensors/arrays -> lists/numbers, paths -> str.

    >>> to_jsonable({"a": float("nan"), "b": torch.tensor([1.5]), "c": np.int64(2)})
    {'a': None, 'b': [1.5], 'c': 2}
    """
    if isinstance(x, Mapping):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, torch.Tensor):
        return to_jsonable(x.detach().cpu().tolist() if x.ndim else x.item())
    if isinstance(x, np.ndarray):
        return to_jsonable(x.tolist())
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return v if math.isfinite(v) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, Path):
        return str(x)
    return x


def json_text(obj: Any, *, indent: int | None = 2) -> str:
    """``to_jsonable(obj)`` as strict JSON (no NaN tokens) and a final newline: the text
    :func:`atomic_write_json` writes."""
    return json.dumps(to_jsonable(obj), indent=indent, allow_nan=False) + "\n"


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> Path:
    """Write ``to_jsonable(obj)`` as strict JSON (no NaN tokens) atomically."""
    return atomic_write_text(path, json_text(obj, indent=indent))


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-')):,} digits (at most "
                       f"{MAX_JSON_INT_DIGITS} allowed)")
    return int(text)


def _parse_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise _Refused(f"the number {text[:40]} overflows to {v}")
    return v


def _parse_constant(name: str) -> Any:
    raise _Refused(f"the non-finite value {name} (torchcal writes null)")


def _max_depth(data: bytes) -> int:
    """Deepest nesting of ``[``/``{`` outside strings (vectorised: no recursion, no loop)."""
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return 0
    arr = np.frombuffer(_STRING_RE.sub(b"", data), dtype=np.uint8)
    step = (((arr == ord("[")) | (arr == ord("{"))).astype(np.int32)
            - ((arr == ord("]")) | (arr == ord("}"))).astype(np.int32))
    return int(np.cumsum(step).max(initial=0))


def parse_json(data: bytes | str, *, what: str = "File", path: str | os.PathLike = "",
               error: type[Exception] = ValueError) -> Any:
    """Strict JSON of bounded shape: ``error`` naming ``path`` for invalid UTF-8 or JSON,
    nesting deeper than :data:`MAX_JSON_DEPTH`, integers longer than
    :data:`MAX_JSON_INT_DIGITS` digits, ``NaN``/``Infinity`` or numbers that overflow.

    >>> parse_json(b'{"a": [1, 2.5, null]}')
    {'a': [1, 2.5, None]}
    >>> parse_json("[" * 100, path="x.json")
    Traceback (most recent call last):
    ValueError: File 'x.json' is nested 100 levels deep (at most 64 allowed): refused
    """
    name = f"{what} {str(path)!r}"
    raw = data.encode("utf-8") if isinstance(data, str) else data
    depth = _max_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise error(f"{name} is nested {depth} levels deep (at most {MAX_JSON_DEPTH} allowed): "
                    "refused")
    try:
        text = raw.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                          parse_constant=_parse_constant)
    except UnicodeDecodeError as exc:
        raise error(f"{name} cannot be read: it is not UTF-8 text ({exc})") from None
    except _Refused as exc:
        raise error(f"{name} holds {exc}: refused") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise error(f"{name} is not valid JSON: {str(exc)[:200]}") from None


def read_json(path: str | os.PathLike, *, what: str = "File", error: type[Exception] = ValueError,
              max_bytes: int | None = None, verified: bool = False,
              hint: str = "do not use it") -> Any:
    """The one reader of JSON that torchcal reads back: :func:`read_bytes_bounded` (a regular
    file of at most ``max_bytes``, default :data:`MAX_JSON_BYTES`), then :func:`parse_json`;
    with ``verified`` the file is first checked against its SHA-256 file (:func:`read_verified`).

    Raises:
        FileNotFoundError: ``path`` does not exist (unless ``verified``: then ``error``).
        error: anything else, the message naming the file.
    """
    path = Path(path)
    max_bytes = MAX_JSON_BYTES if max_bytes is None else max_bytes
    if verified:
        if not path.exists():
            raise error(f"{what} {str(path)!r} does not exist")
        data = read_verified(path, what=what, error=error, hint=hint, max_bytes=max_bytes)
    else:
        try:
            data = read_bytes_bounded(path, max_bytes=max_bytes, what=what, error=error)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise error(f"{what} {str(path)!r} cannot be read: {exc}") from exc
    return parse_json(data, what=what, path=path, error=error)


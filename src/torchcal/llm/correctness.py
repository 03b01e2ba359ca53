"""Whether each answer is right: exact match, SQuAD's normalised match, or your own rule.

Each function takes N predicted answers (strings) and N references, each reference one
string or a non-empty list of acceptable strings (an answer is right when it matches any of
them), and returns an (N,) bool tensor: the ``correct`` of every metric and calibrator in
:mod:`torchcal.llm`.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["normalize_answer", "exact_match", "normalized_match", "match_with"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation (the official evaluation script's ``normalize_answer``):
    lower case, punctuation removed, the articles "a", "an", "the" removed, whitespace runs
    collapsed to one space and stripped.

    Example:
        >>> normalize_answer("  The Eiffel-Tower!  ")
        'eiffeltower'
        >>> normalize_answer("A  cat, an owl")
        'cat owl'
    """
    if not isinstance(text, str):
        raise TypeError(f"Expected a string answer, got {type(text).__name__}")
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _references(references: Sequence[Any], n: int) -> list[list[str]]:
    if isinstance(references, str) or len(references) != n:
        raise ValueError(f"Expected `references` to be a sequence of {n} references (one per "
                         f"prediction), got {type(references).__name__} of length "
                         f"{len(references) if not isinstance(references, str) else 'a string'}")
    out = []
    for i, r in enumerate(references):
        refs = [r] if isinstance(r, str) else list(r)
        if not refs:
            raise ValueError(f"Expected `references[{i}]` to hold at least one acceptable "
                             "answer, got an empty answer set")
        if not all(isinstance(x, str) for x in refs):
            raise TypeError(f"Expected `references[{i}]` to be a string or a list of strings")
        out.append(refs)
    return out


def _predictions(predictions: Sequence[Any]) -> list[str]:
    if isinstance(predictions, str):
        raise TypeError("Expected `predictions` to be a sequence of strings, got one string")
    preds = list(predictions)
    for i, p in enumerate(preds):
        if not isinstance(p, str):
            raise TypeError(f"Expected `predictions[{i}]` to be a string, got "
                            f"{type(p).__name__}")
    return preds


def match_with(predictions: Sequence[str], references: Sequence[Any],
               compare: Callable[[str, str], Any]) -> torch.Tensor:
    """``compare(prediction, reference)`` for every pair, True when any reference matches.

    Args:
        predictions: N answers.
        references: N references, each a string or a non-empty list of strings.
        compare: your rule, ``(prediction, reference) -> bool`` (e.g. a numeric tolerance,
            or a judge model's verdict).

    Example:
        >>> match_with(["3.0", "x"], ["3", ["4", "x "]], lambda p, r: p.strip() == r.strip()
        ...            or p.replace(".0", "") == r)
        tensor([True, True])
    """
    preds = _predictions(predictions)
    refs = _references(references, len(preds))
    if not callable(compare):
        raise TypeError(f"Expected `compare` to be callable, got {type(compare).__name__}")
    return torch.tensor([any(bool(compare(p, r)) for r in rs) for p, rs in zip(preds, refs, strict=True)],
                        dtype=torch.bool)


def exact_match(predictions: Sequence[str], references: Sequence[Any], *,
                strip: bool = True) -> torch.Tensor:
    """Right when the answer equals a reference character for character (after stripping
    surrounding whitespace, unless ``strip=False``).

    Example:
        >>> exact_match(["Paris", "paris", " 42 "], ["Paris", "Paris", ["41", "42"]])
        tensor([ True, False,  True])
    """
    if strip:
        return match_with(predictions, references, lambda p, r: p.strip() == r.strip())
    return match_with(predictions, references, lambda p, r: p == r)


def normalized_match(predictions: Sequence[str], references: Sequence[Any]) -> torch.Tensor:
    """Right when the normalised answer equals a normalised reference
    (:func:`normalize_answer`: SQuAD's exact-match score).

    Example:
        >>> normalized_match(["The Paris.", "Lyon"], ["paris", "Paris"])
        tensor([ True, False])
    """
    return match_with(predictions, references,
                      lambda p, r: normalize_answer(p) == normalize_answer(r))

"""Sequence-level confidence of a language model's answers, from what users have.

Inputs, in every function (torch tensors or NumPy arrays, results on the input's device):

* ``log_probs`` (N, T): the log-probability of each generated token (``<= 0``), and ``mask``
  (N, T) bool, True where a token belongs to the answer (padding and anything after the end
  of the answer False).  Masked-out positions may hold anything (``-inf``, NaN): they are
  never read.
* ``logits`` (N, T, V): the model's scores of the next token at each answer position, with
  ``tokens`` (N, T) the answer's token ids (:func:`token_log_probs` turns them into
  ``log_probs``).
* Hugging Face ``generate(..., output_scores=True, return_dict_in_generate=True)`` outputs:
  :func:`from_generate` turns ``sequences`` and ``scores`` into ``tokens``, ``log_probs``,
  ``mask`` and ``logits``.

Every score is computed over the answer's tokens at once (masked reductions, no Python loop
over tokens), in float64, and is oriented "higher = more confident" except
:func:`mean_token_entropy` (an uncertainty; :func:`confidence_scores` negates it).  An answer
with no token (a mask row all False) is refused with the indices of the empty rows: its
length-normalised score is 0/0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch

from .._validation import as_tensor

__all__ = [
    "GeneratedAnswers",
    "token_log_probs",
    "from_generate",
    "sequence_log_prob",
    "mean_log_prob",
    "length_normalized_prob",
    "min_token_prob",
    "mean_token_entropy",
    "confidence_scores",
    "p_true",
    "option_probs",
    "VERBAL_WORDS",
    "parse_verbal_confidence",
]


# ----------------------------------------------------------------------------- validation
def _float(x: Any, name: str, ndim: int) -> torch.Tensor:
    t = as_tensor(x, name)
    if not t.is_floating_point():
        if t.dtype == torch.bool or t.is_complex():
            raise TypeError(f"Expected `{name}` to be a real floating tensor, got {t.dtype}")
        t = t.to(torch.float64)
    if t.ndim != ndim:
        raise ValueError(f"Expected `{name}` to have {ndim} dimensions, got shape "
                         f"{tuple(t.shape)}")
    return t


def _mask(mask: Any, shape: tuple[int, ...], device: torch.device, like: str) -> torch.Tensor:
    m = as_tensor(mask, "mask")
    if tuple(m.shape) != tuple(shape):
        raise ValueError(f"Expected `mask` to have shape {tuple(shape)} like `{like}` (N, T), "
                         f"got {tuple(m.shape)}")
    if m.dtype != torch.bool:
        if m.is_floating_point() or m.is_complex() or bool(((m != 0) & (m != 1)).any()):
            raise TypeError(f"Expected `mask` to be bool (True = answer token) or 0/1 "
                            f"integers, got {m.dtype}")
        m = m.bool()
    m = m.to(device)
    empty = (~m.any(dim=1)).nonzero().flatten()
    if empty.numel():
        raise ValueError(f"Expected every answer to have at least one token in `mask`, got "
                         f"{empty.numel()} empty answer(s) at rows {empty[:5].tolist()}")
    return m


def _log_probs(log_probs: Any, mask: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_probs`` (N, T) float64 with masked-out entries set to 0, and the mask."""
    lp = _float(log_probs, "log_probs", 2)
    m = _mask(mask, tuple(lp.shape), lp.device, "log_probs")
    lp = lp.to(torch.float64)
    kept = lp[m]
    if bool(torch.isnan(kept).any()):
        raise ValueError("Expected `log_probs` to be free of NaN at the answer's tokens")
    if bool((kept > 1e-6).any()):
        raise ValueError(f"Expected `log_probs` to be log-probabilities (<= 0) at the "
                         f"answer's tokens, got a maximum of {float(kept.max()):.4g} (logits? "
                         f"use token_log_probs(logits, tokens))")
    return torch.where(m, lp.clamp(max=0.0), torch.zeros((), dtype=lp.dtype,
                                                          device=lp.device)), m


# ----------------------------------------------------------------------------- inputs
def token_log_probs(logits: Any, tokens: Any) -> torch.Tensor:
    """Per-token log-probabilities ``log softmax(logits[n, t])[tokens[n, t]]`` (N, T) float64.

    Args:
        logits: (N, T, V) next-token scores at each answer position (position t scores
            token t of the answer, as ``generate``'s ``scores`` do; for a forward pass over
            ``prompt + answer`` use the logits one position to the left of each answer token).
        tokens: (N, T) integer token ids of the answer (padding ids are fine: mask them out
            in the scores).

    Example:
        >>> z = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]]))
        >>> token_log_probs(z, torch.tensor([[0, 2]])).exp()
        tensor([[0.5000, 0.8000]], dtype=torch.float64)
    """
    z = _float(logits, "logits", 3)
    tok = as_tensor(tokens, "tokens").to(z.device)
    if tok.is_floating_point() or tok.dtype == torch.bool or tok.is_complex():
        raise TypeError(f"Expected `tokens` to be integer token ids, got {tok.dtype}")
    if tuple(tok.shape) != tuple(z.shape[:2]):
        raise ValueError(f"Expected `tokens` to have shape {tuple(z.shape[:2])} (N, T) like "
                         f"`logits` (N, T, V), got {tuple(tok.shape)}")
    tok = tok.long()
    if tok.numel() and (int(tok.min()) < 0 or int(tok.max()) >= z.shape[2]):
        raise ValueError(f"Expected `tokens` in [0, {z.shape[2]}) (the vocabulary of "
                         f"`logits`), got [{int(tok.min())}, {int(tok.max())}]")
    logp = torch.log_softmax(z.to(torch.float64), dim=-1)
    return logp.gather(2, tok.unsqueeze(2)).squeeze(2)


class GeneratedAnswers(NamedTuple):
    """The answers of a ``generate`` call, position t of each row the t-th generated token.

    Attributes:
        tokens: (N, T) int64 generated token ids.
        log_probs: (N, T) float64 ``log softmax(scores[t])`` of each generated token (0 where
            ``mask`` is False).
        mask: (N, T) bool, True for the answer's tokens.
        logits: (N, T, V) the stacked ``scores`` (for :func:`mean_token_entropy`).
    """

    tokens: torch.Tensor
    log_probs: torch.Tensor
    mask: torch.Tensor
    logits: torch.Tensor


def _ids(value: Any, name: str) -> list[int]:
    if value is None:
        return []
    items = [value] if isinstance(value, int) else list(value)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        raise TypeError(f"Expected `{name}` to be an int, a list of ints or None, got {value!r}")
    return items


def from_generate(sequences: Any, scores: Any, *, eos_token_id: Any = None,
                  pad_token_id: int | None = None, include_eos: bool = True
                  ) -> GeneratedAnswers:
    """Token log-probabilities and the answer mask from ``generate``'s outputs.

    For ``out = model.generate(..., output_scores=True, return_dict_in_generate=True)``
    (greedy search or sampling; for beam search use ``model.compute_transition_scores``):
    ``out.sequences`` (N, P + T) holds the prompt (decoder-only models; the decoder start
    token for encoder-decoder ones) and the T generated tokens, ``out.scores`` a tuple of T
    (N, V) tensors, the scores each generated token was chosen from.  The generated tokens
    are the last T columns of ``sequences``.

    The mask: a row's answer ends at its first ``eos_token_id`` (any of them, when a list);
    the end token itself is part of the answer when ``include_eos`` (the probability of
    stopping there), and everything after it is padding.  Tokens equal to ``pad_token_id``
    (when it is not an end token) are masked out too.

    ``scores`` are the *processed* scores (temperature, top-k, repetition penalty applied);
    to score the model's raw distribution pass ``out.logits`` (``output_logits=True``)
    instead.

    Args:
        sequences: (N, L) token ids, L >= T.
        scores: a sequence of T (N, V) tensors, or one (N, T, V) tensor.
        eos_token_id: an int, a list of ints, or None (no end token: every generated token
            counts unless it is ``pad_token_id``).
        pad_token_id: the padding id, or None.
        include_eos: count the end token in the answer (default True).

    Example:
        >>> seq = torch.tensor([[5, 1, 2, 0, 0], [5, 2, 0, 0, 0]])  # prompt [5], eos = pad = 0
        >>> sc = torch.zeros(2, 4, 3)  # uniform over 3 tokens
        >>> ans = from_generate(seq, sc, eos_token_id=0, pad_token_id=0)
        >>> ans.mask
        tensor([[ True,  True,  True, False],
                [ True,  True, False, False]])
        >>> sequence_log_prob(ans.log_probs, ans.mask) / math.log(1 / 3)
        tensor([3., 2.], dtype=torch.float64)
    """
    if isinstance(scores, (list, tuple)):
        if not scores:
            raise ValueError("Expected `scores` to hold one (N, V) tensor per generated token, "
                             "got an empty sequence")
        z = torch.stack([_float(s, "scores[t]", 2) for s in scores], dim=1)
    else:
        z = _float(scores, "scores", 3)
    seq = as_tensor(sequences, "sequences").to(z.device)
    if seq.ndim != 2 or seq.shape[0] != z.shape[0] or seq.shape[1] < z.shape[1]:
        raise ValueError(f"Expected `sequences` of shape (N, L) with N = {z.shape[0]} and "
                         f"L >= T = {z.shape[1]} (the scores' steps), got {tuple(seq.shape)}")
    tokens = seq[:, seq.shape[1] - z.shape[1]:].long()
    eos = _ids(eos_token_id, "eos_token_id")
    is_eos = torch.isin(tokens, torch.tensor(eos, dtype=torch.long, device=z.device)) \
        if eos else torch.zeros_like(tokens, dtype=torch.bool)
    ended = torch.cumsum(is_eos.long(), dim=1)  # end tokens so far, this one included
    mask = (ended - is_eos.long() == 0) if include_eos else (ended == 0)
    if pad_token_id is not None and pad_token_id not in eos:
        mask &= tokens != pad_token_id
    # positions after the end hold padding that the scores may give -inf: read only the mask
    safe = torch.where(mask, tokens, torch.zeros_like(tokens))
    lp = token_log_probs(z, safe)
    lp = torch.where(mask, lp, torch.zeros_like(lp))
    return GeneratedAnswers(tokens=tokens, log_probs=lp, mask=mask, logits=z)


# ----------------------------------------------------------------------------- scores
def sequence_log_prob(log_probs: Any, mask: Any) -> torch.Tensor:
    """The answer's log-probability ``sum_t mask_t log p_t`` (N,) float64.

    Example:
        >>> lp = torch.log(torch.tensor([[0.5, 0.5, 0.1], [0.9, 0.2, 1.0]]))
        >>> sequence_log_prob(lp, torch.tensor([[1, 1, 0], [1, 1, 1]])).exp()
        tensor([0.2500, 0.1800], dtype=torch.float64)
    """
    lp, _ = _log_probs(log_probs, mask)
    return lp.sum(dim=1)


def mean_log_prob(log_probs: Any, mask: Any) -> torch.Tensor:
    """Length-normalised log-probability ``sum_t mask_t log p_t / sum_t mask_t`` (N,) float64.

    Dividing by the answer's length keeps long answers from looking less certain just for
    being long (Malinin and Gales 2021).

    Example:
        >>> lp = torch.log(torch.tensor([[0.5, 0.5, 0.1], [0.9, 0.2, 1.0]]))
        >>> mean_log_prob(lp, torch.tensor([[1, 1, 0], [1, 1, 1]])).exp()  # 0.5; 0.18^(1/3)
        tensor([0.5000, 0.5646], dtype=torch.float64)
    """
    lp, m = _log_probs(log_probs, mask)
    return lp.sum(dim=1) / m.sum(dim=1).to(torch.float64)


def length_normalized_prob(log_probs: Any, mask: Any) -> torch.Tensor:
    """``exp(mean_log_prob)``: the geometric mean of the answer's token probabilities, in
    [0, 1] (N,) float64."""
    return mean_log_prob(log_probs, mask).exp()


def min_token_prob(log_probs: Any, mask: Any) -> torch.Tensor:
    """The smallest probability among the answer's tokens ``min_t p_t`` (N,) float64.

    Example:
        >>> lp = torch.log(torch.tensor([[0.5, 0.7, 0.1], [0.9, 0.2, 1.0]]))
        >>> min_token_prob(lp, torch.tensor([[1, 1, 0], [1, 1, 1]]))
        tensor([0.5000, 0.2000], dtype=torch.float64)
    """
    lp, m = _log_probs(log_probs, mask)
    return torch.where(m, lp, torch.zeros((), dtype=lp.dtype, device=lp.device)).amin(
        dim=1).exp()


def mean_token_entropy(logits: Any, mask: Any) -> torch.Tensor:
    """Mean over the answer's tokens of the next-token entropy ``H_t = -sum_v p_tv log p_tv``
    (nats; (N,) float64).  An *uncertainty*: higher = less confident.

    Args:
        logits: (N, T, V) next-token scores at the answer's positions.
        mask: (N, T) bool, True for the answer's tokens.

    Example:
        >>> z = torch.zeros(1, 3, 4)  # uniform over 4 tokens: H = log 4 at every position
        >>> mean_token_entropy(z, torch.tensor([[True, True, False]])) / math.log(4)
        tensor([1.], dtype=torch.float64)
    """
    z = _float(logits, "logits", 3)
    m = _mask(mask, tuple(z.shape[:2]), z.device, "logits")
    logp = torch.log_softmax(z.to(torch.float64), dim=-1)
    # p log p with p = 0 (a -inf logit) counted as 0
    h = -torch.where(logp.isneginf(), torch.zeros_like(logp), logp.exp() * logp).sum(dim=-1)
    h = torch.where(m, h, torch.zeros_like(h))
    if bool(torch.isnan(h).any()):
        raise ValueError("Expected `logits` to be free of NaN at the answer's tokens")
    return h.sum(dim=1) / m.sum(dim=1).to(torch.float64)


def confidence_scores(log_probs: Any, mask: Any, logits: Any = None) -> dict[str, torch.Tensor]:
    """Every token-based score at once, each (N,) float64, higher = more confident:

    ``"mean_log_prob"``, ``"length_normalized_prob"``, ``"sequence_log_prob"``,
    ``"sequence_prob"`` (its exp), ``"min_token_prob"`` and, given ``logits`` (N, T, V),
    ``"neg_mean_entropy"`` (minus :func:`mean_token_entropy`).  The probabilities among them
    are in [0, 1]; the others are ranking scores (calibrate them with
    :func:`~torchcal.llm.calibrate_scores` and ``scale="logit"``).
    """
    out = {"mean_log_prob": mean_log_prob(log_probs, mask)}
    out["length_normalized_prob"] = out["mean_log_prob"].exp()
    out["sequence_log_prob"] = sequence_log_prob(log_probs, mask)
    out["sequence_prob"] = out["sequence_log_prob"].exp()
    out["min_token_prob"] = min_token_prob(log_probs, mask)
    if logits is not None:
        out["neg_mean_entropy"] = -mean_token_entropy(logits, mask)
    return out


def p_true(logits: Any, yes_ids: Any, no_ids: Any, *, normalize: bool = True) -> torch.Tensor:
    """P(True) (Kadavath et al. 2022): the probability that the model says "yes" when asked
    whether its answer is right.

    The prompt is yours (e.g. ``"Question: ... Proposed answer: ... Is the proposed answer
    correct? Answer yes or no:"``); pass the (N, V) logits of the token that follows it.
    With ``normalize=True`` (default) ``P = p_yes / (p_yes + p_no)``, where ``p_yes`` sums
    the probabilities of every id in ``yes_ids`` (e.g. the ids of ``" yes"``, ``" Yes"``),
    so the mass on other tokens does not count; ``normalize=False`` returns ``p_yes`` under
    the full softmax.

    Args:
        logits: (N, V) next-token logits after the yes/no prompt.
        yes_ids: an int or a non-empty list of token ids meaning "yes".
        no_ids: an int or a non-empty list of token ids meaning "no" (disjoint from
            ``yes_ids``).
        normalize: renormalise over the yes and no tokens.

    Example:
        >>> z = torch.log(torch.tensor([[0.6, 0.2, 0.2], [0.1, 0.3, 0.6]]))
        >>> p_true(z, yes_ids=0, no_ids=1)  # 0.6 / 0.8; 0.1 / 0.4
        tensor([0.7500, 0.2500], dtype=torch.float64)
        >>> p_true(z, yes_ids=0, no_ids=1, normalize=False)
        tensor([0.6000, 0.1000], dtype=torch.float64)
    """
    z = _float(logits, "logits", 2)
    yes, no = _ids(yes_ids, "yes_ids"), _ids(no_ids, "no_ids")
    if not yes or not no:
        raise ValueError("Expected `yes_ids` and `no_ids` to name at least one token each")
    if set(yes) & set(no):
        raise ValueError(f"Expected `yes_ids` and `no_ids` to be disjoint, both hold "
                         f"{sorted(set(yes) & set(no))}")
    v = z.shape[1]
    bad = [i for i in yes + no if not 0 <= i < v]
    if bad:
        raise ValueError(f"Expected token ids in [0, {v}) (the vocabulary of `logits`), got "
                         f"{bad}")
    logp = torch.log_softmax(z.to(torch.float64), dim=1)
    ly = torch.logsumexp(logp[:, yes], dim=1)
    if not normalize:
        return ly.exp()
    ln = torch.logsumexp(logp[:, no], dim=1)
    return torch.sigmoid(ly - ln)


def option_probs(scores: Any, *, option_token_ids: Any = None, lengths: Any = None
                 ) -> torch.Tensor:
    """Multiple-choice confidence: the options' scores normalised over the options (Q, K).

    ``softmax_k(scores[q, k] / lengths[q, k])``: ``scores`` are either each option's summed
    log-likelihood of its continuation (what lm-evaluation-harness's ``loglikelihood``
    requests return) or each option's logit; the predicted option is the arg-max and its
    probability the answer's confidence.  ``lengths`` (e.g. the options' token or byte
    counts, lm-evaluation-harness's ``acc_norm``) normalise long continuations.  With
    ``option_token_ids`` (K,), ``scores`` are instead the (Q, V) next-token logits after a
    prompt that lists the options (``"A"``, ``"B"``, ...), and the options' scores are those
    tokens' logits.

    Example:
        >>> option_probs(torch.log(torch.tensor([[0.2, 0.1, 0.1]])))  # 0.2 / 0.4 ...
        tensor([[0.5000, 0.2500, 0.2500]], dtype=torch.float64)
        >>> option_probs(torch.tensor([[0.0, 5.0, 1.0, 1.0]]), option_token_ids=[2, 3])
        tensor([[0.5000, 0.5000]], dtype=torch.float64)
    """
    s = _float(scores, "scores", 2).to(torch.float64)
    if option_token_ids is not None:
        ids = _ids(option_token_ids, "option_token_ids")
        if not ids:
            raise ValueError("Expected `option_token_ids` to name at least one option")
        if not all(0 <= i < s.shape[1] for i in ids):
            raise ValueError(f"Expected `option_token_ids` in [0, {s.shape[1]}), got {ids}")
        s = s[:, ids]
    if s.shape[1] == 0:
        raise ValueError("Expected at least one option (K >= 1), got an empty answer set "
                         f"of shape {tuple(s.shape)}")
    if lengths is not None:
        n = _float(lengths, "lengths", 2).to(s)
        if n.shape != s.shape or bool((n <= 0).any()):
            raise ValueError(f"Expected `lengths` > 0 of shape {tuple(s.shape)} like the "
                             f"options' scores, got shape {tuple(n.shape)}")
        s = s / n
    if bool(torch.isnan(s).any()) or bool(torch.isposinf(s).any()):
        raise ValueError("Expected the options' scores to be free of NaN and +inf")
    return torch.softmax(s, dim=1)


# ----------------------------------------------------------------------------- verbalised
#: The default word map of :func:`parse_verbal_confidence` (lower case; longest match first).
VERBAL_WORDS: Mapping[str, float] = {
    "certain": 0.95, "almost certain": 0.95, "very high": 0.9, "high": 0.8, "likely": 0.7,
    "fairly high": 0.7, "medium": 0.5, "moderate": 0.5, "unsure": 0.4, "uncertain": 0.4,
    "unlikely": 0.3, "fairly low": 0.3, "low": 0.2, "very low": 0.1,
}

_NUM = r"(\d+(?:\.\d+)?|\.\d+)"
_VALUE = rf"{_NUM}\s*(%|percent\b|/\s*{_NUM})?"
_KEYWORD = re.compile(r"\bconfiden(?:ce|t)\b(?:\s+(?:level|score|rating))?\s*(?:[:=]|is\b|of\b)?"
                      r"\s*(?:about\s+|around\s+|approximately\s+)?", re.IGNORECASE)
_PERCENT = re.compile(rf"{_NUM}\s*(?:%|percent\b)", re.IGNORECASE)


def _number(num: str, suffix: str | None, denom: str | None) -> float | None:
    v = float(num)
    if suffix and denom is not None:
        d = float(denom)
        return v / d if d > 0 and v <= d else None
    if suffix:  # % or percent
        return v / 100 if v <= 100 else None
    if v <= 1:
        return v
    return v / 100 if v <= 100 else None


def _word_pattern(words: Mapping[str, float]) -> re.Pattern[str]:
    alts = sorted((re.escape(w.lower()) for w in words), key=len, reverse=True)
    return re.compile(r"(" + "|".join(alts) + r")\b", re.IGNORECASE)


def _parse_one(text: str, words: Mapping[str, float], word_re: re.Pattern[str]
               ) -> float | None:
    value_re = re.compile(_VALUE, re.IGNORECASE)
    for m in reversed(list(_KEYWORD.finditer(text))):  # the last "confidence: X" first
        rest = text[m.end():]
        num = value_re.match(rest)
        if num:
            return _number(num.group(1), num.group(2), num.group(3))
        word = word_re.match(rest)
        if word:
            return float(words[word.group(1).lower()])
    pct = list(_PERCENT.finditer(text))
    if pct:
        return _number(pct[-1].group(1), "%", None)
    bare = text.strip().rstrip(".!").strip().lower()
    whole = value_re.fullmatch(bare)
    if whole:
        return _number(whole.group(1), whole.group(2), whole.group(3))
    if bare in {w.lower() for w in words}:
        return float({w.lower(): p for w, p in words.items()}[bare])
    return None


def parse_verbal_confidence(texts: Sequence[str], *, words: Mapping[str, float] | None = None
                            ) -> tuple[torch.Tensor, list[int]]:
    """Parse verbalised confidences ("Confidence: 80%") into numbers in [0, 1].

    Grammar (case-insensitive), tried in this order on each text:

    1. **After a keyword**: ``confidence`` or ``confident`` (optionally followed by
       ``level``/``score``/``rating``, then ``:``, ``=``, ``is`` or ``of``, then optionally
       ``about``/``around``/``approximately``), the *last* such phrase in the text, followed
       by a value: ``80%``, ``80 percent``, ``0.8``, ``80`` (a number above 1 and at most 100
       is read as a percentage), ``8/10`` (a fraction), or a word of ``words``
       (``"Confidence: high"``).
    2. **A percentage anywhere**: the last ``N%`` or ``N percent`` in the text
       (``"I am 90% sure"``).
    3. **The whole text** (trailing ``.``/``!`` dropped) is a value as in 1: ``"0.8"``,
       ``"75"``, ``"3/4"``, ``"High"``.

    Values outside [0, 1] after these rules (``"150%"``, ``"confidence: 250"``, ``"7/5"``)
    and texts that match no rule are *unparsed*: NaN, and their indices are returned.

    Args:
        texts: the model's outputs (one string each).
        words: the word map (lower case words to probabilities), default
            :data:`VERBAL_WORDS`: certain / almost certain 0.95, very high 0.9, high 0.8,
            likely / fairly high 0.7, medium / moderate 0.5, unsure / uncertain 0.4,
            unlikely / fairly low 0.3, low 0.2, very low 0.1.

    Returns:
        ``(values, unparsed)``: (N,) float64 tensor with NaN where unparsed, and the list of
        unparsed indices.

    Example:
        >>> v, bad = parse_verbal_confidence(["Answer: 12. Confidence: 80%", "0.3",
        ...                                   "I'm 90 percent sure", "confidence: high",
        ...                                   "no idea", "Confidence: 7/10"])
        >>> v.tolist()[:4], bad, float(v[5])
        ([0.8, 0.3, 0.9, 0.8], [4], 0.7)
    """
    if isinstance(texts, str):
        raise TypeError("Expected `texts` to be a sequence of strings, got one string")
    words = dict(VERBAL_WORDS if words is None else words)
    for w, p in words.items():
        if not isinstance(w, str) or not w.strip() or not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"Expected `words` to map non-empty strings to probabilities in "
                             f"[0, 1], got {w!r}: {p!r}")
    words = {w.lower().strip(): float(p) for w, p in words.items()}
    word_re = _word_pattern(words)
    values: list[float] = []
    for i, t in enumerate(texts):  # one regular-expression pass per text (not per token)
        if not isinstance(t, str):
            raise TypeError(f"Expected `texts[{i}]` to be a string, got {type(t).__name__}")
        v = _parse_one(t, words, word_re)
        values.append(math.nan if v is None or not 0.0 <= v <= 1.0 else v)
    out = torch.tensor(values, dtype=torch.float64)
    return out, torch.isnan(out).nonzero().flatten().tolist()

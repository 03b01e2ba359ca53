"""Language models' answers you can trust: sequence-level confidence, its calibration against
correctness, and abstention.

* :mod:`~torchcal.llm.scores`: confidence of generated answers from token log-probabilities,
  logits or ``generate`` outputs (length-normalised log-probability, minimum token
  probability, mean token entropy, P(True), multiple-choice option probabilities, verbalised
  confidence).
"""

from __future__ import annotations

from .scores import (
    VERBAL_WORDS,
    GeneratedAnswers,
    confidence_scores,
    from_generate,
    length_normalized_prob,
    mean_log_prob,
    mean_token_entropy,
    min_token_prob,
    option_probs,
    p_true,
    parse_verbal_confidence,
    sequence_log_prob,
    token_log_probs,
)

__all__ = [
    # scores
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

"""Language models' answers you can trust: sequence-level confidence, its calibration against
correctness, and abstention.

* :mod:`~torchcal.llm.scores`: confidence of generated answers from token log-probabilities,
  logits or ``generate`` outputs (length-normalised log-probability, minimum token
  probability, mean token entropy, P(True), multiple-choice option probabilities, verbalised
  confidence).
* :mod:`~torchcal.llm.correctness`: whether each answer is right (exact match, SQuAD's
  normalised match, your own rule).
* :mod:`~torchcal.llm.calibrate`: a score's ECE, Brier, AUROC, AURC and AUGRC against
  correctness, its calibration (Platt, isotonic, beta, histogram; temperature on option
  scores) and its reliability diagram.
* :mod:`~torchcal.llm.abstention`: answer only above a threshold certified to keep the error
  among answered questions below ``eps`` (Learn-then-Test, through
  :class:`torchcal.conformal.SelectiveRiskControl`), the abstention curve, and conformal
  answer sets for multiple choice.
* :mod:`~torchcal.llm.integrations`: the same numbers for lm-evaluation-harness (per-sample
  logs, registered metrics) and a Hugging Face ``evaluate`` metric module.
"""

from __future__ import annotations

from .abstention import (
    AbstentionCurve,
    SplitCheck,
    abstention_curve,
    abstention_split_check,
    abstention_threshold,
    conformal_answer_sets,
)
from .calibrate import (
    CALIBRATORS,
    SCALES,
    ScoreCalibrator,
    calibrate_options,
    calibrate_scores,
    evaluate_confidence,
    reliability_diagram,
)
from .correctness import exact_match, match_with, normalize_answer, normalized_match
from .integrations import (
    calibration_report,
    lm_eval_aurc,
    lm_eval_ece,
    lm_eval_mc_item,
    register_lm_eval,
    sample_confidence,
    summarize_samples,
)
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
    # correctness
    "normalize_answer",
    "exact_match",
    "normalized_match",
    "match_with",
    # calibration
    "evaluate_confidence",
    "ScoreCalibrator",
    "calibrate_scores",
    "CALIBRATORS",
    "SCALES",
    "calibrate_options",
    "reliability_diagram",
    # abstention
    "abstention_threshold",
    "abstention_curve",
    "AbstentionCurve",
    "abstention_split_check",
    "SplitCheck",
    "conformal_answer_sets",
    # integrations
    "summarize_samples",
    "sample_confidence",
    "calibration_report",
    "lm_eval_mc_item",
    "lm_eval_ece",
    "lm_eval_aurc",
    "register_lm_eval",
]

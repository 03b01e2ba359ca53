"""ECE and the abstention curve where LLMs are evaluated: lm-evaluation-harness and Hugging
Face ``evaluate``.  Neither is imported by torchcal (both optional); the recipes below follow
their documented interfaces.

**lm-evaluation-harness** (``lm_eval``, tested beside this torch with 0.4.13).  Two ways:

1. *After a run*, from its per-sample log (``lm_eval ... --log_samples``, one JSON object
   per question in ``samples_<task>_*.jsonl``): :func:`summarize_samples` reads each record's
   ``filtered_resps`` (multiple choice: one ``[loglikelihood, is_greedy]`` pair per option)
   and ``target`` (the right option's index), or this module's own documented dicts (below),
   and returns ECE, Brier, AUROC, AURC, AUGRC and the abstention curve.
2. *Inside a run*, as metrics of a task: :func:`register_lm_eval` registers the metrics
   ``torchcal_ece`` and ``torchcal_aurc`` and their aggregations in lm_eval's registry.
   Their per-question items are ``(gold, probs)``, the items of lm_eval's own
   ``brier_score`` metric (``probs`` the softmax of the options' loglikelihoods), which a
   task's ``process_results`` returns (:func:`lm_eval_mc_item`); for generation tasks the
   items are ``(correct, confidence)``.  A task YAML::

       process_results: !function utils.process_results   # returns {"torchcal_ece": item, ...}
       metric_list:
         - metric: acc
         - metric: torchcal_ece
           aggregation: torchcal_ece
           higher_is_better: false

**Hugging Face evaluate**: ``examples/hf_evaluate/torchcal_calibration.py`` in the repository
is a metric module (``evaluate.load("path/to/torchcal_calibration.py")``) whose ``_compute(
predictions, references, confidences)`` calls :func:`calibration_report`.

Documented per-sample dicts of :func:`summarize_samples`:

* multiple choice: ``{"loglikelihoods": [ll_1, ..., ll_K], "gold": k}`` (optionally
  ``"lengths"``: the options' lengths for length-normalised probabilities);
* generation: ``{"token_logprobs": [lp_1, ..., lp_T], "correct": bool}`` (the confidence is
  the length-normalised probability ``exp(mean lp)``), or ``{"confidence": p, "correct":
  bool}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from .abstention import abstention_curve
from .calibrate import evaluate_confidence
from .correctness import exact_match
from .scores import length_normalized_prob, option_probs

__all__ = ["summarize_samples", "sample_confidence", "calibration_report", "lm_eval_mc_item",
           "lm_eval_ece", "lm_eval_aurc", "register_lm_eval"]


def _mc(loglikelihoods: Sequence[Any], gold: Any, lengths: Any = None) -> tuple[float, bool]:
    ll = torch.tensor([[float(x) for x in loglikelihoods]], dtype=torch.float64)
    n = None if lengths is None else torch.tensor([[float(x) for x in lengths]])
    p = option_probs(ll, lengths=n)[0]
    g = int(gold)
    if not 0 <= g < p.shape[0]:
        raise ValueError(f"Expected the gold index in [0, {p.shape[0]}), got {gold!r}")
    return float(p.max()), int(p.argmax()) == g


def sample_confidence(sample: Mapping[str, Any]) -> tuple[float, bool]:
    """``(confidence, correct)`` of one per-sample record (the formats of
    :func:`summarize_samples`)."""
    if "loglikelihoods" in sample:
        return _mc(sample["loglikelihoods"], sample["gold"], sample.get("lengths"))
    if "filtered_resps" in sample and "target" in sample:  # lm_eval --log_samples, MC
        resps = sample["filtered_resps"]
        lls = [r[0] if isinstance(r, (list, tuple)) else r for r in resps]
        return _mc(lls, sample["target"])
    if "token_logprobs" in sample:
        lp = torch.tensor([[float(x) for x in sample["token_logprobs"]]], dtype=torch.float64)
        conf = float(length_normalized_prob(lp, torch.ones_like(lp, dtype=torch.bool))[0])
        return conf, bool(sample["correct"])
    if "confidence" in sample:
        return float(sample["confidence"]), bool(sample["correct"])
    raise ValueError(f"Expected a sample with 'loglikelihoods' and 'gold', 'filtered_resps' and "
                     f"'target', 'token_logprobs' and 'correct', or 'confidence' and 'correct'; "
                     f"got keys {sorted(sample)}")


def _report(conf: torch.Tensor, correct: torch.Tensor, n_bins: int) -> dict[str, Any]:
    out: dict[str, Any] = evaluate_confidence(conf, correct, n_bins=n_bins)
    curve = abstention_curve(conf, correct)
    out["abstention_curve"] = {"threshold": curve.threshold.tolist(),
                               "coverage": curve.coverage.tolist(),
                               "selective_error": curve.selective_error.tolist()}
    return out


def summarize_samples(samples: Iterable[Mapping[str, Any]], *, n_bins: int = 15
                      ) -> dict[str, Any]:
    """ECE, Brier, AUROC, AURC, AUGRC (:func:`~torchcal.llm.evaluate_confidence`) and the
    abstention curve (as lists) of lm-evaluation-harness-style per-sample results.

    Example:
        >>> out = summarize_samples([
        ...     {"loglikelihoods": [-1.0, -3.0], "gold": 0},
        ...     {"filtered_resps": [[-2.0, False], [-0.5, True]], "target": 0},
        ...     {"token_logprobs": [-0.1, -0.2], "correct": True}], n_bins=5)
        >>> out["accuracy"], out["abstention_curve"]["coverage"]
        (0.6666666666666666, [0.3333333333333333, 0.6666666666666666, 1.0])
    """
    pairs = [sample_confidence(s) for s in samples]  # one record per question
    if not pairs:
        raise ValueError("Expected at least one sample, got none")
    conf = torch.tensor([p for p, _ in pairs], dtype=torch.float64)
    correct = torch.tensor([c for _, c in pairs], dtype=torch.bool)
    return _report(conf, correct, n_bins)


def calibration_report(predictions: Sequence[Any], references: Sequence[Any],
                       confidences: Sequence[float], *, n_bins: int = 15,
                       compare: Callable[[Sequence[str], Sequence[Any]], torch.Tensor] | None
                       = None) -> dict[str, Any]:
    """The body of the Hugging Face ``evaluate`` metric: answers are right when they equal
    their reference (integers or labels compared as they are; strings by ``compare``,
    default :func:`~torchcal.llm.exact_match`), and the confidences are measured against
    that (:func:`summarize_samples`'s output).

    Example:
        >>> r = calibration_report(["a", "b", "c"], ["a", "x", "c"], [0.9, 0.6, 0.3], n_bins=2)
        >>> r["accuracy"], r["auroc"]
        (0.6666666666666666, 0.5)
    """
    preds, refs = list(predictions), list(references)
    if len(preds) != len(refs) or len(preds) != len(confidences) or not preds:
        raise ValueError(f"Expected as many predictions, references and confidences (>= 1), "
                         f"got {len(preds)}, {len(refs)} and {len(confidences)}")
    if all(isinstance(p, str) for p in preds):
        correct = (compare or exact_match)(preds, refs)
    else:
        correct = torch.tensor([p == r for p, r in zip(preds, refs, strict=True)])
    conf = torch.tensor([float(c) for c in confidences], dtype=torch.float64)
    return _report(conf, correct, n_bins)


def lm_eval_mc_item(results: Sequence[Any], gold: int) -> tuple[int, list[float]]:
    """The item ``(gold, probs)`` of one multiple-choice question from lm_eval's
    ``process_results`` ``results`` (one ``(loglikelihood, is_greedy)`` per option): the
    items of lm_eval's ``brier_score`` metric, which :func:`lm_eval_ece` aggregates."""
    lls = [float(r[0]) if isinstance(r, (list, tuple)) else float(r) for r in results]
    return int(gold), option_probs(torch.tensor([lls], dtype=torch.float64))[0].tolist()


def _items(items: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(conf, correct) from ``(gold, probs)`` or ``(correct, confidence)`` items."""
    conf, correct = [], []
    for first, second in items:
        if isinstance(second, (int, float)) and not isinstance(second, bool):
            conf.append(float(second))
            correct.append(bool(first))
        else:
            p = [float(x) for x in second]
            k = max(range(len(p)), key=p.__getitem__)
            conf.append(p[k])
            correct.append(k == int(first))
    return (torch.tensor(conf, dtype=torch.float64), torch.tensor(correct, dtype=torch.bool))


def lm_eval_ece(items: Sequence[Any]) -> float:
    """lm_eval aggregation: the binary ECE (15 bins) of the questions' items."""
    conf, correct = _items(items)
    return evaluate_confidence(conf, correct)["ece"]


def lm_eval_aurc(items: Sequence[Any]) -> float:
    """lm_eval aggregation: the AURC of the questions' items (NaN for no item)."""
    if not items:
        return math.nan
    conf, correct = _items(items)
    return evaluate_confidence(conf, correct)["aurc"]


def register_lm_eval(register_metric: Callable[..., Any] | None = None,
                     register_aggregation: Callable[..., Any] | None = None) -> list[str]:
    """Register ``torchcal_ece`` and ``torchcal_aurc`` (metrics and aggregations) in
    lm-evaluation-harness's registry (``lm_eval.api.registry``'s decorators, or the ones
    given); returns the registered names.  Call it before ``lm_eval.simple_evaluate`` (or
    from the module of a task's ``!function``)."""
    if register_metric is None or register_aggregation is None:
        # deferred: lm-evaluation-harness is an optional dependency, imported only here
        from lm_eval.api import registry

        register_metric = register_metric or registry.register_metric
        register_aggregation = register_aggregation or registry.register_aggregation
    names = []
    for name, agg in (("torchcal_ece", lm_eval_ece), ("torchcal_aurc", lm_eval_aurc)):
        register_aggregation(name)(agg)
        register_metric(metric=name, higher_is_better=False, aggregation=name,
                        output_type=["multiple_choice", "generate_until", "loglikelihood"]
                        )(_passthrough)
        names.append(name)
    return names


def _passthrough(items: Any) -> Any:
    """lm_eval's per-sample metric function of the registered metrics: the items as they are
    (as for its ``brier_score``)."""
    return items

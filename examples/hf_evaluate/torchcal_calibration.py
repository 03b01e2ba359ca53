"""A Hugging Face ``evaluate`` metric module: the calibration of answers' confidences.

    import evaluate
    metric = evaluate.load("examples/hf_evaluate/torchcal_calibration.py")
    metric.compute(predictions=["Paris", "Lyon"], references=["Paris", "Paris"],
                   confidences=[0.9, 0.7])
    # {'ece': ..., 'brier': ..., 'auroc': ..., 'aurc': ..., 'augrc': ..., 'accuracy': ...,
    #  'abstention_curve': {'threshold': [...], 'coverage': [...], 'selective_error': [...]}}

An answer is right when it equals its reference (strings: torchcal.llm.exact_match, after
stripping whitespace); ``confidences`` are in [0, 1].  The numbers come from
torchcal.llm.calibration_report (binary ECE with 15 equal-width bins, Brier, AUROC, AURC,
AUGRC, and the abstention curve).
"""

import datasets
import evaluate

from torchcal.llm.integrations import calibration_report

_DESCRIPTION = __doc__
_CITATION = ""
_KWARGS_DESCRIPTION = """
Args:
    predictions: the model's answers (strings or class ids).
    references: the right answers, one per prediction.
    confidences: the model's confidence in each answer, in [0, 1].
    n_bins: equal-width bins of the ECE (default 15).
Returns:
    ece, brier, auroc, aurc, augrc, accuracy, mean_confidence, n, abstention_curve.
"""


class TorchcalCalibration(evaluate.Metric):
    """ECE, Brier, AUROC, AURC, AUGRC and the abstention curve of answers' confidences."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features({"predictions": datasets.Value("string"),
                                   "references": datasets.Value("string"),
                                   "confidences": datasets.Value("float64")}),
                datasets.Features({"predictions": datasets.Value("int64"),
                                   "references": datasets.Value("int64"),
                                   "confidences": datasets.Value("float64")}),
            ],
        )

    def _compute(self, predictions, references, confidences, n_bins=15):
        return calibration_report(predictions, references, confidences, n_bins=n_bins)

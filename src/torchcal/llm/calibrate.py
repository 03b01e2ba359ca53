"""A confidence score against correctness: its metrics, its calibration, its reliability
diagram.

``conf`` is one number per answer (higher = more confident), ``correct`` whether the answer
was right ((N,) bool or 0/1, e.g. from :func:`~torchcal.llm.exact_match`).  The metrics are
those of a binary problem (:mod:`torchcal.metrics`, ``task="binary"``): is the answer right,
with probability ``conf``?  The calibrators are :mod:`torchcal.posthoc`'s binary ones, fitted
on the score turned into the two-column logits ``[0, s]`` they expect (``s`` the score's
log-odds).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from .. import metrics as M
from .. import plot
from .._validation import as_tensor
from ..metrics import bin_index
from ..posthoc import (
    BetaCalibration,
    Estimator,
    HistogramBinning,
    IsotonicCalibration,
    PlattScaling,
    TemperatureScaling,
    calibrator_from_dict,
)
from ..regression.predictive import like

__all__ = ["evaluate_confidence", "ScoreCalibrator", "calibrate_scores", "CALIBRATORS",
           "SCALES", "calibrate_options", "reliability_diagram", "check_correct",
           "check_confidence"]

#: The methods of :class:`ScoreCalibrator` (the first is the default).
CALIBRATORS = ("platt", "isotonic", "beta", "histogram")
#: The scales of :class:`ScoreCalibrator`: what the scores are.
SCALES = ("probability", "logit")


def check_correct(correct: Any, n: int | None = None) -> torch.Tensor:
    """``correct`` as an (N,) bool tensor (bool or 0/1 integers), with one clear line when it
    is not."""
    c = as_tensor(correct, "correct")
    if c.ndim != 1 or (n is not None and c.shape[0] != n):
        raise ValueError(f"Expected `correct` to have shape ({'N' if n is None else n},) like "
                         f"the confidences, got {tuple(c.shape)}")
    if c.dtype != torch.bool:
        if c.is_floating_point() or c.is_complex() or bool(((c != 0) & (c != 1)).any()):
            raise TypeError(f"Expected `correct` to be bool or 0/1 integers, got {c.dtype}")
        c = c.bool()
    return c


def check_confidence(conf: Any, name: str = "conf", *, probability: bool = True
                     ) -> torch.Tensor:
    """(N,) float64 scores, non-empty and finite; with ``probability=True`` in [0, 1]."""
    s = as_tensor(conf, name)
    if s.dtype == torch.bool or s.is_complex():
        raise TypeError(f"Expected `{name}` to be real numbers, got {s.dtype}")
    s = s.to(torch.float64)
    if s.ndim != 1 or s.shape[0] == 0:
        raise ValueError(f"Expected `{name}` to be a non-empty 1-D tensor (N,), got shape "
                         f"{tuple(s.shape)}")
    if not bool(torch.isfinite(s).all()):
        raise ValueError(f"Expected `{name}` to be finite, got {int((~torch.isfinite(s)).sum())}"
                         " NaN/inf value(s) (unparsed verbal confidences? drop those answers)")
    if probability and (bool((s < 0).any()) or bool((s > 1).any())):
        raise ValueError(f"Expected `{name}` to be probabilities in [0, 1], got values in "
                         f"[{float(s.min()):.4g}, {float(s.max()):.4g}] (a log-probability or "
                         "other score? use scale='logit', or exp() it)")
    return s


def evaluate_confidence(conf: Any, correct: Any, *, n_bins: int = 15) -> dict[str, float]:
    """How well a confidence in [0, 1] predicts that an answer is right.

    * ``"ece"``: :func:`torchcal.metrics.ece` with ``task="binary"`` (``n_bins`` equal-width
      bins, right-closed: the binned ``conf`` against the share of right answers).
    * ``"brier"``: ``mean (conf - correct)^2`` (the binary Brier score; half of
      :func:`torchcal.metrics.brier` on the two columns ``[1 - conf, conf]``).
    * ``"auroc"``: :func:`torchcal.metrics.auroc` of ``conf`` for right against wrong (NaN,
      with a warning, when every answer is right or every one wrong).
    * ``"aurc"``, ``"augrc"``: :func:`torchcal.metrics.aurc` and
      :func:`torchcal.metrics.augrc` (Riemann rule) with the uncertainty ``-conf``: the area
      under the (generalised) risk-coverage curve of abstaining on the least confident.
    * ``"accuracy"``, ``"mean_confidence"``, ``"n"``.

    Example:
        >>> r = evaluate_confidence(torch.tensor([0.9, 0.8, 0.3, 0.6]),
        ...                         torch.tensor([1, 1, 0, 0]), n_bins=2)
        >>> round(r["ece"], 4), round(r["brier"], 4), r["auroc"]  # ECE (0.3 + 3 * 0.1) / 4
        (0.15, 0.125, 1.0)
    """
    s = check_confidence(conf)
    c = check_correct(correct, s.shape[0])
    out = {"n": float(s.shape[0]), "accuracy": float(c.double().mean()),
           "mean_confidence": float(s.mean())}
    out["ece"] = float(M.ece(probs=s, labels=c.long(), n_bins=n_bins, task="binary"))
    out["brier"] = float(((s - c.double()) ** 2).mean())
    if bool(c.all()) or not bool(c.any()):
        warnings.warn(f"AUROC is undefined when every answer is {'right' if c.all() else 'wrong'}"
                      f" ({s.shape[0]} answers): reported as NaN", stacklevel=2)
        out["auroc"] = math.nan
    else:
        out["auroc"] = float(M.auroc(scores=s, labels=c))
    out["aurc"] = float(M.aurc(uncertainty=-s, correct=c))
    out["augrc"] = float(M.augrc(uncertainty=-s, correct=c))
    return out


def _check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"Expected `{name}` to be one of {choices}, got {value!r}")
    return value


class ScoreCalibrator(Estimator):
    """Map a confidence score to the probability that the answer is right.

    The score ``s`` (``scale="probability"``: ``p`` in [0, 1], turned into its log-odds
    ``logit(p)``, clipped at 1e-12 from 0 and 1; ``scale="logit"``: any real score, e.g. a
    mean log-probability or a negative entropy, taken as it is) becomes the two-column logits
    ``[0, s]`` and ``correct`` the labels of a binary problem, on which a
    :mod:`torchcal.posthoc` calibrator is fitted:

    * ``"platt"``: :class:`~torchcal.posthoc.PlattScaling`, ``sigmoid(a s + b)``.
    * ``"beta"``: :class:`~torchcal.posthoc.BetaCalibration` on ``p = sigmoid(s)``.
    * ``"isotonic"``: :class:`~torchcal.posthoc.IsotonicCalibration` (needs scikit-learn).
    * ``"histogram"``: :class:`~torchcal.posthoc.HistogramBinning` (``n_bins`` equal-mass
      bins): the bin's share of right answers.  That calibrator bins the *top-label*
      confidence ``max(p, 1 - p)``, which would fold the scores below 1/2 onto those above
      it, so the score is first standardised (``u = (s - mean) / std`` of the fit's scores)
      and mapped monotonically into (1/2, 1) as ``(1 + sigmoid(u)) / 2``; the fitted bins
      (``edges_``, ``bin_values_``) are then looked up on that scale, and a bin empty at
      fit time gives the fit's accuracy.

    The calibrated probability is fitted to the score's relation to correctness on the
    calibration answers; it holds on new answers drawn like them (same model, prompt and
    kind of question).

    Args:
        method: one of :data:`CALIBRATORS`.
        scale: one of :data:`SCALES`.
        n_bins: bins of ``"histogram"``.

    Attributes:
        calibrator_: the fitted :mod:`torchcal.posthoc` calibrator.
        shift_, scale_ (float): the standardisation of ``"histogram"`` (0 and 1 otherwise).
        base_rate_ (float): the fit's share of right answers.

    Example:
        >>> s = torch.tensor([0.9, 0.9, 0.6, 0.6, 0.6, 0.3, 0.3, 0.9])
        >>> ok = torch.tensor([1, 1, 1, 0, 0, 0, 1, 0])
        >>> ScoreCalibrator("histogram", n_bins=3).fit(s, ok).predict(torch.tensor([0.6]))
        tensor([0.3333], dtype=torch.float64)
    """

    _fitted_attr = "calibrator_"

    def __init__(self, method: str = "platt", scale: str = "probability", n_bins: int = 15
                 ) -> None:
        _check_choice(method, "method", CALIBRATORS)
        _check_choice(scale, "scale", SCALES)
        if not isinstance(n_bins, int) or isinstance(n_bins, bool) or n_bins < 1:
            raise ValueError(f"Expected `n_bins` to be a positive integer, got {n_bins!r}")
        self.method = method
        self.scale = scale
        self.n_bins = n_bins

    def _log_odds(self, scores: Any) -> torch.Tensor:
        s = check_confidence(scores, "scores", probability=self.scale == "probability")
        if self.scale == "probability":
            s = torch.logit(s.clamp(1e-12, 1 - 1e-12))
        return s

    def _histogram_logits(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-label confidence ``(1 + sigmoid(u)) / 2`` and its two-column logits."""
        # softmax of these logits gives back ``conf`` (to rounding) with class 1 on top
        u = (s - self.shift_) / self.scale_
        conf = (1 + torch.sigmoid(u)) / 2
        return conf, torch.stack([torch.zeros_like(u), torch.log(conf / (1 - conf))], dim=1)

    def fit(self, scores: Any, correct: Any) -> ScoreCalibrator:
        """Fit on calibration answers' ``scores`` (N,) and ``correct`` (N,); returns self."""
        _check_choice(self.method, "method", CALIBRATORS)
        s = self._log_odds(scores)
        c = check_correct(correct, s.shape[0])
        self.base_rate_ = float(c.double().mean())
        self.shift_, self.scale_ = 0.0, 1.0
        if self.method == "histogram":
            std = float(s.std()) if s.shape[0] > 1 else 0.0
            self.shift_, self.scale_ = float(s.mean()), std if std > 0 else 1.0
            cal: Any = HistogramBinning(n_bins=self.n_bins)
            z = self._histogram_logits(s)[1]
        else:
            cal = {"platt": PlattScaling, "beta": BetaCalibration,
                   "isotonic": IsotonicCalibration}[self.method]()
            z = torch.stack([torch.zeros_like(s), s], dim=1)
        self.calibrator_ = cal.fit(z, c.long())
        return self

    def predict(self, scores: Any) -> Any:
        """The calibrated probability that each answer is right (N,) float64 (NumPy in, NumPy
        out)."""
        self._check_fitted()
        s = self._log_odds(scores)
        if self.method == "histogram":
            # the top-1 confidence exactly as the calibrator computed it at fit time
            conf = torch.softmax(self._histogram_logits(s)[1], dim=1).amax(dim=1)
            cal = self.calibrator_
            h = cal.bin_values_.to(s.device)[bin_index(conf, cal.edges_.to(s.device))]
            q = torch.where(torch.isnan(h), torch.full_like(h, self.base_rate_), h)
        else:
            z = torch.stack([torch.zeros_like(s), s], dim=1)
            q = self.calibrator_.predict_proba(z)[:, 1].to(torch.float64)
        return like(q, scores)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (settings and the inner calibrator's ``to_dict``)."""
        self._check_fitted()
        return {"type": type(self).__name__, "method": self.method, "scale": self.scale,
                "n_bins": self.n_bins, "shift": self.shift_, "std": self.scale_,
                "base_rate": self.base_rate_, "calibrator": self.calibrator_.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScoreCalibrator:
        """Rebuild a fitted calibrator from :meth:`to_dict`'s output."""
        if not isinstance(d, dict) or d.get("type") != cls.__name__:
            raise ValueError(f"Expected a dict from {cls.__name__}.to_dict()")
        obj = cls(method=d["method"], scale=d["scale"], n_bins=d["n_bins"])
        obj.shift_, obj.scale_ = float(d["shift"]), float(d["std"])
        obj.base_rate_ = float(d["base_rate"])
        obj.calibrator_ = calibrator_from_dict(d["calibrator"])
        return obj


def calibrate_scores(scores: Any, correct: Any, method: str = "platt", *,
                     scale: str = "probability", n_bins: int = 15) -> ScoreCalibrator:
    """``ScoreCalibrator(method, scale, n_bins).fit(scores, correct)``.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> conf = torch.rand(2000, generator=g, dtype=torch.float64)
        >>> right = torch.rand(2000, generator=g, dtype=torch.float64) < conf ** 2  # too sure
        >>> cal = calibrate_scores(conf, right, "isotonic")
        >>> ece = evaluate_confidence(conf, right)["ece"]
        >>> ece > 0.1 and evaluate_confidence(cal.predict(conf), right)["ece"] < 0.02
        True
    """
    return ScoreCalibrator(method=method, scale=scale, n_bins=n_bins).fit(scores, correct)


def calibrate_options(scores: Any, answers: Any, *, lengths: Any = None,
                      method: str = "nll") -> TemperatureScaling:
    """Temperature scaling of multiple-choice option scores: a
    :class:`~torchcal.posthoc.TemperatureScaling` fitted on the (Q, K) options' scores
    (log-likelihoods or logits, divided by ``lengths`` when given, as in
    :func:`~torchcal.llm.option_probs`) with the right option's index (Q,).  Its
    ``predict_proba(scores / lengths)`` are the calibrated option probabilities."""
    s = as_tensor(scores, "scores")
    if s.ndim != 2 or s.shape[1] == 0:
        raise ValueError(f"Expected `scores` of shape (Q, K) with K >= 1 options, got "
                         f"{tuple(s.shape)}")
    if lengths is not None:
        n = as_tensor(lengths, "lengths").to(s.device, torch.float64)
        if n.shape != s.shape or bool((n <= 0).any()):
            raise ValueError(f"Expected `lengths` > 0 of shape {tuple(s.shape)}")
        s = s.to(torch.float64) / n
    return TemperatureScaling(method=method).fit(s, answers)


def reliability_diagram(conf: Any, correct: Any, **kwargs: Any) -> Any:
    """:func:`torchcal.plot.reliability_diagram` of a confidence in [0, 1] against
    correctness (``task="binary"``; ``kwargs``: ``n_bins``, ``title``, ``path``, ``ax`` ...).
    Returns the matplotlib figure."""
    s = check_confidence(conf)
    c = check_correct(correct, s.shape[0])
    return plot.reliability_diagram(probs=s, labels=c.long(), task="binary", **kwargs)

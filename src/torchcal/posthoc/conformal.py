"""Split-conformal prediction sets for classifiers: LAC, APS and RAPS, randomised or not,
marginal or class-conditional (Mondrian)."""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import numpy as np
import torch

from .._validation import check_alpha, check_labels, check_nonneg_finite, check_positive_int
from ..conformal import conformal_rank
from ..metrics import IGNORE_INDEX
from ._checks import (
    check_choice,
    check_dense_logits,
    check_n_classes,
    dense_axis,
    finite_float,
    float_list,
    prepare_fit,
    prepare_logits,
)
from ._layout import apply_rows, fit_rows, like_input, row_chunks
from .base import Estimator

__all__ = ["ConformalClassifier", "RAPS_LAMBDAS", "RAPS_TUNE_FRACTION"]

_METHODS = ("lac", "aps", "raps")
_CONDITIONAL = (None, "class")
#: The λ values the reference RAPS code tries when ``lam`` is not given (its ``pick_lamda_size``).
RAPS_LAMBDAS = (0.001, 0.01, 0.1, 0.2, 0.5)
#: The share of the calibration data the reference RAPS code sets aside to choose ``k_reg``
#: and ``lam`` (its ``pct_paramtune``).
RAPS_TUNE_FRACTION = 0.3


def _check_bool(value: Any, name: str, allow_none: bool = False) -> Any:
    if not (isinstance(value, bool) or (allow_none and value is None)):
        raise ValueError(f"Expected `{name}` to be a bool{' or None' if allow_none else ''}, "
                         f"got {value!r}")
    return value


def as_ndim(x: Any) -> int:
    """The number of dimensions of a tensor or array (0 for anything else)."""
    return int(getattr(x, "ndim", 0))


def _kth(s: torch.Tensor, alpha: float) -> float:
    """The conformal threshold of scores ``s``: the k-th smallest, ``inf`` when ``k > n``."""
    n = s.shape[0]
    k = conformal_rank(n, alpha)
    return math.inf if k > n else float(torch.kthvalue(s.cpu(), k).values)


class ConformalClassifier(Estimator):
    r"""Split-conformal prediction sets with a coverage guarantee.

    Fit on held-out calibration logits: every sample gets a non-conformity score
    ``s(x_i, y_i)``, and the threshold ``q`` is the ``k``-th smallest of the n scores with
    ``k = ceil((n + 1)(1 - alpha))``.  The prediction set of a new ``x`` is
    ``{y : s(x, y) <= q}``.  If the calibration and test samples are exchangeable, the set
    contains the true label with probability at least ``1 - alpha``, and (scores without
    ties, e.g. randomised ones) at most ``1 - alpha + 1 / (n + 1)``, whatever the model.
    Scores, with ``p = softmax(z)`` in float64, ``p_(1) >= p_(2) >= ...`` the sorted
    probabilities, ``r`` the (1-based) rank of the candidate label and ``u ~ U(0, 1)`` one
    draw per sample:

    * ``"lac"`` (Sadinle et al. 2019): ``s = 1 - p_y``; the smallest sets on average.
    * ``"aps"`` (Romano et al. 2020): ``s = p_(1) + ... + p_(r)`` (``randomized=False``) or
      ``p_(1) + ... + p_(r-1) + u p_(r)`` (``randomized=True``, the published form: the
      deterministic score's sets are much larger and give empty sets to confident correct
      predictions); sets grow with the model's uncertainty.
    * ``"raps"`` (Angelopoulos et al. 2021, "Uncertainty sets for image classifiers using
      conformal prediction"): the APS score plus ``lam * max(0, r - k_reg)``.  When ``k_reg``
      or ``lam`` is None (the default) it is chosen as the reference code does: 30 % of the
      calibration samples (``RAPS_TUNE_FRACTION``, drawn with ``random_state``) are set aside;
      ``k_reg`` is one plus the ``1 - alpha`` quantile (the next higher value) of the
      0-based ranks of their labels, ``lam`` the first value of ``RAPS_LAMBDAS`` with the
      smallest mean set size when RAPS is calibrated and evaluated on them; the threshold is
      calibrated on the other 70 %.

    ``include_top_label`` puts the most probable class in every set (no empty sets; the
    reference RAPS code's ``allow_zero_sets=False``).  The guarantee ``>= 1 - alpha`` still
    holds (sets only grow), the upper bound does not.  Departure: the reference code then also
    leaves the calibration score of a label ranked first unrandomised (``p_(1)``); on a
    confident model that raises ``q`` and the sets (digits, logistic regression, alpha = 0.1:
    coverage 0.993 and mean size 2.42 against 0.90 and 1.32 without the top label forced;
    ``benchmarks/bench_conformal_peers.py``), so torchcal randomises every calibration score
    and only adds the top label to the sets.  Its default ``None`` means True for
    ``"aps"``/``"raps"`` and False for ``"lac"``.  Peers' defaults: the reference RAPS code
    ``randomized=True, allow_zero_sets=False``; TorchCP's ``APS``/``RAPS``
    ``randomized=True`` with empty sets allowed (one ``u`` per sample and class); MAPIE's
    ``include_last_label=True`` (not randomised; the class that crosses ``q`` is included, so
    no empty sets); LAC in both allows empty sets.

    ``conditional="class"`` (Mondrian conformal prediction, Vovk et al. 2005) calibrates one
    threshold per class on the calibration samples of that class; label ``y`` enters a set
    when ``s(x, y) <= q_y``, and the coverage guarantee holds within every class (a class
    with fewer than ``ceil(1 / alpha) - 1`` calibration samples gets ``q = inf`` and a
    warning).

    Sets can be empty (without ``include_top_label``) or hold every class; with ``k > n``
    (too few calibration samples for ``alpha``) every set is the full set and :meth:`fit`
    warns.  :meth:`set_params` after :meth:`fit` with a changed setting drops the fitted
    threshold (call ``fit`` again; using it before raises).

    Args:
        method: ``"lac"``, ``"aps"`` or ``"raps"``.
        alpha: miscoverage level in (0, 1): sets cover the label with probability >= 1 - alpha.
        lam: RAPS penalty weight >= 0, or None to choose it on the calibration data.
        k_reg: RAPS rank (>= 1) from which the penalty starts, or None to choose it.
        randomized: randomised APS / RAPS scores (True, the published default).
        include_top_label: always include the most probable class (None: method default).
        conditional: None (marginal coverage) or ``"class"`` (coverage within every class).
        random_state: None, an int (repeatable: the same sets for the same logits on every
            call) or a ``numpy.random.RandomState``; draws ``u`` and the RAPS tuning split.

    Attributes:
        quantile_ (float | torch.Tensor): the threshold q (``inf`` when ``k > n``); with
            ``conditional="class"`` a (C,) float64 tensor of per-class thresholds.
        lam_ (float), k_reg_ (int): the RAPS settings used (given or chosen; "raps" only).
        n_calib_ (int): the calibration samples the threshold was computed from.
        n_classes_ (int): C.

    Example:
        >>> z = torch.tensor([[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0],
        ...                   [1.0, 1.0, 0.0], [0.0, 1.0, 1.0]] * 4)
        >>> y = torch.tensor([0, 1, 2, 0, 2] * 4)
        >>> cp = ConformalClassifier(method="lac", alpha=0.2).fit(z, y)
        >>> cp.predict_sets(torch.tensor([[3.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
        tensor([[ True, False, False],
                [ True,  True, False]])
    """

    _fitted_attr = "quantile_"

    def __init__(self, method: str = "lac", alpha: float = 0.1, lam: float | None = None,
                 k_reg: int | None = None, *, randomized: bool = True,
                 include_top_label: bool | None = None, conditional: str | None = None,
                 random_state: Any = None) -> None:
        self.method = method
        self.alpha = alpha
        self.lam = lam
        self.k_reg = k_reg
        self.randomized = randomized
        self.include_top_label = include_top_label
        self.conditional = conditional
        self.random_state = random_state
        self._settings()

    def _settings(self) -> tuple[str, float]:
        """The settings, checked (at construction, at ``set_params`` and at fit)."""
        method = check_choice(self.method, "method", _METHODS)
        if self.lam is not None:
            check_nonneg_finite(self.lam, "lam")
        if self.k_reg is not None:
            check_positive_int(self.k_reg, "k_reg")
        _check_bool(self.randomized, "randomized")
        _check_bool(self.include_top_label, "include_top_label", allow_none=True)
        if self.conditional not in _CONDITIONAL:
            raise ValueError(f"Expected `conditional` to be one of {_CONDITIONAL}, got "
                             f"{self.conditional!r}")
        if not (self.random_state is None or isinstance(self.random_state, numbers.Integral)
                or isinstance(self.random_state, np.random.RandomState)):
            raise ValueError("Expected `random_state` to be None, an int or a "
                             f"numpy.random.RandomState, got {self.random_state!r}")
        return method, check_alpha(self.alpha)

    @property
    def _top(self) -> bool:
        return self.method != "lac" if self.include_top_label is None else self.include_top_label

    def _rng(self, stream: int) -> np.random.RandomState:
        """A fresh generator per call for an int ``random_state`` (stream 0: fit, 1: sets)."""
        rs = self.random_state
        if isinstance(rs, numbers.Integral) and not isinstance(rs, bool):
            return np.random.RandomState(np.random.SeedSequence([int(rs), stream])
                                         .generate_state(1)[0])
        # deferred: scikit-learn's import (2 s of CPU) only for a conformal predictor's seed
        from sklearn.utils import check_random_state

        return check_random_state(rs)

    def _uniform(self, n: int, device: torch.device, stream: int) -> torch.Tensor | None:
        if self.method == "lac" or not self.randomized:
            return None
        return torch.as_tensor(self._rng(stream).random_sample(n), dtype=torch.float64,
                               device=device)

    def _scores(self, z: torch.Tensor, u: torch.Tensor | None = None, lam: float = 0.0,
                k_reg: int = 1) -> torch.Tensor:
        """(N, C) float64 score of every (sample, candidate label) pair."""
        p = torch.softmax(z.to(torch.float64), dim=1)
        if self.method == "lac":
            return 1.0 - p
        sorted_p, order = torch.sort(p, dim=1, descending=True, stable=True)
        cum = torch.cumsum(sorted_p, dim=1)
        if u is not None:
            cum = cum - (1.0 - u.unsqueeze(1)) * sorted_p
        if self.method == "raps":
            rank = torch.arange(1, p.shape[1] + 1, dtype=torch.float64, device=p.device)
            cum = cum + float(lam) * (rank - int(k_reg)).clamp(min=0)
        return torch.empty_like(cum).scatter_(1, order, cum)

    def _label_scores(self, z: torch.Tensor, y: torch.Tensor, stream: int) -> torch.Tensor:
        """(N,) float64 score of each sample's label (chunk by chunk: the (N, C) scores of a
        dense input are never held at once)."""
        u = self._uniform(z.shape[0], z.device, stream)
        parts = []
        for sl in row_chunks(z.shape[0], z.shape[1]):
            s = self._scores(z[sl], None if u is None else u[sl], self._lam(), self._k_reg())
            parts.append(s.gather(1, y[sl].unsqueeze(1)).squeeze(1))
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def _lam(self) -> float:
        return float(getattr(self, "lam_", 0.0) or 0.0)

    def _k_reg(self) -> int:
        return int(getattr(self, "k_reg_", 1) or 1)

    def fit(self, logits: Any, labels: Any, *, ignore_index: Any = IGNORE_INDEX,
            class_axis: Any = None) -> ConformalClassifier:
        """Calibrate the threshold(s) on held-out ``logits`` and ``labels`` (and choose RAPS's
        missing ``k_reg`` / ``lam`` first); returns ``self``.

        ``logits`` (N, C) with labels (N,), dense (N, C, d1, ...) with labels (N, d1, ...),
        or token logits (N, T, C) with labels (N, T): every position whose label is not
        ``ignore_index`` (default -100) is one calibration sample, and the sets are then
        per position (:meth:`predict_sets` of the same layout).  Positions of one image are
        not exchangeable with each other's neighbours in general: the guarantee is the
        marginal one over positions drawn like the calibration positions."""
        method, alpha = self._settings()
        z, y = prepare_fit(logits, labels, one_class_ok=True, ignore_index=ignore_index,
                           class_axis=class_axis)
        self.class_axis_ = None if as_ndim(logits) <= 2 else dense_axis(
            check_dense_logits(logits), class_axis, n_classes=z.shape[1])
        self.__dict__.pop("_refit_needed", None)
        if method == "raps":
            z, y = self._tune_raps(z, y, alpha)
        s = self._label_scores(z, y, stream=0)
        c = z.shape[1]
        if self.conditional == "class":
            q = torch.tensor([_kth(s[y == k], alpha) if bool((y == k).any()) else math.inf
                              for k in range(c)], dtype=torch.float64)
            few = torch.isinf(q).nonzero().flatten().tolist()
            if few:
                self._warn_few(f"class(es) {few[:10]} have", alpha)
            self.quantile_ = q
        else:
            q = _kth(s, alpha)
            if math.isinf(q):
                self._warn_few(f"{s.shape[0]} calibration samples are", alpha)
            self.quantile_ = q
        self.n_calib_ = int(s.shape[0])
        self.n_classes_ = c
        return self

    def _warn_few(self, who: str, alpha: float) -> None:
        warnings.warn(
            f"ConformalClassifier: {who} too few for alpha={alpha} (the threshold is the "
            f"ceil((n + 1)(1 - alpha))-th smallest score); every prediction set holds those "
            f"labels. At least {math.ceil(1 / alpha) - 1} samples are needed.",
            RuntimeWarning, stacklevel=3)

    def _tune_raps(self, z: torch.Tensor, y: torch.Tensor, alpha: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Set ``k_reg_`` / ``lam_`` (given, or chosen on a tuning split as the reference RAPS
        code does) and return the samples left for calibrating the threshold."""
        self.k_reg_ = None if self.k_reg is None else int(self.k_reg)
        self.lam_ = None if self.lam is None else float(self.lam)
        if self.k_reg_ is not None and self.lam_ is not None:
            return z, y
        n = z.shape[0]
        n_tune = int(RAPS_TUNE_FRACTION * n)
        if n_tune < 1 or n - n_tune < 1:
            raise ValueError(f"Expected at least 4 calibration samples to choose RAPS's "
                             f"`k_reg`/`lam`, got {n}; pass both")
        perm = torch.as_tensor(self._rng(2).permutation(n), device=z.device)
        zt, yt = z[perm[:n_tune]], y[perm[:n_tune]]
        if self.k_reg_ is None:
            p = torch.softmax(zt.to(torch.float64), dim=1)
            order = torch.argsort(p, dim=1, descending=True, stable=True)
            ranks = (order == yt.unsqueeze(1)).to(torch.int64).argmax(dim=1)
            self.k_reg_ = int(np.quantile(ranks.cpu().numpy(), 1 - alpha,
                                          method="higher")) + 1
        if self.lam_ is None:
            sizes = []
            for lam in RAPS_LAMBDAS:
                self.lam_ = lam
                q = _kth(self._label_scores(zt, yt, stream=3), alpha)
                sets = self._sets_at(zt, q, stream=4)
                sizes.append(float(sets.sum(dim=1, dtype=torch.float64).mean()))
            self.lam_ = RAPS_LAMBDAS[int(np.argmin(sizes))]
        return z[perm[n_tune:]], y[perm[n_tune:]]

    def _sets_at(self, z: torch.Tensor, q: Any, stream: int = 1,
                 u: torch.Tensor | None = None) -> torch.Tensor:
        """Boolean (N, C) sets of validated logits for threshold(s) ``q`` (``u``: the uniform
        draws of these rows when the caller took them)."""
        if u is None:
            u = self._uniform(z.shape[0], z.device, stream)
        s = self._scores(z, u, self._lam(), self._k_reg())
        qq = q.to(s.device).unsqueeze(0) if isinstance(q, torch.Tensor) else q
        sets = s <= qq
        if self._top:
            sets.scatter_(1, torch.softmax(z.to(torch.float64), 1).argmax(1, keepdim=True),
                          True)
        return sets

    def _valid(self, logits: Any) -> torch.Tensor:
        self._check_fitted()
        z = prepare_logits(logits)
        check_n_classes(z, self.n_classes_)
        return z

    def _dense_sets(self, logits: Any, class_axis: Any = None) -> torch.Tensor:
        """Sets of the input's shape: (N, C), or per position for (N, C, d1, ...) /
        (N, T, C) logits, chunk by chunk (one uniform draw per position for the
        randomised scores, taken once in the rows' order)."""
        self._check_fitted()
        z = check_dense_logits(logits)
        if z.ndim <= 2:
            return self._sets_at(self._valid(z), self.quantile_)
        axis = dense_axis(z, class_axis, fitted_axis=self.__dict__.get("class_axis_"),
                          n_classes=self.n_classes_)
        c = z.shape[axis]
        if c != self.n_classes_:
            raise ValueError(f"Expected `logits` to have {self.n_classes_} classes on axis "
                             f"{axis} as in fit, got shape {tuple(z.shape)}")
        u = self._uniform(z.numel() // c, z.device, 1)

        def sets(rows: torch.Tensor, start: int) -> torch.Tensor:
            uu = None if u is None else u[start:start + rows.shape[0]]
            return self._sets_at(rows, self.quantile_, u=uu)

        return apply_rows(sets, z, axis, with_offset=True)

    def predict_sets(self, logits: Any, *, class_axis: Any = None) -> Any:
        """Boolean mask of the prediction sets of the logits' shape: (N, C), or one set per
        position of dense (N, C, d1, ...) / token (N, T, C) logits (NumPy for NumPy input)."""
        return like_input(self._dense_sets(logits, class_axis), logits)

    def mean_set_size(self, logits: Any, *, class_axis: Any = None) -> float:
        """Average number of classes in the prediction sets of ``logits`` (over every
        position of a dense input)."""
        sets = self._dense_sets(logits, class_axis)
        axis = 1 if sets.ndim <= 2 else dense_axis(
            sets, class_axis, fitted_axis=self.__dict__.get("class_axis_"),
            n_classes=self.n_classes_)
        return float(sets.sum(dim=axis, dtype=torch.float64).mean())

    def _rows(self, logits: Any, labels: Any, ignore_index: Any
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Validated kept rows (M, C) and labels (M,) of any layout."""
        self._check_fitted()
        rows, yr, _, _ = fit_rows(logits, labels, ignore_index=ignore_index)
        z = self._valid(rows)
        return z, check_labels(yr, n=z.shape[0], num_classes=z.shape[1], device=z.device)

    def coverage(self, logits: Any, labels: Any, *, ignore_index: Any = IGNORE_INDEX) -> float:
        """Share of samples (positions whose label is not ``ignore_index``, for dense input)
        whose prediction set (the one :meth:`predict_sets` gives for these logits' rows)
        contains the label: the empirical coverage."""
        z, y = self._rows(logits, labels, ignore_index)
        sets = self._sets_at(z, self.quantile_)
        return float(sets.gather(1, y.unsqueeze(1)).to(torch.float64).mean())

    def score(self, logits: Any, labels: Any, *, ignore_index: Any = IGNORE_INDEX) -> float:
        r"""``-(mean set size) / C - |coverage - (1 - alpha)|`` on ``logits``/``labels``
        (higher is better; at most 0).

        Rewards coverage near the target ``1 - alpha`` and penalises set size, both on a
        [0, 1] scale, so that ``GridSearchCV`` / ``cross_val_score`` prefer the predictor
        with the smallest sets among those that cover as asked (a full-set predictor scores
        about ``-1 - alpha``, an empty-set one ``-(1 - alpha)``).
        """
        z, y = self._rows(logits, labels, ignore_index)
        sets = self._sets_at(z, self.quantile_)
        size = float(sets.sum(dim=1, dtype=torch.float64).mean()) / z.shape[1]
        cover = float(sets.gather(1, y.unsqueeze(1)).to(torch.float64).mean())
        return -size - abs(cover - (1.0 - check_alpha(self.alpha)))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (settings, the calibrated threshold(s), RAPS's settings used;
        a ``numpy.random.RandomState`` ``random_state`` is written as None)."""
        self._check_fitted()
        q = self.quantile_
        d = self._header()
        if isinstance(d["random_state"], np.random.RandomState):
            d["random_state"] = None
        if isinstance(q, torch.Tensor):
            quantile: Any = [None if math.isinf(v) else v for v in q.tolist()]
        else:
            quantile = None if math.isinf(q) else q
        out = {**d, "quantile": quantile, "n_calib": self.n_calib_, "n_classes": self.n_classes_}
        if self.method == "raps":
            out.update(lam_used=self.lam_, k_reg_used=self.k_reg_)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConformalClassifier:
        """Rebuild a fitted predictor from :meth:`to_dict`'s output."""
        cls._check_dict(d, ("method", "alpha", "lam", "k_reg", "quantile", "n_calib",
                            "n_classes"))
        obj = cls(method=d["method"], alpha=d["alpha"], lam=d["lam"], k_reg=d["k_reg"],
                  randomized=d.get("randomized", False),
                  include_top_label=d.get("include_top_label", False),
                  conditional=d.get("conditional"), random_state=d.get("random_state"))
        q = d["quantile"]
        if isinstance(q, list):
            vals = float_list(q, "d['quantile']", allow_none=True)
            obj.quantile_ = torch.tensor([math.inf if v is None else v for v in vals],
                                         dtype=torch.float64)
        else:
            obj.quantile_ = math.inf if q is None else finite_float(q, "d['quantile']")
        obj.n_calib_ = check_positive_int(d["n_calib"], "d['n_calib']")
        obj.n_classes_ = check_positive_int(d["n_classes"], "d['n_classes']")
        if obj.method == "raps":
            obj.lam_ = check_nonneg_finite(d.get("lam_used", d["lam"]), "d['lam_used']")
            obj.k_reg_ = check_positive_int(d.get("k_reg_used", d["k_reg"]), "d['k_reg_used']")
        return obj

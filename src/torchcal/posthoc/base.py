"""The base of every post-hoc calibrator: the file a calibrator author reads.

:class:`Estimator` is scikit-learn's estimator contract (``get_params`` / ``set_params``, the
fitted-state checks, the ``to_dict`` header) without importing scikit-learn;
:class:`Calibrator` adds ``fit`` / ``transform`` / ``predict_proba`` / ``score`` on every input
layout, so that a calibrator implements only ``_fit(z, y, w)`` and ``_transform(z)`` on
validated (M, C) rows (and ``to_dict`` / ``from_dict``).  :func:`identity_check` is the warning
when calibrated probabilities are worse than none.

The helpers a calibrator uses live beside it: the row layout (``_layout``), the checks of its
inputs and settings (``_checks``), the numerical fits (``_fitting``: L-BFGS, Newton
backtracking, cross-validation folds) and the top-label probabilities (``_toplabel``).
"""

from __future__ import annotations

import inspect
import math
import warnings
from typing import Any

import torch

from .._validation import check_labels
from ..errors import (
    CalibrationFitError,
    MemorizedValidationWarning,
    NotFittedError,
    WorseThanIdentityWarning,
)
from ..metrics import IGNORE_INDEX
from ._checks import check_dense_logits, dense_axis, prepare_fit_weighted, prepare_logits
from ._layout import apply_rows, fit_rows, like_input, row_chunks, work_dtype

__all__ = [
    "Estimator",
    "Calibrator",
    "CalibrationFitError",
    "WorseThanIdentityWarning",
    "MemorizedValidationWarning",
    "identity_check",
    "IDENTITY_MARGIN",
    "not_fitted_error",
]

_SCHEMA_VERSION = 1


_NOT_FITTED: list[type] = []  # the class of not_fitted_error, made on first use


def not_fitted_error(message: str) -> NotFittedError:
    """The error an unfitted estimator raises: a :class:`torchcal.errors.NotFittedError` that
    is also scikit-learn's ``NotFittedError`` (its estimator checks and ``except
    sklearn.exceptions.NotFittedError`` recognise it).  Its class is made on the first call,
    which imports scikit-learn: importing the calibrators does not (issue 43)."""
    if not _NOT_FITTED:
        # deferred: scikit-learn's import (2 s of CPU) only once an unfitted estimator is used
        from sklearn.exceptions import NotFittedError as SklearnNotFittedError

        _NOT_FITTED.append(type("NotFittedError", (NotFittedError, SklearnNotFittedError), {
            "__module__": NotFittedError.__module__, "__doc__": NotFittedError.__doc__,
            "__reduce__": lambda self: (not_fitted_error, (str(self),))}))
    return _NOT_FITTED[0](message)


#: Relative margin of :class:`WorseThanIdentityWarning`: it is raised when the calibrated NLL
#: exceeds the identity's by more than this fraction (noise on a held-out set of a calibrator
#: that barely changes the probabilities stays quiet).
IDENTITY_MARGIN = 0.01


def identity_check(name: str, nll_calibrated: float, nll_identity: float, where: str) -> None:
    """Warn (:class:`WorseThanIdentityWarning`) when ``nll_calibrated`` exceeds
    ``nll_identity`` by more than ``IDENTITY_MARGIN`` of it."""
    if nll_calibrated > nll_identity * (1 + IDENTITY_MARGIN) or (
            math.isnan(nll_calibrated) and not math.isnan(nll_identity)):
        held_out = where != "validation"
        cause = ("it over-fits its validation set, or these data differ from it"
                 if held_out else "it over-fits its validation set, or its fit failed")
        advice = ("fit it on validation data drawn like these" if name == "TemperatureScaling"
                  else "regularise it (e.g. reg='odir' with larger `lam`/`mu`), fit it on more "
                  "samples, or use a calibrator with fewer parameters (TemperatureScaling)")
        warnings.warn(
            f"{name}: the calibrated NLL on the {where} data ({nll_calibrated:.4g}) is worse "
            f"than the uncalibrated probabilities' ({nll_identity:.4g}, the identity map): "
            f"{cause}; {advice}", WorseThanIdentityWarning, stacklevel=3)


def _same(a: Any, b: Any) -> bool:
    """Whether two setting values are equal (False when they cannot be compared)."""
    if a is b:
        return True
    try:
        return bool(a == b) and type(a) is type(b)
    except (TypeError, ValueError, RuntimeError):
        return False


class Estimator:
    """scikit-learn's estimator contract shared by the calibrators and the conformal predictor.

    ``get_params`` / ``set_params`` as :class:`sklearn.base.BaseEstimator`'s (so
    ``sklearn.base.clone``, ``Pipeline`` and ``GridSearchCV`` work): every constructor stores
    its arguments unchanged under their own names, after checking them, and ``fit`` checks
    them again (``set_params`` does not).  Learned attributes end in ``_``; using an unfitted
    estimator raises :class:`torchcal.errors.NotFittedError` (a ``ValueError`` and an
    ``AttributeError``, as scikit-learn's own).  Written here rather than inherited from
    ``BaseEstimator`` so that importing the calibrators imports no scikit-learn (2 s of CPU in
    every process that evaluates a run, issue 43); scikit-learn is imported only by the
    methods that only scikit-learn calls (``__sklearn_tags__``) and by the calibrators that
    use it (isotonic regression, the conformal predictor's random state).
    """

    _fitted_attr: str = ""

    @classmethod
    def _get_param_names(cls) -> list[str]:
        """The constructor's argument names, sorted (scikit-learn's rule: no ``*args``)."""
        init = cls.__init__
        if init is object.__init__:
            return []
        params = [p for p in inspect.signature(init).parameters.values()
                  if p.name != "self" and p.kind != p.VAR_KEYWORD]
        if any(p.kind == p.VAR_POSITIONAL for p in params):
            raise RuntimeError(f"{cls.__name__}'s constructor takes *args: scikit-learn's "
                               "estimators must name every setting")
        return sorted(p.name for p in params)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The settings by name (scikit-learn's ``get_params``; ``deep``: also those of nested
        estimators, as ``name__setting``)."""
        out: dict[str, Any] = {}
        for key in self._get_param_names():
            value = getattr(self, key)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                out.update((f"{key}__{k}", v) for k, v in value.get_params().items())
            out[key] = value
        return out

    def _set_params(self, **params: Any) -> Estimator:
        """scikit-learn's ``set_params``: names checked, nested ``name__setting`` passed on."""
        if not params:
            return self
        valid = self.get_params(deep=True)
        nested: dict[str, dict[str, Any]] = {}
        for key, value in params.items():
            key, delim, sub_key = key.partition("__")
            if key not in valid:
                raise ValueError(f"Invalid parameter {key!r} for estimator {self}. "
                                 f"Valid parameters are: {self._get_param_names()!r}.")
            if delim:
                nested.setdefault(key, {})[sub_key] = value
            else:
                setattr(self, key, value)
                valid[key] = value
        for key, sub_params in nested.items():
            valid[key].set_params(**sub_params)
        return self

    def __sklearn_tags__(self) -> Any:
        """scikit-learn's tags (``BaseEstimator``'s defaults): ``fit`` needs the labels
        (``target_tags.required``)."""
        # deferred: only scikit-learn calls this, and scikit-learn's import costs 2 s of CPU
        from sklearn.utils import Tags, TargetTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=True),
                    transformer_tags=None, regressor_tags=None, classifier_tags=None)

    def __sklearn_is_fitted__(self) -> bool:
        return self.is_fitted

    @property
    def is_fitted(self) -> bool:
        """Whether ``fit`` (or ``from_dict``) has set the learned attributes."""
        return getattr(self, self._fitted_attr, None) is not None

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            name = type(self).__name__
            if self.__dict__.get("_refit_needed"):
                raise not_fitted_error(
                    f"This {name} instance's settings were changed by `set_params` after "
                    "`fit`, so its fitted state was dropped; call `fit(logits, labels)` again"
                )
            raise not_fitted_error(
                f"This {name} instance is not fitted yet; call `fit(logits, labels)` before "
                "using it"
            )

    def set_params(self, **params: Any) -> Estimator:
        """Set settings (scikit-learn's ``set_params``), checked as the constructor checks
        them, before any is changed.  On a fitted estimator a changed setting drops the fitted
        state: using it raises :class:`~torchcal.errors.NotFittedError` until ``fit`` runs
        again (a fitted threshold or map never silently serves other settings)."""
        current = self.get_params(deep=False)
        if not params or any(k not in current for k in params):
            return self._set_params(**params)  # scikit-learn's error for unknown names
        type(self)(**{**current, **params})  # raises on a bad value; nothing changed yet
        changed = [k for k, v in params.items() if not _same(current[k], v)]
        self._set_params(**params)
        if changed and self.is_fitted:
            setattr(self, self._fitted_attr, None)
            self.__dict__["_refit_needed"] = True
        return self

    @classmethod
    def _check_dict(cls, d: Any, keys: tuple[str, ...]) -> None:
        if not isinstance(d, dict):
            raise TypeError(f"Expected `d` to be a dict from to_dict(), got {type(d).__name__}")
        if d.get("type") != cls.__name__:
            raise ValueError(
                f"Expected `d['type']` to be {cls.__name__!r}, got {d.get('type')!r}"
            )
        if d.get("version") != _SCHEMA_VERSION:
            raise ValueError(
                f"Expected `d['version']` to be {_SCHEMA_VERSION}, got {d.get('version')!r}"
            )
        missing = [k for k in keys if k not in d]
        if missing:
            raise ValueError(f"Expected `d` to have the key(s) {missing} written by to_dict()")

    def _header(self) -> dict[str, Any]:
        """The ``type`` / ``version`` / settings part of ``to_dict`` (JSON-safe)."""
        return {"type": type(self).__name__, "version": _SCHEMA_VERSION,
                **self.get_params(deep=False)}

    def __repr__(self, N_CHAR_MAX: int = 700) -> str:  # noqa: N803 - BaseEstimator's signature
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params(deep=False).items())
        return f"{type(self).__name__}({params})"


class Calibrator(Estimator):
    """Base of the post-hoc calibrators (scikit-learn's estimator contract).

    The constructor stores settings; :meth:`fit` learns attributes ending in ``_`` and returns
    ``self``; :meth:`transform` maps logits to calibrated logits and :meth:`predict_proba` to
    probabilities; :meth:`score` is the mean log-likelihood (higher is better, what
    ``GridSearchCV`` maximises); :meth:`to_dict` / ``from_dict`` round-trip through JSON.
    Torch tensors in give tensors out (same device and dtype); NumPy arrays in give NumPy
    arrays out.  Subclasses implement :meth:`_transform` (and :meth:`_predict_proba` when the
    probabilities come first) on validated tensors.
    """

    def __sklearn_tags__(self) -> Any:
        """scikit-learn's tags: a transformer (logits to calibrated logits) needing labels."""
        from sklearn.utils import TransformerTags  # sklearn >= 1.6, only for the checks

        tags = super().__sklearn_tags__()
        tags.transformer_tags = TransformerTags()
        return tags

    #: Whether ``fit`` takes dense (N, C, d1, ...) and token (N, T, C) layouts with
    #: ``ignore_index`` (every calibrator does: it is fitted on the kept rows).
    supports_dense: bool = True
    #: Whether ``fit`` takes ``sample_weight`` (every calibrator does).
    supports_sample_weight: bool = True
    #: Whether ``predict_proba`` may change the arg-max of the logits (the predicted class).
    #: False for the maps that keep the ranking (temperature) or calibrate the top label's
    #: confidence (histogram binning, top-label isotonic / Platt / beta); True for the maps
    #: whose definition changes it (vector, matrix, Dirichlet, one-vs-rest isotonic, binary
    #: Platt / beta on class 1).
    changes_argmax: bool = False

    def fit(self, logits: Any, labels: Any, *, sample_weight: Any = None,
            ignore_index: Any = IGNORE_INDEX, class_axis: Any = None) -> Calibrator:
        """Fit on validation ``logits`` and ``labels``; returns ``self``.

        Args:
            logits: (N, C) logits with (N,) labels; dense (N, C, d1, ...) logits with (N, d1,
                ...) labels (``F.cross_entropy``'s layout: segmentation); or token logits
                (N, T, C) with (N, T) labels (a language model's).  The calibrator is fitted on
                the kept rows, exactly as on those rows flattened to (M, C).
            labels: integer class indices.
            sample_weight: optional non-negative weights of the labels' shape
                (scikit-learn's convention: an integer weight k counts a row k times; weight 0
                drops it), e.g. importance weights under shift.
            ignore_index: label value whose rows are ignored (default -100; None keeps all).
            class_axis: 1 or -1 to name the class axis of 3-D or higher input when the
                labels' shape leaves it ambiguous (default: from the labels' shape).
        """
        z, y, w, axis = prepare_fit_weighted(logits, labels, ignore_index=ignore_index,
                                             sample_weight=sample_weight, class_axis=class_axis)
        self._fit(z, y, w)
        self.class_axis_ = axis
        return self

    def _fit(self, z: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None
             ) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _transform(self, z: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _predict_proba(self, z: torch.Tensor) -> torch.Tensor:
        zt = self._transform(z)
        return torch.softmax(zt.to(work_dtype(zt.dtype)), dim=1).to(zt.dtype)

    def _axis(self, z: torch.Tensor, class_axis: Any) -> int:
        return dense_axis(z, class_axis, fitted_axis=self.__dict__.get("class_axis_"),
                          n_classes=self.__dict__.get("n_classes_"))

    def transform(self, logits: Any, *, class_axis: Any = None) -> Any:
        """Calibrated logits of the input's shape ((N, C), (N, C, d1, ...) or (N, T, C)), dtype
        and device (NumPy for NumPy input)."""
        self._check_fitted()
        z = check_dense_logits(logits)
        return like_input(apply_rows(self._transform, z,
                                     self._axis(z, class_axis)), logits)

    def predict_proba(self, logits: Any, *, class_axis: Any = None) -> Any:
        """Calibrated probabilities of the input's shape ((N, C), (N, C, d1, ...) with the
        classes on axis 1, or (N, T, C)), computed in at least float32 and returned in the
        logits' floating dtype (NumPy for NumPy input); dense input is processed in chunks of
        rows."""
        self._check_fitted()
        z = check_dense_logits(logits)
        return like_input(apply_rows(self._predict_proba, z,
                                     self._axis(z, class_axis)), logits)

    def fit_transform(self, logits: Any, labels: Any, **fit_params: Any) -> Any:
        """``fit(logits, labels, **fit_params).transform(logits)``."""
        return self.fit(logits, labels, **fit_params).transform(
            logits, class_axis=fit_params.get("class_axis"))

    def score(self, logits: Any, labels: Any, *, sample_weight: Any = None,
              ignore_index: Any = IGNORE_INDEX) -> float:
        """Mean log-likelihood ``(1/N) sum_i log q_{i, y_i}`` of the labels under the calibrated
        probabilities (the negative NLL, float64; weighted by ``sample_weight``; dense layouts
        and ``ignore_index`` as :meth:`fit`): higher is better, so ``GridSearchCV`` can
        tune a calibrator's settings without a ``scoring`` argument.

        Warns (:class:`WorseThanIdentityWarning`) when this NLL is worse than the uncalibrated
        probabilities' on the same data by more than 1 % (``IDENTITY_MARGIN``): on held-out
        data, the sign that the calibrator over-fits its validation set."""
        self._check_fitted()
        rows, yr, w, _ = fit_rows(logits, labels, ignore_index=ignore_index,
                                  sample_weight=sample_weight)
        z = prepare_logits(rows)
        y = check_labels(yr, n=z.shape[0], num_classes=z.shape[1], device=z.device)
        return -self._nll_vs_identity(z, y, "scored (held-out)", w)

    def _nll_vs_identity(self, z: torch.Tensor, y: torch.Tensor, where: str,
                         w: torch.Tensor | None = None) -> float:
        """The calibrated NLL of validated ``z``/``y`` (weighted by ``w``); warns when it is
        worse than the identity map's (:func:`identity_check`).  Chunked over rows."""
        chunks = row_chunks(z.shape[0], z.shape[1])
        if len(chunks) == 1 and w is None:
            logq = torch.log_softmax(self._transform(z).to(torch.float64), dim=1)
            nll = -float(logq.gather(1, y.unsqueeze(1)).mean())
            logp = torch.log_softmax(z.to(torch.float64), dim=1)
            nll_id = -float(logp.gather(1, y.unsqueeze(1)).mean())
        else:
            tot = tot_id = 0.0
            for sl in chunks:
                yc = y[sl].unsqueeze(1)
                wc = None if w is None else w[sl]
                lq = torch.log_softmax(self._transform(z[sl]).to(torch.float64), 1).gather(1, yc)
                lp = torch.log_softmax(z[sl].to(torch.float64), 1).gather(1, yc)
                tot += float(lq.sum() if wc is None else (lq.squeeze(1) * wc).sum())
                tot_id += float(lp.sum() if wc is None else (lp.squeeze(1) * wc).sum())
            total_w = float(z.shape[0]) if w is None else float(w.sum())
            nll, nll_id = -tot / total_w, -tot_id / total_w
        identity_check(type(self).__name__, nll, nll_id, where)
        return nll

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

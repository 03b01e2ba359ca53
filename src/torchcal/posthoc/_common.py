"""Input checks and the estimator plumbing shared by the post-hoc calibrators."""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from typing import Any

import numpy as np
import torch

from .._validation import check_labels, check_logits, check_scalar
from ..errors import CalibrationError, NotFittedError
from ..metrics import warn_if_probabilities

__all__ = [
    "Calibrator",
    "CalibrationError",
    "WorseThanIdentityWarning",
    "Estimator",
    "default_grid",
    "check_grid",
    "prepare_fit",
    "prepare_logits",
]

_SCHEMA_VERSION = 1


def default_grid() -> tuple[float, ...]:
    """The papers' temperature grid ``0.1, 0.2, ..., 10.0`` as exact decimals.

    Built as ``k / 10`` for ``k = 1..100`` in float64, so every entry is the double nearest to
    its decimal (``0.3``, not the ``0.30000000000000004`` of ``np.arange(0.1, 10.05, 0.1)``).

    >>> g = default_grid()
    >>> len(g), g[0], g[2], g[10], g[-1]
    (100, 0.1, 0.3, 1.1, 10.0)
    """
    return tuple(k / 10 for k in range(1, 101))


def check_grid(grid: Any) -> tuple[float, ...]:
    """Validate a grid of temperatures: a non-empty 1-D sequence of positive finite numbers.

    Returns the temperatures as a tuple of Python floats in the given order (``None`` gives
    :func:`default_grid`).

    >>> check_grid([0.5, 2])
    (0.5, 2.0)
    """
    if grid is None:
        return default_grid()
    if isinstance(grid, torch.Tensor):
        values = grid.detach().cpu().double().reshape(-1).tolist() if grid.ndim <= 1 else None
    elif isinstance(grid, (str, bytes)) or isinstance(grid, numbers.Number):
        values = None
    else:
        try:
            arr = np.asarray(grid)
        except Exception:  # noqa: BLE001 - any failure means "not a sequence of numbers"
            arr = None
        ok = arr is not None and arr.ndim == 1 and (
            np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
        )
        values = [float(v) for v in arr.tolist()] if ok else None
    if values is None:
        raise TypeError(
            f"Expected `grid` to be a 1-D sequence of temperatures, got {type(grid).__name__}"
        )
    if len(values) == 0:
        raise ValueError("Expected `grid` to hold at least one temperature, got an empty grid")
    for i, v in enumerate(values):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(
                f"Expected `grid` to hold positive finite temperatures, got {v!r} at index {i}"
            )
    return tuple(values)


def prepare_logits(logits: Any, name: str = "logits") -> torch.Tensor:
    """Validate logits of shape (N, C): floating dtype, 2-D, non-empty, C >= 2, finite
    (:func:`torchcal._validation.check_logits`)."""
    return check_logits(logits, name)


def prepare_fit(logits: Any, labels: Any, *, one_class_ok: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated (detached) validation logits (N, C) and int64 labels (N,) on the logits' device.

    Errors name the problem: non-floating or non-2-D logits, fewer than two samples or
    classes, NaN/Inf, labels of the wrong length, dtype or range, and labels that are all of
    one class (a calibrator fitted on them predicts that class with probability 1; a conformal
    predictor passes ``one_class_ok=True``).
    """
    z = prepare_logits(logits).detach()
    warn_if_probabilities(z, what="the calibrator",  # as the metrics do (fit(probs, y))
                          instead="Pass logits (or log-probabilities: log(probs)) instead.")
    if z.shape[0] < 2:
        raise ValueError(
            f"Expected at least 2 validation samples (rows of `logits`), got {z.shape[0]}"
        )
    y = check_labels(labels, n=z.shape[0], num_classes=z.shape[1], device=z.device)
    if not one_class_ok and bool((y == y[0]).all()):
        raise ValueError(
            f"Expected `labels` of at least 2 different classes to fit a calibrator, got "
            f"{y.shape[0]} labels all equal to {int(y[0])}"
        )
    return z, y


def log_proba(q: torch.Tensor) -> torch.Tensor:
    """``log q`` clamped at the dtype's smallest normal number (finite "logits" whose softmax
    gives back the probabilities ``q``: the transform of the probability-level calibrators)."""
    return torch.log(q.clamp(min=torch.finfo(q.dtype).tiny))


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half precision, else the dtype itself (float32 / float64)."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def finite_float(value: Any, name: str) -> float:
    """``value`` as a Python float, or ValueError naming ``name`` if it is not a finite number."""
    return check_scalar(value, name, float)


#: Largest magnitude of a fitted parameter (a weight, bias or coefficient) that ``from_dict``
#: accepts, and the temperature range ``[1 / MAX_PARAMETER, MAX_PARAMETER]``: a fit never gets
#: near it, while a larger value (a file edited by hand, a corrupted fit) overflows the float32
#: calibrated logits into NaN probabilities.
MAX_PARAMETER = 1e6


def float_list(value: Any, name: str, *, length: int | None = None,
               allow_none: bool = False, bounds: tuple[float, float] | None = None) -> list:
    """A JSON list of finite floats (or ``None`` entries when ``allow_none``), validated;
    with ``bounds=(lo, hi)`` every number must lie in ``[lo, hi]``.

    >>> float_list([0.5, 1], "d['values']", bounds=(0.0, 1.0))
    [0.5, 1.0]
    >>> float_list([2.0], "d['values']", bounds=(0.0, 1.0))
    Traceback (most recent call last):
    ValueError: Expected `d['values'][0]` to lie in [0, 1], got 2.0
    """
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"Expected `{name}` to be a list of numbers, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise ValueError(f"Expected `{name}` to have {length} entries, got {len(value)}")
    out = []
    for i, v in enumerate(value):
        if v is None and allow_none:
            out.append(None)
            continue
        f = finite_float(v, f"{name}[{i}]")
        if bounds is not None and not bounds[0] <= f <= bounds[1]:
            raise ValueError(f"Expected `{name}[{i}]` to lie in [{bounds[0]:g}, {bounds[1]:g}], "
                             f"got {f!r}")
        out.append(f)
    return out


#: ``bounds`` of :func:`float_list` for fitted weights, biases and coefficients.
PARAMETER_BOUNDS = (-MAX_PARAMETER, MAX_PARAMETER)


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


class WorseThanIdentityWarning(RuntimeWarning):
    """A fitted calibrator's NLL on some data is worse than the uncalibrated probabilities'
    (the identity map, ``softmax(logits)``): it over-fits its validation set, or its
    optimisation failed."""


class MemorizedValidationWarning(WorseThanIdentityWarning):
    """A calibrator with more parameters than validation samples (matrix or Dirichlet scaling at
    many classes) fitted its validation labels far better than temperature scaling can: it has
    memorised them, and on other data it will likely be worse than no calibration."""


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


def like_input(out: torch.Tensor, ref: Any) -> Any:
    """``out`` as a NumPy array when the input ``ref`` was one (NumPy in, NumPy out), else the
    tensor itself."""
    if isinstance(ref, np.ndarray):
        return out.detach().cpu().numpy()
    return out


def check_choice(value: Any, name: str, choices: tuple) -> Any:
    """``value`` if it is one of ``choices``, else ValueError naming ``name``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"Expected `{name}` to be one of {choices}, got {value!r}")
    return value


def check_n_classes(z: torch.Tensor, n_classes: int | None, name: str = "logits") -> None:
    """Raise if ``z`` has a different number of columns than the data the calibrator saw."""
    if n_classes is not None and z.shape[1] != n_classes:
        raise ValueError(
            f"Expected `{name}` to have {n_classes} classes (columns) as in fit, "
            f"got {z.shape[1]}"
        )


# Largest |gradient| of a validation objective accepted when L-BFGS stops on its budget.
GRAD_TOL = 1e-6


def lbfgs_fit(params: list[torch.Tensor], objective: Any, *, max_iter: int, name: str,
              hint: str = "") -> tuple[float, float]:
    """Minimise ``objective()`` (a 0-d float64 tensor of ``params``) with L-BFGS (strong Wolfe
    line search) and return its ``(start, end)`` values.

    Raises :class:`CalibrationError` with the reason if the objective becomes non-finite, or if
    L-BFGS uses up its budget (``max_iter`` iterations or ``1.25 * max_iter`` evaluations) with
    the gradient still above ``GRAD_TOL``; ``hint`` (e.g. why the objective may have no finite
    minimiser) is added to that message.
    """
    opt = torch.optim.LBFGS(
        params, lr=1.0, max_iter=max_iter, tolerance_grad=1e-10, tolerance_change=1e-14,
        history_size=20, line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    with torch.enable_grad():
        with torch.no_grad():
            start = float(objective())
        opt.step(closure)
        state = opt.state[opt.param_groups[0]["params"][0]]
        n_iter, n_eval = state.get("n_iter", 0), state.get("func_evals", 0)
        loss = objective()
        grads = torch.autograd.grad(loss, params)
    end = float(loss.detach())
    if not math.isfinite(end):
        raise CalibrationError(
            f"{name} failed: L-BFGS reached a non-finite validation objective ({end!r}) after "
            f"{n_iter} iterations"
        )
    grad = max(float(g.abs().max()) for g in grads)
    max_eval = opt.param_groups[0]["max_eval"]
    if (n_iter >= max_iter or n_eval >= max_eval) and not grad <= GRAD_TOL:
        raise CalibrationError(
            f"{name} failed: L-BFGS used its budget ({n_iter} iterations, {n_eval} function "
            f"evaluations; max_iter={max_iter}) with the validation NLL gradient still "
            f"{grad:.3g} (> {GRAD_TOL:g}){hint}; increase `max_iter`"
        )
    return start, end


def backtrack(objective: Any, theta: torch.Tensor, f: float, step: torch.Tensor, slope: float
              ) -> tuple[torch.Tensor, float] | None:
    """Armijo backtracking along ``-step`` from ``theta`` (objective value ``f``; ``slope`` the
    directional derivative ``<grad, step>``) for the damped Newton fits.

    Returns the first ``(theta - t step, value)`` with ``t = 1, 1/2, ...`` that decreases
    ``objective`` strictly and by at least ``1e-4 t slope``, or ``None`` when no ``t`` down to
    ``1e-12`` does: the minimum is then reached to rounding (a non-strict test would accept
    equal values forever).
    """
    t = 1.0
    while t > 1e-12:
        cand = theta - t * step
        f_new = objective(cand)
        if f_new < f and f_new <= f - 1e-4 * t * slope:
            return cand, f_new
        t /= 2
    return None


#: Seed of :func:`cv_folds`'s permutation (the same data give the same folds).
CV_SEED = 0


def cv_folds(n: int, k: int, device: Any = None) -> list[torch.Tensor]:
    """``k`` disjoint index sets covering ``range(n)``: a fixed permutation (seed ``CV_SEED``)
    dealt round-robin, so fold sizes differ by at most one.  The folds of the calibrators'
    cross-validation (``lam="cv"``) and of ``torchcal calibrate``'s held-out numbers.

    >>> [f.tolist() for f in cv_folds(5, 2)]
    [[4, 1, 2], [0, 3]]
    """
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(CV_SEED))
    return [perm[i::k].to(device) for i in range(k)]


def absent_classes(y: torch.Tensor, c: int) -> list[int]:
    """The class indices in [0, C) that never occur in ``y``."""
    return (torch.bincount(y, minlength=c) == 0).nonzero().flatten().tolist()


def describe_classes(classes: list[int]) -> str:
    """``"0, 3, 7"`` (the first ten, then ``...``)."""
    return ", ".join(map(str, classes[:10])) + (", ..." if len(classes) > 10 else "")


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

    def fit(self, logits: Any, labels: Any) -> Calibrator:  # pragma: no cover - abstract
        raise NotImplementedError

    def _transform(self, z: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _predict_proba(self, z: torch.Tensor) -> torch.Tensor:
        zt = self._transform(z)
        return torch.softmax(zt.to(work_dtype(zt.dtype)), dim=1).to(zt.dtype)

    def transform(self, logits: Any) -> Any:
        """Calibrated logits (N, C) in the logits' dtype and device (NumPy for NumPy input)."""
        self._check_fitted()
        return like_input(self._transform(prepare_logits(logits)), logits)

    def predict_proba(self, logits: Any) -> Any:
        """Calibrated probabilities (N, C): ``softmax(transform(logits))``, computed in at least
        float32 and returned in the logits' floating dtype (NumPy for NumPy input)."""
        self._check_fitted()
        return like_input(self._predict_proba(prepare_logits(logits)), logits)

    def fit_transform(self, logits: Any, labels: Any) -> Any:
        """``fit(logits, labels).transform(logits)``."""
        return self.fit(logits, labels).transform(logits)

    def score(self, logits: Any, labels: Any) -> float:
        """Mean log-likelihood ``(1/N) sum_i log q_{i, y_i}`` of the labels under the calibrated
        probabilities (the negative NLL, float64): higher is better, so ``GridSearchCV`` can
        tune a calibrator's settings without a ``scoring`` argument.

        Warns (:class:`WorseThanIdentityWarning`) when this NLL is worse than the uncalibrated
        probabilities' on the same data by more than 1 % (``IDENTITY_MARGIN``): on held-out
        data, the sign that the calibrator over-fits its validation set."""
        self._check_fitted()
        z = prepare_logits(logits)
        y = check_labels(labels, n=z.shape[0], num_classes=z.shape[1], device=z.device)
        return -self._nll_vs_identity(z, y, "scored (held-out)")

    def _nll_vs_identity(self, z: torch.Tensor, y: torch.Tensor, where: str) -> float:
        """The calibrated NLL of validated ``z``/``y``; warns when it is worse than the
        identity map's (:func:`identity_check`)."""
        logq = torch.log_softmax(self._transform(z).to(torch.float64), dim=1)
        nll = -float(logq.gather(1, y.unsqueeze(1)).mean())
        logp = torch.log_softmax(z.to(torch.float64), dim=1)
        identity_check(type(self).__name__, nll, -float(logp.gather(1, y.unsqueeze(1)).mean()),
                       where)
        return nll

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

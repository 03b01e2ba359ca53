"""Exception types raised by torchcal.

User mistakes that the command line should report as one clear line (unknown names, missing
data, corrupt files) derive from :class:`TorchcalError`.  Argument validation in library
functions raises plain :class:`ValueError` / :class:`TypeError`, as PyTorch does.
Warnings are shown on one line by the command line and its worker processes
(:func:`one_line_warnings`).

Every exception and warning class of torchcal is defined here, and only here
(``tools/check_architecture.py`` checks it); the modules that raise one re-export it under its
old import path.  The one exception made elsewhere is the post-hoc calibrators' subclass of
:class:`NotFittedError` that is also scikit-learn's, which needs scikit-learn at run time.
"""

from __future__ import annotations

__all__ = [
    "TorchcalError",
    "DataNotFoundError",
    "ChecksumError",
    "CheckpointError",
    "NotFittedError",
    "CalibrationFitError",
    "UnknownRecipeError",
    "CacheError",
    "StaleCacheError",
    "ResultsFileError",
    "InUseError",
    "DivergedError",
    "UnsafePathError",
    "LaneDivergedError",
    "TwoColumnWarning",
    "MissingValidationWarning",
    "WorseThanIdentityWarning",
    "MemorizedValidationWarning",
    "CompiledStepWarning",
    "PackedLossWarning",
    "InfiniteIntervalWarning",
    "NotConvergedWarning",
    "diverged_message",
    "one_line_warnings",
]
# Not in __all__ (internal signals, caught where they are raised): RefusedJSONValueError,
# RefusedPickleError.


class TorchcalError(Exception):
    """Base class for errors the CLI reports as a single line (no traceback)."""


class DataNotFoundError(TorchcalError, FileNotFoundError):
    """A data set file is absent and could not (or may not) be downloaded."""


class ChecksumError(TorchcalError, ValueError):
    """A downloaded or cached file does not match its published checksum."""


class CheckpointError(TorchcalError, RuntimeError):
    """A checkpoint is missing, truncated or was written by an incompatible configuration."""


class NotFittedError(TorchcalError, RuntimeError, ValueError, AttributeError):
    """A calibrator or head was used before ``fit``.

    A ``ValueError`` and an ``AttributeError`` as scikit-learn's ``NotFittedError`` is.  The
    post-hoc calibrators raise a subclass that is also scikit-learn's ``NotFittedError`` (its
    estimator checks and ``except sklearn.exceptions.NotFittedError`` recognise it), made by
    the posthoc layer on first use, so that this module imports no third-party package
    (``tools/check_architecture.py`` checks it) and importing the calibrators no
    scikit-learn."""


class CalibrationFitError(TorchcalError, RuntimeError):
    """A post-hoc calibrator could not be fitted (an optimiser ran out of budget, a non-finite
    objective); the message gives the reason.  The command line reports it as one line.

    :class:`torchcal.integrations.torchmetrics.CalibrationError` is a metric, not an error."""


class UnknownRecipeError(TorchcalError, ValueError):
    """The recipe name is not registered."""


class CacheError(TorchcalError, ValueError):
    """An embedding cache is missing, truncated, corrupt or not a cache."""


class StaleCacheError(CacheError):
    """An embedding cache was built from another backbone, other data or other settings."""


class ResultsFileError(TorchcalError, ValueError):
    """A results / logits file is missing or malformed."""


class InUseError(TorchcalError, BlockingIOError):
    """A run (or output) directory is locked by another live process (:func:`torchcal._io.exclusive_lock`)."""


class UnsafePathError(TorchcalError, OSError):
    """A path torchcal would write, lock or delete is a symbolic link, a FIFO, a device or a
    directory where a regular file (or a real directory) was expected: refused, so that nothing
    outside the run is written through it (:func:`torchcal._io.check_own_path`)."""


class DivergedError(TorchcalError, RuntimeError):
    """Training diverged: the loss or the parameters became NaN/Inf (the run stops at that epoch;
    its directory keeps the last good checkpoint).  Its message comes from
    :func:`diverged_message`."""


class LaneDivergedError(DivergedError, FloatingPointError):
    """A packed run's training loss or parameters became non-finite: that run stopped, the other
    runs of its pack go on.  Its message comes from :func:`diverged_message`."""


class RefusedJSONValueError(ValueError):
    """Internal: a JSON document holds a value torchcal refuses to read back (a huge integer, a
    number that overflows, NaN/Infinity); :func:`torchcal._io.parse_json` turns it into the
    caller's error with the file's name."""


class RefusedPickleError(ValueError):
    """Internal: a CIFAR pickle asked for something the official files never contain;
    :func:`torchcal.data.cifar.read_cifar_pickle` turns it into a ``ValueError`` naming the
    file."""


class TwoColumnWarning(UserWarning):
    """A 2-column input measured with ``task="multiclass"``: the top label is binned
    (:mod:`torchcal.metrics.tasks`)."""


class MissingValidationWarning(UserWarning):
    """A loss that needs validation statistics started an epoch without them
    (:class:`torchcal.losses.base.CalibrationLoss`)."""


class WorseThanIdentityWarning(RuntimeWarning):
    """A fitted calibrator's NLL on some data is worse than the uncalibrated probabilities'
    (the identity map, ``softmax(logits)``): it over-fits its validation set, or its
    optimisation failed."""


class MemorizedValidationWarning(WorseThanIdentityWarning):
    """A calibrator with more parameters than validation samples (matrix or Dirichlet scaling at
    many classes) fitted its validation labels far better than temperature scaling can: it has
    memorised them, and on other data it will likely be worse than no calibration."""


class CompiledStepWarning(UserWarning):
    """A pack asked for the compiled step trains eagerly (the warning says why;
    :mod:`torchcal.train.compiled`)."""


class PackedLossWarning(UserWarning):
    """A packed run's loss cannot join its group's vmapped call and is called alone
    (:mod:`torchcal.train.loss_groups`)."""


class InfiniteIntervalWarning(UserWarning):
    """Too few calibration points for the requested miscoverage: ``ceil((n + 1)(1 - alpha)) >
    n``, so the conformal interval (or threshold) is infinite, never silently narrow
    (:mod:`torchcal.conformal`)."""


class NotConvergedWarning(RuntimeWarning):
    """An iterative fit stopped before it converged; its result may be off
    (:mod:`torchcal.regression`, :mod:`torchcal.conformal`)."""


def diverged_message(epoch: int, what: str, then: str, run: str | None = None) -> str:
    """The message of :class:`DivergedError` and :class:`LaneDivergedError`: who diverged
    (``run``'s path, else "Training"), in which epoch (``epoch`` counts from 0, shown from 1),
    what became non-finite and what happens next or what to do.

    >>> diverged_message(1, "the training loss became NaN/Inf", "lower --lr")
    'Training diverged in epoch 2: the training loss became NaN/Inf; lower --lr'
    >>> diverged_message(0, "training loss nan", "the others go on", run="runs/a")
    "Run 'runs/a' diverged in epoch 1: training loss nan; the others go on"
    """
    who = "Training" if run is None else f"Run {run!r}"
    return f"{who} diverged in epoch {epoch + 1}: {what}; {then}"


def one_line_warnings(command: str):
    """A ``warnings.formatwarning`` giving ``torchcal COMMAND: warning: MESSAGE`` on one line
    (no file name, no source line).  Set by the command line while a command runs, never at
    import; only the display changes (filters and recording, e.g. pytest's, are untouched).

    >>> one_line_warnings("train")("amp is CUDA only; float32", UserWarning, "x.py", 3)
    'torchcal train: warning: amp is CUDA only; float32\\n'
    """

    def format_warning(message, category, filename, lineno, line=None) -> str:
        text = " ".join(str(message).split())
        kind = "warning" if category is UserWarning else category.__name__
        return f"torchcal {command}: {kind}: {text}\n"

    return format_warning

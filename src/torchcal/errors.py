"""Exception types raised by torchcal.

User mistakes that the command line should report as one clear line (unknown names, missing
data, corrupt files) derive from :class:`TorchcalError`.  Argument validation in library
functions raises plain :class:`ValueError` / :class:`TypeError`, as PyTorch does.
Warnings are shown on one line by the command line and its worker processes
(:func:`one_line_warnings`).
"""

from __future__ import annotations

__all__ = [
    "TorchcalError",
    "DataNotFoundError",
    "ChecksumError",
    "CheckpointError",
    "NotFittedError",
    "CalibrationError",
    "UnknownRecipeError",
    "CacheError",
    "StaleCacheError",
    "ResultsFileError",
    "InUseError",
    "DivergedError",
    "UnsafePathError",
    "MemberDivergedError",
    "diverged_message",
    "one_line_warnings",
]


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


class CalibrationError(TorchcalError, RuntimeError):
    """A post-hoc calibrator could not be fitted (an optimiser ran out of budget, a non-finite
    objective); the message gives the reason.  The command line reports it as one line."""


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


class MemberDivergedError(DivergedError, FloatingPointError):
    """A packed run's training loss or parameters became non-finite: that run stopped, the other
    runs of its pack go on.  Its message comes from :func:`diverged_message`."""


def diverged_message(epoch: int, what: str, then: str, run: str | None = None) -> str:
    """The message of :class:`DivergedError` and :class:`MemberDivergedError`: who diverged
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

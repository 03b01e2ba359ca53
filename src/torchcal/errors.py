"""Exception types raised by torchcal.

User mistakes that the command line should report as one clear line (unknown names, missing
data, corrupt files) derive from :class:`TorchcalError`.  Argument validation in library
functions raises plain :class:`ValueError` / :class:`TypeError`, as PyTorch does.
"""

from __future__ import annotations

__all__ = [
    "TorchcalError",
    "DataNotFoundError",
    "ChecksumError",
    "CheckpointError",
    "NotFittedError",
    "ResultsFileError",
    "InUseError",
]


class TorchcalError(Exception):
    """Base class for errors the CLI reports as a single line (no traceback)."""


class DataNotFoundError(TorchcalError, FileNotFoundError):
    """A data set file is absent and could not (or may not) be downloaded."""


class ChecksumError(TorchcalError, ValueError):
    """A downloaded or cached file does not match its published checksum."""


class CheckpointError(TorchcalError, RuntimeError):
    """A checkpoint is missing, truncated or was written by an incompatible configuration."""


try:  # scikit-learn (a required dependency) checks for its own NotFittedError
    from sklearn.exceptions import NotFittedError as _SklearnNotFitted
except ImportError:  # pragma: no cover - scikit-learn is installed with torchcal
    _SklearnNotFitted = RuntimeError  # type: ignore[misc,assignment]


class NotFittedError(TorchcalError, RuntimeError, _SklearnNotFitted):
    """A calibrator or head was used before ``fit`` (also scikit-learn's ``NotFittedError``,
    so its estimator checks and ``check_is_fitted`` users recognise it)."""


class ResultsFileError(TorchcalError, ValueError):
    """A results / logits file is missing or malformed."""


class InUseError(TorchcalError, BlockingIOError):
    """A run (or output) directory is locked by another live process (:func:`torchcal._io.exclusive_lock`)."""

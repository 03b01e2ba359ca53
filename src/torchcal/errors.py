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
    "ResultsFileError",
    "InUseError",
    "DivergedError",
    "UnsafePathError",
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


class UnsafePathError(TorchcalError, OSError):
    """A path torchcal would write, lock or delete is a symbolic link, a FIFO, a device or a
    directory where a regular file (or a real directory) was expected: refused, so that nothing
    outside the run is written through it (:func:`torchcal._io.check_own_path`)."""


class DivergedError(TorchcalError, RuntimeError):
    """Training diverged: the loss or the parameters became NaN/Inf (the run stops at that epoch;
    its directory keeps the last good checkpoint)."""
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

"""Deprecated: one run's building was renamed :mod:`torchcal.train.run` (these are not the
engine's steps, which live in :mod:`torchcal.train.engine`).

``import torchcal.train.steps`` still works: it warns once (``DeprecationWarning``) and serves
:mod:`torchcal.train.run`'s names.
"""

from __future__ import annotations

import warnings
from typing import Any

from . import run as _new
from .run import *  # noqa: F403  (the deprecated module serves every public name)
from .run import __all__  # noqa: F401

warnings.warn("torchcal.train.steps is deprecated: it was renamed torchcal.train.run",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_new, name)

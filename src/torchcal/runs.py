"""Deprecated: the run directory's module was renamed :mod:`torchcal.run_dir`.

``import torchcal.runs`` still works: it warns once (``DeprecationWarning``) and re-exports
:mod:`torchcal.run_dir`'s public names.
"""

from __future__ import annotations

import warnings

from .run_dir import *  # noqa: F403  (the deprecated module serves every public name)
from .run_dir import __all__  # noqa: F401

warnings.warn("torchcal.runs is deprecated: it was renamed torchcal.run_dir",
              DeprecationWarning, stacklevel=2)

"""The optional extras the integration tests need: skipped without them, except in CI (the
environment variable CI is set), where .ci/run installs every extra and a missing one fails."""

from __future__ import annotations

import importlib
import os

import pytest


def require(module: str, extra: str):
    """Import ``module``; skip the calling test module without it (fail in CI)."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f'needs the extra: pip install -e ".[{extra}]"')

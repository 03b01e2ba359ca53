"""The report tests' shared fixtures: ``runs``, a tree of fake evaluated runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_runs import write_runs  # same folder (pytest puts it on sys.path)


@pytest.fixture()
def runs(request, tmp_path) -> Path:
    """``tmp_path / "runs"`` written by :func:`write_runs` with the keywords of the test
    module's ``RUNS`` dict (none: its defaults, one seed of cross-entropy and focal loss)."""
    return write_runs(tmp_path / "runs", **getattr(request.module, "RUNS", {}))

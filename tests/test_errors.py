"""``torchcal.errors`` holds every exception and warning class; the modules that raise one
re-export it under its old import path."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from torchcal import errors

# (module that raised it before it moved to errors.py, class name)
MOVED = [
    ("torchcal.metrics.tasks", "TwoColumnWarning"),
    ("torchcal.metrics", "TwoColumnWarning"),
    ("torchcal.losses.base", "MissingValidationWarning"),
    ("torchcal.losses", "MissingValidationWarning"),
    ("torchcal.posthoc.base", "WorseThanIdentityWarning"),
    ("torchcal.posthoc", "WorseThanIdentityWarning"),
    ("torchcal.posthoc", "MemorizedValidationWarning"),
    ("torchcal.train.compiled", "CompiledStepWarning"),
    ("torchcal.train.loss_groups", "PackedLossWarning"),
    ("torchcal.posthoc", "CalibrationFitError"),
]


@pytest.mark.parametrize("module, name", MOVED)
def test_moved_classes_are_reexported_where_they_were_defined(module, name):
    obj = getattr(importlib.import_module(module), name)
    assert obj is getattr(errors, name) and obj.__module__ == "torchcal.errors"
    assert name in errors.__all__


def test_the_torchmetrics_metric_keeps_its_name():
    tm = pytest.importorskip("torchcal.integrations.torchmetrics")
    assert not issubclass(tm.CalibrationError, BaseException)


def test_the_former_names_are_gone():
    """0.1.0 keeps no renamed names (CHANGELOG.md lists them)."""
    import torchcal.posthoc
    from torchcal.train import joint_head, loss_groups
    for mod, old in ((errors, "CalibrationError"), (torchcal.posthoc, "CalibrationError"),
                     (joint_head, "NoHead"), (loss_groups, "loss_pack_problem")):
        assert not hasattr(mod, old), (mod.__name__, old)


def test_errors_imports_the_standard_library_only():
    code = ("import sys; before = set(sys.modules); import torchcal.errors; "
            "print('\\n'.join(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    third_party = [m for m in out if m.split(".")[0] not in sys.stdlib_module_names
                   and m.split(".")[0] != "torchcal"]
    assert "torchcal.errors" in out and third_party == [], out

"""``torchcal.errors`` holds every exception and warning class; the modules that raise one
re-export it under its old import path, and renamed classes keep their old names as deprecated
aliases that are the class itself (``except OldName`` keeps catching)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

from torchcal import errors
from torchcal.errors import CalibrationFitError, renamed_getattr

# (module that raised it before it moved to errors.py, class name)
MOVED = [
    ("torchcal.metrics.tasks", "TwoColumnWarning"),
    ("torchcal.metrics", "TwoColumnWarning"),
    ("torchcal.losses.base", "MissingValidationWarning"),
    ("torchcal.losses", "MissingValidationWarning"),
    ("torchcal.posthoc._common", "WorseThanIdentityWarning"),
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


@pytest.mark.parametrize("module", ["torchcal.errors", "torchcal.posthoc"])
def test_calibration_error_is_a_deprecated_alias_of_the_fit_error(module):
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"{module}.CalibrationError is deprecated: "
                      r"it was renamed torchcal\.\w+\.CalibrationFitError"):
        old = mod.CalibrationError
    assert old is CalibrationFitError
    with pytest.raises(old, match="budget"):  # ``except CalibrationError`` keeps catching
        raise CalibrationFitError("L-BFGS used its budget")
    assert "CalibrationError" not in mod.__all__  # ``import *`` gives no deprecated name
    with pytest.warns(DeprecationWarning):
        exec(f"from {module} import CalibrationError as imported", {})


def test_the_torchmetrics_metric_keeps_its_name():
    tm = pytest.importorskip("torchcal.integrations.torchmetrics")
    assert not issubclass(tm.CalibrationError, BaseException)


def test_renamed_getattr_refuses_other_names():
    get = renamed_getattr("m", {"Old": ("m.New", KeyError)})
    with pytest.raises(AttributeError, match="module 'm' has no attribute 'Gone'"):
        get("Gone")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DeprecationWarning, match="m.Old is deprecated: it was renamed m.New"):
            get("Old")
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        errors.Nope  # noqa: B018


def test_errors_imports_the_standard_library_only():
    code = ("import sys; before = set(sys.modules); import torchcal.errors; "
            "print('\\n'.join(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    third_party = [m for m in out if m.split(".")[0] not in sys.stdlib_module_names
                   and m.split(".")[0] != "torchcal"]
    assert "torchcal.errors" in out and third_party == [], out

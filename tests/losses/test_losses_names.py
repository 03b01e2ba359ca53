"""Issue 32 item 5: a loss's registry name, its class and its function share one stem
(``ece_gap`` -> ``ECEGapLoss`` -> ``ece_gap_loss``); the former registry names are gone.  The
exceptions are listed here, each with why."""

from __future__ import annotations

import inspect

import pytest

import torchcal.functional as F
from torchcal.losses import LOSSES, ECEGapLoss, MMCEUnweightedLoss, create_loss, list_losses

#: The papers' abbreviations kept as registry names: name -> class.
ABBREVIATED = {"ce": "CrossEntropyLoss", "ls": "LabelSmoothingLoss",
               "ce_exp": "CrossEntropyExpLoss"}
#: Losses without a plain function, and why.
NO_FUNCTION = {
    "adafocal": "its γ per bin is state updated from validation passes (the module only)",
    "ce": "torch's cross-entropy: torchcal.functional.cross_entropy",
    "ls": "torchcal.functional.label_smoothing_loss (the abbreviation again)",
}


def _stem(text: str) -> str:
    return text.lower().replace("_", "")


@pytest.mark.parametrize("name", list_losses())
def test_registry_name_class_and_function_share_a_stem(name):
    obj = LOSSES.get(name)
    if not inspect.isclass(obj):  # a factory of a published setting (flsd53: focal's schedule)
        return
    if name in ABBREVIATED:
        assert obj.__name__ == ABBREVIATED[name]
    else:
        assert obj.__name__.endswith("Loss") and _stem(obj.__name__[:-4]) == _stem(name), (
            name, obj.__name__)
    if name not in NO_FUNCTION:
        assert callable(getattr(F, f"{name}_loss", None)), f"torchcal.functional.{name}_loss"


def test_former_names_are_gone():
    for old in ("ece_loss", "mmce_m"):  # now ece_gap, mmce_unweighted (CHANGELOG.md)
        assert old not in LOSSES
        with pytest.raises(ValueError, match="Unknown loss"):
            create_loss(old)
    assert isinstance(create_loss("ece_gap"), ECEGapLoss)
    assert isinstance(create_loss("mmce_unweighted"), MMCEUnweightedLoss)

"""A loss that needs validation statistics warns (once) when an epoch starts without them
(issue 24, 1): AdaFocal used to become focal loss with γ = 1 without a word."""

from __future__ import annotations

import warnings

import pytest
import torch

from torchcal.losses import create_loss, list_losses
from torchcal.losses.base import MissingValidationWarning

STATEFUL = [n for n in list_losses() if getattr(create_loss(n), "wants_validation", False)]


def val_data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(40, 3, generator=g) * 3, torch.randint(0, 3, (40,), generator=g)


def test_every_stateful_loss_is_covered():
    assert {"adafocal", "ece_gap", "temperature_focal", "temperature_bsce",
            "consistency"} <= set(STATEFUL)


@pytest.mark.parametrize("name", STATEFUL)
def test_hand_loop_without_validation_warns_once_naming_loss_and_call(name):
    loss = create_loss(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingValidationWarning)
        loss.set_epoch(0)  # the first epoch has no statistics by construction
    with pytest.warns(MissingValidationWarning) as rec:
        loss.set_epoch(1)
        loss.set_epoch(2)
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert type(loss).__name__ in msg and f"loss.{loss.validation_call}(" in msg
    assert "epoch 1" in msg


@pytest.mark.parametrize("name", STATEFUL)
@pytest.mark.parametrize("call", ["on_validation", "own"])
def test_fed_loss_does_not_warn(name, call):
    loss = create_loss(name)
    z, y = val_data()
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingValidationWarning)
        warnings.simplefilter("ignore", RuntimeWarning)  # a temperature at its grid's end
        for epoch in range(3):
            loss.set_epoch(epoch)
            fn = loss.on_validation if call == "on_validation" else getattr(
                loss, loss.validation_call)
            fn(logits=z, labels=y)


def test_missing_one_epoch_after_updates_warns_and_resume_does_not():
    loss = create_loss("adafocal")
    z, y = val_data()
    loss.set_epoch(0)
    loss.update(logits=z, labels=y)
    loss.set_epoch(1)  # fed: no warning
    with pytest.warns(MissingValidationWarning, match="since epoch 1"):
        loss.set_epoch(2)
    # a loss restored from a checkpoint starts at its resume epoch without a warning
    resumed = create_loss("adafocal")
    resumed.load_state_dict(loss.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingValidationWarning)
        resumed.set_epoch(3)
        resumed.set_epoch(3)  # the same epoch again is not a new epoch


def test_stateless_losses_never_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingValidationWarning)
        for name in ("focal", "flsd53", "flsc531", "ce"):
            loss = create_loss(name)
            for epoch in range(3):
                loss.set_epoch(epoch)

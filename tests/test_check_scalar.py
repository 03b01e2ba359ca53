"""The one parametrised scalar check (``torchcal._validation.check_scalar``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from torchcal._validation import check_scalar


@pytest.mark.parametrize(
    "value, kwargs, expected",
    [
        (3, dict(target_type=int, min_val=1), 3),
        (np.int64(0), dict(target_type=int, min_val=0), 0),
        (0.5, dict(min_val=0.0, max_val=1.0), 0.5),
        (1.0, dict(min_val=0.0, max_val=1.0), 1.0),
        (0.0, dict(min_val=0.0, max_val=1.0, include_boundaries="left"), 0.0),
        (torch.tensor(2.5), dict(min_val=0.0), 2.5),
        (-7.0, dict(), -7.0),
        (None, dict(allow_none=True), None),
    ],
)
def test_valid_values_come_back_converted(value, kwargs, expected):
    out = check_scalar(value, "x", **kwargs)
    assert out == expected and type(out) is type(expected)


@pytest.mark.parametrize(
    "value, kwargs, message",
    [
        (0, dict(target_type=int, min_val=1), "Expected `x` to be a positive integer, got 0"),
        (-1, dict(target_type=int, min_val=0), "a non-negative integer, got -1"),
        (2.0, dict(target_type=int, min_val=1), "a positive integer, got 2.0"),
        (True, dict(target_type=int, min_val=1), "a positive integer, got True"),
        (True, dict(), "a finite number, got True"),
        (-0.1, dict(min_val=0.0), "a finite non-negative number, got -0.1"),
        (0.0, dict(min_val=0.0, include_boundaries="neither"), "a finite number > 0, got 0.0"),
        (math.nan, dict(), "a finite number, got nan"),
        (math.inf, dict(min_val=0.0), "a finite non-negative number, got inf"),
        ("0.5", dict(min_val=0.0, max_val=1.0), "a number in [0, 1], got '0.5'"),
        (1.0, dict(min_val=0.0, max_val=1.0, include_boundaries="left"),
         "a number in [0, 1), got 1.0"),
        (0.0, dict(min_val=0.0, max_val=1.0, include_boundaries="right"),
         "a number in (0, 1], got 0.0"),
        (5, dict(target_type=int, min_val=2, max_val=4), "an integer in [2, 4], got 5"),
        (1.5, dict(min_val=2.0), "a finite number >= 2, got 1.5"),
        (3.0, dict(max_val=2.0, include_boundaries="left"), "a finite number < 2, got 3.0"),
        (-1, dict(target_type=int, min_val=0, allow_none=True),
         "a non-negative integer or None, got -1"),
        (None, dict(), "a finite number, got None"),
        (torch.tensor([1.0]), dict(), "a finite number, got tensor([1.])"),
        (torch.tensor(1.0, requires_grad=True), dict(), "a finite number, got tensor(1."),
        (0.2, dict(min_val=0.5, expected="big enough"), "to be big enough, got 0.2"),
    ],
)
def test_bad_values_name_the_argument_and_the_rule(value, kwargs, message):
    with pytest.raises(ValueError) as info:
        check_scalar(value, "x", **kwargs)
    assert message in str(info.value)


def test_bad_options():
    with pytest.raises(TypeError, match="target_type"):
        check_scalar(1, "x", str)
    with pytest.raises(ValueError, match="include_boundaries"):
        check_scalar(1.0, "x", include_boundaries="open")

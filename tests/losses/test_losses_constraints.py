"""Each loss declares its hyperparameters' constraints (``_parameter_constraints``, after
scikit-learn); validation checks exactly those, refuses undeclared names at construction, and a
loss never depends on the order in which its hyperparameters reach :class:`CalibrationLoss`.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from loss_data import logits_targets

import torchcal.functional as TF
from torchcal.losses import (
    LOSSES,
    CalibrationLoss,
    TemperatureBSCELoss,
    create_loss,
    list_losses,
    register_loss,
)
from torchcal.losses.base import Interval, Options

_BASE_ARGS = ("reduction", "ignore_index", "validate_args")


_data = partial(logits_targets, n=8, c=5, scale=3.0, dtype=torch.float32)


def test_temperature_bsce_subclass_with_gamma_before_beta_keeps_them_apart():
    """The issue's case: a subclass passing ``gamma=`` before ``beta=`` to the base class got
    β and γ swapped by the temperature losses' forward (it passed them by position in the
    order given): 27.47 instead of 4.07 here."""

    class GammaFirst(TemperatureBSCELoss):
        def __init__(self, gamma=2.0, beta=2.0):
            CalibrationLoss.__init__(self, gamma=gamma, beta=beta, criterion="ece")
            self._init_temperature()

    x, y = _data()
    got = GammaFirst(gamma=1.0, beta=3.0)(x, y)
    ref = TF.temperature_bsce_loss(x, y, beta=3.0, gamma=1.0, temperature=1.0)
    assert abs(float(ref) - 4.0665) < 1e-3  # an independent value, not the swapped 27.47
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(got, TemperatureBSCELoss(beta=3.0, gamma=1.0)(x, y))


class _ReverseHyperparameters(CalibrationLoss):
    """Sits just above :class:`CalibrationLoss` in a subclass' MRO and hands the hyperparameters
    on in the reverse of the order it got them."""

    def __init__(self, **kwargs):
        hyper = {k: v for k, v in kwargs.items() if k not in _BASE_ARGS}
        rest = {k: v for k, v in kwargs.items() if k in _BASE_ARGS}
        super().__init__(**dict(reversed(list(hyper.items()))), **rest)


def _distinct_values(loss: CalibrationLoss) -> dict:
    """The loss' hyperparameters with every number moved by a different amount, so that two
    swapped hyperparameters give a different loss (β = γ = 2 by default, e.g.)."""
    out = {}
    for k, (name, v) in enumerate(loss.hyperparameters.items()):
        if isinstance(v, float):
            v = v + 0.1 * (k + 1)
        out[name] = v
    return out


@pytest.mark.parametrize("name", list_losses())
def test_every_loss_subclassed_with_reordered_keywords_gives_the_base_value(name):
    base = create_loss(name)
    cls = type(base)
    hp = _distinct_values(base)

    class Reordered(cls, _ReverseHyperparameters):
        pass

    assert Reordered.__mro__.index(_ReverseHyperparameters) == \
        Reordered.__mro__.index(CalibrationLoss) - 1
    ref, sub = cls(**hp, reduction="sum"), Reordered(**hp, reduction="sum")
    assert sub.hyperparameters == ref.hyperparameters == hp
    assert repr(sub) == repr(ref).replace(cls.__name__, "Reordered", 1)
    x, y = _data()
    torch.testing.assert_close(sub(x, y), ref(x, y), rtol=0, atol=0)


@pytest.mark.parametrize("name", list_losses())
def test_every_loss_declares_exactly_its_hyperparameters(name):
    loss = create_loss(name)
    declared = type(loss)._parameter_constraints
    assert list(loss.hyperparameters) == list(declared)
    for hp, constraint in declared.items():
        assert callable(constraint), (name, hp)
    assert tuple(loss.hyperparameters) == loss._hyperparameters


def test_an_undeclared_hyperparameter_is_refused_at_construction():
    class Undeclared(CalibrationLoss):
        def __init__(self, epsilon=0.1, *, reduction="mean"):
            super().__init__(epsilon=epsilon, reduction=reduction)

    with pytest.raises(TypeError, match=r"undeclared hyperparameter\(s\) \['epsilon'\].*"
                                        r"declares \[\]") as info:
        Undeclared(epsilon="abc")
    assert "\n" not in str(info.value)

    class Missing(CalibrationLoss):
        _parameter_constraints = {"gamma": Interval(float, 0, None, closed="left"),
                                  "beta": Interval(float, 0, None, closed="neither")}

        def __init__(self, gamma=1.0):
            super().__init__(gamma=gamma)

    with pytest.raises(TypeError, match=r"\['beta'\] .*not passed"):
        Missing()


def test_a_user_loss_declares_its_own_constraints():
    @register_loss("_test_eps", paper="a test")
    class Eps(CalibrationLoss):
        _parameter_constraints = {"epsilon": Interval(float, 0, None, closed="left"),
                                  "mode": Options(("a", "b"))}

        def __init__(self, epsilon=0.1, mode="a", *, reduction="mean"):
            super().__init__(epsilon=epsilon, mode=mode, reduction=reduction)

        def forward(self, input, target):
            return self.epsilon * torch.nn.functional.cross_entropy(input, target)

    try:
        with pytest.raises(ValueError, match="Expected `epsilon` to be a finite non-negative "
                                             "number, got 'abc'"):
            create_loss("_test_eps", epsilon="abc")
        with pytest.raises(ValueError, match=r"Expected `mode` to be one of \('a', 'b'\), "
                                             "got 'c'"):
            Eps(mode="c")
        loss = create_loss("_test_eps", epsilon=2, mode="b")
        assert loss.epsilon == 2.0 and isinstance(loss.epsilon, float)
        assert repr(loss) == "Eps(epsilon=2.0, mode='b', reduction='mean')"
    finally:
        LOSSES.unregister("_test_eps")


def test_constraints_report_the_argument_and_what_was_expected():
    assert Interval(int, 1, None)(3, "n_bins") == 3
    with pytest.raises(ValueError, match="Expected `n_bins` to be a positive integer, got 0"):
        Interval(int, 1, None)(0, "n_bins")
    with pytest.raises(ValueError, match=r"Expected `alpha` to be a number in \[0, 1\), got 1"):
        Interval(float, 0, 1, closed="left")(1, "alpha")
    assert Interval(int, 1, None, allow_none=True)(None, "update_every") is None
    with pytest.raises(ValueError, match=r"one of \('ece', 'nll'\)"):
        Options(("ece", "nll"))("adaece", "criterion")
    with pytest.raises(ValueError, match="`closed`"):
        Interval(float, 0, 1, closed="open")
    assert "Interval(float, 0, None, closed='left')" == repr(Interval(float, 0, None,
                                                                      closed="left"))


@pytest.mark.parametrize("name", list_losses())
def test_every_loss_log_state_is_json(name):
    import json

    loss = create_loss(name)
    state = loss.log_state()
    assert json.loads(json.dumps(state)) == state


def test_log_state_of_the_stateful_losses():
    from torchcal.losses import AdaFocalLoss, ScheduledFocalLoss

    ada = AdaFocalLoss(n_bins=2)
    assert ada.log_state() == {"gammas": [1.0, 1.0], "bin_edges": [0.0, 0.5, 1.0]}
    sched = ScheduledFocalLoss(milestones=(2,), gammas=(5.0, 1.0))
    sched.set_epoch(2)
    assert sched.log_state() == {"gamma": 1.0}
    temp = TemperatureBSCELoss()
    temp.temperature.fill_(2.5)
    assert temp.log_state() == {"temperature": 2.5}
    assert create_loss("focal").log_state() == {}  # a constant γ is in the config, not the log

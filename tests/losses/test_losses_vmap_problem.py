"""``CalibrationLoss.vmap_problem`` says why a loss cannot join a vmapped group of packed runs;
its former name ``pack_problem`` (which in train/ means "this run cannot join a pack") is a
deprecated alias, and a loss written before the rename that overrides ``pack_problem`` keeps
deciding (with a warning), also through ``super()`` chains."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from torchcal.losses import ConsistencyLoss, FocalLoss
from torchcal.losses.base import CalibrationLoss
from torchcal.posthoc import TemperatureScaling
from torchcal.train import loss_groups


class _Plain(CalibrationLoss):
    def forward(self, logits, labels):
        return logits.sum()


def test_vmap_problem_names_what_cannot_be_stacked():
    assert FocalLoss().vmap_problem() is None
    assert "calibrator" in ConsistencyLoss(calibrator=TemperatureScaling()).vmap_problem()
    held = _Plain()
    held.cache = torch.zeros(2)
    assert "holds the tensor 'cache' outside its buffers" in held.vmap_problem()
    held = _Plain()
    held.w = nn.Parameter(torch.zeros(1))
    assert "has trainable parameters" in held.vmap_problem()
    assert loss_groups.loss_vmap_problem(nn.CrossEntropyLoss()).startswith("CrossEntropyLoss")


def test_pack_problem_is_a_deprecated_alias():
    with pytest.warns(DeprecationWarning, match="pack_problem is deprecated: it was renamed "
                      "vmap_problem"):
        why = ConsistencyLoss(calibrator=TemperatureScaling()).pack_problem()
    assert "calibrator" in why  # the subclass's override decides, as before
    with pytest.warns(DeprecationWarning, match="loss_pack_problem is deprecated"):
        old = loss_groups.loss_pack_problem
    assert old is loss_groups.loss_vmap_problem


def _legacy_classes():
    with pytest.warns(DeprecationWarning, match="Legacy overrides CalibrationLoss.pack_problem"):
        class Legacy(ConsistencyLoss):
            def pack_problem(self):
                return getattr(self, "refuse", None) or super().pack_problem()
    with pytest.warns(DeprecationWarning, match="Legacy2 overrides"):
        class Legacy2(Legacy):
            def pack_problem(self):
                return super().pack_problem()

    class Modern(Legacy2):  # renamed: no warning at definition
        def vmap_problem(self):
            return super().vmap_problem()
    return Legacy, Legacy2, Modern


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_loss_that_overrides_the_old_name_still_decides(which):
    """Without the legacy mapping, the grouping would call the base vmap_problem and vmap a loss
    its author refused: silently wrong.  With it, the override is heard, through ``super()``
    (down to ConsistencyLoss's own reason) and without recursion."""
    cls = _legacy_classes()[which]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        loss = cls()
        assert loss.vmap_problem() is None
        loss.refuse = "a Python-object state"
        assert loss_groups.loss_vmap_problem(loss) == "a Python-object state"
        assert loss.pack_problem() == "a Python-object state"
        del loss.refuse
        loss.calibrator = TemperatureScaling()
        assert "calibrator" in loss.vmap_problem() and "calibrator" in loss.pack_problem()

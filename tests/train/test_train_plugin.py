"""A run's plug-in interface is :class:`torchcal.train.plugin.RunPlugin` ("head" names the
uncertainty head a plug-in may train, not the interface)."""

from __future__ import annotations

import torch
from torch import nn

from torchcal.train.joint_head import JointHead
from torchcal.train.multitask import TaskHead
from torchcal.train.plugin import RunPlugin


def test_the_plug_ins_share_the_run_plugin_interface():
    assert issubclass(JointHead, RunPlugin) and issubclass(TaskHead, RunPlugin)
    bare = RunPlugin()
    model = nn.Linear(2, 2)
    assert bare.wrap(model) is model and bare.results() is None
    total = torch.tensor(1.0)
    assert bare.add_loss(total, None, None, None) is total
    assert bare.state(full=True) == {"head": None, "head_optimizer": None}


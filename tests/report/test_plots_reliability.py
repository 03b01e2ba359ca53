"""reliability_diagram: a real PNG with the bars the reliability curve says, Agg only."""

import numpy as np
import pytest
import torch
from PIL import Image

import torchcal.metrics as M
from torchcal.report import plots


def _data():
    g = torch.Generator().manual_seed(0)
    z = 3 * torch.randn(400, 5, generator=g)
    y = torch.randint(0, 5, (400,), generator=g)
    return z, y


def test_png_written_atomically_with_two_panels(tmp_path):
    z, y = _data()
    path = tmp_path / "sub" / "rel.png"
    fig = plots.reliability_diagram(logits=z, labels=y, n_bins=10, title="demo", path=path)
    assert path.exists() and [p.name for p in path.parent.iterdir()] == ["rel.png"]
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 200 and im.size[1] > 200
    top, bottom = fig.axes
    assert top.get_title() == "demo"
    # accuracy bars = the non-empty bins of the reliability curve, with its heights
    curve = M.reliability_curve(logits=z, labels=y, n_bins=10)
    filled = curve.counts > 0
    acc_bars = top.containers[0]
    heights = np.array([r.get_height() for r in acc_bars])
    assert np.allclose(heights, curve.accuracies[filled].numpy(), atol=1e-6)
    # histogram: shares sum to 1
    shares = np.array([r.get_height() for r in bottom.containers[0]])
    assert shares.sum() == pytest.approx(1.0)
    # the ECE label matches the metric
    texts = [t.get_text() for t in top.texts]
    ece = M.ece(logits=z, labels=y, n_bins=10).item()
    assert texts == [f"ECE = {100 * ece:.2f}%"]


def test_into_existing_axes_and_bad_input():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    z, y = _data()
    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    out = plots.reliability_diagram(probs=torch.softmax(z, 1).numpy(), labels=y.numpy(), ax=ax)
    assert out is fig and len(fig.axes) == 1
    with pytest.raises(ValueError, match="exactly one of `logits` or `probs`"):
        plots.reliability_diagram(labels=y)

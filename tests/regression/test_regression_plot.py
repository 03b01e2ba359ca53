"""The regression reliability diagrams draw the numbers of the metric functions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchcal.regression import Gaussian, calibration_curve, ence, quantile_calibration_error
from torchcal.regression.plot import regression_reliability_diagram, sigma_reliability_diagram


def _pred(n=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(n, generator=g, dtype=torch.float64)
    sd = 0.2 + 2 * torch.rand(n, generator=g, dtype=torch.float64)
    y = mu + 1.3 * sd * torch.randn(n, generator=g, dtype=torch.float64)
    return Gaussian(mu, std=sd), y


@pytest.mark.parametrize("kind", ["interval", "quantile"])
def test_regression_reliability_diagram_draws_the_calibration_curve(kind, tmp_path):
    pred, y = _pred()
    fig = regression_reliability_diagram(pred, y, kind=kind, title="t", path=tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    ax = fig.axes[0]
    exp, obs = calibration_curve(pred, y, kind=kind)
    curve = ax.get_lines()[-1]
    assert np.allclose(curve.get_xdata(), exp.numpy()) and np.allclose(curve.get_ydata(),
                                                                       obs.numpy())
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    mace = float(quantile_calibration_error(pred, y, kind=kind))
    area = float(quantile_calibration_error(pred, y, kind=kind, norm="area"))
    assert f"MACE {mace:.3f}" in texts[-1] and f"area {area:.3f}" in texts[1]


def test_sigma_reliability_diagram_points_are_rmv_and_rmse_per_bin():
    pred, y = _pred(400, 1)
    fig = sigma_reliability_diagram(pred, y, n_bins=4)
    pts = fig.axes[0].get_lines()[-1]
    sd, err = pred.std.numpy(), (y - pred.mean).numpy()
    order = np.argsort(sd)
    rmv = [np.sqrt(np.mean(sd[order[k * 100:(k + 1) * 100]] ** 2)) for k in range(4)]
    rmse = [np.sqrt(np.mean(err[order[k * 100:(k + 1) * 100]] ** 2)) for k in range(4)]
    assert np.allclose(pts.get_xdata(), rmv) and np.allclose(pts.get_ydata(), rmse)
    label = fig.axes[0].get_legend().get_texts()[-1].get_text()
    assert f"ENCE {float(ence(pred, y, n_bins=4)):.3f}, 100 per bin" in label


def test_diagrams_draw_into_the_callers_axes():
    # deferred: matplotlib is only needed by this test
    from matplotlib.figure import Figure

    pred, y = _pred(100, 2)
    fig = Figure()
    left, right = fig.subplots(1, 2)
    assert regression_reliability_diagram(pred, y, ax=left) is fig
    assert sigma_reliability_diagram(pred, y, 5, ax=right, std_range=(0.1, 10)) is fig
    assert right.get_lines() and left.get_lines()

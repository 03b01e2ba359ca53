"""RegressionMeter over batches equals the metric functions over all the data; DDP sync."""

from __future__ import annotations

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from torchcal.regression import (
    Gaussian,
    Quantiles,
    RegressionMeter,
    Samples,
    crps,
    ence,
    gaussian_nll,
    interval_coverage,
    interval_score,
    interval_width,
    pinball_loss,
    quantile_calibration_error,
    sharpness,
    uce,
)

STD_RANGE = (0.05, 20.0)


def _dense(seed=0, n=40):
    g = torch.Generator().manual_seed(seed)
    shape = (n, 3, 4)
    mu = torch.randn(shape, generator=g, dtype=torch.float64)
    sd = 0.2 + 2 * torch.rand(shape, generator=g, dtype=torch.float64)
    y = mu + 1.2 * sd * torch.randn(shape, generator=g, dtype=torch.float64)
    mask = torch.rand(shape, generator=g) > 0.25
    draws = mu + sd * torch.randn((9, *shape), generator=g, dtype=torch.float64)
    return mu, sd, y, mask, draws


def _expected(pred, y, mask, kind, alpha, levels=None):
    """The functions over all the data (the reference the meter must equal)."""
    k = {"mask": mask}
    out = {"crps": crps(pred, y, **k)}
    if kind == "quantiles":
        out["pinball"] = pinball_loss(pred, y, **k)
        out["qce"] = quantile_calibration_error(pred, y, **k)
        out["qce_quantile"] = quantile_calibration_error(pred, y, kind="quantile", **k)
        out["miscalibration_area"] = quantile_calibration_error(pred, y, norm="area", **k)
    else:
        mean = pred.mean[mask]
        out["mae"] = (y[mask] - mean).abs().mean()
        out["rmse"] = (y[mask] - mean).square().mean().sqrt()
        out["sharpness"] = sharpness(pred, mask=mask)
        for name, fn in (("ence", ence), ("uce", uce)):
            out[name] = fn(pred, y, n_bins=6, std_range=STD_RANGE, **k)
        out["qce"] = quantile_calibration_error(pred, y, levels, **k)
        out["qce_quantile"] = quantile_calibration_error(pred, y, levels, kind="quantile", **k)
        out["miscalibration_area"] = quantile_calibration_error(pred, y, levels, norm="area",
                                                                **k)
    if kind == "gaussian":
        out["nll"] = gaussian_nll(pred, y, **k)
    out["picp"] = interval_coverage(pred, y, alpha=alpha, **k)
    out["mpiw"] = interval_width(pred, y, alpha=alpha, **k)
    out["interval_score"] = interval_score(pred, y, alpha=alpha, **k)
    return out


def _batches(n, size):
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


@pytest.mark.parametrize("kind", ["gaussian", "samples", "quantiles"])
def test_meter_over_batches_equals_functions_over_all_data(kind):
    mu, sd, y, mask, draws = _dense()
    levels = torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95], dtype=torch.float64)
    full = {"gaussian": Gaussian(mu, std=sd), "samples": Samples(draws),
            "quantiles": Gaussian(mu, std=sd).quantiles(levels)}[kind]
    meter = RegressionMeter(kind, alpha=0.1, n_bins=6, std_range=STD_RANGE,
                            levels=levels if kind == "quantiles" else None)
    for sl in _batches(mu.shape[0], 7):
        part = {"gaussian": lambda s=sl: Gaussian(mu[s], std=sd[s]),
                "samples": lambda s=sl: Samples(draws[:, s]),
                "quantiles": lambda s=sl: Gaussian(mu[s], std=sd[s]).quantiles(levels)}[kind]()
        meter.update(part, y[sl], mask=mask[sl])
    got = meter.compute()
    want = _expected(full, y, mask, kind, 0.1)
    assert set(got) == set(want) == set(meter.keys)
    for key, value in want.items():
        assert got[key].dtype == torch.float64 and got[key].ndim == 0
        assert float(got[key]) == pytest.approx(float(value), rel=1e-10, abs=1e-12), key
    assert meter.num_samples == int(mask.sum())


def test_meter_point_predictions_and_reset():
    mu, _, y, mask, _ = _dense(1)
    meter = RegressionMeter("point")
    meter.update(mu[:10], y[:10], mask=mask[:10])
    meter.update(mu[10:], y[10:], ignore_value=None, mask=mask[10:])
    out = meter.compute()
    err = (y[mask] - mu[mask])
    assert set(out) == {"crps", "mae", "rmse"}
    assert float(out["crps"]) == pytest.approx(float(err.abs().mean()))
    assert float(out["rmse"]) == pytest.approx(math.sqrt(float(err.square().mean())))
    meter.reset()
    assert meter.state is None
    with pytest.raises(ValueError, match="at least one observed target"):
        meter.compute()


def test_meter_skips_a_fully_masked_batch_and_refuses_a_wrong_kind():
    meter = RegressionMeter("gaussian")
    meter.update(Gaussian([0.0, 1.0], [1.0, 1.0]), [0.0, 0.0], ignore_value=0.0)
    assert meter.num_samples == 0
    with pytest.raises(TypeError, match="kind 'gaussian'"):
        meter.update(torch.tensor([0.0]), [1.0])
    with pytest.raises(ValueError, match="levels"):
        RegressionMeter("quantiles")
    with pytest.raises(ValueError, match="kind"):
        RegressionMeter("bernoulli")
    qm = RegressionMeter("quantiles", levels=[0.1, 0.9])
    with pytest.raises(ValueError, match="levels"):
        qm.update(Quantiles([[0.0, 1.0]], [0.2, 0.8]), [0.5])


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank, port, world, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mu, sd, y, mask, _ = _dense(2)
        meter = RegressionMeter("gaussian", n_bins=6, std_range=STD_RANGE)
        if rank == 0:  # rank 0 sees the first 30 rows, rank 1 the other 10
            meter.update(Gaussian(mu[:30], std=sd[:30]), y[:30], mask=mask[:30])
        else:
            meter.update(Gaussian(mu[30:], std=sd[30:]), y[30:], mask=mask[30:])
        out = meter.compute()
        queue.put((rank, {k: float(v) for k, v in out.items()}))
    finally:
        dist.destroy_process_group()


def test_meter_syncs_under_a_gloo_group_of_two():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_ddp_worker, args=(r, port, 2, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    mu, sd, y, mask, _ = _dense(2)
    single = RegressionMeter("gaussian", n_bins=6, std_range=STD_RANGE)
    single.update(Gaussian(mu, std=sd), y, mask=mask)
    want = single.compute()
    for rank in (0, 1):
        for key, value in want.items():
            assert results[rank][key] == pytest.approx(float(value), rel=1e-12), (rank, key)

"""CalibrationMeter: equals the functional metrics over all the data, in any batching, and
under torch.distributed (2 CPU processes, gloo) equals one process over all the data."""

import math
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

import torchcal.metrics as M

KEYS = ["ece", "adaptive_ece", "classwise_ece", "mce", "rmsce", "nll", "brier", "error",
        "topk_error", "s99_share", "s99_accuracy"]


def _data(n, c, seed, scale=4.0):
    g = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(n, c, generator=g, dtype=torch.float64)
    y = torch.randint(0, c, (n,), generator=g)
    return z, y


def functional(z, y, n_bins=15, k=5, **src):
    src = src or {"logits": z}
    share, acc = M.s99(**src, labels=y)
    return {
        "ece": M.ece(**src, labels=y, n_bins=n_bins),
        "adaptive_ece": M.adaptive_ece(**src, labels=y, n_bins=n_bins),
        "classwise_ece": M.classwise_ece(**src, labels=y, n_bins=n_bins),
        "mce": M.mce(**src, labels=y, n_bins=n_bins),
        "rmsce": M.rmsce(**src, labels=y, n_bins=n_bins),
        "nll": M.nll(**src, labels=y),
        "brier": M.brier(**src, labels=y),
        "error": M.error(**src, labels=y),
        "topk_error": M.topk_error(**src, labels=y, k=k),
        "s99_share": share,
        "s99_accuracy": acc,
    }


def _assert_close(out, ref, tol=1e-12):
    assert list(out) == KEYS
    for key in KEYS:
        a, b = float(out[key]), float(ref[key])
        if math.isnan(b):
            assert math.isnan(a), key
        else:
            assert a == pytest.approx(b, abs=tol), key


@pytest.mark.parametrize("batch", [1, 37, 1000])
def test_meter_equals_functional(batch):
    z, y = _data(500, 8, seed=batch)
    meter = M.CalibrationMeter(8, n_bins=10, topk=3)
    for i in range(0, 500, batch):
        meter.update(logits=z[i:i + batch], labels=y[i:i + batch])
    assert meter.num_samples == 500
    out = meter.compute()
    _assert_close(out, functional(z, y, n_bins=10, k=3))
    for v in out.values():
        assert v.dtype == torch.float64 and v.ndim == 0
    # compute() does not consume the state: more data can follow
    meter.update(logits=z[:50], labels=y[:50])
    _assert_close(meter.compute(), functional(torch.cat([z, z[:50]]), torch.cat([y, y[:50]]),
                                              n_bins=10, k=3))
    meter.reset()
    assert meter.num_samples == 0


def test_meter_probs_numpy_float32_and_options():
    z, y = _data(300, 5, seed=0)
    p = torch.softmax(z, 1).float()
    meter = M.CalibrationMeter(5, adaptive=False, topk=6)
    meter.update(probs=p[:100].numpy(), labels=y[:100].numpy())
    meter.update(probs=p[100:], labels=y[100:])
    out = meter.compute()
    ref = functional(None, y, k=5, probs=p)
    assert math.isnan(float(out["adaptive_ece"]))  # switched off: no O(N) state kept
    assert math.isnan(float(out["topk_error"]))  # k > C
    assert meter._conf == []
    for key in ["ece", "classwise_ece", "mce", "rmsce", "nll", "brier", "error", "s99_share"]:
        assert float(out[key]) == pytest.approx(float(ref[key]), abs=1e-6), key
    # s99 with hits
    meter = M.CalibrationMeter(2, threshold=0.9)
    meter.update(probs=torch.tensor([[0.95, 0.05], [0.5, 0.5], [0.02, 0.98]]),
                 labels=torch.tensor([0, 0, 0]))
    out = meter.compute()
    assert float(out["s99_share"]) == pytest.approx(2 / 3) and float(out["s99_accuracy"]) == 0.5


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_meter_low_precision_equals_functional(dtype):
    # AdaECE from the stored (float64) confidences bins exactly as the functional metric
    # does on the low-precision values; ties from float16 rounding included
    z, y = _data(400, 4, seed=9)
    p = torch.softmax(z, 1).to(dtype)
    meter = M.CalibrationMeter(4, n_bins=15, topk=2)
    for i in range(0, 400, 128):
        meter.update(probs=p[i:i + 128], labels=y[i:i + 128], validate_args=False)
    out = meter.compute()
    for key, fn in [("adaptive_ece", M.adaptive_ece), ("ece", M.ece), ("mce", M.mce),
                    ("classwise_ece", M.classwise_ece)]:
        ref = fn(probs=p, labels=y, validate_args=False).double().item()
        assert float(out[key]) == pytest.approx(ref, abs=1e-6), key


def test_state_is_fixed_size():
    meter = M.CalibrationMeter(4, n_bins=15, adaptive=False)
    z, y = _data(64, 4, seed=1)
    meter.update(logits=z, labels=y)
    size = meter._state.numel()
    for _ in range(5):
        meter.update(logits=z, labels=y)
    assert meter._state.numel() == size == 3 * 15 + 4 * 15 + 7


WORKER = textwrap.dedent("""
    import os, sys
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    import torchcal.metrics as M

    rank, world, port, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    g = torch.Generator().manual_seed(0)
    z = 4 * torch.randn(701, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 6, (701,), generator=g)
    # uneven shards: rank 0 gets 450 rows in batches of 100, rank 1 gets 251 in batches of 64
    lo, hi, bs = (0, 450, 100) if rank == 0 else (450, 701, 64)
    uneven = M.CalibrationMeter(6, n_bins=12, topk=2)
    for i in range(lo, hi, bs):
        uneven.update(logits=z[i:min(i + bs, hi)], labels=y[i:min(i + bs, hi)])
    # rank 1 sees nothing at all
    lopsided = M.CalibrationMeter(6, n_bins=12, topk=2)
    if rank == 0:
        lopsided.update(logits=z, labels=y)
    local = M.CalibrationMeter(6, n_bins=12, topk=2, sync_dist=False)
    local.update(logits=z[lo:hi], labels=y[lo:hi])
    res = {"uneven": uneven.compute(), "lopsided": lopsided.compute(), "local": local.compute()}
    torch.save(res, out_path)
    dist.destroy_process_group()
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_two_processes_equal_one_process(tmp_path):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed not available")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = str(_free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "2", port,
                               str(tmp_path / f"out{r}.pt")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(2)]
    logs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=120)
            logs.append(out.decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)
    g = torch.Generator().manual_seed(0)
    z = 4 * torch.randn(701, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 6, (701,), generator=g)
    ref = functional(z, y, n_bins=12, k=2)
    for r in range(2):
        res = torch.load(tmp_path / f"out{r}.pt", weights_only=True)
        _assert_close(res["uneven"], ref)
        _assert_close(res["lopsided"], ref)
    # and the local (unsynced) meters really were partial
    res0 = torch.load(tmp_path / "out0.pt", weights_only=True)
    _assert_close(res0["local"], functional(z[:450], y[:450], n_bins=12, k=2))
    assert float(res0["local"]["ece"]) != pytest.approx(float(ref["ece"]), abs=1e-9)

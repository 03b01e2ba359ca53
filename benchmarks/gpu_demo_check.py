"""The demo at the accelerator's pace (issue 31), every GPU measurement in one command.

Sections (each with its own time limit; a section that fails prints why and the rest go on):

1. ``equivalence``: three runs (CE, AdaFocal, focal; seeds 0-2; the ``mnist1d-cnn`` recipe on
   MNIST-1D, 2 epochs) trained packed on CUDA (TF32 off) and packed on the CPU; prints each
   member's largest parameter difference and validation ECEs (a run's numbers on CUDA equal its
   CPU numbers to float rounding for the first epochs).
2. ``syncs``: one packed epoch of the demo's 7 claim losses under
   ``torch.cuda.set_sync_debug_mode("error")`` inside the training steps (the end of the epoch
   reads its numbers once, outside): a synchronising call fails this section, naming it.
3. ``gpu``: ``torchcal demo --full --device cuda`` end to end (start-up and report included),
   with ``nvidia-smi`` sampling the GPU's utilisation every 0.5 s.
4. ``cpu``: ``torchcal demo --full --device cpu --workers $(nproc)`` for a fixed window
   (``--cpu-window`` seconds), then stopped; the run-epochs it completed (log lines) give its
   pace, extrapolated to the whole run's 24,500 run-epochs.
5. ``profile``: two packed epochs of the 70 ``--full`` runs under ``torch.profiler``: the sum
   of CUDA kernel time against the wall time per epoch.

Prints one summary: the GPU demo's wall time, its speed-up over the machine's CPU cores, the
mean utilisation and kernel-time share.  Run on a lent GPU machine (the mnist1d wheel carried,
as the device tool's README says)::

    python benchmarks/gpu_demo_check.py --out $OUT [--cpu-window 90] [--skip cpu,profile]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

FULL_RUN_EPOCHS = 70 * 350


def _section(name: str, fn, *args) -> object:
    print(f"\n=== {name} ===", flush=True)
    t0 = time.perf_counter()
    try:
        out = fn(*args)
    except Exception:  # noqa: BLE001 - report and go on
        traceback.print_exc(limit=4)
        out = None
    print(f"[{name}: {time.perf_counter() - t0:.1f} s]", flush=True)
    return out


def _configs(root: str, device: str, losses, epochs: int, seeds=None) -> list:
    from torchcal.experiments.calibration import DEMO_LOSS_KWARGS
    from torchcal.train import get_recipe
    base = get_recipe("mnist1d-cnn")
    seeds = seeds or range(len(losses))
    return [dataclasses.replace(base, loss=loss, loss_kwargs=dict(DEMO_LOSS_KWARGS.get(loss, {})),
                                seed=s, epochs=epochs, out_dir=f"{root}/{device}/{loss}{s}",
                                device=device, progress=False, evaluate=False, num_threads=1)
            for loss, s in zip(losses, seeds, strict=True)]


def equivalence() -> None:
    from torchcal.train.checkpoint import load_checkpoint
    from torchcal.train.packed import train_packed
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    losses = ("ce", "adafocal", "focal")
    with tempfile.TemporaryDirectory() as root:
        res = {d: train_packed(_configs(root, d, losses, 2)) for d in ("cuda", "cpu")}
        for i, loss in enumerate(losses):
            a = load_checkpoint(f"{root}/cuda/{loss}{i}/checkpoints/last.pt")["model"]
            b = load_checkpoint(f"{root}/cpu/{loss}{i}/checkpoints/last.pt")["model"]
            diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
            print(f"{loss:>9}: largest parameter difference CUDA vs CPU {diff:.2e}; val ECE "
                  f"{res['cuda'][i]['final']['val_ece']:.5f} vs {res['cpu'][i]['final']['val_ece']:.5f}")


def syncs() -> None:
    import torchcal.train.engine as E
    import torchcal.train.packed as P
    from torchcal.experiments.calibration import CLAIM_LOSSES
    orig = E.train_epoch

    def strict(*a, **kw):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return orig(*a, **kw)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    orig_val = E._drive_validation

    def val(*a, **kw):  # a loss hook's own validation pass reads values: outside the step
        torch.cuda.set_sync_debug_mode("default")
        try:
            return orig_val(*a, **kw)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    E.train_epoch, E._drive_validation = strict, val
    try:
        with tempfile.TemporaryDirectory() as root:
            res = P.train_packed(_configs(root, "cuda", CLAIM_LOSSES, 1))
    finally:
        E.train_epoch, E._drive_validation = orig, orig_val
    bad = [r for r in res if isinstance(r, BaseException)]
    print("no synchronising call inside a training step" if not bad else f"FAILED: {bad[0]!r}")


def _demo(out: Path, device: str, workers: int, timeout: float | None):
    cmd = [sys.executable, "-m", "torchcal", "demo", "--full", "--device", device, "--workers",
           str(workers), "--out", str(out), "--no-progress", "--no-figures"]
    smi = None
    if device == "cuda":
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu",
                                "--format=csv,noheader,nounits", "-lms", "500"],
                               stdout=subprocess.PIPE, text=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out_text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out_text, _ = proc.communicate()
    wall = time.perf_counter() - t0
    util = []
    if smi is not None:
        smi.terminate()
        util = [float(x) for x in smi.communicate()[0].split() if x.strip().isdigit()]
    return wall, proc.returncode, out_text, util


def gpu(out: Path) -> float | None:
    wall, rc, text, util = _demo(out / "gpu", "cuda", 1, 560)
    print(text[-3000:])
    mean = sum(util) / len(util) if util else float("nan")
    print(f"torchcal demo --full --device cuda: {wall:.1f} s wall (exit {rc}); GPU utilisation "
          f"mean {mean:.0f}% over {len(util)} samples")
    return wall if rc == 0 else None


def cpu(out: Path, window: float) -> float | None:
    workers = os.cpu_count() or 1
    wall, rc, _, _ = _demo(out / "cpu", "cpu", workers, window)
    done = sum(len(p.read_text().splitlines()) for p in (out / "cpu").glob("runs/*/*/log.jsonl"))
    if done == 0:
        print("the CPU run completed no epoch in the window")
        return None
    whole = wall * FULL_RUN_EPOCHS / done
    print(f"torchcal demo --full --device cpu --workers {workers}: {done} run-epochs in "
          f"{wall:.0f} s (start-up included): about {whole:.0f} s for the whole run")
    return whole


def profile() -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    from torchcal.experiments.calibration import MNIST1D
    from torchcal.train.packed import train_packed
    full = MNIST1D.losses("full")
    losses = [loss for loss in full for _ in range(5)]
    seeds = [s for _ in full for s in range(5)]
    with tempfile.TemporaryDirectory() as root:
        cfgs = _configs(root, "cuda", losses, 2, seeds)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            train_packed(cfgs)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    kernel = sum(e.self_device_time_total for e in p.key_averages()) / 1e6
    print(f"2 packed epochs of {len(cfgs)} runs (build included): wall {wall:.2f} s, CUDA kernel "
          f"time {kernel:.2f} s ({100 * kernel / wall:.0f}% of wall)")
    print(p.key_averages().table(sort_by="self_device_time_total", row_limit=12))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=tempfile.mkdtemp(prefix="gpu-demo-"))
    ap.add_argument("--cpu-window", type=float, default=90.0)
    ap.add_argument("--skip", default="", help="comma-separated sections to skip")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_demo_check.py needs a CUDA device")
    warnings.simplefilter("ignore")
    skip = set(a.skip.split(","))
    out = Path(a.out)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPU cores")
    for name, fn, args in (("equivalence", equivalence, ()), ("syncs", syncs, ())):
        if name not in skip:
            _section(name, fn, *args)
    g = None if "gpu" in skip else _section("gpu", gpu, out)
    c = None if "cpu" in skip else _section("cpu", cpu, out, a.cpu_window)
    if "profile" not in skip:
        _section("profile", profile)
    if g and c:
        print(f"\nsummary: GPU demo --full {g:.0f} s (target <= 60 s); CPU cores about {c:.0f} s; "
              f"speed-up {c / g:.1f}x (target >= 5x)")


if __name__ == "__main__":
    main()

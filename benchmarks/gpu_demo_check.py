"""The demo at the accelerator's pace (issues 31 and 38), every GPU measurement in one command.

Sections (each with its own time limit; a section that fails prints why and the rest go on; the
whole script is sized for one device call of at most 8 minutes):

1. ``equivalence``: three runs (CE, AdaFocal, focal; seeds 0-2; the ``mnist1d-cnn`` recipe on
   MNIST-1D, 2 epochs) trained packed on CUDA (TF32 off; the compiled step, as the demo trains)
   and packed on the CPU (eager); prints each member's largest parameter difference and
   validation ECEs.
2. ``syncs``: the third packed epoch of the demo's 7 claim losses (the first two compile and
   capture the step's graphs) with ``torch.cuda.set_sync_debug_mode("warn")`` inside **each
   step** (the eager step or the compiled step's call): prints the steps checked, the steps
   that synchronised and the first sources.  The end of the epoch (one host
   copy by design) and a loss hook's validation pass are outside the steps.
3. ``gpu``: ``torchcal demo --full --device cuda`` end to end (start-up and report included),
   with ``nvidia-smi`` sampling the GPU's utilisation every 0.5 s.
4. ``cpu``: ``torchcal demo --full --device cpu --workers $(nproc)`` for a fixed window
   (``--cpu-window`` seconds), then stopped; the run-epochs it completed (log lines) give its
   pace, extrapolated to the whole run's 24,500 run-epochs.
5. ``verdicts``: the claims' verdicts of the GPU demo's results.csv against the committed CPU
   run's (``docs/results/mnist1d/results.csv``).
6. ``profile``: the second packed epoch of the 70 ``--full`` runs under ``torch.profiler`` (the
   first compiles and warms up, unprofiled): CUDA kernel time and kernel launches per epoch
   against its wall time.

Prints one summary: the GPU demo's wall time (target <= 60 s), its speed-up over the machine's
CPU cores (target >= 5x), the mean utilisation (target >= 60%) and whether the verdicts match;
the whole output is also written to ``$OUT/gpu_demo_check.txt``.  The one command, on a lent
GPU machine (``timeout_s`` 540)::

    PYTHONUNBUFFERED=1 PYTHONPATH=src python benchmarks/gpu_demo_check.py --out $OUT

``--dry-run`` runs every section's logic on the CPU at a toy size in seconds (what the test
suite checks; no figure it prints means anything).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import shutil
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
BUDGET_S = 480.0  # one device call of at most 8 minutes


class _Tee(io.TextIOBase):
    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, s: str) -> int:
        for st in self.streams:
            st.write(s)
            st.flush()
        return len(s)


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


def _configs(root: str, device: str, losses, epochs: int, seeds=None, **kw) -> list:
    from torchcal.experiments.calibration import DEMO_LOSS_KWARGS  # noqa: PLC0415
    from torchcal.train import get_recipe  # noqa: PLC0415
    base = get_recipe("mnist1d-cnn")
    seeds = seeds or range(len(losses))
    return [dataclasses.replace(base, loss=loss, loss_kwargs=dict(DEMO_LOSS_KWARGS.get(loss, {})),
                                seed=s, epochs=epochs, out_dir=f"{root}/{device}/{loss}{s}",
                                device=device, progress=False, evaluate=False, num_threads=1,
                                **kw)
            for loss, s in zip(losses, seeds, strict=True)]


def equivalence(device: str, dry: bool) -> None:
    from torchcal.train.checkpoint import load_checkpoint  # noqa: PLC0415
    from torchcal.train.packs import train_packed  # noqa: PLC0415
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    losses = ("ce", "adafocal", "focal")
    epochs = 1 if dry else 2
    with tempfile.TemporaryDirectory() as root:
        res = {d: train_packed(_configs(root, d, losses, epochs,
                                        compile_step="auto" if d != "cpu" else "off"))
               for d in dict.fromkeys((device, "cpu"))}
        for i, loss in enumerate(losses):
            a = load_checkpoint(f"{root}/{device}/{loss}{i}/checkpoints/last.pt")["model"]
            b = load_checkpoint(f"{root}/cpu/{loss}{i}/checkpoints/last.pt")["model"]
            diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
            print(f"{loss:>9}: largest parameter difference {device} vs cpu {diff:.2e}; val ECE "
                  f"{res[device][i]['final']['val_ece']:.5f} vs "
                  f"{res['cpu'][i]['final']['val_ece']:.5f}")


class _StepWatch:
    """Wraps the engine's eager step and the compiled step's call: each step (once ``active``:
    the engine's third epoch, after the compiled step's graphs were compiled, warmed up and
    captured for both batch shapes; after ``skip`` compiled calls) runs with the sync debug
    mode at ``warn``; the synchronising calls' warnings are recorded per step."""

    def __init__(self, cuda: bool, skip: int = 0) -> None:
        self.cuda, self.skip = cuda, skip
        self.active = True
        self.steps = self.synced = 0
        self.sources: list[str] = []

    def wrap(self, fn, compiled: bool):
        seen = [0]

        def step(*a, **kw):
            seen[0] += 1
            if not self.active or (compiled and seen[0] <= self.skip):
                return fn(*a, **kw)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if self.cuda:
                    torch.cuda.set_sync_debug_mode("warn")
                try:
                    return fn(*a, **kw)
                finally:
                    if self.cuda:
                        torch.cuda.set_sync_debug_mode("default")
                    hits = [w for w in caught if "synchroniz" in str(w.message)]
                    self.steps += 1
                    self.synced += bool(hits)
                    self.sources += [f"{Path(w.filename).name}:{w.lineno}: {w.message}"[:160]
                                     for w in hits[:2]]

        return step


def syncs(device: str, dry: bool) -> None:
    import torchcal.train.compiled as C  # noqa: PLC0415
    import torchcal.train.engine as E  # noqa: PLC0415
    import torchcal.train.packs as P  # noqa: PLC0415
    from torchcal.experiments.calibration import CLAIM_LOSSES  # noqa: PLC0415
    watch = _StepWatch(device.startswith("cuda"))
    eager, call, epoch_fn = E._eager_step, C.CompiledStep.__call__, E.train_epoch
    checked = 0 if dry else 2

    def train_epoch(*a, **kw):
        watch.active = a[4] >= checked  # (stack, members, groups, batches, epoch, ...)
        return epoch_fn(*a, **kw)

    E._eager_step, E.train_epoch = watch.wrap(eager, False), train_epoch
    C.CompiledStep.__call__ = watch.wrap(call, True)
    losses = CLAIM_LOSSES[:2] if dry else CLAIM_LOSSES
    try:
        with tempfile.TemporaryDirectory() as root:
            res = P.train_packed(_configs(root, device, losses, checked + 1))
    finally:
        E._eager_step, C.CompiledStep.__call__, E.train_epoch = eager, call, epoch_fn
    bad = [r for r in res if isinstance(r, BaseException)]
    if bad:
        print(f"FAILED: {bad[0]!r}")
    print(f"{watch.steps} steps checked, {watch.synced} synchronised")
    for s in dict.fromkeys(watch.sources):
        print(f"  {s}")


def _demo(out: Path, device: str, workers: int, timeout: float | None, dry: bool):
    size = ["--quick", "--losses", "ce", "--seeds", "1", "--epochs", "1"] if dry else ["--full"]
    cmd = [sys.executable, "-m", "torchcal", "demo", *size, "--device", device, "--workers",
           str(workers), "--out", str(out), "--no-progress", "--no-figures"]
    smi = None
    if device.startswith("cuda") and shutil.which("nvidia-smi"):
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


def gpu(out: Path, device: str, dry: bool, limit: float) -> tuple[float | None, float]:
    wall, rc, text, util = _demo(out / "gpu", device, 1, limit, dry)
    print(text[-2000:])
    mean = sum(util) / len(util) if util else float("nan")
    print(f"torchcal demo {'(dry run) ' if dry else '--full '}--device {device}: {wall:.1f} s "
          f"wall (exit {rc}); GPU utilisation mean {mean:.0f}% over {len(util)} samples")
    return (wall if rc == 0 else None), mean


def cpu(out: Path, window: float, dry: bool) -> float | None:
    workers = 1 if dry else (os.cpu_count() or 1)
    wall, _, _, _ = _demo(out / "cpu", "cpu", workers, window, dry)
    done = sum(len(p.read_text().splitlines()) for p in (out / "cpu").glob("runs/*/*/log.jsonl"))
    if done == 0:
        print("the CPU run completed no epoch in the window")
        return None
    whole = wall * FULL_RUN_EPOCHS / done
    print(f"torchcal demo --full --device cpu --workers {workers}: {done} run-epochs in "
          f"{wall:.0f} s (start-up included): about {whole:.0f} s for the whole run")
    return whole


def verdicts(out: Path) -> bool | None:
    """The GPU demo's claim verdicts against the committed CPU run's (True: the same)."""
    from torchcal.experiments.benchmark import committed_verdicts, get_benchmark  # noqa: PLC0415
    from torchcal.report.aggregate import group_runs, runs_from_results_csv  # noqa: PLC0415
    from torchcal.report.claims import check_claims  # noqa: PLC0415
    bench = get_benchmark("mnist1d")
    committed = committed_verdicts(bench) or {}
    found = sorted((out / "gpu").rglob("results.csv"))
    if not found:
        print("the GPU demo wrote no results.csv")
        return None
    runs = runs_from_results_csv(found[0].read_text(encoding="utf-8"))
    got = {r.claim.key: (r.k, r.n) for r in check_claims(group_runs(runs), bench.claims) if r.n}
    same = True
    for key, (label, k, n) in committed.items():
        mine = got.get(key)
        ok = mine == (k, n)
        same &= ok
        print(f"  {'same' if ok else 'DIFFERS'}: {label}: committed {k}/{n}, this run "
              f"{'-' if mine is None else f'{mine[0]}/{mine[1]}'}")
    print("verdicts: the same as the committed CPU run" if same else
          "verdicts: NOT the same as the committed CPU run")
    return same


def profile(device: str, dry: bool) -> None:
    """The second packed epoch of the ``--full`` runs (the first compiles, unprofiled)."""
    from torch.profiler import ProfilerActivity  # noqa: PLC0415
    from torch.profiler import profile as prof  # noqa: PLC0415

    import torchcal.train.engine as E  # noqa: PLC0415
    from torchcal.experiments.calibration import MNIST1D  # noqa: PLC0415
    from torchcal.train.packs import train_packed  # noqa: PLC0415
    full = ["ce", "focal"] if dry else MNIST1D.losses("full")
    seeds = 1 if dry else 5
    losses = [loss for loss in full for _ in range(seeds)]
    cuda = device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    plain_train, plain_end, box = E.train_epoch, E.end_epoch, {}

    def train(*args, **kw):
        if args[4] == 1:  # epoch 2: epoch 1 compiled, captured and warmed up, unprofiled
            if cuda:
                torch.cuda.synchronize()
            box["prof"] = prof(activities=acts)
            box["prof"].__enter__()
            box["t0"] = time.perf_counter()
        return plain_train(*args, **kw)

    def end(*args, **kw):
        plain_end(*args, **kw)
        if args[4] == 1:
            if cuda:
                torch.cuda.synchronize()
            box["prof"].__exit__(None, None, None)
            box["wall"] = time.perf_counter() - box["t0"]

    E.train_epoch, E.end_epoch = train, end
    try:
        with tempfile.TemporaryDirectory() as root:
            train_packed(_configs(root, device, losses, 2, [s for _ in full for s in range(seeds)]))
    finally:
        E.train_epoch, E.end_epoch = plain_train, plain_end
    p, wall = box["prof"], box["wall"]
    events = p.key_averages()
    kernel = sum(e.self_device_time_total for e in events) / 1e6 if cuda else 0.0
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel",
                                                        "cudaGraphLaunch"))
    print(f"epoch 2 of {len(losses)} packed runs: wall {wall:.2f} s, CUDA kernel time "
          f"{kernel:.2f} s ({100 * kernel / max(wall, 1e-9):.0f}% of wall), "
          f"{launches} kernel/graph launches")
    print(events.table(sort_by="self_device_time_total" if cuda else "self_cpu_time_total",
                       row_limit=12))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=tempfile.mkdtemp(prefix="gpu-demo-"))
    ap.add_argument("--cpu-window", type=float, default=60.0)
    ap.add_argument("--gpu-limit", type=float, default=180.0,
                    help="seconds before the GPU demo is stopped")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip")
    ap.add_argument("--dry-run", action="store_true",
                    help="every section at a toy size on the CPU (checks the script, in seconds)")
    a = ap.parse_args(argv)
    device = "cpu" if a.dry_run else "cuda"
    if not a.dry_run and not torch.cuda.is_available():
        sys.exit("gpu_demo_check.py needs a CUDA device (or --dry-run)")
    warnings.simplefilter("ignore")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "gpu_demo_check.txt", "w", encoding="utf-8") as log, \
            contextlib.redirect_stdout(_Tee(sys.stdout, log)):
        _run(a, device, out)


def _run(a, device: str, out: Path) -> None:
    t0 = time.perf_counter()
    skip = set(a.skip.split(","))
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (dry run)"
    print(f"device: {name}, torch {torch.__version__}, {os.cpu_count()} CPU cores")
    for sec, fn in (("equivalence", equivalence), ("syncs", syncs)):
        if sec not in skip:
            _section(sec, fn, device, a.dry_run)
    g = None if "gpu" in skip else _section("gpu", gpu, out, device, a.dry_run, a.gpu_limit)
    c = None if "cpu" in skip else _section("cpu", cpu, out, a.cpu_window, a.dry_run)
    v = None if "verdicts" in skip else _section("verdicts", verdicts, out)
    if "profile" not in skip:
        _section("profile", profile, device, a.dry_run)
    wall = time.perf_counter() - t0
    g_wall, util = g if g else (None, float("nan"))
    print(f"\nsummary ({name}): GPU demo --full "
          f"{'not finished' if g_wall is None else f'{g_wall:.0f} s'} (target <= 60 s); CPU "
          f"cores {'-' if c is None else f'about {c:.0f} s'}; speed-up "
          f"{'-' if not (g_wall and c) else f'{c / g_wall:.1f}x'} (target >= 5x); GPU "
          f"utilisation {util:.0f}% (target >= 60%); verdicts "
          f"{'-' if v is None else ('the same' if v else 'DIFFER')}; script {wall:.0f} s "
          f"(budget {BUDGET_S:.0f} s{', OVER' if wall > BUDGET_S else ''})")


if __name__ == "__main__":
    main()

"""The floor of the default demo: the time of its training kernels alone (issue 50).

    OMP_NUM_THREADS=1 python benchmarks/demo_floor.py [--epochs-a 10 --epochs-b 30]

Forms the default demo's runs and packs exactly as ``torchcal demo`` does (its benchmark,
profile, recipe, losses, seeds; :func:`torchcal.train.packs.form_packs`), then trains each pack
with :func:`torchcal.train.packs.train_pack`, in this process on one thread, twice with the
schedule cut to ``--epochs-a`` and ``--epochs-b`` epochs (the recipe's learning-rate
milestones, 150 and 250, are not reached: every epoch has the same cost), once plain and once
under :mod:`torch.profiler`.  A pack's cost is a line in the number of epochs, ``fixed + E x
per_epoch``: the two schedules give the line, so the start-up and each run's final evaluation
(``fixed``) are told apart from the epochs.  Per pack it prints

* the plain time per epoch (the training steps, the validation pass, the test pass every 10
  epochs, checkpoints: everything the demo does per epoch) and the fixed time;
* the time inside ATen operators per epoch (the sum of the operators' *self* CPU time under the
  profiler: the kernels and their dispatch, not Python, autograd's engine or the optimiser's
  Python), the floor: what the same epochs would cost with no machinery around the kernels;

and the demo projected from both, its packs' full schedule (``--epochs-full``, the recipe's
350) shared by the demo's 2 workers (each pack on one worker: the longer worker's packs, as the
demo's executor hands them out in order, 2 at a time).  The profiler inflates what it
measures (a few microseconds per operator), so the floor it gives is an upper bound of the
kernels' time.  Times are CPU time of this process (``time.process_time``): a loaded machine
stretches the wall, less the CPU time; run it on idle cores for the figures that count.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from torchcal.experiments.benchmark import get_benchmark
from torchcal.experiments.demo import DemoConfig, resolve
from torchcal.experiments.training import benchmark_config
from torchcal.train.packs import form_packs, train_pack


def demo_configs(out: Path, epochs: int):
    """The default demo's resolved runs (loss-major within each seed, as the demo), cut to
    ``epochs`` epochs, in ``out``."""
    cfg = resolve(DemoConfig())
    bench = get_benchmark(cfg.benchmark)
    configs = []
    for seed in cfg.seeds:
        for loss in cfg.losses:
            kw = dict(bench.loss_kwargs.get(loss, {}))
            if loss == "adafocal" and cfg.adafocal_lam is not None:
                kw["lam"] = float(cfg.adafocal_lam)
            configs.append(benchmark_config(
                cfg.recipe, loss=loss, loss_kwargs=kw, seed=int(seed),
                run_dir=str(out / "runs" / loss / f"seed{seed}"), epochs=epochs,
                n_bins=int(cfg.n_bins), data_kwargs=cfg.data_kwargs, overrides=cfg.overrides))
    return cfg, configs


def aten_self_seconds(prof) -> float:
    """Seconds of self CPU time inside ATen operators (``aten::*``) over the profile."""
    return sum(e.self_cpu_time_total for e in prof.key_averages()
               if e.key.startswith("aten::")) / 1e6


def time_pack(pack, profiled: bool) -> float:
    """CPU seconds of training ``pack`` (ATen self time when ``profiled``)."""
    if profiled:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            outcomes = train_pack(pack)
        secs = aten_self_seconds(prof)
    else:
        t0 = time.process_time()
        outcomes = train_pack(pack)
        secs = time.process_time() - t0
    bad = [o.error for o in outcomes if o.error]
    if bad:
        raise RuntimeError(f"a run of pack {pack.name} failed: {bad[0]}")
    return secs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs-a", type=int, default=10)
    ap.add_argument("--epochs-b", type=int, default=30)
    ap.add_argument("--epochs-full", type=int, default=None,
                    help="the schedule projected to (default: the demo's)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores (load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}), {platform.system()}, Python "
          f"{platform.python_version()}, torch {torch.__version__}, 1 thread; clock: CPU time")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg, _ = demo_configs(Path(tmp), 1)
        full = args.epochs_full or int(cfg.epochs or 350)
        if full is None or full < 1:
            raise SystemExit("--epochs-full: expected a positive number of epochs")
        measured: dict[tuple[int, bool], list[float]] = {}
        names: list[str] = []
        for e in (args.epochs_a, args.epochs_b):
            for profiled in (False, True):
                out = Path(tmp) / f"e{e}-{int(profiled)}"
                _, configs = demo_configs(out, e)
                packs = form_packs(configs)
                names = [p.name for p in packs]
                measured[(e, profiled)] = [time_pack(p, profiled) for p in packs]
                print(f"  {e} epochs, {'profiled' if profiled else 'plain'}: "
                      + ", ".join(f"{s:.1f} s" for s in measured[(e, profiled)]), flush=True)
    de = args.epochs_b - args.epochs_a
    print(f"\nper pack, a line in the epochs E fitted through E = {args.epochs_a} and "
          f"{args.epochs_b}; projected to the full schedule, {full} epochs:\n")
    print(f"{'s/epoch':>8s} {'fixed s':>8s} {'ATen s/epoch':>13s} {'ATen share':>10s} "
          f"{'full s':>8s} {'floor s':>8s}  pack")
    for i, name in enumerate(names):
        a, b = measured[(args.epochs_a, False)][i], measured[(args.epochs_b, False)][i]
        pa, pb = measured[(args.epochs_a, True)][i], measured[(args.epochs_b, True)][i]
        per, kper = (b - a) / de, (pb - pa) / de
        fixed, kfixed = a - per * args.epochs_a, pa - kper * args.epochs_a
        rows.append((per * full + fixed, kper * full + kfixed))
        print(f"{per:8.3f} {fixed:8.1f} {kper:13.3f} {kper / per:10.0%} "
              f"{rows[-1][0]:8.1f} {rows[-1][1]:8.1f}  {name}")
    # the executor hands the packs out in order to the first free worker
    def makespan(costs: list[float]) -> float:
        load = [0.0] * args.workers
        for c in costs:
            load[load.index(min(load))] += c
        return max(load)
    print(f"\nthe demo's training on {args.workers} workers (packs handed out in order): "
          f"{makespan([r[0] for r in rows]):.0f} s as it runs, "
          f"{makespan([r[1] for r in rows]):.0f} s for its ATen operators alone (the floor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

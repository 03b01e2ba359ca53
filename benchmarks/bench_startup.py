"""Start-up of the command line and of a demo worker, against ``python -c "import torch"``
(issues 40 item 5 and 43 item 2), measured side by side in one run.

Run: ``python benchmarks/bench_startup.py [--repeats 5] [--baseline-src /path/to/old/src]``

Each command runs in a fresh interpreter, the commands alternating inside each repeat; for each
the median over repeats of its wall time and of its CPU time (user + system of the child,
``resource.getrusage(RUSAGE_CHILDREN)``; on a loaded machine the CPU time is the steadier of
the two).  Commands:

1. ``import torch``: the reference.
2. ``torchcal --version`` (``python -m torchcal --version``).  Target: wall <= 1.3x the
   reference; it imports <= 15 torchcal modules, no scikit-learn, no matplotlib (counted by
   ``tests/cli/test_cli_startup.py``).
3. a worker's start-up: what a spawned demo worker imports before its first job
   (``torchcal.experiments.runner`` and ``.packed``) and its first SGD optimiser
   (``torchcal.train.run.SGD``).  Target: <= 1.2x the reference.

Every source is measured with its bytecode compiled (``compileall`` first, and
``PYTHONDONTWRITEBYTECODE`` unset in the children), as pip installs a package: with that
variable set, as on some development machines, each process compiles every torchcal module it
imports, 0.2-0.3 s of CPU that an installed torchcal never pays (issue 43: half of a worker's
measured start-up over ``import torch`` was that compilation).

With ``--baseline-src`` (e.g. the ``src`` of a checkout of main a8765c0), commands 2 and 3 also
run against that source (its worker builds ``torch.optim.SGD``), and the last lines are
``RATIO <item>: before/after = X.XX`` (CPU time), the convention of
``benchmarks/bench_cpu_costs.py``.
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")

WORKER = ("import torch, torchcal.experiments.runner, torchcal.experiments.training\n"
          "p = [torch.nn.Parameter(torch.zeros(3))]\n"
          "try:\n"
          "    from torchcal.train.run import SGD\n"
          "except ImportError:  # a source from before torchcal's SGD\n"
          "    SGD = torch.optim.SGD\n"
          "SGD(p, lr=0.1, momentum=0.9, weight_decay=5e-4)\n")


def commands(src: str) -> dict[str, list[str]]:
    py = sys.executable
    return {"version": [py, "-m", "torchcal", "--version"], "worker": [py, "-c", WORKER]}


def run_once(argv: list[str], src: str | None) -> tuple[float, float]:
    """(wall s, CPU s) of one fresh process."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: the bytecode is read, not compiled
    if src is not None:
        env["PYTHONPATH"] = src
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def measure(repeats: int, baseline_src: str | None) -> dict[str, tuple[float, float]]:
    """``{name: (median wall, median CPU)}`` of every command, alternating in each repeat."""
    jobs: dict[str, tuple[list[str], str | None]] = {
        "import torch": ([sys.executable, "-c", "import torch"], SRC)}
    for name, argv in commands(SRC).items():
        jobs[name] = (argv, SRC)
        if baseline_src:
            jobs[f"{name} (baseline)"] = (argv, baseline_src)
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in jobs}
    for src in {SRC, baseline_src} - {None}:  # the bytecode, as pip writes it on install
        compileall.compile_dir(src, quiet=1)
    for argv, src in jobs.values():  # warm the file cache once
        run_once(argv, src)
    for _ in range(repeats):
        for name, (argv, src) in jobs.items():
            samples[name].append(run_once(argv, src))
    return {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
            for k, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline-src", default=None,
                    help="another checkout's src/ to measure as 'before'")
    args = ap.parse_args(argv)
    res = measure(args.repeats, args.baseline_src)
    ref_wall, ref_cpu = res["import torch"]
    print(f"{'command':<22} {'wall s':>7} {'CPU s':>7} {'wall/torch':>10} {'CPU/torch':>9}")
    for name, (wall, cpu) in res.items():
        print(f"{name:<22} {wall:7.2f} {cpu:7.2f} {wall / ref_wall:10.2f} {cpu / ref_cpu:9.2f}")
    print(f"targets: torchcal --version wall <= 1.3x import torch "
          f"({res['version'][0] / ref_wall:.2f}x); worker start-up <= 1.2x "
          f"({res['worker'][1] / ref_cpu:.2f}x CPU, {res['worker'][0] / ref_wall:.2f}x wall)")
    if args.baseline_src:
        for name in ("version", "worker"):
            before = res[f"{name} (baseline)"][1]
            print(f"RATIO start-up {name}: before/after = {before / res[name][1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

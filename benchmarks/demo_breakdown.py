"""Where the default demo's time goes: every process profiled, the time split by stage.

    python benchmarks/demo_breakdown.py --out /tmp/demo-prof [DEMO ARGS ...]   # run and profile
    python benchmarks/demo_breakdown.py --profiles DIR                          # only summarise

Runs ``torchcal demo --out OUT --no-progress DEMO ARGS`` with a ``sitecustomize`` module put
first on ``PYTHONPATH`` that starts :mod:`cProfile` in every Python process (the demo's own and
its ``spawn`` worker processes) and writes ``OUT.profiles/<kind>-<pid>.prof`` when the process
exits; then sums, over the processes of each kind, the inclusive time of the functions that
delimit the demo's stages (``STAGES``) and prints one Markdown table.  Only each process's main
thread is profiled (the epoch files' writer thread is not), and cProfile's own cost inflates
call-heavy code (the training steps' Python) more than kernel-heavy code: read the shares, not
the absolute seconds, and time the demo itself with ``/usr/bin/time`` for its wall.
"""

from __future__ import annotations

import argparse
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: ``sitecustomize`` of the profiled processes: a profiler from start-up to exit.
SITECUSTOMIZE = '''
import atexit, cProfile, os, sys
_dir = os.environ.get("DEMO_BREAKDOWN_DIR")
if _dir:
    _prof = cProfile.Profile()
    _prof.enable()

    def _dump():
        _prof.disable()
        argv = " ".join(sys.orig_argv)
        kind = ("worker" if "--multiprocessing-fork" in argv else
                "helper" if "resource_tracker" in argv else "main")
        _prof.dump_stats(os.path.join(_dir, f"{kind}-{os.getpid()}.prof"))
    atexit.register(_dump)
'''

#: The stages: (label, process kind, [(file suffix, function name), ...]); a stage's time is
#: the sum of its functions' inclusive time over the processes of that kind (the functions of
#: one stage never call one another).
STAGES: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("start-up imports (main)", "main", (("_bootstrap>", "_find_and_load"),)),
    ("data generation (MNIST-1D, main)", "main", (("data/mnist1d.py", "_make"),)),
    ("waiting for the workers (main)", "main", (("concurrent/futures/_base.py", "wait"),)),
    ("seed ensembles (main)", "main", (("experiments/demo.py", "seed_ensembles"),)),
    ("report (main)", "main", (("report/build.py", "build_report"),)),
    ("  report: reading results.json", "main", (("report/aggregate.py", "load_runs"),)),
    ("  report: test logits", "main", (("report/aggregate.py", "read_test_logits"),)),
    ("  report: figures", "main", (("report/build.py", "_make_figures"),)),
    ("  report: claims", "main", (("report/claims.py", "check_claims"),
                                  ("report/claims.py", "claims_section"))),
    ("  report: pages and files", "main", (("report/build.py", "write_report_pages"),)),
    ("worker start-up imports", "worker", (("_bootstrap>", "_find_and_load"),)),
    ("worker data (load, cache)", "worker", (("data/mnist1d.py", "load_mnist1d_splits"),
                                             ("data/mnist1d.py", "load_mnist1d_ood"))),
    ("training steps (all epochs)", "worker", (("train/engine.py", "train_epoch"),)),
    ("  steps: compiled step", "worker", (("train/compiled.py", "__call__"),)),
    ("  steps: eager step", "worker", (("train/engine.py", "_eager_step"),)),
    ("  steps: stateful losses' validation passes", "worker",
     (("train/engine.py", "_drive_validation"),)),
    ("end of epoch (validation, checkpoints)", "worker", (("train/engine.py", "end_epoch"),)),
    ("evaluation (test logits, metrics, T fits)", "worker",
     (("train/engine.py", "final_results"),)),
    ("  evaluation: temperature fits", "worker", (("posthoc/temperature.py", "fit_temperatures"),)),
    ("  evaluation: metrics", "worker", (("evaluate.py", "compute_metrics"),
                                         ("evaluate.py", "ood_metrics"))),
)


def run_demo(out: Path, demo_args: list[str]) -> tuple[Path, float]:
    """Run the profiled demo; returns the profiles' folder and the demo's wall seconds."""
    prof_dir = Path(f"{out}.profiles")
    prof_dir.mkdir(parents=True, exist_ok=True)
    site = Path(tempfile.mkdtemp(prefix="demo-breakdown-site-"))
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ, DEMO_BREAKDOWN_DIR=str(prof_dir),
               PYTHONPATH=os.pathsep.join(filter(None, [str(site),
                                                        os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "torchcal", "demo", "--out", str(out), "--no-progress",
           *demo_args]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return prof_dir, time.perf_counter() - t0


def _inclusive(stats: pstats.Stats, suffix: str, name: str) -> float:
    """Inclusive seconds of the functions ``name`` in files ending in ``suffix``."""
    return sum(v[3] for (f, _line, n), v in stats.stats.items()  # type: ignore[attr-defined]
               if n == name and f.endswith(suffix))


def summarise(prof_dir: Path) -> str:
    """The Markdown table of the stages over the profiles of ``prof_dir``."""
    kinds: dict[str, list[pstats.Stats]] = {"main": [], "worker": []}
    for p in sorted(prof_dir.glob("*.prof")):  # "helper": the resource tracker, left out
        kinds.setdefault(p.name.split("-")[0], []).append(pstats.Stats(str(p)))
    totals = {k: sum(s.total_tt for s in v) for k, v in kinds.items()}  # type: ignore[attr-defined]
    lines = [f"Profiles: {len(kinds['main'])} main, {len(kinds['worker'])} worker process(es); "
             f"profiled main-thread time: main {totals['main']:.1f} s, workers "
             f"{totals['worker']:.1f} s (sum over workers).", "",
             "| stage | process | seconds | share of its processes' time |",
             "| --- | --- | ---: | ---: |"]
    for label, kind, funcs in STAGES:
        s = sum(_inclusive(st, suf, name) for st in kinds[kind] for suf, name in funcs)
        share = 100 * s / totals[kind] if totals[kind] else float("nan")
        lines.append(f"| {label} | {kind} | {s:.1f} | {share:.1f} % |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="the demo's output directory (runs the demo)")
    ap.add_argument("--profiles", type=Path, help="summarise these profiles only")
    args, demo_args = ap.parse_known_args()
    if args.profiles is None and args.out is None:
        ap.error("give --out (run the demo) or --profiles (summarise)")
    if args.profiles is None:
        prof_dir, wall = run_demo(args.out, demo_args)
        print(f"demo wall (profiled): {wall:.1f} s")
    else:
        prof_dir = args.profiles
    print(summarise(prof_dir))


if __name__ == "__main__":
    main()

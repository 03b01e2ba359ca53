"""The CPU costs every user pays (issue 43): each item's before/after CPU-time ratio, measured
side by side in one run.

Run: ``python benchmarks/bench_cpu_costs.py [--repeats 3] [--baseline-src OLD/src] [--demo]
[--no-startup] [--no-siblings]``

CPU time (user + system, of this process or of its children), not wall time: the ratios hold on
a loaded machine.  Items:

- **figures** (item 1), measured here on the report of 7 losses (synthetic test and OOD logits
  of MNIST-1D's size, an AdaFocal γ history).  Always: the default figures' CPU as a demo pays
  it, in a fresh process each (``build_report(figures="default")`` less ``figures="none"``:
  the imports, the drawing, the files), as SVG (``torchcal.report.svg``, the default) and as
  PNG (``figure_format="png"``: matplotlib), alternating, median of ``--repeats``; with
  ``--baseline-src`` also the baseline source's (its default, PNG).  Without
  ``--baseline-src`` also in this process: the figures drawn as before issue 43 (every
  figure, each PNG saved with ``bbox_inches="tight"``) and as now (``figures="default"``).
  With ``--demo`` also ``torchcal demo --quick`` with ``--figures none``, ``default`` (SVG)
  and ``default --figure-format png``, side by side, ``--repeats`` each (a few minutes of
  CPU): the figures' share of the demo's CPU (target <= 5%).
- **start-up** (item 2): ``benchmarks/bench_startup.py`` (``torchcal --version`` and a demo
  worker's start-up against ``import torch``; before/after needs ``--baseline-src``).
- **sibling scripts**, each run by subprocess when it exists in ``benchmarks/``:
  ``bench_lbfgs_tolerance.py`` (item 3), ``bench_adafocal_history.py`` (item 4),
  ``bench_meter_state.py`` (item 5).

Convention: every script ends its output with one line per item of the form::

    RATIO <item>: before/after = X.XX

(before and after measured in the same run; > 1 means the item got cheaper).  This script
collects those lines and prints them together at the end, followed by its own.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(SRC))  # this checkout's torchcal (not another installed one)
SIBLINGS = ("bench_lbfgs_tolerance.py", "bench_adafocal_history.py", "bench_meter_state.py")
RATIO = re.compile(r"^RATIO (?P<item>[^:]+): before/after = (?P<x>[0-9.]+|inf|nan)\s*$")
LOSSES = ("ce", "focal", "flsd53", "dual_focal", "adafocal", "bsce", "bsce_gra")


def _write_runs(root: Path, n_test: int = 4000, n_classes: int = 10) -> None:
    """Seven losses' evaluated runs (as the demo's: test and OOD logits; AdaFocal's γ per bin
    in its log)."""
    from torchcal.logits_file import save_logits
    from torchcal.results_file import SCHEMA, write_results
    from torchcal.run_dir import LOSS_STATE_KEY, RunDir

    rng = np.random.default_rng(0)
    for i, loss in enumerate(LOSSES):
        d = root / loss / "seed0"
        pre = {"ece": 0.05 + 0.01 * i, "adaptive_ece": 0.05, "error": 0.25, "nll": 0.7}
        post = dict(pre, ece=0.02)
        write_results(d, {
            "schema": SCHEMA,
            "meta": {"dataset": "mnist1d", "model": "mnist1d_cnn", "loss": loss,
                     "loss_kwargs": {}, "seed": 0},
            "temperatures": {"grid_ece": 1.2, "grid_adaece": 1.2, "grid_nll": 1.2, "nll": 1.2},
            "test": {"pre": pre, "post": {m: post for m in ("grid_ece", "grid_adaece",
                                                              "grid_nll", "nll")}},
            "val": {"pre": pre},
            "ood": {"shuffled": {"auroc_entropy": 0.55}},
            "n": {"val": 1000, "test": n_test}, "n_bins": 15})
        y = rng.integers(0, n_classes, n_test)
        z = rng.normal(size=(n_test, n_classes)).astype(np.float32) * 2
        z[np.arange(n_test), y] += 1.5
        save_logits(d / "logits" / "test.npz", z, y)
        save_logits(d / "logits" / "ood_shuffled.npz",
                    rng.normal(size=(n_test, n_classes)).astype(np.float32), y)
        if loss == "adafocal":
            run = RunDir(d)
            for e in range(15):
                run.append_log({"epoch": e, LOSS_STATE_KEY: {"gammas": list(rng.random(15) + 1)}},
                                fsync=False)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _tight_save(fig, path, *, dpi: int = 100) -> Path:
    """The report's figure saving before issue 43 (a second layout pass for the tight box)."""
    from torchcal._io import atomic_write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())


def figures_ratio(repeats: int) -> tuple[float, float, int, int]:
    """(median CPU s before, after, figures before, after) of drawing the report's figures."""
    from torchcal.report import build as B
    from torchcal.report import figures as F

    current_save = F.save_figure
    before, after, counts = [], [], [0, 0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        _write_runs(root)
        B.build_report([root], Path(tmp) / "warm", figures="default")  # imports, font cache
        base = _measure(B, root, Path(tmp) / "none", "none")
        for k in range(repeats):
            F.save_figure = _tight_save
            try:
                cpu, counts[0] = _measure(B, root, Path(tmp) / f"b{k}", "all")
            finally:
                F.save_figure = current_save
            before.append(cpu - base[0])
            cpu, counts[1] = _measure(B, root, Path(tmp) / f"a{k}", "default")
            after.append(cpu - base[0])
    return statistics.median(before), statistics.median(after), counts[0], counts[1]


def _measure(B, root: Path, out: Path, figures: str) -> tuple[float, int]:
    t = _cpu()
    rep = B.build_report([root], out, figures=figures)
    return _cpu() - t, len(rep.figures)


def _child_cpu(argv: list[str], src: Path | str) -> float:
    """CPU s (user + system) of one fresh process running ``argv`` with ``src`` first on the
    path, one thread, the bytecode read as installed (``bench_startup.py``)."""
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


_REPORT = ("import sys\nfrom torchcal.report import build_report\n"
           "kw = {'figure_format': sys.argv[4]} if sys.argv[4:] else {}\n"
           "build_report([sys.argv[1]], sys.argv[2], figures=sys.argv[3], **kw)\n")


def figures_fresh(variants: dict[str, tuple[str, str | None]], repeats: int) -> dict[str, float]:
    """``{name: median CPU s of the default figures}`` of each ``(source, figure format or
    None: the source's default)`` in ``variants``, each report built in a fresh process
    (``figures="default"`` less ``"none"``), alternating."""
    import compileall

    out: dict[str, list[float]] = {k: [] for k in variants}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        _write_runs(root)
        for src, fmt in variants.values():
            compileall.compile_dir(src, quiet=1)
            _child_cpu([sys.executable, "-c", _REPORT, str(root), f"{tmp}/w", "default",
                        *([fmt] if fmt else [])], src)
        for k in range(repeats):
            for name, (src, fmt) in variants.items():
                cpu = {f: _child_cpu([sys.executable, "-c", _REPORT, str(root),
                                      f"{tmp}/{name}{k}{f}", f, *([fmt] if fmt else [])], src)
                       for f in ("none", "default")}
                out[name].append(cpu["default"] - cpu["none"])
    return {k: statistics.median(v) for k, v in out.items()}


#: ``torchcal demo --quick``'s variants of :func:`demo_cpu`: no figures, the default (SVG) and
#: the default figures as PNG (matplotlib).
DEMO_VARIANTS = {"none": ["--figures", "none"], "svg": ["--figures", "default"],
                 "png": ["--figures", "default", "--figure-format", "png"]}


def demo_cpu(repeats: int) -> dict[str, float]:
    """``{variant: median CPU s}`` of ``torchcal demo --quick`` with each of
    :data:`DEMO_VARIANTS` (this process's children), alternating; prints every run's."""
    out: dict[str, list[float]] = {k: [] for k in DEMO_VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(repeats):
            for name, extra in DEMO_VARIANTS.items():
                out[name].append(_child_cpu(
                    [sys.executable, "-m", "torchcal", "demo", "--quick", *extra,
                     "--no-progress", "--out", f"{tmp}/demo{k}{name}"], SRC))
    print("demo --quick, each run's CPU s: " + "; ".join(
        f"{k}: {', '.join(f'{x:.1f}' for x in v)}" for k, v in out.items()))
    return {k: statistics.median(v) for k, v in out.items()}


def figures_item(args: argparse.Namespace) -> str:
    """Print the figures' measurements; returns their ``RATIO`` line."""
    variants = {"svg": (str(SRC), "svg"), "png": (str(SRC), "png")}
    if args.baseline_src:
        variants["baseline"] = (args.baseline_src, None)
    res = figures_fresh(variants, args.repeats)
    print(f"--- figures (default set, fresh process each, imports included): SVG "
          f"{res['svg']:.2f} s CPU, PNG (matplotlib) {res['png']:.2f} s CPU"
          + (f", baseline source {res['baseline']:.2f} s CPU" if args.baseline_src else ""))
    b, a = res.get("baseline", res["png"]), res["svg"]
    if not args.baseline_src:
        tb, ta, nb, na = figures_ratio(args.repeats)
        print(f"--- figures (in this process): before issue 43 {tb:.2f} s CPU ({nb} PNGs, tight "
              f"boxes), the default set {ta:.2f} s CPU ({na} figures, SVG)")
    if args.demo:
        d = demo_cpu(args.repeats)
        share = {k: (d[k] - d["none"]) / d[k] for k in ("svg", "png")}
        print(f"demo --quick: {d['none']:.1f} s CPU with --figures none, {d['svg']:.1f} s with "
              f"the default figures as SVG, {d['png']:.1f} s as PNG: the figures' share "
              f"{100 * share['svg']:.1f}% as SVG, {100 * share['png']:.1f}% as PNG (target "
              f"<= 5%); with the fresh-process figures' CPU above: SVG "
              f"{100 * a / (d['none'] + a):.1f}%, PNG {100 * res['png'] / (d['none'] + res['png']):.1f}% "
              "(a difference of the demos smaller than their runs' spread above is noise)")
    return f"RATIO figures: before/after = {b / a:.2f}"


def run_script(name: str, extra: list[str]) -> list[str]:
    """The ``RATIO`` lines of ``benchmarks/NAME`` (run by subprocess; [] when it is absent)."""
    path = HERE / name
    if not path.is_file():
        print(f"{name}: not in benchmarks/ (skipped)")
        return []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), str(HERE)]))
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, str(path), *extra], env=env, capture_output=True,
                          text=True)
    print(f"--- {name} ({time.perf_counter() - t:.0f} s, exit {proc.returncode})")
    print(proc.stdout.rstrip())
    if proc.returncode:
        print(proc.stderr.rstrip()[-2000:])
    return [line.strip() for line in proc.stdout.splitlines() if RATIO.match(line.strip())]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline-src", default=None,
                    help="src/ of a checkout before issue 43 (the start-up's and the figures' "
                         "before)")
    ap.add_argument("--no-startup", action="store_true",
                    help="skip bench_startup.py (a minute or more on a loaded machine)")
    ap.add_argument("--no-siblings", action="store_true",
                    help="skip the sibling scripts (items 3-5)")
    ap.add_argument("--demo", action="store_true",
                    help="also run `torchcal demo --quick` with --figures none and default (their "
                         "share of its CPU)")
    args = ap.parse_args(argv)
    ratios: list[str] = []
    for name in () if args.no_siblings else SIBLINGS:
        ratios += run_script(name, [])
    startup = ["--repeats", str(args.repeats)]
    if args.baseline_src:
        startup += ["--baseline-src", args.baseline_src]
    if not args.no_startup:
        ratios += run_script("bench_startup.py", startup)
    ratios.append(figures_item(args))
    print("\n" + "\n".join(ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())

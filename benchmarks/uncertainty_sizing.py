"""Per-unit costs of ``torchcal demo --suite uncertainty`` (the sizing of its profiles).

Measures, in one process with one thread, the CPU time (``time.process_time``, a proxy for the
wall time of an idle core; wall time is printed beside it with the load average) of:

* a backbone epoch of the Kirchhof unit (MNIST-1D CNN width 64 on 2,000 signals of classes 0-4),
* a head epoch from the cache (512-512 head, 2,000 rows) and the caches + evaluations,
* a two-task epoch of the Kendall unit (width 64, 4,000 signals),
* the start-up of a worker process (imports),

Usage: ``python benchmarks/uncertainty_sizing.py OUT_DIR``
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from torchcal.experiments.uncertainty import PROFILES, kendall_unit, kirchhof_unit, suite_specs


def _clock():
    return time.process_time(), time.perf_counter()


def _since(t):
    c, w = _clock()
    return c - t[0], w - t[1]


def main(out: str) -> None:
    torch.set_num_threads(1)
    out_p = Path(out)
    print(f"load average at start: {os.getloadavg()}")
    t = _clock()
    subprocess.run([sys.executable, "-c", "import torchcal.experiments.uncertainty"], check=True)
    print(f"worker start-up (a fresh interpreter importing the suite): wall {_since(t)[1]:.2f} s")
    p = PROFILES["default"]
    for e in (2, 12):
        prof = dataclasses.replace(p, backbone_epochs=e, head_epochs=10, seeds=(0,))
        spec = suite_specs(prof, out_p / f"k{e}", out_p / "data")[0]
        t = _clock()
        res = kirchhof_unit(spec)
        cpu, wall = _since(t)
        print(f"kirchhof unit, backbone {e} epochs x2 (plain + joint), head 10 epochs: cpu "
              f"{cpu:.2f} s, wall {wall:.2f} s; head epoch {res['timing']['head_epoch_from_cache']:.4f} s"
              f", backbone pass {res['timing']['backbone_pass']:.4f} s")
    for e in (2, 7):
        prof = dataclasses.replace(p, mt_epochs=e, seeds=(0,))
        spec = [s for s in suite_specs(prof, out_p / f"m{e}", out_p / "data")
                if s["kind"] == "kendall" and s["arm"] == "kendall"][0]
        t = _clock()
        kendall_unit(spec)
        cpu, wall = _since(t)
        print(f"kendall unit, {e} epochs: cpu {cpu:.2f} s, wall {wall:.2f} s")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", help="a directory for the units' runs and data (created)")
    main(ap.parse_args().out_dir)

"""Is AdaFocal's CUDA-vs-CPU difference a CUDA defect or the loss's own sensitivity?

``benchmarks/gpu_demo_check.py``'s ``equivalence`` section trains CE, AdaFocal and focal
(packed, the ``mnist1d-cnn`` recipe, 2 epochs) on CUDA and on the CPU: CE and focal agree to
about 1e-6, AdaFocal's parameters differ by 5.2e-2.  This script changes nothing but the CPU's
thread count (1 vs 2: a rounding-level change in the reductions' order) and compares the same
three runs: if AdaFocal moves by as much on one CPU, its per-bin gamma updates (a discrete
switch on the sign of each bin's validation calibration gap) amplify rounding, and the CUDA
figure is that sensitivity, not a device defect.

    python benchmarks/adafocal_sensitivity.py
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_demo_check import _configs  # noqa: E402

from torchcal.train.checkpoint import load_checkpoint  # noqa: E402
from torchcal.train.packs import train_packed  # noqa: E402


def main() -> None:
    losses = ("ce", "adafocal", "focal")
    res = {}
    with tempfile.TemporaryDirectory() as root:
        for tag, threads in (("t1", 1), ("t2", 2)):
            cfgs = [dataclasses.replace(c, num_threads=threads,
                                        out_dir=c.out_dir.replace("/cpu/", f"/{tag}/"))
                    for c in _configs(root, "cpu", losses, 2, compile_step="off")]
            res[tag] = train_packed(cfgs)
            bad = [r for r in res[tag] if isinstance(r, BaseException)]
            if bad:
                raise bad[0]
        for i, loss in enumerate(losses):
            a = load_checkpoint(f"{root}/t1/{loss}{i}/checkpoints/last.pt")["model"]
            b = load_checkpoint(f"{root}/t2/{loss}{i}/checkpoints/last.pt")["model"]
            diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
            print(f"{loss:>9}: 1 vs 2 CPU threads, largest parameter difference {diff:.2e}; "
                  f"val ECE {res['t1'][i]['final']['val_ece']:.5f} vs "
                  f"{res['t2'][i]['final']['val_ece']:.5f}")


if __name__ == "__main__":
    main()

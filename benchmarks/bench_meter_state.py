"""CalibrationMeter(metrics=...) against the meter that computes everything (issue 43, 5).

    python benchmarks/bench_meter_state.py                  # C = 10, 100, 1000; 20 x 2,000 rows
    python benchmarks/bench_meter_state.py --c 100 --batches 10 --repeats 3

"before" is ``CalibrationMeter(C)`` (every metric: the O(N C) classwise sums, NLL, Brier,
top-k and the O(N) AdaECE confidences on every batch, which is what main's meter did whatever
was asked); "after" is ``CalibrationMeter(C, metrics=("ece",))`` and
``metrics=("ece", "nll")``, which keep and compute only that.  Also shown: the functional
``ece`` on the concatenated batches and torchmetrics' streaming
``MulticlassCalibrationError`` (when installed).  Process CPU time of the updates plus one
``compute()``, one thread, each pair measured back to back within a repeat (alternating
which goes first); the median ratio over the repeats is printed, with the state's bytes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import torchcal.metrics as M
from torchcal.metrics import CalibrationMeter


def _cpu(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def _meter_run(c: int, batches, metrics):
    def run():
        meter = CalibrationMeter(c, metrics=metrics)
        for z, y in batches:
            meter.update(logits=z, labels=y)
        meter.compute()
    return run


def _state_bytes(c: int, batches, metrics) -> int:
    meter = CalibrationMeter(c, metrics=metrics)
    for z, y in batches:
        meter.update(logits=z, labels=y)
    conf = sum(t.numel() * t.element_size() for t in meter._conf + meter._correct)
    return meter.state_size * 8 + conf


def _candidates(c: int, batches) -> dict:
    out = {f"after: metrics={keys}": (_meter_run(c, batches, keys), keys)
           for keys in (("ece",), ("ece", "nll"))}
    z_all = torch.cat([z for z, _ in batches])
    y_all = torch.cat([y for _, y in batches])
    out["functional ece (all rows)"] = (lambda: M.ece(logits=z_all, labels=y_all), None)
    try:
        from torchmetrics.classification import MulticlassCalibrationError
    except ImportError:  # optional peer
        return out

    def tm():
        metric = MulticlassCalibrationError(num_classes=c, n_bins=15)
        for z, y in batches:
            metric.update(z, y)
        metric.compute()
    out["torchmetrics MulticlassCalibrationError"] = (tm, None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--c", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--rows", type=int, default=2_000, help="rows per batch")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, {args.batches} batches x {args.rows:,} rows, "
          f"float32 logits, process CPU time, median of {args.repeats} repeats")
    for c in args.c:
        g = torch.Generator().manual_seed(c)
        batches = [(3 * torch.randn(args.rows, c, generator=g),
                    torch.randint(0, c, (args.rows,), generator=g))
                   for _ in range(args.batches)]
        before = _meter_run(c, batches, None)
        print(f"\nC = {c}: before = CalibrationMeter({c}) (every metric), "
              f"state {_state_bytes(c, batches, None):,} bytes")
        for name, (fn, keys) in _candidates(c, batches).items():
            ratios, times = [], []
            for r in range(args.repeats):
                if r % 2:
                    t_after, t_before = _cpu(fn), _cpu(before)
                else:
                    t_before, t_after = _cpu(before), _cpu(fn)
                ratios.append(t_before / max(t_after, 1e-9))
                times.append((t_before, t_after))
            tb = statistics.median(t[0] for t in times)
            ta = statistics.median(t[1] for t in times)
            state = "" if keys is None else f", state {_state_bytes(c, batches, keys):,} bytes"
            print(f"  {name:<42} before {tb:6.3f} s  after {ta:6.3f} s  "
                  f"before/after = {statistics.median(ratios):5.1f}x{state}")


if __name__ == "__main__":
    main()

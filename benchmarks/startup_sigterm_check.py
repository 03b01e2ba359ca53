"""Exit statuses of ``torchcal demo`` stopped by SIGTERM during its start-up, N times.

Run: ``python benchmarks/startup_sigterm_check.py [--runs 80]``

Each run starts ``python -m torchcal demo --benchmark digits --losses ce --seeds 1 --epochs 150
--workers 1 --no-progress --no-figures --out TMP``, sends SIGTERM as soon as the demo's lock
file exists (its start-up: modules still loading, no run yet) and records the exit status.
Every run should end with 143 (128 + SIGTERM) and one line on stderr.  Before the fixes of
2026-12-05 about 1 run in 20-40 ended with -2 (CPython's mark of a KeyboardInterrupt that left
exec'd code) or 0 (the KeyboardInterrupt was ignored in a weakref callback and the demo ran
to its end), more often beside another CPU-heavy process (the signal tests ran beside it).
Prints the counts and each odd run's stderr.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchcal.run_dir import LOCK_NAME


def one_run(out: Path) -> tuple[int, str]:
    argv = ["demo", "--benchmark", "digits", "--losses", "ce", "--seeds", "1", "--epochs", "150",
            "--workers", "1", "--no-progress", "--no-figures", "--out", str(out)]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "torchcal", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / LOCK_NAME).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=80)
    args = ap.parse_args()
    counts: collections.Counter[int] = collections.Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            code, err = one_run(Path(tmp) / f"demo{i}")
            counts[code] += 1
            if code != 128 + signal.SIGTERM or len(err.strip().splitlines()) != 1:
                print(f"run {i}: exit {code}, stderr: {err[-1500:]!r}", flush=True)
    print(f"exit statuses of {args.runs} start-up SIGTERMs: {dict(sorted(counts.items()))} "
          f"(load average at the end {os.getloadavg()})")


if __name__ == "__main__":
    main()

"""Operations dispatched per packed epoch: does a packed epoch's work grow with its members?

On a GPU every aten operation is (at least) one kernel launch, and a small network's step is
bound by launches, not by arithmetic; so the number of aten operations a packed epoch
dispatches is a machine-independent measure of how the packed engine scales.  Counted with a
``TorchDispatchMode`` over :func:`torchcal.train.train_packed` on the CPU, with the
``mnist1d-cnn`` recipe (MNIST-1D, batch 128) and the demo's 7 claim losses
(:data:`CLAIM_LOSSES`) at its published defaults, seeds 0.. so that M members are M/7 seeds of
each loss.

Two phases of the **last epoch of a 2-epoch run** are counted separately:

* **training**: :func:`torchcal.train.engine.train_epoch` (the steps, their statistics, a
  stateful loss' extra passes);
* **end of epoch**: :func:`torchcal.train.engine.end_epoch` on the training thread (the loss
  hooks, the evaluation forward per split, every member's numbers, the best-epoch snapshot,
  the epoch's one host copy, the log lines and checkpoints handed to the writer).  The
  writer thread's own operations (slicing the host copy into each member's files: host memory
  only, never a device kernel) are counted apart, as ``writer``.

By default the demo's real settings (the recipe's: best epoch by ECE, a checkpoint every
epoch, the test split every 10 epochs and at the last epoch, so epoch 2 of 2 includes it);
``--cheap`` counts the old settings (``select_best_by="none"``, ``eval_test_every=0``, one
checkpoint per run), which leave most of the end of an epoch out.

Prints each phase's ops at each M, per member, and the ratio to the smallest M (issue 38:
the end of an epoch at 35 members at most 1.1x its ops at 7; issue 31: training at 35 at most
1.5x), for the vmapped forward (what a GPU runs) and the per-member forward the CPU runs by
default.  A breakdown by operator name (``--top``) shows where the end of the epoch goes.

Run::

    python benchmarks/bench_packed_ops.py [--members 7,35] [--forward vmap] [--cheap] [--top 15]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import tempfile
import threading
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchcal.train.engine as engine
from torchcal.experiments.calibration import CLAIM_LOSSES, DEMO_LOSS_KWARGS
from torchcal.train import get_recipe
from torchcal.train.packs import train_packed

PHASES = ("train", "end", "writer")


class OpCounter(TorchDispatchMode):
    """Counts every aten operation dispatched (by overload name) into the current phase of
    the thread that dispatches it (the training thread's phases, the writer thread's)."""

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()
        self._lock = threading.Lock()
        self.counts: dict[tuple[int, str], collections.Counter[str]] = collections.defaultdict(
            collections.Counter)

    @property
    def where(self) -> tuple[int, str]:
        return getattr(self._local, "where", (-1, "other"))

    @where.setter
    def where(self, value: tuple[int, str]) -> None:
        self._local.where = value

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        with self._lock:
            self.counts[self.where][str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def _phase(counter: OpCounter, name: str, fn):
    def wrapped(*args, **kwargs):
        before, counter.where = counter.where, (args[4], name)  # both take the epoch 5th
        try:
            return fn(*args, **kwargs)
        finally:
            counter.where = before
    return wrapped


def _writer_phase(counter: OpCounter, fn):
    """The writer thread's work, counted in its own thread (a dispatch mode is per thread)."""
    def wrapped(self, job):
        with counter:
            counter.where = (job.epoch, "writer")
            return fn(self, job)
    return wrapped


def configs(members: int, epochs: int, root: str, cheap: bool, losses=CLAIM_LOSSES) -> list:
    base = get_recipe("mnist1d-cnn")
    out = []
    for i in range(members):
        loss = losses[i % len(losses)]
        extra = (dict(eval_test_every=0, select_best_by="none", checkpoint_every=epochs)
                 if cheap else {})
        out.append(dataclasses.replace(
            base, loss=loss, loss_kwargs=dict(DEMO_LOSS_KWARGS.get(loss, {})),
            seed=i // len(losses), epochs=epochs, out_dir=f"{root}/m{members}e{epochs}/r{i}",
            evaluate=False, progress=False, device="cpu", num_threads=1, **extra))
    return out


def count(members: int, forward: str, cheap: bool, epochs: int = 2
          ) -> dict[str, collections.Counter[str]]:
    """Each phase's operator counts in the last epoch of an ``epochs``-epoch run."""
    counter = OpCounter()
    saved = engine.train_epoch, engine.end_epoch
    writer_cls = getattr(engine, "EpochWriter", None)
    saved_job = getattr(writer_cls, "_write", None)
    engine.train_epoch = _phase(counter, "train", saved[0])
    engine.end_epoch = _phase(counter, "end", saved[1])
    if saved_job is not None:
        writer_cls._write = _writer_phase(counter, saved_job)
    try:
        with tempfile.TemporaryDirectory() as root:
            with counter:
                res = train_packed(configs(members, epochs, root, cheap), forward=forward)
    finally:
        engine.train_epoch, engine.end_epoch = saved
        if saved_job is not None:
            writer_cls._write = saved_job
    bad = [r for r in res if isinstance(r, BaseException)]
    if bad:
        raise RuntimeError(f"a member failed: {bad[0]!r}")
    return {p: counter.counts[(epochs - 1, p)] for p in PHASES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", default="7,35")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--forward", default="vmap,loop",
                    help="the packs' forward(s) to count: vmap (a GPU's), loop (the CPU's)")
    ap.add_argument("--cheap", action="store_true",
                    help="the old settings: no best epoch, no test split, one checkpoint")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    ms = [int(m) for m in a.members.split(",")]
    print("settings:", "cheap (select_best_by=none, eval_test_every=0, one checkpoint)"
          if a.cheap else "the demo's (best by ECE, a checkpoint every epoch, the test split "
          "every 10 epochs; epoch 2 of 2 includes it)")
    for forward in a.forward.split(","):
        rows = [(m, count(m, forward, a.cheap)) for m in ms]
        print(f"\nforward={forward}, counted at epoch 2 of 2")
        print(f"{'members':>8} {'train ops':>10} {'x smallest':>11} {'end ops':>9} "
              f"{'x smallest':>11} {'end/member':>11} {'writer ops':>11}")
        base = rows[0][1]
        for m, c in rows:
            tr, end, wr = (sum(c[p].values()) for p in PHASES)
            print(f"{m:>8} {tr:>10,} {tr / max(sum(base['train'].values()), 1):>11.2f} "
                  f"{end:>9,} {end / max(sum(base['end'].values()), 1):>11.2f} "
                  f"{end / m:>11,.0f} {wr:>11,}")
        m, c = rows[-1]
        print(f"\ntop end-of-epoch operators at M={m} (forward={forward}):")
        for name, k in sorted(c["end"].items(), key=lambda kv: -kv[1])[:a.top]:
            print(f"  {name:<32} {k:>8,}")


if __name__ == "__main__":
    main()

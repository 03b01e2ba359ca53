"""Operations a packed training epoch dispatches: the eager step against the compiled step.

Counts, with a ``TorchDispatchMode`` as ``benchmarks/bench_packed_ops.py`` counts (every aten
operation by overload name), the operations of one packed **training** epoch
(:func:`torchcal.train.engine.train_epoch`: the steps, without the end of the epoch) at M
members of the demo's 7 claim losses (M/7 seeds of each; the ``mnist1d-cnn`` recipe, the
vmapped forward), counted in the second epoch so that the compiled step's compilation (in the
first) is not counted.  The counter declares ``ignore_compile_internals``, so that a compiled
function runs compiled under it: what it counts then is what the compiled step dispatches at
run time (the kernels inductor calls out to, such as the convolutions, and the steps' own
operations outside the graph), not the fused kernels inductor generated (on a GPU one launch
each).

Issue 38's target: at 35 members, at most 2,000 operations per training epoch through the
compiled step on the CPU with inductor (9,749 with the eager step).  Compiling takes minutes
on a small CPU (``--backend aot_eager`` traces without inductor: quick, but it runs the traced
aten graph eagerly, so it counts as many operations as eager).

Run::

    python benchmarks/bench_compiled_ops.py [--members 35] [--modes off,on] [--top 12]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import tempfile
import time
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torchcal.train.engine as engine
from torchcal.experiments.calibration import CLAIM_LOSSES, DEMO_LOSS_KWARGS
from torchcal.train import compiled, get_recipe
from torchcal.train.packs import train_packed


class OpCounter(TorchDispatchMode):
    """Counts every aten operation dispatched (by overload name); compiled code runs compiled
    under it."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def configs(members: int, root: str, mode: str, epochs: int = 2) -> list:
    base = get_recipe("mnist1d-cnn")
    out = []
    for i in range(members):
        loss = CLAIM_LOSSES[i % len(CLAIM_LOSSES)]
        out.append(dataclasses.replace(
            base, loss=loss, loss_kwargs=dict(DEMO_LOSS_KWARGS.get(loss, {})),
            seed=i // len(CLAIM_LOSSES), epochs=epochs, out_dir=f"{root}/r{i}", evaluate=False,
            progress=False, device="cpu", num_threads=1, compile_step=mode))
    return out


def count_training_epoch(members: int, mode: str, backend: str = "inductor", counted: int = 1
                         ) -> tuple[collections.Counter[str], float]:
    """The operations of training epoch ``counted`` (0-based) of a packed run, and the
    seconds the whole run took."""
    counter = OpCounter()
    plain = engine.train_epoch
    timed: list[float] = []

    def watched(stack, members_, groups, batches, epoch, bar, compiled_=None):
        if epoch != counted:
            return plain(stack, members_, groups, batches, epoch, bar, compiled_)
        t0 = time.perf_counter()
        with counter:
            out = plain(stack, members_, groups, batches, epoch, bar, compiled_)
        timed.append(time.perf_counter() - t0)
        return out

    engine.train_epoch = watched
    engine.make_compiled_step = functools.partial(compiled.make_compiled_step, backend=backend)
    try:
        with tempfile.TemporaryDirectory() as root:
            t0 = time.perf_counter()
            res = train_packed(configs(members, root, mode, counted + 1), forward="vmap")
            seconds = time.perf_counter() - t0
    finally:
        engine.train_epoch = plain
        engine.make_compiled_step = compiled.make_compiled_step
    bad = [r for r in res if isinstance(r, BaseException)]
    if bad:
        raise RuntimeError(f"a member failed: {bad[0]!r}")
    return counter.counts, seconds, timed[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=35)
    ap.add_argument("--modes", default="off,on", help="compile_step settings to count")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    rows = []
    for mode in a.modes.split(","):
        counts, seconds, epoch_s = count_training_epoch(a.members, mode, a.backend)
        rows.append((mode, sum(counts.values()), seconds, epoch_s, counts))
    base = rows[0][1]
    print(f"training epoch 2 of a pack of {a.members} members (7 claim losses, vmapped forward)")
    print("(epoch s: the counted training epoch under the counter; run s: the whole 2-epoch run,"
          " compilation included)")
    print(f"{'compile_step':>12} {'ops/epoch':>10} {'x first':>8} {'epoch s':>8} {'run s':>8}")
    for mode, n, seconds, epoch_s, _ in rows:
        print(f"{mode:>12} {n:>10,} {n / base:>8.2f} {epoch_s:>8.2f} {seconds:>8.1f}")
    for mode, _, _, _, counts in rows:
        print(f"\ntop operators ({mode}):")
        for name, c in sorted(counts.items(), key=lambda kv: -kv[1])[:a.top]:
            print(f"  {name:<32} {c:>8,}")


if __name__ == "__main__":
    main()

"""Operations dispatched per packed epoch: does a packed step's work grow with its members?

On a GPU every aten operation is (at least) one kernel launch, and a small network's step is
bound by launches, not by arithmetic; so the number of aten operations a packed epoch
dispatches is a machine-independent measure of how the packed engine scales.  Counted with a
``TorchDispatchMode`` over :func:`torchcal.train.train_packed` on the CPU: one epoch's count is
the count of a 2-epoch run minus that of a 1-epoch run (start-up, building and the run
directory's files cancel), with ``TrainConfig(evaluate=False)``, the ``mnist1d-cnn`` recipe
(MNIST-1D, batch 128) and the demo's 7 claim losses (:data:`CLAIM_LOSSES`) at its published
defaults, seeds 0.. so that M members are M/7 seeds of each loss.

Prints the ops per epoch at each M, the ops per member, and the ratio of each M's count to the
smallest M's (issue 31's target: 35 members at most 1.5x 7 members; 3.4x before the grouped
engine), for the vmapped forward (what a GPU runs: the target's subject) and the per-member
forward the CPU runs by default (the model's operations then grow with the members; the rest
does not).  A breakdown by operator name (``--top``) shows where the rest goes.

Run::

    python benchmarks/bench_packed_ops.py [--members 7,14,35] [--top 15]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import tempfile
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchcal.experiments.calibration import CLAIM_LOSSES, DEMO_LOSS_KWARGS
from torchcal.train import get_recipe
from torchcal.train.packed import train_packed


class OpCounter(TorchDispatchMode):
    """Counts every aten operation dispatched (by overload name)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def configs(members: int, epochs: int, root: str, losses=CLAIM_LOSSES) -> list:
    base = get_recipe("mnist1d-cnn")
    out = []
    for i in range(members):
        loss = losses[i % len(losses)]
        out.append(dataclasses.replace(
            base, loss=loss, loss_kwargs=dict(DEMO_LOSS_KWARGS.get(loss, {})),
            seed=i // len(losses), epochs=epochs, out_dir=f"{root}/m{members}e{epochs}/r{i}",
            evaluate=False, progress=False, device="cpu", num_threads=1,
            eval_test_every=0, select_best_by="none", checkpoint_every=epochs))
    return out


def count(members: int, epochs: int, forward: str) -> collections.Counter[str]:
    with tempfile.TemporaryDirectory() as root:
        cfgs = configs(members, epochs, root)
        with OpCounter() as oc:
            res = train_packed(cfgs, forward=forward)
    bad = [r for r in res if isinstance(r, BaseException)]
    if bad:
        raise RuntimeError(f"a member failed: {bad[0]!r}")
    return oc.counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", default="7,14,35")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--forward", default="vmap,loop",
                    help="the packs' forward(s) to count: vmap (a GPU's), loop (the CPU's)")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    ms = [int(m) for m in a.members.split(",")]
    for forward in a.forward.split(","):
        rows = []
        for m in ms:
            one, two = count(m, 1, forward), count(m, 2, forward)
            per_epoch = two.copy()
            per_epoch.subtract(one)
            rows.append((m, sum(per_epoch.values()), per_epoch))
        base = rows[0][1]
        print(f"\nforward={forward}")
        print(f"{'members':>8} {'ops/epoch':>10} {'ops/member':>11} {'x smallest M':>13}")
        for m, n, _ in rows:
            print(f"{m:>8} {n:>10,} {n / m:>11,.0f} {n / base:>13.2f}")
    m, n, per = rows[-1]
    print(f"\ntop operators per epoch at M={m} (forward={forward}):")
    for name, c in sorted(per.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"  {name:<32} {c:>8,}")


if __name__ == "__main__":
    main()

"""AdaFocal's history in a checkpoint: a snapshot plus a save, before and after (issue 43).

Before, every update appended 4 CPU tensors (``.cpu()`` of γ, the edges, the gaps, the counts)
to a list, ``get_extra_state`` cloned the whole list and the trainer's snapshot cloned it again,
so that a checkpoint at update n serialised 4n small tensors: the cost of the checkpoints of a
run grew as the square of its epochs.  Now the history is one preallocated float64 tensor of
``4B + 1`` columns on the state's device, written in place by an update, and a checkpoint
holds it as one tensor.

Measured side by side in one run, at 0, 350 and 3,500 updates (``--entries``): the time of
the trainer's copy of the loss state (:meth:`torchcal.train.epoch_end.StateRows.capture`, a
run alone: every tensor cloned) plus ``torch.save`` into memory, for the old list (:class:`_ListHistory`, the previous
code kept here as the reference) and for :class:`~torchcal.losses.AdaFocalLoss`, the median
of ``--repeat`` runs, and their ratio; then the time of one update, both ways.  Both histories
hold the same numbers (checked).

Run::

    python benchmarks/bench_adafocal_history.py [--entries 0,350,3500] [--repeat 5]
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
import types
from typing import Any

import torch

from torchcal.losses import AdaFocalLoss
from torchcal.train.epoch_end import StateRows


class _ListHistory(AdaFocalLoss):
    """The previous AdaFocal history, for the comparison: a list of dicts of CPU tensors,
    appended with four ``.cpu()`` per update, cloned whole by ``get_extra_state``."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.old: list[dict[str, torch.Tensor]] = []

    def _append(self, row: torch.Tensor) -> None:
        c = self._columns()
        self.old.append({"gammas": row[c["gammas"]].detach().cpu().clone(),
                         "bin_edges": row[c["bin_edges"]].detach().cpu().clone(),
                         "gaps": row[c["gaps"]].detach().cpu().clone(),
                         "counts": row[c["counts"]].detach().cpu().to(torch.int64)})

    def get_extra_state(self) -> dict[str, Any]:
        return {"history": [{k: v.clone() for k, v in h.items()} for h in self.old]}


def _filled(cls: type, n: int, n_bins: int = 15) -> AdaFocalLoss:
    """A loss with ``n`` history entries (random γ, edges, gaps and counts)."""
    loss = cls(n_bins=n_bins)
    gen = torch.Generator().manual_seed(0)
    rows = torch.rand(n, 4 * n_bins + 1, generator=gen, dtype=torch.float64)
    rows[:, 3 * n_bins + 1:] = torch.randint(0, 400, (n, n_bins), generator=gen)
    for row in rows:
        loss._append(row)
    return loss


# a run alone's stack: no stacked tensors, so capture clones every tensor
_ALONE = types.SimpleNamespace(stacked_state=dict)


def _snapshot_and_save(loss: AdaFocalLoss) -> int:
    state = StateRows(_ALONE).capture({"loss": loss.state_dict()})  # the trainer's copy
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.tell()


def _median(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _update_time(cls: type, n: int, repeat: int) -> float:
    loss = _filled(cls, n)
    gen = torch.Generator().manual_seed(1)
    z, y = torch.randn(1000, 10, generator=gen) * 3, torch.randint(0, 10, (1000,), generator=gen)
    return _median(lambda: loss.update(logits=z, labels=y), repeat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", default="0,350,3500")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'entries':>8} {'old ms':>9} {'new ms':>9} {'old/new':>8} {'old bytes':>11} "
          f"{'new bytes':>10}   (snapshot + torch.save, median of {a.repeat})")
    for n in (int(v) for v in a.entries.split(",")):
        old, new = _filled(_ListHistory, n), _filled(AdaFocalLoss, n)
        assert len(new.history) == len(old.old) == n
        assert all(torch.equal(h[k], o[k]) for h, o in zip(new.history, old.old, strict=True)
                   for k in o), "the two histories differ"
        t_old = _median(lambda old=old: _snapshot_and_save(old), a.repeat)
        t_new = _median(lambda new=new: _snapshot_and_save(new), a.repeat)
        print(f"{n:>8,} {1e3 * t_old:>9.2f} {1e3 * t_new:>9.2f} {t_old / t_new:>8.1f} "
              f"{_snapshot_and_save(old):>11,} {_snapshot_and_save(new):>10,}")
    n = max(int(v) for v in a.entries.split(","))
    u_old, u_new = _update_time(_ListHistory, n, a.repeat), _update_time(AdaFocalLoss, n, a.repeat)
    print(f"\none update at {n:,} entries: old {1e3 * u_old:.2f} ms, new {1e3 * u_new:.2f} ms, "
          f"old/new {u_old / u_new:.2f}")


if __name__ == "__main__":
    main()

"""Speed of AdaFocal: training loss relative to ``F.cross_entropy`` and the validation update.

Run: ``python benchmarks/bench_adafocal.py [--repeats 21] [--threads 0]``
(``--shapes 256x10 --n-val 500 --repeats 3`` for a quick check that it runs; the targets are
for the defaults.)

1. forward + backward of :class:`torchcal.losses.AdaFocalLoss` (15 bins, after an update so that
   the edges are equal-mass and γ has both signs) on float32 CPU logits (4096, 100) and
   (4096, 1000): the median over repeats of ``time(adafocal) / time(F.cross_entropy)``, the two
   timings alternating inside each repeat, each timing the mean of ``--inner`` calls (the
   machine is shared; ratios are what we report).
   Target <= 1.5x.  For reference, the same ratio of ``signed_focal_loss`` with a precomputed
   per-sample γ (what AdaFocal adds on top of it is the bin lookup).
2. ``update()`` on 10,000 validation samples (C = 100 and 1000): median wall time, and its
   ratio to ``torchcal.metrics.adaptive_ece`` on the same logits (the same equal-mass binning
   plus the softmax).  Target: well under a second.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from bench_losses import _shapes  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from torchcal.functional import signed_focal_loss
from torchcal.losses import AdaFocalLoss
from torchcal.metrics import adaptive_ece

INNER = 5  # calls per timing sample (averages out scheduler jitter on a shared machine)


def _fwd_bwd(fn, x0: torch.Tensor, y: torch.Tensor) -> float:
    xs = [x0.detach().clone().requires_grad_(True) for _ in range(INNER)]
    t0 = time.perf_counter()
    for x in xs:
        fn(x, y).backward()
    return (time.perf_counter() - t0) / INNER


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def alternated(f, b, repeats: int) -> tuple[float, float, float]:
    """Median of f()/b() with alternating order, and the median times (ms) of each."""
    for _ in range(2):
        f()
        b()
    rs, tf, tb = [], [], []
    for i in range(repeats):
        if i % 2:
            tb_i = b()
            tf_i = f()
        else:
            tf_i = f()
            tb_i = b()
        rs.append(tf_i / tb_i)
        tf.append(tf_i)
        tb.append(tb_i)
    return statistics.median(rs), 1e3 * statistics.median(tf), 1e3 * statistics.median(tb)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave default)")
    ap.add_argument("--inner", type=int, default=5, help="calls per timing sample")
    ap.add_argument("--shapes", type=_shapes, default=((4096, 100), (4096, 1000)),
                    help="comma-separated NxC training-batch shapes (default 4096x100,4096x1000)")
    ap.add_argument("--n-val", type=int, default=10_000,
                    help="validation samples for the update timing (default 10000)")
    args = ap.parse_args(argv)
    global INNER
    INNER = max(1, args.inner)
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, repeats {args.repeats}")

    print("\nforward+backward, ratio to F.cross_entropy (target <= 1.5x)")
    for n, c in args.shapes:
        x = torch.randn(n, c, generator=gen) * 3
        y = torch.randint(0, c, (n,), generator=gen)
        loss = AdaFocalLoss()
        # a realistic state: equal-mass edges from a validation set, γ of both signs
        loss.update(logits=torch.randn(5000, c, generator=gen) * 3,
                    labels=torch.randint(0, c, (5000,), generator=gen))
        with torch.no_grad():
            loss.gammas.copy_(torch.linspace(-2.0, 5.0, 15, dtype=torch.float64))
        r, tf, tb = alternated(lambda x=x, y=y, loss=loss: _fwd_bwd(loss, x, y),
                               lambda x=x, y=y: _fwd_bwd(F.cross_entropy, x, y), args.repeats)
        flag = "ok" if r <= 1.5 else "SLOW"
        print(f"  ({n}, {c:4d})  adafocal {tf:7.2f} ms  ce {tb:7.2f} ms  ratio {r:5.2f}x  {flag}")
        # reference: the same signed focal loss with a precomputed per-sample γ (no bin lookup)
        g = loss.gammas.float()[torch.randint(0, 15, (n,), generator=gen)]
        r2, tf2, tb2 = alternated(
            lambda x=x, y=y, g=g: _fwd_bwd(lambda a, b: signed_focal_loss(a, b, g), x, y),
            lambda x=x, y=y: _fwd_bwd(F.cross_entropy, x, y), args.repeats)
        print(f"  ({n}, {c:4d})  signed_focal(γ given) {tf2:7.2f} ms  ce {tb2:7.2f} ms  "
              f"ratio {r2:5.2f}x  (reference)")

    nv = args.n_val
    print(f"\nupdate() on {nv:,} validation samples (target: well under 1 s for 10,000)")
    for c in sorted({c for _, c in args.shapes}):
        z = torch.randn(nv, c, generator=gen) * 3
        y = torch.randint(0, c, (nv,), generator=gen)
        loss = AdaFocalLoss()

        def upd(loss=loss, z=z, y=y):
            return _timed(lambda: loss.update(logits=z, labels=y))

        def ada(z=z, y=y):
            return _timed(lambda: adaptive_ece(logits=z, labels=y, n_bins=15))

        r, tf, tb = alternated(upd, ada, args.repeats)
        flag = "ok" if tf < 250 else "SLOW"
        print(f"  ({nv}, {c:4d})  update {tf:7.2f} ms  adaptive_ece {tb:7.2f} ms  "
              f"ratio {r:5.2f}x  {flag}")


if __name__ == "__main__":
    main()

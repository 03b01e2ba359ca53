"""Speed of training an uncertainty head from the embedding cache vs recomputing the backbone.

Run: ``python benchmarks/bench_uncertainty.py [--repeats 7] [--steps 10] [--threads 1]``

Both arms train the same :class:`torchcal.uncertainty.UncertaintyHead` (512-512, the paper's)
with the same batch (256) and optimiser (AdamW) on the ranking loss:

* **cache**: the head reads embeddings and the classifier's logits from an
  :class:`~torchcal.uncertainty.EmbeddingCache` built once (loaded into memory); a step is
  gather + head forward/backward + optimiser step.
* **recompute**: every step runs the frozen backbone (``small_cnn``, torchcal's 3-block CNN,
  on 32x32 RGB uint8 images: normalise, ``forward_features`` + ``fc`` under ``no_grad``) and then
  does the same head step.

The two timings alternate inside each repeat (the machine is shared); we report the median of
the per-repeat ratio ``time(recompute) / time(cache)`` in steps per second, plus the one-off
cache build time and the number of head steps after which the cache has paid for itself.  The
paper reports ~180x with ViT-Large on a GPU; a small CNN on a CPU gives a smaller ratio because
the backbone is cheap relative to the head.  Images are random (speed does not depend on
content; nothing is downloaded).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from torchcal.data.augment import normalize
from torchcal.models import create_model
from torchcal.uncertainty import EmbeddingCache, UncertaintyHead, ranking_loss
from torchcal.uncertainty.head import per_sample_cross_entropy

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


def _prep(x: torch.Tensor) -> torch.Tensor:
    return normalize(x, MEAN, STD)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10, help="head steps per timing")
    ap.add_argument("--n", type=int, default=2560, help="images in the data set")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (0: torch's default; 1 is steadiest on a shared machine)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (args.n, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (args.n,), generator=g)
    torch.manual_seed(0)
    backbone = create_model("small_cnn", 10).eval()
    for p in backbone.parameters():
        p.requires_grad_(False)
    d = int(backbone.num_features)

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        cache = EmbeddingCache.build(Path(tmp) / "cache", backbone, (images, labels),
                                     transform=_prep, batch_size=512)
        build_s = time.perf_counter() - t0
        emb, logits, lab = cache.tensors()
    target = per_sample_cross_entropy(logits, lab)

    def make():
        torch.manual_seed(1)
        head = UncertaintyHead(d)
        return head, torch.optim.AdamW(head.parameters(), lr=1e-3, weight_decay=1e-4)

    head_c, opt_c = make()
    head_r, opt_r = make()
    bs = args.batch_size

    def step(head, opt, feats, tgt):
        loss = ranking_loss(head(feats), tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def run_cache(batches):
        t = time.perf_counter()
        for idx in batches:
            step(head_c, opt_c, emb[idx], target[idx])
        return time.perf_counter() - t

    def run_recompute(batches):
        t = time.perf_counter()
        for idx in batches:
            with torch.no_grad():
                z = backbone.forward_features(_prep(images[idx]))
                tgt = per_sample_cross_entropy(backbone.fc(z), labels[idx])
            step(head_r, opt_r, z, tgt)
        return time.perf_counter() - t

    def draw():
        return [torch.randint(0, args.n, (bs,), generator=g) for _ in range(args.steps)]

    run_cache(draw()[:2])  # warm-up
    run_recompute(draw()[:2])
    ratios, t_cache, t_rec = [], [], []
    for r in range(args.repeats):
        batches = draw()
        if r % 2:
            tr, tc = run_recompute(batches), run_cache(batches)
        else:
            tc, tr = run_cache(batches), run_recompute(batches)
        t_cache.append(tc)
        t_rec.append(tr)
        ratios.append(tr / tc)
    sps_c = args.steps / statistics.median(t_cache)
    sps_r = args.steps / statistics.median(t_rec)
    ratio = statistics.median(ratios)
    per_step_saving = 1 / sps_r - 1 / sps_c
    breakeven = build_s / per_step_saving if per_step_saving > 0 else float("inf")
    print(f"uncertainty head training, batch {bs}, head {d}-512-512-1, backbone small_cnn "
          f"(3x32x32), torch threads {torch.get_num_threads()}, {args.repeats} repeats x "
          f"{args.steps} steps")
    print(f"  from cache:        {sps_c:8.1f} steps/s  ({sps_c * bs:9.0f} samples/s)")
    print(f"  recompute backbone:{sps_r:8.1f} steps/s  ({sps_r * bs:9.0f} samples/s)")
    print(f"  speed-up (median of per-repeat ratios): {ratio:.1f}x  "
          f"[min {min(ratios):.1f}x, max {max(ratios):.1f}x]")
    print(f"  one-off cache build: {build_s:.2f} s for {args.n} images "
          f"(pays for itself after ~{breakeven:.0f} head steps)")
    return {"ratio": ratio, "steps_per_s_cache": sps_c, "steps_per_s_recompute": sps_r,
            "build_s": build_s}


if __name__ == "__main__":
    main()

"""Batched random crop + flip (torchcal.data.augment) against a per-sample loop.

The baseline is what a DataLoader transform does: for each image, pad, crop at a random offset,
maybe flip (here in torch, without the PIL round trip torchvision would add, so the baseline
is generous).  Both run on the same uint8 CIFAR-sized batch in the same process with one
thread; the two timings alternate within each repeat and the median ratio is printed.

    python benchmarks/bench_data_augment.py
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from torchcal.data.augment import normalize, random_crop_flip

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)


def per_sample(x: torch.Tensor, padding: int, gen: torch.Generator) -> torch.Tensor:
    n, c, h, w = x.shape
    out = torch.empty((n, c, h, w), dtype=torch.float32)
    for i in range(n):
        p = F.pad(x[i], (padding,) * 4)
        dy, dx = (int(v) for v in torch.randint(0, 2 * padding + 1, (2,), generator=gen))
        crop = p[:, dy:dy + h, dx:dx + w]
        if torch.rand(1, generator=gen).item() < 0.5:
            crop = crop.flip(-1)
        out[i] = (crop.float() / 255 - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    return out


def batched(x: torch.Tensor, padding: int, gen: torch.Generator) -> torch.Tensor:
    return normalize(random_crop_flip(x, padding, generator=gen), MEAN, STD)


def main(batch: int = 128, repeats: int = 15) -> None:
    # One thread: the machine is shared, and a DataLoader worker runs single-threaded too.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8)
    g = torch.Generator().manual_seed(0)
    for f in (per_sample, batched):  # warm-up
        f(x, 4, g)
    ratios, tb, tl = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        batched(x, 4, g)
        t1 = time.perf_counter()
        per_sample(x, 4, g)
        t2 = time.perf_counter()
        tb.append(t1 - t0)
        tl.append(t2 - t1)
        ratios.append((t2 - t1) / (t1 - t0))
    print(f"batch {batch}x3x32x32 uint8, crop 32 pad 4 + flip + normalise, {repeats} repeats, "
          f"{torch.get_num_threads()} threads")
    print(f"  batched (torchcal):  median {statistics.median(tb) * 1e3:8.2f} ms")
    print(f"  per-sample loop:     median {statistics.median(tl) * 1e3:8.2f} ms")
    print(f"  speed-up (median of per-repeat ratios): {statistics.median(ratios):.1f}x")


if __name__ == "__main__":
    main()

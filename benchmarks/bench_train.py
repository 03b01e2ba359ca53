"""Input pipeline of the trainer: batched index gathers vs a per-sample DataLoader.

torchcal's trainer feeds in-memory data sets (CIFAR, SVHN, Tiny-ImageNet, digits) without a
DataLoader: the uint8 images live on the device, a batch is one index gather, and the random
crop + flip + normalisation run batched (:class:`torchcal.train.inference.BatchSource`).  The
baseline is the usual pipeline: a ``DataLoader`` (``num_workers=0``, ``shuffle=True``) over a
data set that pads, crops, flips and normalises each sample in ``__getitem__`` and collates.

Prints the time of one epoch of batches (CIFAR-sized 3x32x32 uint8 images, batch 128, no model)
for both, alternating within each repeat, and the median ratio.

    python benchmarks/bench_train.py [--n 10000] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from torchcal.data import ArrayDataset
from torchcal.train.distributed import epoch_permutation
from torchcal.train.inference import BatchSource

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2023, 0.1994, 0.2010)


class PerSampleCifar(Dataset):
    """The baseline: per-sample pad/crop/flip/normalise, as torchvision transforms do."""

    def __init__(self, data: torch.Tensor, labels: torch.Tensor) -> None:
        self.data, self.labels = data, labels
        self.mean = torch.tensor(MEAN)[:, None, None]
        self.std = torch.tensor(STD)[:, None, None]

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, i):
        x = F.pad(self.data[i], (4, 4, 4, 4))
        dy, dx = torch.randint(0, 9, (2,)).tolist()
        x = x[:, dy:dy + 32, dx:dx + 32]
        if torch.rand(()) < 0.5:
            x = x.flip(2)
        return (x.float() / 255 - self.mean) / self.std, self.labels[i]


def epoch_batched(src: BatchSource, n: int, epoch: int) -> int:
    g = torch.Generator().manual_seed(epoch)
    seen = 0
    for x, _ in src.batches(epoch_permutation(n, 0, epoch), 128, augment=True, generator=g):
        seen += x.shape[0]
    return seen


def epoch_loader(loader: DataLoader) -> int:
    seen = 0
    for x, _ in loader:
        seen += x.shape[0]
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10000, help="images per epoch")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (args.n, 3, 32, 32), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, 10, (args.n,), generator=gen)
    src = BatchSource(ArrayDataset(data, labels), torch.device("cpu"), mean=MEAN, std=STD)
    loader = DataLoader(PerSampleCifar(data, labels), batch_size=128, shuffle=True,
                        num_workers=0)
    epoch_batched(src, args.n, 0)  # warm-up
    epoch_loader(loader)
    t_fast, t_base, ratios = [], [], []
    for r in range(args.repeats):
        t0 = time.perf_counter()
        assert epoch_batched(src, args.n, r) == args.n
        t1 = time.perf_counter()
        assert epoch_loader(loader) == args.n
        t2 = time.perf_counter()
        t_fast.append(t1 - t0)
        t_base.append(t2 - t1)
        ratios.append((t2 - t1) / (t1 - t0))
    print(f"one epoch of {args.n} CIFAR-sized images, batch 128, {args.threads} thread(s):")
    print(f"  torchcal BatchSource (index gather + batched crop/flip/normalise): "
          f"{statistics.median(t_fast) * 1e3:8.1f} ms")
    print(f"  DataLoader, per-sample transforms (num_workers=0):                 "
          f"{statistics.median(t_base) * 1e3:8.1f} ms")
    print(f"  median speed-up: {statistics.median(ratios):.1f}x  (per repeat: "
          + ", ".join(f"{x:.1f}" for x in ratios) + ")")


if __name__ == "__main__":
    main()

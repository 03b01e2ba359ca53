"""Check torchcal's MNIST-1D loader and ``mnist1d_cnn`` against the package paper's setting.

The paper (Greydanus & Kobak 2024; README table of github.com/greydanus/mnist1d) reports about
94% test accuracy for its CNN on the default data set (4,000 training / 1,000 test signals,
generator seed 42).  Its training code (``notebooks/train.py``): Adam, lr 1e-2, no weight decay,
batch 100 taken in order (``x[(step * 100) % 4000:][:100]``, no shuffling), 8,000 steps,
mean cross-entropy, PyTorch's default initialisation; its ``ConvBase`` has width 25.

Here the data come from :func:`torchcal.data.load_mnist1d_splits` with sizes (3,600, 400, 1,000)
and seed 42: training + validation are then exactly the package's default ``x`` (4,000) and the
test split its ``x_test`` (checked against ``mnist1d.data.make_dataset`` below), so the paper's
training set is ``train + val``.

    OMP_NUM_THREADS=1 python benchmarks/results/mnist1d_paper_check.py [--widths 25,64] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from mnist1d.data import get_dataset_args, make_dataset

from torchcal.data import load_mnist1d_splits
from torchcal.models import count_parameters, create_model


def train_paper(x, y, xt, yt, width: int, seed: int, steps: int = 8000, batch: int = 100) -> float:
    """The paper's training loop; returns the test accuracy after the last step."""
    torch.manual_seed(seed)
    model = create_model("mnist1d_cnn", 10, width=width)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=0)
    for step in range(steps + 1):  # the paper's loop runs total_steps + 1 steps
        bix = (step * batch) % len(x)
        loss = F.cross_entropy(model(x[bix:bix + batch]), y[bix:bix + batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float((model(xt).argmax(1) == yt).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="25,64")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--data-root", default=None, help="cache directory (default: a temporary one)")
    args = ap.parse_args()
    root = args.data_root or tempfile.mkdtemp()
    s = load_mnist1d_splits(root, seed=42, n_train=3600, n_val=400, n_test=1000)
    x = torch.cat([s.train.data, s.val.data])
    y = torch.cat([s.train.labels, s.val.labels])
    ref = make_dataset(get_dataset_args())
    same = (np.array_equal(x.numpy(), ref["x"].astype(np.float32))
            and np.array_equal(y.numpy(), ref["y"])
            and np.array_equal(s.test.data.numpy(), ref["x_test"].astype(np.float32))
            and np.array_equal(s.test.labels.numpy(), ref["y_test"]))
    print(f"loader == mnist1d.data.make_dataset(get_dataset_args()) (4,000 / 1,000, seed 42): {same}")
    for width in (int(w) for w in args.widths.split(",")):
        params = count_parameters(create_model("mnist1d_cnn", 10, width=width))
        accs = [train_paper(x, y, s.test.data, s.test.labels, width, int(sd))
                for sd in args.seeds.split(",")]
        print(f"width {width} ({params:,} parameters): test accuracy "
              + ", ".join(f"{a:.1%}" for a in accs) + f" (mean {np.mean(accs):.1%}; paper: ~94%)",
              flush=True)


if __name__ == "__main__":
    main()

"""Suite-wide pytest settings.

The suite runs as ``pytest -n 2`` on 2 cores: each xdist worker uses one intra-op thread so the
workers do not oversubscribe the cores (with two threads per worker small tensor operations were
measured 25-37x slower under contention).  Tests that need more threads set them locally.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import matplotlib  # noqa: E402

matplotlib.use("Agg")

import torch  # noqa: E402

torch.set_num_threads(1)

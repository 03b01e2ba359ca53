"""Packed training on a CUDA device in under 3 minutes: equivalence, host syncs, step GFLOP/s.

1. Equivalence: three runs (CE, AdaFocal, focal; seeds 0-2; the 1-D CNN on the embedded digits,
   2 epochs, clipping that bites) trained packed with ``torchcal.train.packs.train_packed`` and
   separately with ``torchcal.train.train`` on the device (TF32 off); prints each member's
   largest parameter difference to its separate run, and the validation ECEs.
2. Host syncs: one more packed epoch under ``torch.cuda.set_sync_debug_mode("warn")``; prints
   the synchronising calls per training step (packing must not multiply them by M).
3. The step against the limit: ``benchmarks/bench_train_step.py``'s GFLOP/s table on the device
   (MNIST-1D CNN at M = 1, 5, 14, 70; ResNet-20 at batch 128 for M = 1, 5, 14, 32 where they fit).

Run::

    python benchmarks/gpu_pack_check.py [--skip-bench]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from torchcal.train import build_data, get_recipe, train  # noqa: E402
from torchcal.train.checkpoint import load_checkpoint  # noqa: E402
from torchcal.train.packs import train_packed  # noqa: E402

MEMBERS = [(0, "ce"), (1, "adafocal"), (2, "focal")]


DEVICE = "cuda"


def _config(root: Path, name: str, seed: int, loss: str, epochs: int = 2):
    return dataclasses.replace(
        get_recipe("digits-mlp"), out_dir=str(root / name), epochs=epochs, progress=False,
        device=DEVICE, model="mnist1d_cnn", model_kwargs={"in_length": 64, "width": 16},
        grad_clip=0.05, data_seed=1, seed=seed, loss=loss, checkpoint_every=1,
        loss_kwargs={"update_every": 7} if loss == "adafocal" else {})


def equivalence(root: Path) -> bool:
    configs = [_config(root, f"p{s}", s, loss) for s, loss in MEMBERS]
    t0 = time.perf_counter()
    res = train_packed(configs)
    tp = time.perf_counter() - t0
    ok = True
    t0 = time.perf_counter()
    for (s, loss), c in zip(MEMBERS, configs, strict=True):
        sep = train(dataclasses.replace(c, out_dir=str(root / f"s{s}")))
        a = load_checkpoint(root / f"p{s}" / "checkpoints" / "last.pt", map_location="cpu")
        b = load_checkpoint(root / f"s{s}" / "checkpoints" / "last.pt", map_location="cpu")
        diff = max(float((a["model"][k].double() - b["model"][k].double()).abs().max())
                   for k in a["model"])
        good = isinstance(res[s], dict) and diff < 1e-4
        ok &= good
        got = res[s]["final"]["val_ece"] if isinstance(res[s], dict) else res[s]
        print(f"  member {s} ({loss}): max |packed - separate| parameter {diff:.2e}; val ECE "
              f"packed {got} separate {sep['final']['val_ece']}  {'OK' if good else 'DIFFERS'}")
    print(f"  packed {tp:.1f} s for 3 runs, separate {time.perf_counter() - t0:.1f} s "
          "(tiny runs: start-up dominates)")
    return ok


def _count_syncs(fn) -> dict[str, int]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    where: dict[str, int] = {}
    for w in caught:
        if "synchroniz" in str(w.message).lower():
            key = f"{Path(w.filename).name}:{w.lineno}"
            where[key] = where.get(key, 0) + 1
    return where


def host_syncs(root: Path) -> None:
    configs = [_config(root, f"sync{s}", s, loss, epochs=1) for s, loss in MEMBERS]
    steps = math.ceil(len(build_data(configs[0]).train) / configs[0].batch_size)
    sep = _count_syncs(lambda: train(dataclasses.replace(configs[0],
                                                          out_dir=str(root / "sync_sep"))))
    packed = _count_syncs(lambda: train_packed(configs))
    print(f"  one epoch of {steps} steps, build, evaluation and checkpoint included: "
          f"{sum(sep.values())} synchronising calls for one separate run, "
          f"{sum(packed.values())} for a pack of 3")
    for key, n in sorted(packed.items(), key=lambda kv: -kv[1])[:8]:
        print(f"    packed {n:5d}  {key}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--device", default="cuda", help="cpu: a local dry run of part 1 only")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cpu":
        with tempfile.TemporaryDirectory() as tmp:
            raise SystemExit(0 if equivalence(Path(tmp)) else 1)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_pack_check.py needs a CUDA device")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        print("1. equivalence of packed members and separate runs on the device (TF32 off)")
        ok = equivalence(Path(tmp))
        print("2. host synchronisations")
        host_syncs(Path(tmp))
    print(f"   ({time.perf_counter() - t0:.0f} s so far)")
    if not args.skip_bench:
        torch.backends.cudnn.allow_tf32 = True  # the default a user trains with
        torch.backends.cuda.matmul.allow_tf32 = False
        print("3. the step against the limit (cuDNN TF32 on as PyTorch's default; the matmul "
              "reference is strict float32)")
        import bench_train_step as B

        sys.argv = [sys.argv[0], "--gflops-only", "--device", "cuda", "--repeats", "5",
                    "--pack-sizes", "resnet20=1,5,14,32"]
        B.main()
    print(f"done in {time.perf_counter() - t0:.0f} s; equivalence {'OK' if ok else 'FAILED'}")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

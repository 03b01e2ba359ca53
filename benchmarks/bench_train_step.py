"""Training-step time with every registry loss against cross-entropy: what a user feels.

``bench_losses.py`` times a loss alone on big logit matrices; here the loss sits in a whole
training step, as :func:`torchcal.train.train` runs it: ``zero_grad``, model forward, the loss
with its published reduction (built by the trainer's own ``build_loss`` with the
``mnist1d-cnn`` recipe's loss defaults), backward, gradient clipping at 2, SGD step (lr 0.1,
momentum 0.9, weight decay 5e-4).  Models, at batch 128 and 10 classes:

* ``mnist1d_cnn`` (width 64) on (128, 40) MNIST-1D-shaped signals;
* ``resnet20`` on (128, 3, 32, 32) CIFAR-shaped images.

The baseline is PyTorch's ``nn.CrossEntropyLoss`` with the reduction torchcal's ``ce`` trains
with (sum); torchcal's own ``ce`` is a row like every other loss.  For every loss of
``list_losses()`` the printed ratio is the median over repeats of
``time(step with the loss) / time(step with CE)``, the two timed alternately in the same run
(the machine is shared; absolute times are noisy, ratios are what we report), with the ratio
of the minimum times beside it.  Then the same compiled: ``torch.compile`` of model + loss
(one graph for forward and loss, ``fullgraph=True`` so that a graph break is reported rather
than silently run in eager mode; backward, clipping and the optimiser step stay eager), against
compiled PyTorch CE.  A loss that does not compile is marked ``FAILS`` with the first line of the error
(and timed again with graph breaks allowed, when that works).

Then the step against the machine's limit (``--no-gflops`` skips it, ``--gflops-only`` runs
only it): GFLOP/s of a separate run's step and of packed steps of M runs
(:mod:`torchcal.train.packed`: the stacked parameters' vmapped forward, each member's own CE
loss, per-member clipping at 2, one SGD), beside the rate of a 1024x1024 float32 matmul measured
in the same process just before each row ("matmul"; "% matmul" is the row's share of it: the
machine may be shared), and before and after the table.  FLOPs per sample
are counted by ``torch.utils.flop_counter`` on a separate step's forward and backward; "x sep"
is M times the separate step's time over the packed step's, the two timed alternately.  The
M of ResNet-20 are those whose saved activations fit in half the free memory.

Run::

    python benchmarks/bench_train_step.py [--repeats 7] [--threads 1] [--models mnist1d_cnn,resnet20]
        [--losses ce,focal] [--no-compile] [--no-eager] [--no-gflops | --gflops-only]
        [--pack-sizes mnist1d_cnn=1,5,14,70 --pack-sizes resnet20=1,2,4] [--device cpu]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable

import torch
import torch._dynamo
from torch import nn

from torchcal.losses import list_losses
from torchcal.models import create_model
from torchcal.train import TrainConfig, get_recipe
from torchcal.train.stacks import PackedModel
from torchcal.train.run import build_loss

BATCH = 128
NUM_CLASSES = 10
INPUTS = {"mnist1d_cnn": (40,), "resnet20": (3, 32, 32)}


class ModelLoss(nn.Module):
    """``forward(x, y) = loss(model(x), y)``: the part of a step that ``torch.compile`` gets."""

    def __init__(self, model: nn.Module, loss: nn.Module) -> None:
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(self.model(x).float(), y)


def make_loss(name: str) -> nn.Module:
    """The loss as the ``mnist1d-cnn`` recipe trains with it (published reduction, defaults)."""
    recipe = get_recipe("mnist1d-cnn")
    return build_loss(TrainConfig(loss=name, loss_defaults=recipe.loss_defaults,
                                  reduction="published"), NUM_CLASSES)


def make_step(model: nn.Module, opt: torch.optim.Optimizer, fwd: Callable,
              x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    params = [p for p in model.parameters()]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        fwd(x, y).backward()
        torch.nn.utils.clip_grad_norm_(params, 2.0)
        opt.step()

    return step


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _block(step: Callable[[], None], inner: int) -> float:
    _sync()
    t0 = time.perf_counter()
    for _ in range(inner):
        step()
    _sync()
    return (time.perf_counter() - t0) / inner


def ratio(fn: Callable[[], None], base: Callable[[], None], repeats: int
          ) -> tuple[float, float, float, float]:
    """Alternating timings of two steps (order swapped every repeat), each block about 50 ms.

    Returns (median ratio, min-time ratio, median ms of fn, median ms of base).
    """
    t = _block(base, 1)
    inner = max(1, min(100, int(0.05 / max(t, 1e-6))))
    for _ in range(2):  # warm-up
        _block(base, inner)
        _block(fn, inner)
    rs, tf, tb = [], [], []
    for i in range(repeats):
        if i % 2:
            b, f = _block(base, inner), _block(fn, inner)
        else:
            f, b = _block(fn, inner), _block(base, inner)
        rs.append(f / b)
        tf.append(f)
        tb.append(b)
    return (statistics.median(rs), min(tf) / min(tb), 1e3 * statistics.median(tf),
            1e3 * statistics.median(tb))


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:160]


def _compiled_step(model, opt, loss, x, y, fullgraph: bool) -> Callable[[], None]:
    """A step with ``torch.compile(ModelLoss)``, run once here so compile errors surface now."""
    step = make_step(model, opt, torch.compile(ModelLoss(model, loss), fullgraph=fullgraph), x, y)
    step()
    step()
    return step


def bench_model(name: str, losses: list[str], args: argparse.Namespace,
                g: torch.Generator) -> None:
    torch.manual_seed(args.seed)
    model = create_model(name, NUM_CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(BATCH, *INPUTS[name], generator=g)
    y = torch.randint(0, NUM_CLASSES, (BATCH,), generator=g)
    head = f"{'loss':<16}{'median':>8}{'min':>7}{'ms':>9}{'CE ms':>9}"
    ce = nn.CrossEntropyLoss(reduction=make_loss("ce").reduction)  # PyTorch's, the baseline
    if not args.no_eager:
        base = make_step(model, opt, ModelLoss(model, ce), x, y)
        print(f"\n{name}, batch {BATCH}, input {tuple(x.shape[1:])}: eager, "
              "time(step) / time(step with PyTorch CE)")
        print(head)
        for loss_name in losses:
            step = make_step(model, opt, ModelLoss(model, make_loss(loss_name)), x, y)
            r, rmin, tf, tb = ratio(step, base, args.repeats)
            print(f"{loss_name:<16}{r:>8.2f}{rmin:>7.2f}{tf:>9.2f}{tb:>9.2f}", flush=True)
    if args.no_compile:
        return
    print(f"\n{name}: torch.compile(model + loss, fullgraph=True) vs compiled PyTorch CE "
          "(both compiled afresh for every loss)")
    print(head + "  compile")
    for loss_name in losses:
        # a fresh dynamo cache: a graph compiled for another loss of the same class (or with
        # graph breaks allowed) must not be reused, and fullgraph must be enforced every time
        torch._dynamo.reset()
        try:
            base = _compiled_step(model, opt, ce, x, y, fullgraph=True)
        except Exception as exc:  # noqa: BLE001 - any compile error is reported, not raised
            print(f"compiled PyTorch CE FAILS: {_first_line(exc)}; no compiled timings")
            return
        t0 = time.perf_counter()
        try:
            step = _compiled_step(model, opt, make_loss(loss_name), x, y, fullgraph=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{loss_name:<16}{'FAILS':>8}  {_first_line(exc)}", flush=True)
            try:
                step = _compiled_step(model, opt, make_loss(loss_name), x, y, fullgraph=False)
            except Exception as exc2:  # noqa: BLE001
                print(f"{'':<16}{'':>8}  with graph breaks allowed: FAILS too: {_first_line(exc2)}")
                continue
            r, rmin, tf, tb = ratio(step, base, args.repeats)
            print(f"{'  (breaks ok)':<16}{r:>8.2f}{rmin:>7.2f}{tf:>9.2f}{tb:>9.2f}", flush=True)
            continue
        tc = time.perf_counter() - t0
        r, rmin, tf, tb = ratio(step, base, args.repeats)
        print(f"{loss_name:<16}{r:>8.2f}{rmin:>7.2f}{tf:>9.2f}{tb:>9.2f}  {tc:5.1f} s", flush=True)


# ------------------------------------------------------------------------------------------
# the step against the machine's limit: GFLOP/s of separate and packed steps
# ------------------------------------------------------------------------------------------
def matmul_rate(device: torch.device, n: int = 1024, seconds: float = 0.5) -> float:
    """GFLOP/s of an n x n float32 matmul on ``device`` (the best of five blocks)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    t = _block(lambda: a @ b, 1)
    inner = max(1, int(seconds / 5 / max(t, 1e-6)))
    return 2 * n ** 3 / min(_block(lambda: a @ b, inner) for _ in range(5)) / 1e9


def step_flops(model: nn.Module, loss: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """FLOPs of one forward + backward of a separate step (``torch.utils.flop_counter``)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        loss(model(x).float(), y).backward()
    model.zero_grad(set_to_none=True)
    return float(fc.get_total_flops())


def saved_bytes(model: nn.Module, loss: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes autograd saves for one separate step's backward (its activations)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = loss(model(x).float(), y)
    del out
    return sum(seen.values())


def free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 4 * 2 ** 30


def packed_step(name: str, m: int, device: torch.device, g: torch.Generator, seed: int
                ) -> Callable[[], None]:
    """A packed step of ``m`` members of ``name`` as :mod:`torchcal.train.packed` trains them."""
    models, opts = [], []
    for i in range(m):
        torch.manual_seed(seed + i)
        models.append(create_model(name, NUM_CLASSES).to(device))
        opts.append(torch.optim.SGD(models[-1].parameters(), lr=0.1, momentum=0.9,
                                    weight_decay=5e-4))
    pack = PackedModel(models, opts)
    losses = [make_loss("ce").to(device) for _ in range(m)]
    x = torch.randn(m, BATCH, *INPUTS[name], generator=g).to(device)
    y = torch.randint(0, NUM_CLASSES, (m, BATCH), generator=g).to(device)

    def step() -> None:
        logits = pack.forward(x).float()
        pack.step(torch.stack([f(logits[i], y[i]) for i, f in enumerate(losses)]), logits, y, 2.0)

    return step


def bench_gflops(name: str, sizes: list[int], args: argparse.Namespace, g: torch.Generator,
                 device: torch.device) -> None:
    torch.manual_seed(args.seed)
    model = create_model(name, NUM_CLASSES).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(BATCH, *INPUTS[name], generator=g).to(device)
    y = torch.randint(0, NUM_CLASSES, (BATCH,), generator=g).to(device)
    ce = make_loss("ce").to(device)
    flops = step_flops(model, ce, x, y)
    per_member = saved_bytes(model, ce, x, y) + 6 * sum(p.numel() * 4 for p in model.parameters())
    budget = free_bytes(device) // 2
    base = make_step(model, opt, ModelLoss(model, ce), x, y)
    t1 = statistics.median(_block(base, max(1, int(0.2 / _block(base, 1)))) for _ in range(3))
    print(f"\n{name}, batch {BATCH}: {flops / BATCH / 1e6:.3f} MFLOP per sample (forward + "
          f"backward), {per_member / 2 ** 20:.0f} MiB per member (saved activations + weights, "
          f"gradients, momentum); {budget / 2 ** 30:.1f} GiB = half the free memory")
    print(f"{'':<12}{'M':>5}{'ms/step':>10}{'ms/member':>11}{'GFLOP/s':>9}{'matmul':>8}"
          f"{'% matmul':>9}{'x sep':>7}")
    mm = matmul_rate(device, seconds=0.2)
    print(f"{'separate':<12}{1:>5}{1e3 * t1:>10.2f}{1e3 * t1:>11.2f}{flops / t1 / 1e9:>9.1f}"
          f"{mm:>8.1f}{100 * flops / t1 / 1e9 / mm:>9.0f}{1.0:>7.2f}", flush=True)
    for m in sizes:
        if m * per_member > budget:
            print(f"{'packed':<12}{m:>5}  does not fit ({m * per_member / 2 ** 30:.1f} GiB)")
            continue
        step = packed_step(name, m, device, g, args.seed)
        mm = matmul_rate(device, seconds=0.2)
        r, _, tm, tb = ratio(step, base, args.repeats)
        rate = m * flops / (tm / 1e3) / 1e9
        print(f"{'packed':<12}{m:>5}{tm:>10.2f}{tm / m:>11.2f}{rate:>9.1f}{mm:>8.1f}"
              f"{100 * rate / mm:>9.0f}{m / r:>7.2f}", flush=True)
        del step
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _pack_sizes(text: str) -> tuple[str, list[int]]:
    name, _, sizes = text.partition("=")
    try:
        ms = [int(t) for t in sizes.split(",") if t]
    except ValueError:
        ms = []
    if name not in INPUTS or not ms or min(ms) < 1:
        raise argparse.ArgumentTypeError(f"expected MODEL=M1,M2,... with MODEL among "
                                         f"{', '.join(INPUTS)}, got {text!r}")
    return name, ms


PACK_SIZES = {"mnist1d_cnn": [1, 5, 14, 70], "resnet20": [1, 2, 4]}


def _gflops_table(args: argparse.Namespace, g: torch.Generator) -> None:
    device = torch.device(args.device)
    sizes = dict(PACK_SIZES)
    sizes.update(dict(args.pack_sizes or []))
    print(f"\nThe step against the limit ({device}, {torch.get_num_threads()} thread(s)): "
          f"1024x1024 float32 matmul {matmul_rate(device):.1f} GFLOP/s", flush=True)
    for name in args.models:
        bench_gflops(name, sizes[name], args, g, device)
    print(f"matmul again after the table: {matmul_rate(device):.1f} GFLOP/s")


def _names(valid: list[str], what: str) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [t for t in text.split(",") if t]
        bad = [t for t in names if t not in valid]
        if not names or bad:
            raise argparse.ArgumentTypeError(
                f"expected {what} among {', '.join(valid)}, got {text!r}")
        return names

    return parse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", type=_names(list(INPUTS), "models"), default=list(INPUTS))
    ap.add_argument("--losses", type=_names(list_losses(), "losses"), default=list_losses(),
                    help="comma-separated registry names (default: all)")
    ap.add_argument("--no-compile", action="store_true", help="eager timings only")
    ap.add_argument("--no-eager", action="store_true", help="compiled timings only")
    ap.add_argument("--no-gflops", action="store_true", help="skip the GFLOP/s table")
    ap.add_argument("--gflops-only", action="store_true", help="only the GFLOP/s table")
    ap.add_argument("--pack-sizes", type=_pack_sizes, action="append",
                    help="MODEL=M1,M2,...: packed sizes of the GFLOP/s table (default "
                         + "; ".join(f"{k}={','.join(map(str, v))}"
                                     for k, v in PACK_SIZES.items()) + ")")
    ap.add_argument("--device", default="cpu", help="device of the GFLOP/s table")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch._logging.set_logs(dynamo=logging.ERROR)  # graph-break warnings: we print our own line
    g = torch.Generator().manual_seed(args.seed)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.repeats} repeats, float32 "
          "CPU; a step = zero_grad + forward + loss (published reduction) + backward + clip 2 + "
          "SGD; ratio = median of time(step) / time(step with nn.CrossEntropyLoss), alternating")
    if not args.gflops_only:
        for name in args.models:
            bench_model(name, args.losses, args, g)
    if not args.no_gflops:
        _gflops_table(args, g)


if __name__ == "__main__":
    main()

"""Every registry loss under ``torch.compile(fullgraph=True)``: inductor on the CPU gives the
eager values and gradients (float32, 1e-6 relative); stateful losses (AdaFocal's per-bin γ,
the scheduled γ of FLSc) are compiled once per shape, not once per epoch; target checks work
inside a compiled region; and (on a GPU only) the losses capture into a CUDA graph.

Compiling is slow on a CPU, so the inductor check compiles every loss **in one graph**, in one
test; only if that shared compile fails does it compile each loss alone, to name the culprits.
(The inductor cache makes later runs fast; a cold compile of the graph takes about a minute of
CPU.)  The recompile counters use ``CompileCounter`` (Dynamo's capture alone, no inductor),
which is fast.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch._inductor.compile_fx import compile_fx

from torchcal.losses import AdaFocalLoss, ScheduledFocalLoss, create_loss, list_losses

NAMES = list_losses()
N, C = 24, 7


def _data(seed: int = 0, n: int = N, c: int = C, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    x = 3.0 * torch.randn(n, c, generator=g)
    y = torch.randint(0, c, (n,), generator=g)
    y[[2, 11]] = -100  # ignored entries, so the masked path is compiled too
    return x.to(device), y.to(device)


def _make(name: str, **kwargs):
    loss = create_loss(name, **kwargs)
    if isinstance(loss, AdaFocalLoss):  # equal-mass edges and γ of both signs, 0 < |γ| < 1 too
        g = torch.Generator().manual_seed(5)
        loss.update(logits=3 * torch.randn(300, C, generator=g),
                    labels=torch.randint(0, C, (300,), generator=g))
        with torch.no_grad():
            loss.gammas.copy_(torch.linspace(-2.0, 4.0, loss.n_bins, dtype=torch.float64))
    return loss


class CountingInductor:
    """The inductor backend, counting the graphs it compiles (and Dynamo's restarts)."""

    def __init__(self) -> None:
        self.graphs = 0
        self.calls = 0

    def __call__(self, gm, example_inputs):
        self.calls += 1
        compiled = compile_fx(gm, example_inputs)
        self.graphs += 1
        return compiled


def _value_and_grad(fn, x, y):
    xr = x.clone().requires_grad_(True)
    out = fn(xr, y)
    out.backward()
    return out.detach(), xr.grad


def _eager_and_compiled(names, backend):
    """{name: ((eager value, grad), (compiled value, grad))}, compiled together in one graph."""
    x, y = _data()
    losses = {name: _make(name) for name in names}

    def step(xs, target):
        return [losses[name](xi, target) for name, xi in zip(names, xs, strict=True)]

    xs = [x.clone().requires_grad_(True) for _ in names]
    outs = torch.compile(step, backend=backend, fullgraph=True, dynamic=False)(xs, y)
    torch.stack(outs).sum().backward()
    return {name: (_value_and_grad(losses[name], x, y), (out.detach(), xi.grad))
            for name, out, xi in zip(names, outs, xs, strict=True)}


def _assert_close(actual, expected):
    # 1e-6 relative; gradients relative to their largest entry (entries near 0 are sums of
    # terms of that size, so their own relative error is not meaningful)
    torch.testing.assert_close(actual, expected, rtol=1e-6,
                               atol=1e-6 * float(expected.abs().max()))


def _check_against_eager(result) -> None:
    (v_eager, g_eager), (v_comp, g_comp) = result
    assert torch.isfinite(v_eager) and torch.isfinite(g_eager).all()
    assert g_eager.abs().max() > 0 and torch.all(g_eager[[2, 11]] == 0)  # ignored rows
    _assert_close(v_comp, v_eager)
    _assert_close(g_comp, g_eager)


def test_fullgraph_inductor_matches_eager_for_every_registry_loss():
    # One test (not one per loss) so that pytest-xdist runs the one shared compile once.
    backend = CountingInductor()
    try:
        results = _eager_and_compiled(NAMES, backend)
    except Exception:  # noqa: BLE001 - compile each loss alone to name the ones that fail
        results = None
    failed: dict[str, str] = {}
    for name in NAMES:
        try:
            _check_against_eager(results[name] if results is not None else
                                 _eager_and_compiled([name], CountingInductor())[name])
        except Exception as e:  # noqa: BLE001 - report every failing loss by name
            failed[name] = f"{type(e).__name__}: {e}"
    assert not failed, failed
    assert (backend.graphs, backend.calls) == (1, 1), (
        "expected one graph for all losses (no graph break, no recompile, no restart)")


# ------------------------------------------------------------------ recompiles
def test_adafocal_state_changes_do_not_recompile():
    torch._dynamo.reset()
    counter = CompileCounter()
    loss = _make("adafocal")
    compiled = torch.compile(loss, backend=counter, fullgraph=True, dynamic=False)
    g = torch.Generator().manual_seed(1)
    for epoch in range(4):
        x, y = _data(seed=epoch)
        torch.testing.assert_close(compiled(x, y), loss(x, y), rtol=1e-6, atol=0)
        # the per-bin γ and the edges move at every update (the trainer's on_validation)
        loss.update(logits=3 * torch.randn(200, C, generator=g),
                    labels=torch.randint(0, C, (200,), generator=g))
    assert len(loss.history) == 5 and counter.frame_count == 1
    # a new shape compiles once more, and only once
    for seed in (7, 8):
        x, y = _data(seed=seed, n=2 * N)
        torch.testing.assert_close(compiled(x, y), loss(x, y), rtol=1e-6, atol=0)
    assert counter.frame_count == 2


def test_scheduled_gamma_is_tensor_state_one_compile_per_shape():
    torch._dynamo.reset()
    counter = CompileCounter()
    loss = ScheduledFocalLoss(milestones=(2, 4), gammas=(5.0, 3.0, 0.5))
    compiled = torch.compile(loss, backend=counter, fullgraph=True, dynamic=False)
    x, y = _data()
    seen = set()
    for epoch in range(6):
        loss.set_epoch(epoch)
        seen.add(loss.gamma)
        # the compiled graph reads the epoch's γ (it is not a constant baked into the graph)
        torch.testing.assert_close(compiled(x, y), loss(x, y), rtol=1e-6, atol=0)
    assert seen == {5.0, 3.0, 0.5} and counter.frame_count == 1
    # resuming (extra state) moves the tensor state too
    fresh = ScheduledFocalLoss(milestones=(2, 4), gammas=(5.0, 3.0, 0.5))
    fresh.load_state_dict(loss.state_dict())
    assert fresh.gamma_tensor.item() == 0.5
    x2, y2 = _data(seed=3, n=2 * N)
    compiled(x2, y2)
    assert counter.frame_count == 2


# ------------------------------------------------------------------ checks inside a compiled region
def test_bad_target_inside_compiled_region_fails():
    torch._dynamo.reset()
    x, y = _data()
    y[0] = C  # out of range
    for name in ("focal", "brier", "dual_focal"):
        compiled = torch.compile(create_loss(name), backend="aot_eager", fullgraph=True)
        with pytest.raises(RuntimeError, match="target"):
            compiled(x, y)
        # eager keeps its precise message
        with pytest.raises(ValueError, match=r"Expected `target` values in \[0, 6\].*got 7"):
            create_loss(name)(x, y)


def test_validate_args_false_compiles_without_the_check():
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    loss = create_loss("focal", validate_args=False)
    assert "validate_args=False" in repr(loss)
    x, y = _data()
    torch.testing.assert_close(torch.compile(loss, backend=counter, fullgraph=True)(x, y),
                               create_loss("focal")(x, y), rtol=1e-6, atol=0)
    graph_ops = {str(node.target) for gm in counter.graphs for node in gm.graph.nodes}
    assert not any("assert" in op for op in graph_ops), graph_ops
    # with the default validate_args=True the compiled graph holds the async assertion
    counter = CompileCounterWithBackend("eager")
    torch.compile(create_loss("focal"), backend=counter, fullgraph=True)(x, y)
    assert any("_assert_async" in str(node.target)
               for gm in counter.graphs for node in gm.graph.nodes)


# ------------------------------------------------------------------ CUDA graphs
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="CUDA-graph safety needs a CUDA device; this machine has none (CPU "
                           "only), so the capture (no host sync, no data-dependent shape) "
                           "cannot be checked here")
def test_cuda_graph_capture_and_replay():
    failed = {}
    for name in NAMES:
        try:
            _check_cuda_graph(name)
        except Exception as e:  # noqa: BLE001 - report every loss that fails, by name
            failed[name] = e
    assert not failed, failed


def _check_cuda_graph(name):
    loss = _make(name).cuda()
    x, y = _data(device="cuda")
    x = x.clone().requires_grad_(True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up before capture, as torch.cuda.graphs requires
        for _ in range(3):
            x.grad = None
            loss(x, y).backward()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # any host sync raises inside a capture
        out = loss(x, y)
        out.backward()
    x2, y2 = _data(seed=9, device="cuda")
    with torch.no_grad():
        x.copy_(x2)
        y.copy_(y2)
    graph.replay()
    v, grad = _value_and_grad(loss, x2, y2)
    torch.testing.assert_close(out, v)
    torch.testing.assert_close(x.grad, grad)
    # inductor's own CUDA graphs ("reduce-overhead") take every loss without a skip
    counters.clear()
    compiled = torch.compile(loss, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        xr = x2.clone().requires_grad_(True)
        compiled(xr, y2).backward()
    assert counters["inductor"]["cudagraph_skips"] == 0

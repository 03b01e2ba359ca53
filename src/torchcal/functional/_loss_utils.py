"""Argument checking, log-probabilities and reduction shared by every loss.

The conventions are ``F.cross_entropy``'s: ``input`` of shape (N, C) or (N, C, d1, ...),
integer class-index ``target`` of shape (N,) or (N, d1, ...), ``reduction`` in
{"mean", "sum", "none"}, ``ignore_index`` (default -100) entries contribute 0 and are left out
of the mean's denominator (a mean over zero kept entries is NaN, as in PyTorch).
Computation happens in float32 (float64 stays float64), also for half/bfloat16 inputs and
under autocast.

Inside ``torch.compile`` (and on accelerators) the target checks need no host value: the
ignore mask is always built and an out-of-range target fails through ``torch._assert_async``;
the shape, dtype and ``reduction`` checks are plain Python on static metadata, evaluated once
when the graph is traced.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import no_autocast

try:
    from torch._C._functorch import maybe_current_level
except ImportError:  # pragma: no cover - torch without functorch's C API: never in place
    maybe_current_level = None

__all__ = ["scatter_fresh", "check_loss_args", "check_target_range", "target_log_probs", "reduce_loss", "flat_rows",
           "unflat_rows", "REDUCTIONS", "compute_dtype", "as_compute", "as_index", "sync_free"]

#: The values of every loss' ``reduction``: as ``F.cross_entropy``'s.
REDUCTIONS = ("mean", "sum", "none")


def check_loss_args(input: torch.Tensor, target: torch.Tensor, reduction: str) -> None:
    """Validate shapes, dtypes and ``reduction`` (ranges are checked in ``target_log_probs``)."""
    if not isinstance(input, torch.Tensor) or not input.is_floating_point():
        raise TypeError(
            "Expected `input` to be a floating-point tensor of logits, got "
            + (str(input.dtype) if isinstance(input, torch.Tensor) else type(input).__name__)
        )
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"Expected `target` to be a torch.Tensor, got {type(target).__name__}")
    if target.is_floating_point() or target.dtype == torch.bool or target.is_complex():
        raise TypeError(
            f"Expected `target` to hold integer class indices (torch.long), got {target.dtype}"
        )
    if input.ndim < 2:
        raise ValueError(
            f"Expected `input` of shape (N, C) or (N, C, d1, ...), got shape {tuple(input.shape)}"
        )
    expected = (input.shape[0],) + tuple(input.shape[2:])
    if tuple(target.shape) != expected:
        raise ValueError(
            f"Expected `target` of shape {expected} to match `input` {tuple(input.shape)}, "
            f"got {tuple(target.shape)}"
        )
    if reduction not in REDUCTIONS:
        raise ValueError(f"Expected `reduction` to be one of {REDUCTIONS}, got {reduction!r}")


def compute_dtype(input: torch.Tensor) -> torch.dtype:
    """The dtype a loss computes in: float64 for float64 ``input``, float32 otherwise."""
    return torch.float64 if input.dtype == torch.float64 else torch.float32


def as_compute(input: torch.Tensor) -> torch.Tensor:
    """``input`` in its computation dtype (float32; float64 stays), without a no-op call."""
    return input if input.dtype in (torch.float32, torch.float64) else input.float()


def as_index(target: torch.Tensor) -> torch.Tensor:
    """``target`` as int64 indices, without a no-op call."""
    return target if target.dtype == torch.int64 else target.long()


def target_log_probs(
    input: torch.Tensor, target: torch.Tensor, ignore_index: int = -100,
    *, validate_args: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Return ``(log_p, log_p_y, safe_target, valid)``.

    ``log_p`` is ``log_softmax`` over dim 1 in float32/float64 (shape of ``input``),
    ``log_p_y`` the true-class log-probability (shape of ``target``; 0 where ignored),
    ``safe_target`` the targets with ignored entries replaced by 0, and ``valid`` a boolean
    mask of kept entries (``None`` on the fast path, where no entry is ignored).
    Autocast is disabled inside so that the computation stays in full precision.

    Target checks.  In eager mode on the CPU they cost no extra op: ``gather`` (then
    ``nll_loss``, which skips ignored entries) checks the range itself, and only when it fails
    is the clear ``ValueError`` built.  On an accelerator or inside ``torch.compile`` the mask
    is always built and, with ``validate_args``, a bad target trips ``torch._assert_async``
    (no host sync, CUDA-graph safe).
    """
    c = input.shape[1]
    with no_autocast(input):
        log_p = torch.log_softmax(as_compute(input), dim=1)
    if sync_free(target):
        return _target_log_probs_async(log_p, target, ignore_index, validate_args)
    if not 0 <= ignore_index < c:
        # Fast path, no extra op: on the CPU ``gather`` checks every index itself, so when it
        # succeeds all targets are in [0, C): nothing is ignored and nothing is out of range.
        # Otherwise (ignored entries or a bad target) the careful path below finds which.
        try:
            log_p_y = log_p.gather(1, as_index(target).unsqueeze(1)).squeeze(1)
        except RuntimeError:
            pass
        else:
            return log_p, log_p_y, target, None
    # Ignored entries (or a bad target): ``nll_loss`` reads log p_y with 0 at ignored entries
    # and checks the others' range itself, in one op.
    try:
        log_p_y = F.nll_loss(log_p, as_index(target), reduction="none",
                             ignore_index=ignore_index).neg()
    except (RuntimeError, IndexError) as e:
        error = e
    else:
        error = None
    if error is not None:
        check_target_range(target, c, ignore_index)  # the clear error (outside the except)
        raise error
    valid = target != ignore_index
    return log_p, log_p_y, torch.where(valid, target, 0), valid


def check_target_range(target: torch.Tensor, c: int, ignore_index: int) -> None:
    """Raise ``ValueError`` naming the first target outside [0, C) that is not ``ignore_index``
    (one host sync; eager mode)."""
    bad = ((target < 0) | (target >= c)) & (target != ignore_index)
    if target.numel() and bool(bad.any()):
        raise ValueError(
            f"Expected `target` values in [0, {c - 1}] (or ignore_index={ignore_index}), "
            f"got {int(target[bad][0])}"
        )


def sync_free(target: torch.Tensor) -> bool:
    """On an accelerator the target checks must not wait for the device (no host sync per
    training step), and inside ``torch.compile`` they must not read host values (no graph break,
    no data-dependent guard); in eager mode on the CPU a sync is free and gives a precise error
    message."""
    return target.device.type != "cpu" or torch.compiler.is_compiling()


def flat_rows(t: torch.Tensor) -> torch.Tensor:
    """(N, C, d1, ...) -> (M, C) rows (no copy for 2-D input)."""
    if t.ndim == 2:
        return t
    return t.movedim(1, -1).reshape(-1, t.shape[1])


def unflat_rows(rows: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Inverse of :func:`flat_rows`: (M, C) rows back to the layout ``shape`` = (N, C, d1, ...)."""
    if len(shape) == 2:
        return rows
    return rows.reshape((shape[0],) + tuple(shape[2:]) + (shape[1],)).movedim(-1, 1)


def _target_log_probs_async(log_p, target, ignore_index, validate_args):
    """:func:`target_log_probs` without a host sync: the ignore mask is always built and an
    out-of-range target fails through ``torch._assert_async`` (a device-side assertion, reported
    by the next synchronising call, as ``F.cross_entropy`` does on CUDA)."""
    c = log_p.shape[1]
    ignored = target == ignore_index
    if validate_args:
        bad = ((target < 0) | (target >= c)) & ~ignored
        # under torch.compile the message must not format C: that would specialise the graph
        # on the number of classes (one recompilation per shape, up to Dynamo's limit)
        msg = ("Expected `target` values in [0, C - 1] for C classes (or ignore_index="
               f"{ignore_index})" if torch.compiler.is_compiling() else
               f"Expected `target` values in [0, {c - 1}] (or ignore_index={ignore_index})")
        try:
            torch._assert_async(~bad.any(), msg)
        except TypeError:  # torch without the message overload
            torch._assert_async(~bad.any())
    valid = ~ignored
    safe_target = torch.where(valid, target, torch.zeros_like(target))
    log_p_y = log_p.gather(1, as_index(safe_target).unsqueeze(1)).squeeze(1)
    log_p_y = torch.where(valid, log_p_y, torch.zeros_like(log_p_y))
    return log_p, log_p_y, safe_target, valid


def scatter_fresh(t: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor
                  ) -> torch.Tensor:
    """``t.scatter(dim, index, src)`` for a fresh ``t`` that nothing else reads and that no
    autograd graph holds (an ``exp`` inside an ``autograd.Function``'s forward or under
    ``no_grad``): in place in plain eager mode (the same values without an (N, C) copy); out of
    place inside any ``torch.func`` transform (``vmap``, the packed path: ``scatter_`` has no
    batching rule and would fall back to a per-lane loop; ``grad``, whose wrappers may track
    the tensor) and under ``torch.compile`` (whose kernels fuse the copy anyway, and whose
    tracing of a Function's forward may record it).

    Example:
        >>> scatter_fresh(torch.zeros(1, 3), 1, torch.tensor([[2]]), torch.ones(1, 1))
        tensor([[0., 0., 1.]])
    """
    if (torch.compiler.is_compiling() or maybe_current_level is None or t.requires_grad
            or maybe_current_level() is not None):
        return t.scatter(dim, index, src)
    return t.scatter_(dim, index, src)


def reduce_loss(loss: torch.Tensor, valid: torch.Tensor | None, reduction: str) -> torch.Tensor:
    """Zero ignored entries and reduce like ``F.cross_entropy`` (mean over kept entries)."""
    if valid is not None:
        loss = torch.where(valid, loss, torch.zeros_like(loss))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if valid is None:
        return loss.mean()
    return loss.sum() / valid.sum()

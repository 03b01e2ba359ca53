"""The single home of bin edges, bin assignment and the per-bin sums every binned metric is
computed from (float64 ``bincount`` / ``index_add_`` sums, so that the functional metrics, the
bootstrap, the streaming meter and the losses add up exactly the same numbers).

Equal-width bins (ECE, MCE, RMSCE, Classwise-ECE, reliability diagrams)
    Edges are ``k/B`` computed in the values' own dtype
    (``torch.arange(B + 1, dtype=x.dtype) / B``, evaluated on the CPU so that every device
    gets the same edges).  Bins are right-closed ``(e_k, e_{k+1}]``
    and the first bin also holds 0, so bin index = ``#{k in 1..B-1 : e_k < x}``: a value of
    exactly 0 is in bin 0, exactly 1.0 is in bin B-1, and a value equal to an interior edge
    ``e_k`` is in bin k-1.  The same holds in float16, bfloat16, float32 and float64.
    Every value is in some bin: exact-zero probabilities (masked classes, a saturated softmax;
    they matter for Classwise-ECE) are counted in the first bin, where code that uses
    ``lower < x <= upper`` for every bin, such as the focal-loss calibration code, drops them.

Equal-mass bins (AdaECE, AdaFocal)
    Sort the values ``s_0 <= ... <= s_{N-1}``; interior edges are
    ``e_k = s_{max(floor(kN/B) - 1, 0)}`` for k = 1..B-1, and a value x goes to bin
    ``#{k : e_k < x}`` (right-closed).  Every sample lands in exactly one bin, tied values
    stay together, and the result does not depend on sample order.  Without ties (and N >= B) bin k holds
    ``floor((k+1)N/B) - floor(kN/B)`` samples.

Comparisons are made after an exact up-cast of values and edges to float32 (or float64), so
half-precision inputs follow their own-dtype edges exactly.
"""

from __future__ import annotations

import functools

import torch

from .._validation import check_positive_int

__all__ = [
    "equal_width_edges",
    "equal_mass_edges",
    "bin_index",
    "equal_width_bin_index",
    "equal_mass_bin_index",
    "binned_sums",
    "calibration_from_sums",
    "classwise_sums",
]


def _cmp_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def equal_width_edges(
    n_bins: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """Return the ``B + 1`` equal-width edges ``k/B`` computed in ``dtype``.

    The division runs on the CPU and the edges are then moved to ``device``: CUDA's
    ``tensor / scalar`` multiplies by the rounded reciprocal ``1/B`` instead, which moves some
    edges by one ulp (6 of the 14 interior float32 edges for B = 15, e.g. ``7/15``), so a
    confidence equal to ``k/B`` would change bins between devices.

    >>> equal_width_edges(4)
    tensor([0.0000, 0.2500, 0.5000, 0.7500, 1.0000])
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    if device is None or torch.device(device).type == "cpu":
        return torch.arange(n_bins + 1, dtype=dtype) / n_bins
    # on an accelerator: copied once per (B, dtype, device) and kept, so that binning inside a
    # training step never waits for a host-to-device copy (a read-only table: callers only
    # compare with it)
    return _device_edges(n_bins, dtype, torch.device(device))


@functools.lru_cache(maxsize=64)
def _device_edges(n_bins: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return (torch.arange(n_bins + 1, dtype=dtype) / n_bins).to(device)


def bin_index(
    values: torch.Tensor, interior_edges: torch.Tensor, *, right_closed: bool = True,
    out_int32: bool = False,
) -> torch.Tensor:
    """Assign each value to a bin given the ``B - 1`` sorted interior edges.

    ``right_closed=True`` (the metrics' convention): index = ``#{k : e_k < x}``, bins
    ``(e_k, e_{k+1}]``.  ``right_closed=False`` (AdaFocal's training-sample lookup):
    index = ``#{k : e_k <= x}``, bins ``[e_k, e_{k+1})``.  Values below the first edge go to
    bin 0 and values above the last to bin B-1 either way.  Returns int64, same shape as
    ``values``.  ``interior_edges`` may also be batched, shape (..., B-1) for values of shape
    (..., M) with the same leading dimensions (one set of edges per row).

    >>> bin_index(torch.tensor([0.0, 0.5, 0.6, 1.0]), torch.tensor([0.5]))
    tensor([0, 0, 1, 1])
    >>> bin_index(torch.tensor([0.0, 0.5, 0.6, 1.0]), torch.tensor([0.5]), right_closed=False)
    tensor([0, 1, 1, 1])
    """
    # compare in the wider of the two dtypes (at least float32): exact for float32 values
    # against float64 edges (AdaFocal's state) as well as for own-dtype edges
    cd = torch.promote_types(_cmp_dtype(values.dtype), _cmp_dtype(interior_edges.dtype))
    # a copy in contiguous memory: under vmap (packed losses) ``.contiguous()`` of a slice of
    # stacked edges is contiguous only logically and searchsorted warns about (and copies) it
    edges = interior_edges.to(device=values.device, dtype=cd).clone(
        memory_format=torch.contiguous_format)
    if edges.ndim > 1:
        # Batched edges (..., B-1) for values (..., M) with the same leading dimensions.
        return torch.searchsorted(edges, values.to(cd).contiguous(), right=not right_closed,
                                  out_int32=out_int32)
    return torch.bucketize(values.to(cd), edges, right=not right_closed, out_int32=out_int32)


def equal_width_bin_index(
    values: torch.Tensor, n_bins: int, *, out_int32: bool = False
) -> torch.Tensor:
    """Equal-width bin index of each value in [0, 1] (see the module docstring).

    Values below 0 go to the first bin and values above 1 to the last (as :func:`bin_index`).
    A 1-D input (top-label confidences) with ``B * eps(dtype) <= 1/4`` (float16: B <= 256,
    bfloat16: B <= 32) is binned arithmetically: ``trunc(x * B)`` is within one bin of the
    answer (each edge is within a relative ``eps`` of ``k/B``, i.e. within a quarter bin), and
    one comparison with each neighbouring edge of the own-dtype table makes it exact - the
    same indices as the binary search (tested exhaustively in float16 and bfloat16), about
    2-10x faster on the CPU for spread-out values.

    >>> equal_width_bin_index(torch.tensor([0.0, 0.25, 0.2501, 1.0]), 4)
    tensor([0, 0, 1, 3])
    """
    edges = equal_width_edges(n_bins, dtype=values.dtype, device=values.device)
    if (values.ndim == 1 and values.is_floating_point()
            and n_bins * torch.finfo(values.dtype).eps <= 0.25):
        return _equal_width_arithmetic(values, edges, out_int32)
    return bin_index(values, edges[1:-1], out_int32=out_int32)


def _equal_width_arithmetic(values: torch.Tensor, edges: torch.Tensor, out_int32: bool
                            ) -> torch.Tensor:
    """``#{k in 1..B-1 : e_k < x}`` from ``trunc(x B)`` corrected against the edge table.

    With ``j`` the true bin, ``e_j = j/B (1 + d)`` and ``|d| <= eps``, ``j B eps <= 1/4`` keeps
    ``fl(x B)`` in ``(j - 1/4, j + 2)``, so the guess ``g`` is j-1, j or j+1; ``x > e_{g+1}``
    adds one and ``x <= e_g`` takes one away (never both: the edges are sorted).  Comparisons
    are exact in the (wider) comparison dtype.
    """
    n_bins = edges.shape[0] - 1
    cd = _cmp_dtype(values.dtype)
    e = edges.to(cd)
    # lower / upper edge of bin g; NaN (every comparison false) where there is none: bin 0
    # also holds 0 and below, the last bin 1 and above
    nan = e.new_full((1,), float("nan"))
    lower = torch.cat([nan, e[1:-1]])
    upper = torch.cat([e[1:-1], nan])
    x = values.to(cd)
    # clamp before the integer conversion so that out-of-range and infinite values stay
    # defined, and NaN goes to the last bin as in the binary search; float -> int64 is a
    # vectorised conversion on the CPU (float -> int32 is not)
    g = (torch.mul(x, n_bins).nan_to_num_(nan=float(n_bins - 1)).clamp_(0, n_bins - 1)
         .long())
    up = torch.gt(x, upper.index_select(0, g))
    down = torch.le(x, lower.index_select(0, g))
    g.add_(up).sub_(down.long())
    return g.int() if out_int32 else g


def equal_mass_edges(values: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Interior equal-mass edges (``B - 1`` values) of a 1-D tensor of values.

    ``e_k = s_{max(floor(kN/B) - 1, 0)}`` with ``s`` the sorted values.  A 2-D input (R, N)
    gives one set of edges per row, shape (R, B-1) (used by the bootstrap).

    >>> equal_mass_edges(torch.tensor([0.9, 0.1, 0.3, 0.7]), 2)
    tensor([0.3000])
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    if values.ndim == 0 or values.shape[-1] == 0:
        raise ValueError(
            f"Expected `values` to be a non-empty 1-D tensor, got shape {tuple(values.shape)}"
        )
    n = values.shape[-1]
    s = torch.sort(values, dim=-1).values
    k = torch.arange(1, n_bins, device=values.device)
    pos = torch.clamp(torch.div(k * n, n_bins, rounding_mode="floor") - 1, min=0)
    return s[..., pos]


def equal_mass_bin_index(values: torch.Tensor, n_bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Equal-mass bin index of each value; returns ``(index, interior_edges)``.

    >>> idx, e = equal_mass_bin_index(torch.tensor([0.9, 0.1, 0.3, 0.7]), 2)
    >>> idx
    tensor([1, 0, 0, 1])
    """
    edges = equal_mass_edges(values, n_bins)
    return bin_index(values, edges), edges


# Number of (row, class) elements handled per chunk by the classwise sums: bounds the
# temporary int64 / float64 buffers to ~32 MiB each whatever N and C are.
_CHUNK_ELEMENTS = 1 << 22

def binned_sums(
    idx: torch.Tensor, conf: torch.Tensor, correct: torch.Tensor, n_bins: int
) -> torch.Tensor:
    """Per-bin (count, confidence sum, correct count) as a float64 tensor of shape (3, B).

    On CPU two ``bincount`` s (3x faster than ``index_add_`` for a million samples); on other
    devices one ``index_add_``, which needs no host synchronisation (CUDA's ``bincount`` reads
    the largest index back to the host), so the trainer can call it every batch.  Both give the
    same sums (sequential float64 accumulation on CPU).  Inside ``torch.compile`` it is the
    ``index_add_`` (``bincount``'s output shape depends on the data: a graph break).
    """
    if conf.device.type == "cpu" and not torch.compiler.is_compiling():
        return _binned_sums_bincount(idx, conf, correct, n_bins)
    return _binned_sums_index_add(idx, conf, correct, n_bins)


def _binned_sums_bincount(idx: torch.Tensor, conf: torch.Tensor, correct: torch.Tensor,
                          n_bins: int) -> torch.Tensor:
    """:func:`binned_sums` by ``bincount``: counts and correct counts from one integer bincount
    over (bin, correct) pairs, the confidence sums from a weighted one."""
    both = torch.bincount(idx * 2 + correct, minlength=2 * n_bins).view(n_bins, 2)
    conf_sum = torch.bincount(idx, weights=conf.to(torch.float64), minlength=n_bins)
    return torch.stack([both.sum(dim=1).to(torch.float64), conf_sum, both[:, 1].to(torch.float64)])


def _binned_sums_index_add(idx: torch.Tensor, conf: torch.Tensor, correct: torch.Tensor,
                           n_bins: int) -> torch.Tensor:
    """:func:`binned_sums` by one ``index_add_`` (no host synchronisation on CUDA)."""
    conf = conf.to(torch.float64)
    rows = torch.stack([torch.ones_like(conf), conf, correct.to(torch.float64)])
    sums = torch.zeros(3, n_bins, dtype=torch.float64, device=conf.device)
    return sums.index_add_(1, idx.long(), rows)


def calibration_from_sums(sums: torch.Tensor, norm: str) -> torch.Tensor:
    """ECE ("l1"), MCE ("max"), RMSCE ("l2") or ACE ("mean") in float64 from per-bin sums.

    ``sums`` has shape (3, ..., B): per-bin count, confidence sum and correct count; the result
    has the middle shape (0-d for (3, B); (R,) for a batch of R bootstrap resamples).
    ``(n_b/N)|acc_b - conf_b| = |A_b - S_b|/N`` with ``A_b``/``S_b`` the per-bin sums, so ECE is
    computed without dividing by the (possibly zero) counts.  Empty bins contribute 0 to every
    norm (their gap is defined as 0 and gaps are >= 0, so the max is over non-empty bins);
    "mean" is the unweighted mean gap over the non-empty bins.
    """
    counts, conf_sum, acc_sum = sums[0], sums[1], sums[2]
    n = counts.sum(dim=-1)
    diff = (acc_sum - conf_sum).abs()
    if norm == "l1":
        return diff.sum(dim=-1) / n
    gap = diff / counts.clamp(min=1)
    if norm == "max":
        return gap.amax(dim=-1)
    if norm == "l2":
        return torch.sqrt((counts * gap * gap).sum(dim=-1) / n)
    if norm == "mean":
        return gap.sum(dim=-1) / (counts > 0).sum(dim=-1)
    raise ValueError(f"Expected `norm` to be one of 'l1', 'max', 'l2', 'mean', got {norm!r}")


def classwise_sums(p: torch.Tensor, y: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Per (class, bin) sums of ``p_ik - [y_i = k]`` in float64, shape (C * B,).

    Cell ``k * B + b`` holds ``sum_{i : bin(p_ik) = b} (p_ik - [y_i = k])``.  The indicator of the
    true class lands in the same cell as ``p_{i, y_i}``, so one float64 ``index_add_`` over the
    flattened (N * C) (class, bin) keys does everything; rows are processed in chunks to bound
    memory.
    """
    n, c = p.shape
    out = torch.zeros(c * n_bins, dtype=torch.float64, device=p.device)
    # int32 keys: half the memory traffic of int64 (C * B is far below 2**31)
    offsets = torch.arange(c, device=p.device, dtype=torch.int32) * n_bins
    rows = max(1, _CHUNK_ELEMENTS // c)
    for start in range(0, n, rows):
        pc = p[start : start + rows]
        yc = y[start : start + rows]
        key = equal_width_bin_index(pc, n_bins, out_int32=True)
        key += offsets
        w = pc.to(torch.float64, copy=True)
        w[torch.arange(pc.shape[0], device=p.device), yc] -= 1.0
        out.index_add_(0, key.view(-1), w.view(-1))
    return out

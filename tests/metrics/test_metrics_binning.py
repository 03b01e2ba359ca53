"""binning.py: the one home of bin conventions (equal-width and equal-mass, batched edges)."""

import os
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchcal.metrics import binning as B

sys.path.insert(0, os.path.dirname(__file__))
import metrics_reference as ref  # noqa: E402


def test_equal_width_edges_in_dtype():
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        e = B.equal_width_edges(15, dtype=dtype)
        assert e.dtype == dtype and e.shape == (16,)
        assert e[0].item() == 0.0 and e[-1].item() == 1.0
        assert torch.equal(e, torch.arange(16, dtype=dtype) / 15)
    with pytest.raises(ValueError, match="`n_bins` to be a positive integer, got 0"):
        B.equal_width_edges(0)


def test_edges_are_the_correctly_rounded_quotients():
    # float32 / float64 edges are k/B rounded once (IEEE division of exact operands), not
    # k * (1/B): the product with a rounded reciprocal (what CUDA computes for a tensor divided
    # by a Python scalar) differs for 6 of B = 15's interior float32 edges
    import numpy as np

    for b in (10, 15, 20, 100):
        e32 = B.equal_width_edges(b, dtype=torch.float32)
        assert e32.tolist() == [float(np.float32(k) / np.float32(b)) for k in range(b + 1)]
        e64 = B.equal_width_edges(b, dtype=torch.float64)
        assert e64.tolist() == [k / b for k in range(b + 1)]
    recip = (torch.arange(16, dtype=torch.float32) * (torch.tensor(1.0) / 15))
    assert int((recip != B.equal_width_edges(15)).sum()) == 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_cuda_edges_and_bins_equal_cpu(dtype):
    e_cpu = B.equal_width_edges(15, dtype=dtype)
    assert torch.equal(B.equal_width_edges(15, dtype=dtype, device="cuda").cpu(), e_cpu)
    v = torch.cat([e_cpu, torch.rand(1000, dtype=torch.float64).to(dtype)])
    assert torch.equal(B.equal_width_bin_index(v.cuda(), 15).cpu(), B.equal_width_bin_index(v, 15))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_linspace_trap_is_avoided(dtype):
    # linspace edges differ from k/B in every dtype (e.g. 11/15 in float64); values computed
    # as k/B in the input dtype still land in bin k-1
    lin = torch.linspace(0, 1, 16, dtype=dtype)
    kb = torch.arange(16, dtype=dtype) / 15
    differ = (lin != kb).nonzero().flatten()
    assert differ.numel() > 0
    assert B.equal_width_bin_index(kb[differ], 15).tolist() == (differ - 1).tolist()


def _bisect_reference(values, n_bins):
    """The binary search over the own-dtype interior edges (torch.bucketize)."""
    edges = B.equal_width_edges(n_bins, dtype=values.dtype)
    return B.bin_index(values, edges[1:-1])


@pytest.mark.parametrize("dtype,bins", [
    (torch.float16, [1, 2, 3, 7, 10, 15, 16, 20, 100, 255, 256, 257, 1000, 5000]),
    (torch.bfloat16, [1, 2, 3, 7, 10, 15, 16, 31, 32, 33, 100, 500]),
])
def test_arithmetic_binning_exhaustive_in_half_precision(dtype, bins):
    # every finite value of the dtype (negatives and values above 1 included) plus +-inf and
    # NaN: the arithmetic 1-D path (and the binary-search fallback past 256 / 32 bins) gives
    # exactly the binary search's index (the arithmetic guess alone would be wrong for some
    # values at 5000 float16 / 500 bfloat16 bins, where several edges round to one value)
    every = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    for n_bins in bins:
        ref = _bisect_reference(every, n_bins)
        assert torch.equal(B.equal_width_bin_index(every, n_bins), ref), n_bins
        assert torch.equal(B.equal_width_bin_index(every, n_bins, out_int32=True), ref.int())
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0], dtype=dtype)
    assert B.equal_width_bin_index(special, 15).tolist() == [14, 0, 14, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_bins", [1, 2, 3, 7, 10, 15, 20, 100, 1000, 2**21, 2**21 + 1])
def test_arithmetic_binning_on_edges_and_neighbours(dtype, n_bins):
    # every edge k/B and its two floating-point neighbours, random values, and out-of-range,
    # infinite and NaN values: the same index as the binary search (2**21 is the largest
    # float32 bin count of the arithmetic path, 2**21 + 1 falls back)
    g = torch.Generator().manual_seed(n_bins)
    e = B.equal_width_edges(n_bins, dtype=dtype)
    if n_bins > 5000:
        e = e[torch.randint(0, n_bins + 1, (5000,), generator=g)]
    v = torch.cat([
        torch.rand(5000, generator=g, dtype=torch.float64).to(dtype), e,
        torch.nextafter(e, torch.full_like(e, 2.0)), torch.nextafter(e, torch.full_like(e, -1.0)),
        torch.tensor([-1.0, -0.0, 2.0, 1e30, -1e30, float("inf"), float("-inf"), float("nan")],
                     dtype=dtype),
    ])
    assert torch.equal(B.equal_width_bin_index(v, n_bins), _bisect_reference(v, n_bins))


def test_single_bin_and_extremes():
    v = torch.tensor([0.0, 1e-30, 0.5, 1.0])
    assert B.equal_width_bin_index(v, 1).tolist() == [0, 0, 0, 0]
    assert B.equal_width_bin_index(v, 4).tolist() == [0, 0, 1, 3]


def test_bin_index_right_open_for_adafocal():
    e = torch.tensor([0.2, 0.5])
    v = torch.tensor([0.0, 0.2, 0.3, 0.5, 0.9, 1.0])
    assert B.bin_index(v, e).tolist() == [0, 0, 1, 1, 2, 2]
    assert B.bin_index(v, e, right_closed=False).tolist() == [0, 1, 1, 2, 2, 2]


def test_equal_mass_reference_and_ties():
    v = torch.tensor([0.3, 0.3, 0.3, 0.3, 0.9, 0.1, 0.5, 0.5], dtype=torch.float64)
    idx, edges = B.equal_mass_bin_index(v, 4)
    interior = ref.equal_mass_interior(v.tolist(), 4)
    assert edges.tolist() == interior
    assert idx.tolist() == [ref.equal_mass_bin(x, interior) for x in v.tolist()]
    # ties together: all 0.3 in one bin
    assert len(set(idx[v == 0.3].tolist())) == 1
    with pytest.raises(ValueError, match="`values` to be a non-empty"):
        B.equal_mass_edges(torch.tensor([]), 3)


def test_batched_edges_equal_row_by_row():
    g = torch.Generator().manual_seed(0)
    v = torch.rand(6, 50, generator=g)
    v[:, :10] = 0.5  # ties
    edges = B.equal_mass_edges(v, 7)
    assert edges.shape == (6, 6)
    idx = B.bin_index(v, edges)
    for r in range(6):
        assert torch.equal(edges[r], B.equal_mass_edges(v[r], 7))
        assert torch.equal(idx[r], B.equal_mass_bin_index(v[r], 7)[0])
        assert torch.equal(B.bin_index(v[r], edges[r], right_closed=False),
                           B.bin_index(v, edges, right_closed=False)[r])


@settings(max_examples=50, deadline=None, database=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=80), st.integers(1, 16),
       st.integers(0, 1000))
def test_equal_mass_properties(raw, n_bins, seed):
    v = torch.tensor(raw, dtype=torch.float64) / 20
    idx, edges = B.equal_mass_bin_index(v, n_bins)
    n = v.shape[0]
    assert bool((idx >= 0).all()) and bool((idx < n_bins).all())
    # order independence
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    idx2, edges2 = B.equal_mass_bin_index(v[perm], n_bins)
    assert torch.equal(edges, edges2) and torch.equal(idx[perm], idx2)
    # equal values share a bin; bins are monotone in the value
    order = torch.argsort(v)
    assert bool((idx[order][1:] >= idx[order][:-1]).all())
    # without ties (and N >= B, else the clamp max(., 0) of the first edge index applies),
    # counts are floor((k+1)N/B) - floor(kN/B)
    if len(set(raw)) == n and n >= n_bins:
        counts = torch.bincount(idx, minlength=n_bins)
        assert counts.tolist() == [(k + 1) * n // n_bins - k * n // n_bins for k in range(n_bins)]

"""Batched random crop + flip and normalisation: correctness against a per-sample reference
written from the definition, determinism under a generator."""

from __future__ import annotations

import pytest
import torch

from torchcal.data.augment import normalize, random_crop_flip


def _reference(x, padding, gen):
    """Per-sample loop from the definition, drawing the same numbers in the same order."""
    n, c, h, w = x.shape
    dy = torch.randint(0, 2 * padding + 1, (n,), generator=gen)
    dx = torch.randint(0, 2 * padding + 1, (n,), generator=gen)
    f = torch.randint(0, 2, (n,), generator=gen)
    out = torch.empty_like(x)
    for i in range(n):
        p = torch.zeros((c, h + 2 * padding, w + 2 * padding), dtype=x.dtype)
        p[:, padding:padding + h, padding:padding + w] = x[i]
        crop = p[:, dy[i]:dy[i] + h, dx[i]:dx[i] + w]
        out[i] = crop.flip(-1) if f[i] else crop
    return out, dy, dx, f


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_matches_reference(dtype):
    x = torch.randint(1, 256, (64, 3, 8, 10)).to(dtype)
    got = random_crop_flip(x, 4, generator=torch.Generator().manual_seed(3))
    ref, dy, dx, f = _reference(x, 4, torch.Generator().manual_seed(3))
    assert got.dtype == dtype and got.shape == x.shape
    assert torch.equal(got, ref)
    assert f.any() and (~f.bool()).any() and dy.unique().numel() > 3  # both branches exercised


def test_crop_of_padded_image_and_flip_by_hand():
    x = torch.arange(1, 17, dtype=torch.uint8).reshape(1, 1, 4, 4)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        state = gen.get_state()
        y = random_crop_flip(x, 1, generator=gen)
        g2 = torch.Generator()
        g2.set_state(state)
        dy, dx, f = (torch.randint(0, 3, (1,), generator=g2).item(),
                     torch.randint(0, 3, (1,), generator=g2).item(),
                     torch.randint(0, 2, (1,), generator=g2).item())
        # Out-of-image pixels are zero; in-image pixels are shifted copies.
        shifted = torch.zeros(4, 4, dtype=torch.uint8)
        for r in range(4):
            for c in range(4):
                rr, cc = r + dy - 1, c + dx - 1
                if 0 <= rr < 4 and 0 <= cc < 4:
                    shifted[r, c] = x[0, 0, rr, cc]
        expected = shifted.flip(1) if f else shifted
        assert torch.equal(y[0, 0], expected)


def test_padding_zero_without_flip_is_identity_and_flip_only():
    x = torch.randn(5, 2, 4, 4)
    assert torch.equal(random_crop_flip(x, 0, flip=False), x)
    y = random_crop_flip(x, 0, generator=torch.Generator().manual_seed(1))
    for i in range(5):
        assert torch.equal(y[i], x[i]) or torch.equal(y[i], x[i].flip(-1))


def test_deterministic_under_generator_and_varies_otherwise():
    x = torch.randint(0, 256, (32, 3, 32, 32), dtype=torch.uint8)
    a = random_crop_flip(x, 4, generator=torch.Generator().manual_seed(7))
    b = random_crop_flip(x, 4, generator=torch.Generator().manual_seed(7))
    c = random_crop_flip(x, 4, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_bad_arguments():
    with pytest.raises(ValueError, match="`x`"):
        random_crop_flip(torch.zeros(3, 4, 4))
    with pytest.raises(ValueError, match="`padding`"):
        random_crop_flip(torch.zeros(1, 3, 4, 4), padding=-1)
    with pytest.raises(ValueError, match="`mean`"):
        normalize(torch.zeros(1, 3, 2, 2, dtype=torch.uint8), (0.5,), (0.5,))
    with pytest.raises(ValueError, match="`std`"):
        normalize(torch.zeros(1, 3, 2, 2, dtype=torch.uint8), (0.5,) * 3, (0.5, 0.0, 1.0))


def test_normalize_values():
    x = torch.randint(0, 256, (4, 3, 5, 5), dtype=torch.uint8)
    mean, std = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
    got = normalize(x, mean, std)
    ref = (x.double() / 255 - torch.tensor(mean, dtype=torch.float64).view(3, 1, 1)) / torch.tensor(
        std, dtype=torch.float64).view(3, 1, 1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(normalize(x.float() / 255, mean, std), got)

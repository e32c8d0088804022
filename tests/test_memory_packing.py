"""Bit packing of k-bit codes: round trips for every width and odd sizes, the layout
against numpy's little-endian packbits, Numba == torch reference path, bad input."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from torch_bridge.memory import pack_bits, packed_nbytes, unpack_bits
from torch_bridge.memory.packing import _pack_torch, _unpack_torch

SIZES = [0, 1, 2, 7, 8, 9, 15, 16, 17, 63, 1000, 1001, 4097]


def reference_stream(codes: np.ndarray, k: int) -> np.ndarray:
    """The documented layout: code i in bits [i*k, i*k + k) of a little-endian stream."""
    bits = (codes.astype(np.int64)[:, None] >> np.arange(k)) & 1
    return np.packbits(bits.astype(np.uint8).reshape(-1), bitorder="little")


@pytest.mark.parametrize("k", range(1, 9))
def test_round_trip_and_layout(k):
    g = torch.Generator().manual_seed(k)
    for n in SIZES:
        codes = torch.randint(0, 1 << k, (n,), dtype=torch.uint8, generator=g)
        packed = pack_bits(codes, k)
        assert packed.dtype == torch.uint8 and packed.numel() == packed_nbytes(n, k) == (n * k + 7) // 8
        np.testing.assert_array_equal(packed.numpy(), reference_stream(codes.numpy(), k))
        assert torch.equal(_pack_torch(codes, k), packed)
        assert torch.equal(unpack_bits(packed, k, n), codes)
        assert torch.equal(_unpack_torch(packed, k, n), codes)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8).flatmap(lambda k: st.tuples(
    st.just(k), st.lists(st.integers(0, (1 << k) - 1), max_size=70))))
def test_round_trip_hypothesis(case):
    k, values = case
    codes = torch.tensor(values, dtype=torch.uint8)
    packed = pack_bits(codes, k)
    assert torch.equal(unpack_bits(packed, k, len(values)), codes)
    assert torch.equal(_pack_torch(codes, k), packed)


def test_extremes_and_shapes():
    """All-ones codes fill every bit; multi-dimensional and int64 codes are accepted."""
    for k in range(1, 9):
        codes = torch.full((3, 5, 7), (1 << k) - 1, dtype=torch.int64)
        packed = pack_bits(codes, k)
        full = (105 * k) // 8
        assert torch.all(packed[:full] == 255)
        assert torch.equal(unpack_bits(packed, k, 105).view(3, 5, 7).long(), codes)


def test_bad_input():
    with pytest.raises(ValueError, match=r"bits=0 must be an integer in 1\.\.8"):
        pack_bits(torch.zeros(3, dtype=torch.uint8), 0)
    with pytest.raises(ValueError, match=r"bits=9 must be an integer in 1\.\.8"):
        unpack_bits(torch.zeros(3, dtype=torch.uint8), 9, 3)
    with pytest.raises(ValueError, match=r"codes must lie in \[0, 4\) for bits=2"):
        pack_bits(torch.tensor([0, 4]), 2)
    with pytest.raises(TypeError, match="codes must be an integer torch.Tensor"):
        pack_bits(torch.tensor([0.0, 1.0]), 2)
    with pytest.raises(ValueError, match="packed has 2 bytes; 9 codes of 3 bits need 4"):
        unpack_bits(torch.zeros(2, dtype=torch.uint8), 3, 9)
    with pytest.raises(TypeError, match="packed must be a uint8 torch.Tensor"):
        unpack_bits(torch.zeros(4, dtype=torch.int32), 3, 9)

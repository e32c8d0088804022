"""Bit-packed storage of k-bit codes (k = 1..8) in uint8 tensors.

A tensor of n codes takes ``packed_nbytes(n, k) = ceil(n*k/8)`` bytes: code i sits in
bits [i*k, i*k + k) of a little-endian bit stream (stream bit b is bit b % 8 of byte
b // 8).  CPU tensors use the Numba kernels of ``_kernels``, CUDA tensors their twins
in ``_cuda`` (the same definitions, _scalar.py); any other device uses the vectorised
torch implementation here, which defines the same layout (the tests compare all of
them bit for bit).
"""
from __future__ import annotations

import numpy as np
import torch

from .._backend import on_cuda_backend
from . import _kernels as K

MAX_BITS = 8


def check_bits(bits, name: str = "bits") -> int:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) \
            or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"{name}={bits!r} must be an integer in 1..{MAX_BITS}")
    return int(bits)


def packed_nbytes(numel: int, bits: int) -> int:
    """Bytes that ``numel`` codes of ``bits`` bits occupy."""
    return (int(numel) * check_bits(bits) + 7) // 8


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes in [0, 2**bits) (any shape, flattened in C order) into uint8."""
    bits = check_bits(bits)
    if not isinstance(codes, torch.Tensor) or codes.is_floating_point() or codes.is_complex():
        raise TypeError("codes must be an integer torch.Tensor")
    flat = codes.reshape(-1)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= 1 << bits):
        raise ValueError(f"codes must lie in [0, {1 << bits}) for bits={bits}")
    out = torch.empty(packed_nbytes(flat.numel(), bits), dtype=torch.uint8, device=codes.device)
    flat = flat.to(torch.uint8).contiguous()
    if on_cuda_backend(flat):
        from . import _cuda as C
        C.launch(C.pack, C.groups(flat.numel()), codes=flat, k=bits, out=out)
    elif flat.device.type == "cpu":
        K.pack(flat.numpy(), bits, out.numpy())
    else:
        out = _pack_torch(flat, bits)
    return out


def unpack_bits(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """The ``numel`` codes of a packed stream, as a flat uint8 tensor."""
    bits = check_bits(bits)
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise TypeError("packed must be a uint8 torch.Tensor")
    if packed.numel() != packed_nbytes(numel, bits):
        raise ValueError(f"packed has {packed.numel()} bytes; {numel} codes of {bits} bits "
                         f"need {packed_nbytes(numel, bits)}")
    out = torch.empty(numel, dtype=torch.uint8, device=packed.device)
    if on_cuda_backend(packed):
        from . import _cuda as C
        C.launch(C.unpack, C.groups(numel), packed=packed.contiguous(), k=bits, out=out)
    elif packed.device.type == "cpu":
        K.unpack(packed.contiguous().numpy(), bits, out.numpy())
    else:
        out = _unpack_torch(packed, bits, numel)
    return out


def _pack_torch(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Vectorised torch packing (any device): 8 codes -> one int64 -> ``bits`` bytes."""
    n = codes.numel()
    groups = (n + 7) // 8
    c = torch.zeros(groups * 8, dtype=torch.int64, device=codes.device)
    c[:n] = codes.reshape(-1)
    shifts = torch.arange(8, device=codes.device, dtype=torch.int64) * bits
    words = (c.view(groups, 8) << shifts).sum(1)
    byte_shift = torch.arange(bits, device=codes.device, dtype=torch.int64) * 8
    by = ((words[:, None] >> byte_shift) & 0xFF).to(torch.uint8)
    return by.reshape(-1)[:packed_nbytes(n, bits)]


def _unpack_torch(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    groups = (numel + 7) // 8
    by = torch.zeros(groups * bits, dtype=torch.int64, device=packed.device)
    by[:packed.numel()] = packed.to(torch.int64)
    byte_shift = torch.arange(bits, device=packed.device, dtype=torch.int64) * 8
    words = (by.view(groups, bits) << byte_shift).sum(1)
    shifts = torch.arange(8, device=packed.device, dtype=torch.int64) * bits
    codes = (words[:, None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(-1)[:numel].to(torch.uint8)

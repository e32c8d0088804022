"""Few-bit activations: native forward bit for bit, gradient == grad * q(x) bit for bit
(every activation, several widths, corner inputs), saved bytes, dtypes, bad input."""
import itertools

import numpy as np
import pytest
import torch
from conftest import assert_bits_equal, forward_backward

from torch_bridge.memory import (ACTIVATIONS, FewBitActivation, FewBitGELU, FewBitReLU, activation,
                                 fewbit, fewbit_table, pack_bits, packed_nbytes)
from torch_bridge.memory.fewbit import _quantizer
from torch_bridge.memory.packing import unpack_bits


def corner_inputs(table, n_random=2001, seed=0) -> torch.Tensor:
    """Every breakpoint rounded to float32 and its float32 neighbours, signed zeros,
    infinities, NaN, extremes, plus random values (an odd count)."""
    bp = np.asarray(table.breakpoints, np.float32)
    if table.even:
        bp = np.r_[bp, -bp]
    near = np.r_[bp, np.nextafter(bp, np.float32(np.inf)), np.nextafter(bp, np.float32(-np.inf))]
    special = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-45, -1e-45, 10, -10])
    rnd = np.random.default_rng(seed).standard_normal(n_random).astype(np.float32) * 3
    return torch.from_numpy(np.r_[near, special, rnd].astype(np.float32))


def expected_grad(table, x, g):
    """g * q(x); at a NaN x native torch's gradient (a code names an interval, not NaN)."""
    q = torch.from_numpy(np.asarray(table.values)[table.index(x.double().numpy())])
    out = g * q.to(g.dtype)
    nan = torch.isnan(x)
    if nan.any():       # (tables of default parameters: table.activation is their name)
        xn = torch.full((int(nan.sum()),), np.nan, dtype=x.dtype, requires_grad=True)
        out[nan] = torch.autograd.grad(activation(table.activation).native(xn), xn, g[nan])[0]
    return out


@pytest.mark.parametrize("bits", [1, 2, 3, 8])
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_forward_is_native_and_gradient_is_exactly_q(name, bits):
    table = fewbit_table(name, bits)
    x = corner_inputs(table)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(bits))
    y, dx = forward_backward(lambda v: fewbit(v, name, bits), x, g)
    assert_bits_equal(y.numpy(), activation(name).native(x).numpy(), x.numpy(),
                      what=f"{name} forward")
    assert_bits_equal(dx.numpy(), expected_grad(table, x, g).numpy(), x.numpy(),
                      what=f"{name} {bits}-bit gradient")


@pytest.mark.parametrize("name,bits", [("gelu", 4), ("tanh", 3), ("silu", 5)])
def test_normal_weight_tables_and_shapes(name, bits):
    """Normal-weight tables, a 3-D non-contiguous input: same exactness."""
    table = fewbit_table(name, bits, "normal")
    base = torch.randn(6, 5, 7, generator=torch.Generator().manual_seed(3)) * 2
    x = base.transpose(0, 2).requires_grad_(True)
    y = FewBitActivation(name, bits, "normal")(x)
    g = torch.randn(y.shape)
    y.backward(g)
    assert x.grad.shape == x.shape
    assert_bits_equal(x.grad.numpy(), expected_grad(table, x.detach(), g).numpy(),
                      what=f"{name} normal-weight gradient")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_dtypes(dtype):
    """float64 (Numba) and 16-bit floats (torch path): grad * level in grad's dtype."""
    table = fewbit_table("gelu", 3)
    x = corner_inputs(table, 501).to(dtype)
    g = torch.randn(x.shape).to(dtype)
    y, dx = forward_backward(FewBitGELU(3), x, g)
    assert y.dtype == dx.dtype == dtype
    assert torch.equal(y.view(torch.uint8), torch.nn.functional.gelu(x).view(torch.uint8))
    assert torch.equal(dx.view(torch.uint8), expected_grad(table, x, g).view(torch.uint8))


def test_numba_and_torch_paths_agree():
    """The fused kernels produce the same packed indices and gradients as the torch
    path every non-CPU device takes."""
    for name, bits in [("gelu", 3), ("sigmoid", 2), ("mish", 7)]:
        q = _quantizer(activation(name), bits, "uniform")
        x = corner_inputs(q.table, 999)
        packed = q.index_packed(x)
        assert torch.equal(packed, pack_bits(q.index(x), bits))
        g = torch.randn(x.shape)
        torch_path = g * q.levels.float()[unpack_bits(packed, bits, x.numel()).long()]
        assert torch.equal(q.scale(g, packed), torch_path)


@pytest.mark.parametrize("bits", [1, 3, 4, 8])
def test_saves_only_the_packed_index(bits):
    saved = []
    x = torch.randn(1001, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = FewBitGELU(bits)(x)
    assert len(saved) == 1 and saved[0].dtype == torch.uint8
    assert saved[0].untyped_storage().nbytes() == packed_nbytes(1001, bits) == (1001 * bits + 7) // 8
    y.sum().backward()


def test_native_config_and_no_grad():
    x = torch.randn(50, requires_grad=True)
    m = FewBitGELU(bits=None)
    assert torch.equal(m(x), torch.nn.functional.gelu(x))
    assert m(x).grad_fn.name() == "GeluBackward0"
    with torch.no_grad():
        assert torch.equal(FewBitGELU(2)(x), torch.nn.functional.gelu(x))
    assert "bits=3" in repr(FewBitGELU()) and "gelu_tanh" in repr(FewBitGELU(approximate="tanh"))
    # ReLU is exact at one bit whatever the width asked for
    xr = torch.randn(100, requires_grad=True)
    FewBitReLU(5)(xr).sum().backward()
    assert torch.equal(xr.grad, (xr > 0).float())


def test_parameters_reach_forward_and_table():
    x = torch.randn(300, requires_grad=True)
    m = FewBitActivation("elu", 2, alpha=0.5)
    y = m(x)
    assert torch.equal(y, torch.nn.functional.elu(x, 0.5))
    y.backward(torch.ones_like(y))
    table = fewbit_table(activation("elu", alpha=0.5), 2)
    assert torch.equal(x.grad, expected_grad(table, x.detach(), torch.ones(300)))
    xl = torch.randn(300, requires_grad=True)
    fewbit(xl, "leaky_relu", 1, negative_slope=0.2).sum().backward()
    assert torch.equal(xl.grad, torch.where(xl > 0, 1.0, 0.2))


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"bits=0 must be an integer in 1\.\.8"):
        FewBitGELU(0)
    with pytest.raises(ValueError, match=r"bits=9 must be an integer in 1\.\.8"):
        fewbit(torch.randn(3), "gelu", 9)
    with pytest.raises(TypeError, match="input must have dtype float32, float64, float16 or bfloat16"):
        fewbit(torch.arange(3), "gelu", 2)
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        fewbit([1.0], "gelu", 2)
    with pytest.raises(ValueError, match="activation='hardswish' is not supported"):
        FewBitActivation("hardswish", 2)
    with pytest.raises(ValueError, match="weight='laplace'; expected one of"):
        FewBitGELU(3, weight="laplace")
    with pytest.raises(ValueError, match="approximate='fast'; expected 'none' or 'tanh'"):
        FewBitGELU(3, approximate="fast")


def test_float32_thresholds_preserve_every_comparison():
    """x > b (float64) <=> x > thresholds(b) (float32) for float32 x around each b."""
    from torch_bridge.memory._kernels import thresholds
    rng = np.random.default_rng(1)
    b = np.r_[rng.uniform(-10, 10, 500), np.float32(rng.uniform(-10, 10, 100)), 0.0, np.inf]
    t = thresholds(b, np.float32)
    assert t.dtype == np.float32 and thresholds(b, np.float64) is b
    for bi, ti in zip(b, t):
        x = np.float32(bi) + np.arange(-3, 4, dtype=np.float32) * np.spacing(np.float32(bi))
        assert np.array_equal(x > bi, x > ti)


@pytest.mark.parametrize("bits", range(1, 9))
def test_kernels_across_parallel_chunks(bits):
    """Several parallel chunks of the fused kernels, a ragged last chunk and a tail
    group: the packed index and the gradient equal the torch path bit for bit, for an
    odd (gelu) and an even (tanh: |x|) table, float32 and float64 inputs.  (The sizes
    loop inside one test: each table's kernels compile once per worker.)"""
    cases = itertools.product([8 * 1024 * 2 + 13, 8 * 1024 * 3, 8 * 1024 - 3], ("gelu", "tanh"),
                              (torch.float32, torch.float64))
    for case, (n, name, dtype) in enumerate(cases):
        rng = np.random.default_rng([bits, case])
        q = _quantizer(activation(name), bits, "uniform")
        x = torch.from_numpy(rng.standard_normal(n) * 4).to(dtype)
        x[::997] = float("nan")
        packed = q.index_packed(x)
        assert torch.equal(packed, pack_bits(q.index(x), bits)), (n, name, dtype)
        g = torch.from_numpy(rng.standard_normal(n)).to(dtype)
        idx = unpack_bits(packed, bits, n).long()
        assert torch.equal(q.scale(g, packed), g * q.levels.to(dtype)[idx]), (n, name, dtype)

"""PA activations: forward == x*slope[i] + intercept[i] bit for bit, backward exactly
grad * slope[i] (the derivative of the forward function; NaN at NaN), segment index saved in
ceil(log2 P) bits, stored fits reproduce and their errors are honest, bad input."""
import numpy as np
import pytest
import torch
from conftest import assert_bits_equal, forward_backward

from torch_bridge.memory import (PA_ACTIVATIONS, PAActivation, PAGELU, PASiLU, activation,
                                 fit_pa, pa_activation, pa_table, packed_nbytes, unpack_bits)
from torch_bridge.memory.pa import PIECES, stored_pa


def inputs(table, seed=0) -> torch.Tensor:
    """Knots rounded to float32 and their neighbours, specials, random values."""
    k = np.asarray(table.knots, np.float32)
    near = np.r_[k, np.nextafter(k, np.float32(np.inf)), np.nextafter(k, np.float32(-np.inf))]
    special = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-45, 20, -20])
    rnd = np.random.default_rng(seed).standard_normal(3001).astype(np.float32) * 4
    return torch.from_numpy(np.r_[near, special, rnd].astype(np.float32))


def segment(table, x: np.ndarray) -> np.ndarray:
    i = np.searchsorted(np.asarray(table.knots), x.astype(np.float64), side="left")
    return np.where(np.isnan(x), 0, i)


@pytest.mark.parametrize("pieces", PIECES)
@pytest.mark.parametrize("name", PA_ACTIVATIONS)
def test_forward_and_exact_backward(name, pieces):
    t = pa_table(name, pieces)
    x = inputs(t)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(pieces))
    y, dx = forward_backward(lambda v: pa_activation(v, name, pieces), x, g)
    i = segment(t, x.numpy())
    slope = torch.from_numpy(t.slopes).float()[i]
    icpt = torch.from_numpy(t.intercepts).float()[i]
    assert_bits_equal(y.numpy(), (x * slope + icpt).numpy(), x.numpy(),
                      what=f"PA {name} {pieces} forward")
    want = torch.where(torch.isnan(x), np.nan, g * slope)      # f(NaN) is NaN, so is f'
    assert_bits_equal(dx.numpy(), want.numpy(), x.numpy(),
                      what=f"PA {name} {pieces} backward")


@pytest.mark.parametrize("name", PA_ACTIVATIONS)
def test_backward_is_the_derivative_of_the_forward(name):
    """Inside every segment the float64 PA's finite difference equals the saved slope."""
    t = pa_table(name, 16)
    k = np.asarray(t.knots)
    mids = np.r_[k[0] - 1, 0.5 * (k[1:] + k[:-1]), k[-1] + 1]
    h = 1e-6 * np.minimum(1, np.r_[1, np.diff(k), 1])
    x = torch.from_numpy(mids).requires_grad_(True)
    pa_activation(x, name, 16).sum().backward()
    fd = (t(mids + h) - t(mids - h)) / (2 * h)
    np.testing.assert_allclose(x.grad.numpy(), fd, rtol=1e-6, atol=1e-9)
    assert x.grad[0] == 0 and x.grad[-1] == 1         # the asymptotic outer pieces


@pytest.mark.parametrize("pieces", [2, 4, 8, 16, 32])     # 1..5 bits
def test_saves_only_the_packed_segment_index(pieces):
    saved = []
    x = torch.randn(1001, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = PAGELU(pieces)(x)
    bits = max(1, int(np.ceil(np.log2(pieces))))
    assert pa_table("gelu", pieces).bits == bits
    assert len(saved) == 1 and saved[0].dtype == torch.uint8
    assert saved[0].numel() == packed_nbytes(1001, bits)
    codes = unpack_bits(saved[0], bits, 1001).numpy()
    assert np.array_equal(codes, segment(pa_table("gelu", pieces), x.detach().numpy()))
    y.sum().backward()


@pytest.mark.parametrize("name", PA_ACTIVATIONS)
def test_stored_errors_are_honest_and_shrink(name):
    f = activation(name)
    x = np.linspace(-30, 30, 600_001)
    fx = f.f(torch.from_numpy(x)).numpy()
    errs = []
    for p in PIECES:
        t = stored_pa()[(name, p)]
        e = np.abs(t(x) - fx).max()
        assert e <= t.max_error * (1 + 1e-6)      # the stated sup bounds a fine grid
        assert e >= 0.9 * t.max_error             # ... and is attained (equioscillation)
        errs.append(t.max_error)
    # with the asymptotes as outer pieces, 4 pieces cannot beat 2 (the extra knots
    # cannot follow the convex middle); from 4 on each doubling gains ~4x (O(h^2))
    assert errs[1] <= errs[0] * (1 + 1e-9)
    assert all(b < 0.5 * a for a, b in zip(errs[1:], errs[2:]))


def test_regenerated_fits_equal_the_stored_ones():
    """The fit (scipy's Nelder-Mead and HiGHS) is not bit-reproducible across hosts or
    changes in f's last bits (docs/semantics.md, 6): knots and values agree to 1e-9
    (measured: <= 2.7e-10 after f's definitions changed), and the sup error, |PA - f|
    at an equioscillation point, moves one for one with the values: the same 1e-9."""
    for name in PA_ACTIVATIONS:
        t, ref = fit_pa(name, 2), stored_pa()[(name, 2)]
        np.testing.assert_allclose(t.knots, ref.knots, rtol=0, atol=1e-9)
        np.testing.assert_allclose(t.values, ref.values, rtol=0, atol=1e-9)
        assert t.max_error == pytest.approx(ref.max_error, rel=0, abs=1e-9)


def test_torch_path_equals_numba_path():
    x = torch.randn(4097, dtype=torch.float64) * 3
    t = pa_table("silu", 8)
    _, dx = forward_backward(PASiLU(8), x)
    x16 = x.float().bfloat16()                            # bfloat16 takes the torch path
    _, dx16 = forward_backward(PASiLU(8), x16)
    i = segment(t, x16.double().numpy())
    assert torch.equal(dx16, torch.from_numpy(t.slopes).bfloat16()[i])
    assert torch.equal(dx, torch.from_numpy(t.slopes)[segment(t, x.numpy())])


def test_bad_input():
    with pytest.raises(ValueError, match=r"activation='tanh': PA activations exist for"):
        PAActivation("tanh", 8)
    with pytest.raises(ValueError, match=r"pieces=1 must be an integer in 2\.\.256"):
        PAGELU(1)
    with pytest.raises(ValueError, match=r"pieces=True must be an integer"):
        PAGELU(True)
    with pytest.raises(TypeError, match="input must have dtype"):
        pa_activation(torch.arange(3), "gelu", 4)

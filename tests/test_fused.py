"""torch_bridge's fast paths give the bits of its general path, bit for bit.

* the per-call path of the primitives (emu's serial kernels on the tensors' memory,
  torch_bridge/_core.py) against the emu front-end calls of the general path;
* emu's serial kernel twins against the parallel kernels;
* the scalar form of every approximate derivative (emu/_scalar_approx.py) against the
  registry's sequence of emu calls (emu.grad, kind 'approx').
"""
import numpy as np
import pytest
import torch

import emu
import emu.grad as G
import torch_bridge as tb
from conftest import assert_bits_equal, corner_values
from emu import _kernels as K
from emu import _kernels_grad as KG
from emu._scalar_approx import ln2_pattern
from emu.registry import ops
from torch_bridge import _core
from torch_bridge import functional as PF

FORMATS = ["float32", "bf16", "float16", "float8_e4m3fn", "e3m2"]
ROUNDINGS = ["nearest_even", "toward_zero"]
KINDS = ["approx", "exact"]


def npy(t):
    return t.detach().float().numpy()


@pytest.fixture
def general(monkeypatch):
    """A context that sends every call down the general path (emu's front ends)."""
    def use():
        monkeypatch.setattr(_core, "SERIAL_WORK", -1)
    return use


def specials(shape, seed, scale=3.0):
    """Random float32 values with ±0, subnormals, ±inf and NaN sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    flat = x.view(-1)
    vals = [0.0, -0.0, 1e-40, -1e-40, float("inf"), float("-inf"), float("nan"), 3e38, 1e-30]
    idx = torch.randperm(flat.numel(), generator=g)[:len(vals)]
    for i, v in zip(idx, vals):
        flat[i] = v
    return x


# --- the approximate derivatives, element by element -----------------------------------

def _values(fmt, rng):
    """Every value of an 8-bit format, else corner values and random ones."""
    f = emu.format(fmt)
    if f.width <= 8:
        return emu.from_bits(np.arange(1 << f.width, dtype=np.uint32), f)
    rand = (rng.standard_normal(4000) * np.exp2(rng.integers(-30, 30, 4000))).astype(np.float32)
    return np.concatenate([corner_values(f), rand, np.float32([1e-45, -3e-39, 7e37])])


@pytest.mark.parametrize("fmt", ["float32", "bf16", "float8_e4m3fn", "float8_e5m2", "e3m2",
                                 "float4_e2m1fn", "float8_e4m3fnuz"])
@pytest.mark.parametrize("op", [o.name for o in ops(differentiable=True)])
def test_scalar_approx_rules_are_the_registry_rules(op, fmt, rng):
    f = emu.format(fmt)
    v = _values(fmt, rng)
    entry = emu.OPS[op]
    if entry.arity == 1:
        x = v
        with np.errstate(over="ignore"):
            dy = rng.permutation(np.concatenate([v, v * np.float32(1.7)]))[:x.size]
        want = getattr(G, op)(x, dy, f, "approx")
        got = np.empty(x.size, np.uint32)
        KG.APPROX[False][op](x.view(np.uint32), dy.view(np.uint32), got, ln2_pattern(f),
                             f.consts)
        assert_bits_equal(got.view(np.float32), want, x, dy, what=op)
        return
    a, b = (w.ravel() for w in np.meshgrid(v, v[::7] if v.size > 256 else v))
    dy = rng.permutation(np.resize(np.concatenate([v, v * np.float32(0.3)]), a.size))
    want_a, want_b = getattr(G, op)(a, b, dy, f, "approx")
    got_a, got_b = np.empty(a.size, np.uint32), np.empty(a.size, np.uint32)
    KG.APPROX[False][op](a.view(np.uint32), b.view(np.uint32), dy.view(np.uint32), got_a,
                         got_b, ln2_pattern(f), f.consts)
    assert_bits_equal(got_a.view(np.float32), want_a, a, b, dy, what=f"{op} δA")
    assert_bits_equal(got_b.view(np.float32), want_b, a, b, dy, what=f"{op} δB")


# --- serial twins ---------------------------------------------------------------------------

def test_serial_twins_are_the_parallel_kernels(rng):
    x = specials((3000,), 1).numpy()
    y = specials((3000,), 2).numpy()
    for fmt in ("float32", "bf16", "float8_e4m3fn"):
        fc = emu.format(fmt).consts
        for name in K.BINARY:
            outs = [np.empty(x.size, np.uint32) for _ in range(2)]
            K.BINARY[name](x.view(np.uint32), y.view(np.uint32), outs[0], fc)
            K.BINARY_SERIAL[name](x.view(np.uint32), y.view(np.uint32), outs[1], fc)
            assert_bits_equal(outs[1].view(np.float32), outs[0].view(np.float32), what=name)
        for name in K.UNARY:
            outs = [np.empty(x.size, np.uint32) for _ in range(2)]
            K.UNARY[name](x.view(np.uint32), outs[0], fc)
            K.UNARY_SERIAL[name](x.view(np.uint32), outs[1], fc)
            assert_bits_equal(outs[1].view(np.float32), outs[0].view(np.float32), what=name)
        for mode in (0, 1, 2):
            outs = [np.empty(x.size, np.uint32) for _ in range(2)]
            for par, out in zip((True, False), outs):
                K.QUANTIZE[par](x.view(np.uint32), out, fc, mode, True, False, 12345)
            assert_bits_equal(outs[1].view(np.float32), outs[0].view(np.float32))


# --- the per-call path of the primitives ---------------------------------------------------

def _run(fn, args, seed=0):
    """Forward and backward of ``fn(*args)`` with a random output gradient: the output
    and every argument's gradient."""
    args = [a.clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point()
            else a for a in args]
    out = fn(*args)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)) * 2)
    return [out] + [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


def _same(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what}[{i}]"
        assert_bits_equal(npy(g), npy(w), what=f"{what}[{i}]")


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_per_call_path_is_the_general_path(fmt, kind, rounding, general):
    x, y = specials((3, 4, 5), 1), specials((4, 5), 2, 0.5)
    kw = dict(backward=kind, rounding=rounding)
    cases = {
        "pam_mul": (lambda a, b: PF.pam_mul(a, b, fmt, **kw), (x, y)),
        "pa_div": (lambda a, b: PF.pa_div(b, a, fmt, **kw), (x, y)),
        "pam_mul by 0.3": (lambda a: PF.pam_mul(a, 0.3, fmt, **kw), (x,)),
        "unary": (lambda a: PF.pa_exp(a, fmt, **kw) + PF.pa_log(a, fmt, **kw)
                  + PF.pa_sqrt(a, fmt, **kw) + PF.pa_exp2(a, fmt, **kw)
                  + PF.pa_log2(a, fmt, **kw), (x,)),
        "matmul": (lambda a, b: PF.pam_matmul(a, b.t(), fmt, **kw), (x.nan_to_num(0, 1e3, -1e3),
                                                                   y[:3].nan_to_num(0))),
        "bf16 tensors": (lambda a, b: PF.pam_mul(a, b, fmt, **kw),
                         (x.bfloat16(), y.bfloat16())),
    }
    fast = {name: _run(fn, args) for name, (fn, args) in cases.items()}
    general()
    for name, (fn, args) in cases.items():
        _same(fast[name], _run(fn, args), name)


def test_adamw_updates_in_place_with_the_sequences_bits():
    """The fused update writes the parameter and state in place and bumps their versions
    (as copy_ would); test_torch_models checks its bits against the sequence of calls."""
    w = torch.nn.Parameter(torch.randn(5, 3))
    opt = tb.PAAdamW([w], lr=0.1, config=tb.PAMConfig("bf16"))
    w.grad = torch.randn(5, 3)
    v0, ptr = w._version, w.data_ptr()
    opt.step()
    assert w._version > v0 and w.data_ptr() == ptr
    assert opt.state[w]["exp_avg"].abs().sum() > 0

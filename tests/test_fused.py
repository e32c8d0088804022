"""torch_bridge's fast paths give the bits of its general path, bit for bit.

* the per-call path of the primitives (emu's serial kernels on the tensors' memory,
  torch_bridge/_lean.py) against the emu front-end calls of the general path;
* emu's serial kernel twins against the parallel kernels;
* the scalar form of every approximate derivative (emu/_scalar_approx.py) against the
  registry's sequence of emu calls (emu.grad, kind 'approx').
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import emu
import emu.grad as G
import torch_bridge as tb
from conftest import assert_bits_equal, corner_values
from emu import _kernels as K
from emu import _kernels_grad as KG
from emu._scalar_approx import ln2_pattern
from emu import sizes
from emu.registry import ops
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
        monkeypatch.setattr(sizes, "SERIAL_WORK", -1)
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


# --- the fused composites against their graphs ------------------------------------------------

from torch_bridge import _compose                    # noqa: E402
from torch_bridge.config import check_numerics      # noqa: E402
from torch_bridge import elementwise as PE            # noqa: E402
from torch_bridge import losses as PL                 # noqa: E402
from torch_bridge import norms as PN                  # noqa: E402


def _graph(fn, args, seed=0):
    with _compose.use(False):
        return _run(fn, args, seed)


def _composites(kw):
    """name -> (function, arguments): every fused composite, with its variants."""
    x = specials((4, 9), 3)
    x[1, 2], x[2, 3] = 40.0, -95.0                  # past the 88 and 16 clamps
    w, b = specials((9,), 4), specials((9,), 5)
    x3 = specials((2, 3, 9), 6, 2.0)
    masked = x.clone()
    masked[0] = float("-inf")                       # a fully masked softmax row
    masked[1, :4] = float("-inf")
    T = torch.tensor([3, -100, 8, 0])
    Tw = torch.tensor([1, 2, 2, -100])
    cw = specials((9,), 7).abs() + 0.25
    P = torch.softmax(torch.randn(4, 9, generator=torch.Generator().manual_seed(8)), -1)
    z3 = specials((3, 9, 2), 9, 2.0)                 # (N, C, d) logits
    T3 = torch.tensor([[1, 8], [-100, 0], [4, 4]])
    return {
        "sigmoid": (lambda a: PE.pa_sigmoid(a, **kw), (x,)),
        "tanh": (lambda a: PE.pa_tanh(a, **kw), (x,)),
        "silu": (lambda a: PE.pa_silu(a, **kw), (x,)),
        "gelu tanh": (lambda a: PE.pa_gelu(a, "tanh", **kw), (x,)),
        "gelu erf": (lambda a: PE.pa_gelu(a, **kw), (x,)),
        "softplus": (lambda a: PE.pa_softplus(a, **kw), (x,)),
        "softplus beta": (lambda a: PE.pa_softplus(a, 2.0, 5.0, **kw), (x,)),
        "softmax": (lambda a: PF.pa_softmax(a, -1, **kw), (x,)),
        "softmax masked": (lambda a: PF.pa_softmax(a, -1, **kw), (masked,)),
        "softmax dim 1": (lambda a: PF.pa_softmax(a, 1, **kw), (x3,)),
        "log_softmax": (lambda a: PL.pa_log_softmax(a, -1, **kw), (x,)),
        "log_softmax dim 0": (lambda a: PL.pa_log_softmax(a, 0, **kw), (x3,)),
        "layer_norm": (lambda a, w, b: PF.pa_layer_norm(a, (9,), w, b, **kw), (x, w, b)),
        "layer_norm plain": (lambda a: PF.pa_layer_norm(a, 9, eps=1e-3, **kw), (x,)),
        "layer_norm 2 dims": (lambda a, w: PF.pa_layer_norm(a, (3, 9), w, **kw),
                              (x3, specials((3, 9), 10))),
        "rms_norm": (lambda a, w: PE.pa_rms_norm(a, 9, w, 1e-6, **kw), (x, w)),
        "rms_norm plain": (lambda a: PE.pa_rms_norm(a, (3, 9), **kw), (x3,)),
        "group_norm": (lambda a, w, b: PN.pa_group_norm(a, 3, w[:6], b[:6], **kw),
                       (specials((2, 6, 5), 11), w, b)),
        "cross_entropy": (lambda a: PF.pa_cross_entropy(a, T, **kw), (x,)),
        "cross_entropy smoothing weights": (
            lambda a: PF.pa_cross_entropy(a, Tw, cw, label_smoothing=0.1, **kw), (x.clamp(-50, 50),)),
        "cross_entropy none": (lambda a: PF.pa_cross_entropy(a, T, reduction="none", **kw), (x,)),
        "cross_entropy sum": (lambda a: PF.pa_cross_entropy(a, Tw, reduction="sum",
                                                            label_smoothing=0.3, **kw), (x,)),
        "cross_entropy probs": (lambda a: PF.pa_cross_entropy(a, P, label_smoothing=0.1, **kw),
                                (x.clamp(-50, 50),)),
        "cross_entropy (N, C, d)": (lambda a: PF.pa_cross_entropy(a, T3, cw, **kw), (z3,)),
        "cross_entropy 1-D": (lambda a: PF.pa_cross_entropy(a, torch.tensor(2), **kw), (x[0],)),
        # other consumers of the input: its gradient contributions keep the graph's order
        "tanh + residual": (lambda a: PE.pa_tanh(a, **kw) * 3.0 + a * a, (x,)),
        "gelu + residual": (lambda a: a * 0.5 + PE.pa_gelu(a, "tanh", **kw), (x,)),
        "residual + gelu": (lambda a: PE.pa_gelu(a, "tanh", **kw) + a * 0.5, (x,)),
        "residual + gelu erf": (lambda a: PE.pa_gelu(a, **kw) - a * 0.25, (x,)),
        "residual + silu": (lambda a: PE.pa_silu(a, **kw) - a * 0.25, (x,)),
        "residual + softplus": (lambda a: PE.pa_softplus(a, **kw) - a * 0.25, (x,)),
        "layer_norm + residual": (lambda a: a + PF.pa_layer_norm(a, 9, **kw) * 2.0, (x,)),
        "rms_norm + residual": (lambda a: PE.pa_rms_norm(a, 9, **kw) - a * 3.0, (x,)),
    }


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_fused_composites_are_their_graphs(fmt, kind, rounding):
    """Forward, and backward of both derivative kinds, of every fused composite equal its
    graph of PA Functions bit for bit (NaNs by class), specials included."""
    for name, (fn, args) in _composites(dict(fmt=fmt, backward=kind, rounding=rounding)).items():
        _same(_run(fn, args), _graph(fn, args), name)


def test_fused_composites_under_pam_mode():
    """The tiny models' paths: F.softmax / layer_norm / gelu / silu / cross_entropy / sdpa
    under pam_mode, fused and as graphs."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 6, 8)
    ln = torch.nn.LayerNorm(8)
    t = torch.randint(0, 8, (2 * 4 * 6,))

    def model(a):
        h = F.scaled_dot_product_attention(a, a, a, is_causal=True)
        h = ln(h + a)
        h = F.gelu(h) + torch.tanh(h) + F.silu(h) + torch.sigmoid(h)
        return F.cross_entropy(h.reshape(-1, 8), t, label_smoothing=0.1) + \
            F.log_softmax(h, -1).mean()
    for cfg in (tb.PAMConfig("bf16"), tb.PAMConfig("bf16", backward="exact",
                                                    pa_fmt="bf16")):
        def run(a):
            with tb.pam_mode(cfg):
                return model(a)
        fused = _run(run, (x,))
        _same(fused, _graph(run, (x,)), str(cfg))
        assert ln.weight.grad is not None
        ln.zero_grad()


def test_fused_takes_the_graph_where_it_cannot_run():
    """Stochastic rounding, bf16 tensors and a disabled switch run the graph."""
    x = specials((3, 5), 1)
    ne, sr = (check_numerics("bf16", "approx", r) for r in ("nearest_even", "stochastic"))
    assert _compose.fusable(ne, x) and not _compose.fusable(sr, x)
    assert not _compose.fusable(ne, x.bfloat16())
    with _compose.use(False):
        assert not _compose.fusable(ne, x)
    # the composites' kernels are PAM's: another multiplier runs the graph
    lmul = check_numerics("bf16", "approx", "nearest_even", mul="lmul")
    assert _compose.composite(ne, x) and not _compose.composite(lmul, x)
    y = PE.pa_gelu(x.bfloat16().requires_grad_())
    assert y.dtype == torch.bfloat16 and y.grad_fn.name() != "FusedBackward"
    # beyond FUSED_MAX elements (GELU's ~100 nodes: FUSED_MAX_GELU) the graph's
    # vectorised kernels are faster
    assert PE.pa_gelu(x.requires_grad_()).grad_fn.name() == "FusedBackward"
    big = torch.randn(sizes.FUSED_MAX + 1, requires_grad=True)
    assert PE.pa_silu(big[:-1]).grad_fn.name() == "FusedBackward"
    assert PE.pa_silu(big).grad_fn.name() != "FusedBackward"
    n = sizes.FUSED_MAX_GELU                    # GELU in bfloat16 (float32: FUSED_MAX)
    assert PE.pa_gelu(big[:n], fmt="bf16").grad_fn.name() == "FusedBackward"
    assert PE.pa_gelu(big[:n + 1], fmt="bf16").grad_fn.name() != "FusedBackward"
    assert PE.pa_gelu(big[:-1]).grad_fn.name() == "FusedBackward"


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ["float32", "bf16", "float8_e4m3fn", "e3m2"])
def test_fused_recurrent_cells_are_their_graphs(fmt, kind, rounding):
    """GRU and LSTM layers (two layers, bidirectional, batch first) with every op group PA:
    the fused gate arithmetic per step equals the graph of PA operations; output, h_n,
    c_n and every parameter's gradient, bit for bit."""
    cfg = tb.PAMConfig("bf16", pa_fmt=fmt, backward=kind, rounding=rounding)
    for cell in (torch.nn.GRU, torch.nn.LSTM):
        torch.manual_seed(0)
        rnn = cell(6, 5, num_layers=2, bidirectional=True, batch_first=True)
        x = specials((3, 4, 6), 12).nan_to_num(0.0, 50.0, -50.0)

        def run(a):
            with tb.pam_mode(cfg):
                out = rnn(a)
            h_n = out[1][0] if cell is torch.nn.LSTM else out[1]
            loss = out[0].sum() * 0.5 + h_n.square().sum()
            if cell is torch.nn.LSTM:
                loss = loss + out[1][1].sum() * 3.0
            return loss

        def grads(fn):
            rnn.zero_grad()
            res = fn(run, (x,))
            return res + [p.grad.clone() for p in rnn.parameters()]
        _same(grads(_run), grads(_graph), cell.__name__)


def test_fused_lstm_unused_outputs():
    """An LSTM step whose c' (or h') gets no gradient from outside: as the graph (the
    gate chunks that get no gradient are +0, as the graph's chunk backward makes them)."""
    from torch_bridge.recurrent import _pa_cell
    nm = tb.config.Numerics(emu.float32, "exact", "nearest_even", emu.float32)
    gi, gh, cp = specials((3, 8), 13), specials((3, 8), 14), specials((3, 2), 15)
    for pick in (0, 1):
        def fn(a, b, c):
            return _pa_cell("lstm", nm, a, b, c)[pick] * 2.0
        fused = _run(fn, (gi, gh, cp))
        with _compose.use(False):
            graph = _run(fn, (gi, gh, cp))
        _same(fused, graph, f"output {pick}")


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ["float32", "bf16", "float16", "e3m2"])
def test_fused_linear_is_its_graph(fmt, kind, rounding):
    """pam_linear as one Function equals its graph (reshape, PAMMatmul, reshape, bias
    add): output and the gradients of x, weight and bias."""
    w, b = specials((5, 7), 16, 1.0).nan_to_num(0.0), specials((5,), 17)
    kw = dict(backward=kind, rounding=rounding)
    cases = {
        "3-D with bias": (lambda x, w, b: PF.pam_linear(x, w, b, fmt, **kw),
                          (specials((2, 3, 7), 18).nan_to_num(0.0, 1e4, -1e4), w, b)),
        "2-D": (lambda x, w: PF.pam_linear(x, w, None, fmt, **kw), (specials((4, 7), 19), w)),
        "1-D": (lambda x, w, b: PF.pam_linear(x, w, b, fmt, **kw), (specials((7,), 20), w, b)),
        "frozen weight": (lambda x: PF.pam_linear(x, w, b, fmt, **kw),
                          (specials((3, 7), 21),)),
        "wide output": (lambda x, w: PF.pam_linear(x, w, None, fmt, **kw),
                        (specials((3, 4), 23), specials((9, 4), 24, 0.5).nan_to_num(0.0))),
        "frozen input": (lambda w: PF.pam_linear(specials((6, 7), 25), w, None, fmt, **kw), (w,)),
    }
    for name, (fn, args) in cases.items():
        _same(_run(fn, args), _graph(fn, args), name)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_number_operands_are_tensor_operands(fmt, kind, rounding):
    """``x op number`` and ``number op x`` (no tensor of the number) give the bits of the
    number as a 0-d float32 tensor."""
    x = specials((3, 5), 22)
    kw = dict(backward=kind, rounding=rounding)
    for v in (0.3, -2.5, 3, 1e-40, 7e38, float("inf"), float("nan"), 0.0):
        for name, fn in (("x * v", lambda a: PF.pam_mul(a, v, fmt, **kw)),
                         ("v * x", lambda a: PF.pam_mul(v, a, fmt, **kw)),
                         ("x / v", lambda a: PF.pa_div(a, v, fmt, **kw)),
                         ("v / x", lambda a: PF.pa_div(v, a, fmt, **kw))):
            _same(_run(fn, (x,)), _graph(fn, (x,)), f"{name}, v={v}")

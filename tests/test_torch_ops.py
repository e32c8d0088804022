"""torch_bridge ops == emu, bit for bit, forward and backward (both derivative kinds)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import emu
import emu.mx
import emu.grad as G
import emu.reference_grad as RG
import torch_bridge as tb
from conftest import assert_bits_equal, corner_values

KINDS = ["approx", "exact"]


def t32(a, grad=True):
    return torch.tensor(np.asarray(a, np.float32), requires_grad=grad)


def npy(t):
    return t.detach().float().numpy()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("sa,sb", [((6, 9), (9, 5)), ((3, 6, 9), (9, 5)), ((9,), (9, 5)),
                                   ((6, 9), (9,)), ((2, 1, 6, 9), (3, 9, 5)), ((9,), (9,))])
@pytest.mark.parametrize("fmt", ["float32", "bf16", "e4m3fn", "e5m2"])
@pytest.mark.parametrize("kind", KINDS)
def test_pam_matmul_forward_and_backward_are_emus(sa, sb, fmt, kind, rng):
    A = rng.standard_normal(sa).astype(np.float32)
    B = rng.standard_normal(sb).astype(np.float32)
    a, b = t32(A), t32(B)
    y = tb.pam_matmul(a, b, fmt, backward=kind)
    assert_bits_equal(npy(y), emu.pam_matmul(A, B, fmt), what="forward")
    dY = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(torch.from_numpy(dY))
    da, db = G.pam_matmul(A, B, dY, fmt, kind=kind)
    assert_bits_equal(npy(a.grad), da, what="dA")
    assert_bits_equal(npy(b.grad), db, what="dB")


@pytest.mark.parametrize("sa,sb", [((6, 40), (40, 5)), ((2, 3, 40), (40,))])
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4/16"])
def test_mx_matmul_forward_and_backward_are_emus(sa, sb, fmt, rng):
    """fmt="mxfp8_e4m3": the forward is emu.mx_pam_matmul; backward the float32 PAM
    gradients of the MX operands with dY MX-quantized along its last axis."""
    A = rng.standard_normal(sa).astype(np.float32)
    B = rng.standard_normal(sb).astype(np.float32)
    a, b = t32(A), t32(B)
    mx = emu.mx.mx_format(fmt)
    y = tb.pam_matmul(a, b, fmt)
    assert_bits_equal(npy(y), emu.mx_pam_matmul(A, B, mx.mx, mx.block), what="forward")
    dY = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(torch.from_numpy(dY))
    da, db = G.pam_matmul(mx.round(A, -1), mx.round(B, -2 if B.ndim > 1 else -1),
                          mx.round(dY, -1), "float32")
    assert_bits_equal(npy(a.grad), da, what="dA")
    assert_bits_equal(npy(b.grad), db, what="dB")
    with pytest.raises(ValueError, match="nearest even only"):
        tb.PAMConfig(fmt, rounding="stochastic")


def test_exact_matmul_grads_are_the_table1_derivatives(rng):
    """The exact gradients equal the oracle's folds of Table 1 derivatives (Fractions)."""
    c = corner_values("bf16")
    A = emu.quantize(rng.standard_normal((4, 5)).astype(np.float32), "bf16")
    B = emu.quantize(rng.standard_normal((5, 3)).astype(np.float32), "bf16")
    A[0, 1], B[2, 2] = 0.0, c[3]
    dY = rng.standard_normal((4, 3)).astype(np.float32)
    a, b = t32(A), t32(B)
    tb.pam_matmul(a, b, "bf16", backward="exact").backward(torch.from_numpy(dY))
    wa, wb = RG.pam_matmul(A.tolist(), B.tolist(), dY.tolist(), "bf16", "float32", "exact")
    assert_bits_equal(npy(a.grad), np.array(wa, np.float32), what="dA")
    assert_bits_equal(npy(b.grad), np.array(wb, np.float32), what="dB")


def test_linear_is_a_flattened_pam_matmul(rng):
    X = rng.standard_normal((2, 7, 12)).astype(np.float32)
    W = rng.standard_normal((5, 12)).astype(np.float32)
    bias = rng.standard_normal(5).astype(np.float32)
    x, w, b = t32(X), t32(W), t32(bias)
    y = tb.pam_linear(x, w, b, "bf16")
    want = emu.pam_matmul(X.reshape(-1, 12), W.T, "bf16") + bias
    assert_bits_equal(npy(y), want.reshape(2, 7, 5))
    dY = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(torch.from_numpy(dY))
    da, db = G.pam_matmul(X.reshape(-1, 12), W.T, dY.reshape(-1, 5), "bf16")
    assert_bits_equal(npy(x.grad), da.reshape(X.shape))
    assert_bits_equal(npy(w.grad), db.T)            # one fold over all 14 tokens
    assert_bits_equal(npy(b.grad), emu.fold_sum(dY, (0, 1)))      # emu.fold_sum's order


def conv_by_definition(X, W, stride, padding, dilation, groups, fmt):
    """out[n, o, y, x] = fold over (c, i, j) of pam_mul(W[o, c, i, j], X[n, c', y', x'])."""
    n, c, h, w = X.shape
    o, cg, kh, kw = W.shape
    Xp = np.pad(X, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    ho = (h + 2 * padding - dilation * (kh - 1) - 1) // stride + 1
    wo = (w + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, o, ho, wo), np.float32)
    og = o // groups
    for oc in range(o):
        g = oc // og
        acc = np.zeros((n, ho, wo), np.float32)
        for ci in range(cg):
            for i in range(kh):
                for j in range(kw):
                    patch = Xp[:, g * cg + ci, i * dilation: i * dilation + stride * ho: stride,
                               j * dilation: j * dilation + stride * wo: stride]
                    acc = acc + emu.pam_mul(W[oc, ci, i, j], patch, fmt)
        out[:, oc] = acc
    return out


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 2),
                                                           (1, 2, 2, 1), (3, 1, 1, 4)])
def test_conv2d_is_the_pam_fold_over_the_kernel(stride, padding, dilation, groups, rng):
    X = rng.standard_normal((2, 4, 9, 8)).astype(np.float32)
    W = rng.standard_normal((8, 4 // groups, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32)
    x, w, b = t32(X), t32(W), t32(bias)
    y = tb.pam_conv2d(x, w, b, stride, padding, dilation, groups, "bf16")
    want = conv_by_definition(X, W, stride, padding, dilation, groups, "bf16")
    assert_bits_equal(npy(y), want + bias[None, :, None, None])
    assert y.shape == F.conv2d(x, w, b, stride, padding, dilation, groups).shape
    y.square().sum().backward()
    assert x.grad.shape == x.shape and torch.isfinite(w.grad).all()
    # the approximate gradient is close to the true one for PAM ~ multiplication
    x2, w2 = t32(X), t32(W)
    F.conv2d(x2, w2, None, stride, padding, dilation, groups).square().sum().backward()
    assert F.cosine_similarity(w.grad.flatten(), w2.grad.flatten(), 0) > 0.95


def test_conv2d_padding_modes_and_strings(rng):
    x = t32(rng.standard_normal((1, 2, 6, 6)))
    w = t32(rng.standard_normal((3, 2, 4, 4)))
    for padding in ("same", "valid"):
        assert tb.pam_conv2d(x, w, padding=padding).shape == F.conv2d(x, w, padding=padding).shape
    conv = torch.nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect")
    ref = conv(x)
    pconv = tb.PAMConv2d.from_module(conv, tb.PAMConfig("float32", ops={"matmul"}))
    assert (pconv(x) - ref).abs().max() < 0.3 * ref.abs().max()
    with pytest.raises(ValueError, match="padding='same' needs stride 1"):
        tb.pam_conv2d(x, w, stride=2, padding="same")
    with pytest.raises(ValueError, match="groups=3"):
        tb.pam_conv2d(x, w, groups=3)


BIN = {op.name: getattr(emu, op.name) for op in emu.registry.ops(2, differentiable=True)}
UN = {op.name: getattr(emu, op.name) for op in emu.registry.ops(1, differentiable=True)}


@pytest.mark.parametrize("fmt", ["float32", "bf16", "e4m3fn"])
@pytest.mark.parametrize("kind", KINDS)
def test_elementwise_ops_are_emus(fmt, kind, rng):
    c = corner_values(fmt)
    X = np.concatenate([c, rng.standard_normal(200).astype(np.float32) * 3])
    Y = rng.permutation(X)
    D = rng.standard_normal(X.size).astype(np.float32)
    for op, f in BIN.items():
        a, b = t32(X), t32(Y)
        y = getattr(tb, op)(a, b, fmt, backward=kind)
        assert_bits_equal(npy(y), f(X, Y, fmt), X, Y, what=op)
        y.backward(torch.from_numpy(D))
        da, db = getattr(G, op)(X, Y, D, fmt, kind)
        assert_bits_equal(npy(a.grad), da, X, Y, D, what=f"{op} dA {kind}")
        assert_bits_equal(npy(b.grad), db, X, Y, D, what=f"{op} dB {kind}")
    for op, f in UN.items():
        x = t32(X)
        y = getattr(tb, op)(x, fmt, backward=kind)
        assert_bits_equal(npy(y), f(X, fmt), X, what=op)
        y.backward(torch.from_numpy(D))
        assert_bits_equal(npy(x.grad), getattr(G, op)(X, D, fmt, kind), X, D,
                          what=f"{op}' {kind}")


def test_broadcast_gradients_are_reduced(rng):
    X = rng.standard_normal((4, 5)).astype(np.float32)
    S = rng.standard_normal((4, 1)).astype(np.float32)
    x, s = t32(X), t32(S)
    y = tb.pa_div(x, s, "bf16", backward="exact")
    D = rng.standard_normal((4, 5)).astype(np.float32)
    y.backward(torch.from_numpy(D))
    da, db = G.pa_div(X, S, D, "bf16", "exact")
    assert_bits_equal(npy(x.grad), da)
    assert_bits_equal(npy(s.grad), emu.fold_sum(db, 1, keepdims=True))
    z = t32(X)
    tb.pam_mul(z, 0.75, "bf16").sum().backward()            # a Python-number operand
    assert_bits_equal(npy(z.grad), G.pam_mul(X, 0.75, np.ones_like(X), "bf16", "approx")[0])


# --- composites: every PA node is emu's, the sums are emu.fold_sum's ------------------

def log2e(fmt):
    return emu.quantize(np.float32(np.log2(np.e)), fmt)[()]


def shifted_exp(X, fmt):
    """The forward of the composites' exponentials: t = X ·̂ log2e - floor(max), paexp2(t)."""
    y = emu.pam_mul(X, log2e(fmt), fmt)
    t = y - np.floor(y.max(-1, keepdims=True))
    return t, emu.pa_exp2(t, fmt)


def fsum(v):
    """float32 sums over the last axis in the composites' defined order (emu.fold_sum)."""
    return emu.fold_sum(v, -1, keepdims=True)


def test_softmax_is_emus_composition(rng):
    X = rng.standard_normal((6, 11)).astype(np.float32) * 4
    X[0, 3] = -np.inf                                          # a masked logit
    _, e = shifted_exp(X, "bf16")
    want = emu.pa_div(e, fsum(e), "bf16")
    got = tb.pa_softmax(t32(X), -1, "bf16")
    assert_bits_equal(npy(got), want)
    assert got[0, 3] == 0


def test_layer_norm_is_emus_composition(rng):
    X = rng.standard_normal((3, 4, 10)).astype(np.float32) * 2 + 1
    W = rng.standard_normal(10).astype(np.float32)
    B = rng.standard_normal(10).astype(np.float32)
    xc = X - emu.pa_div(fsum(X), np.float32(10))
    var = emu.pa_div(fsum(emu.pam_mul(xc, xc)), np.float32(10))
    want = emu.pam_mul(emu.pa_div(xc, emu.pa_sqrt(var + np.float32(1e-5))), W) + B
    got = tb.pa_layer_norm(t32(X), (10,), t32(W), t32(B), 1e-5)
    assert_bits_equal(npy(got), want)
    ref = F.layer_norm(t32(X), (10,), t32(W), t32(B))
    assert (got - ref).abs().max() < 0.25 * ref.abs().max()


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_is_emus_composition(smoothing, rng):
    Z = rng.standard_normal((7, 5)).astype(np.float32) * 2
    T = rng.integers(0, 5, 7)
    T[2] = -100                                                # ignored
    t, e = shifted_exp(Z, "float32")
    nlogp = emu.pa_div(emu.pa_log2(fsum(e)) - t, log2e("float32"))
    loss = nlogp[np.arange(7), np.where(T < 0, 0, T)]
    if smoothing:
        loss = emu.pam_mul(loss, np.float32(0.9)) + emu.pam_mul(
            emu.fold_sum(nlogp, -1), emu.pa_div(np.float32(0.1), 5.0))
    loss = np.where(T >= 0, loss, np.float32(0))
    want = emu.pa_div(emu.fold_sum(loss), np.float32(6))
    got = tb.pa_cross_entropy(t32(Z), torch.from_numpy(T), label_smoothing=smoothing)
    assert_bits_equal(npy(got), want)
    ref = F.cross_entropy(t32(Z), torch.from_numpy(T), label_smoothing=smoothing)
    assert abs(got.item() - ref.item()) < 0.1 * ref.item()


@pytest.mark.parametrize("kind", KINDS)
def test_cross_entropy_variants_follow_torch(kind, rng):
    """Shapes, reductions, class weights and probability targets as F.cross_entropy
    (PA values are close to, not equal to, the float ones)."""
    z = t32(rng.standard_normal((4, 3, 6)))
    t = torch.from_numpy(rng.integers(0, 3, (4, 6)))
    w = t32(rng.random(3) + 0.5, grad=False)
    p = torch.softmax(t32(rng.standard_normal((4, 3, 6)), grad=False), 1)
    for kw in ({}, {"reduction": "none"}, {"reduction": "sum"}, {"weight": w},
               {"weight": w, "label_smoothing": 0.2}):
        got = tb.pa_cross_entropy(z, t, backward=kind, **kw)
        ref = F.cross_entropy(z, t, **kw)
        assert got.shape == ref.shape
        assert torch.allclose(got, ref, rtol=0.12, atol=0.05), kw
    got = tb.pa_cross_entropy(z, p, label_smoothing=0.1, backward=kind)
    assert torch.allclose(got, F.cross_entropy(z, p, label_smoothing=0.1), rtol=0.12)
    got.backward()
    assert torch.isfinite(z.grad).all()
    with pytest.raises(ValueError, match="outside"):
        tb.pa_cross_entropy(z, t + 5)


def _oracle(op, *args):
    """emu.reference_grad's exact derivative of ``op`` elementwise (bf16 operands)."""
    fn = getattr(RG, op)
    out = [fn(*map(float, v), "bf16", "exact") for v in zip(*np.broadcast_arrays(*args))]
    return np.asarray(out, np.float32)


def test_exact_composite_derivatives_hold_the_shift_constant(rng):
    """The exact derivative of pa_softmax / pa_cross_entropy is the chain of the oracle's
    Table 1 derivatives through their PA graph with the shift k = floor(max(x ·̂ log2e))
    a constant (docs/semantics.md): no gradient flows through the max.  Shapes keep every
    float32 sum of gradients to two terms or one nonzero term, so the bits are defined."""
    c = log2e("bf16")
    # softmax over pairs, objective (p * V).sum()
    X = (rng.standard_normal((40, 2)) * 3).astype(np.float32)
    V = rng.standard_normal((40, 2)).astype(np.float32)
    x = t32(X)
    (tb.pa_softmax(x, -1, "bf16", backward="exact") * torch.from_numpy(V)).sum().backward()
    t, e = shifted_exp(X, "bf16")
    s = np.broadcast_to(fsum(e), e.shape)
    d = _oracle("pa_div", e.ravel(), s.ravel(), V.ravel()).reshape(40, 2, 2)
    de = d[..., 0] + (d[:, 0, 1] + d[:, 1, 1])[:, None]     # δ numerator + δ of the sum
    dt = _oracle("pa_exp2", t.ravel(), de.ravel())
    want = _oracle("pam_mul", X.ravel(), np.full(80, c), dt)[:, 0].reshape(40, 2)
    assert_bits_equal(npy(x.grad), want)
    # cross-entropy over 7 classes, reduction 'sum' (one nonzero -log p gradient per row)
    Z = (rng.standard_normal((30, 7)) * 3).astype(np.float32)
    T = rng.integers(0, 7, 30)
    z = t32(Z)
    tb.pa_cross_entropy(z, torch.from_numpy(T), reduction="sum", fmt="bf16",
                        backward="exact").backward()
    t, e = shifted_exp(Z, "bf16")
    S = fsum(e)
    num = emu.pa_log2(S, "bf16") - t
    dnlogp = np.eye(7, dtype=np.float32)[T]
    dnum = _oracle("pa_div", num.ravel(), np.full(210, c), dnlogp.ravel())[:, 0].reshape(30, 7)
    dS = _oracle("pa_log2", S.ravel(), fsum(dnum).ravel())
    dt = _oracle("pa_exp2", t.ravel(), np.repeat(dS, 7)).reshape(30, 7) + -dnum
    want = _oracle("pam_mul", Z.ravel(), np.full(210, c), dt.ravel())[:, 0].reshape(30, 7)
    assert_bits_equal(npy(z.grad), want)


@pytest.mark.parametrize("op", ["softmax", "layernorm", "loss"])
@pytest.mark.parametrize("kind", KINDS)
def test_composite_gradients_point_the_right_way(op, kind, rng):
    """Backward runs through the graph of PA nodes: both kinds approximate the true
    gradient (exact ones with higher variance, as section 2.7 says)."""
    X = rng.standard_normal((16, 10)).astype(np.float32)
    T = torch.from_numpy(rng.integers(0, 10, 16))
    V = torch.from_numpy(rng.standard_normal((16, 10)).astype(np.float32))
    fns = {"softmax": (lambda x: (tb.pa_softmax(x, backward=kind) * V).sum(),
                       lambda x: (torch.softmax(x, -1) * V).sum()),
           "layernorm": (lambda x: (tb.pa_layer_norm(x, (10,), backward=kind) * V).sum(),
                         lambda x: (F.layer_norm(x, (10,)) * V).sum()),
           "loss": (lambda x: tb.pa_cross_entropy(x, T, label_smoothing=0.1, backward=kind),
                    lambda x: F.cross_entropy(x, T, label_smoothing=0.1))}
    pa, ref = fns[op]
    x1, x2 = t32(X), t32(X)
    pa(x1).backward()
    ref(x2).backward()
    cos = F.cosine_similarity(x1.grad.flatten(), x2.grad.flatten(), 0)
    assert cos > (0.9 if kind == "approx" else 0.6), cos


# --- every float32 sum of torch_bridge is emu.fold_sum's left fold ---------------------

def left_fold(a, axes):
    """The sum of ``a`` over ``axes``, one float32 add at a time in C order of the axes."""
    a = np.asarray(a, np.float32)
    axes = sorted(ax % a.ndim for ax in axes)
    kept = [d for d in range(a.ndim) if d not in axes]
    t = np.transpose(a, axes + kept).reshape(-1, *(a.shape[d] for d in kept))
    s = t[0].copy()
    for j in range(1, t.shape[0]):
        s = s + t[j]
    return s


def test_bridge_sums_are_left_folds(rng):
    """Bias gradients (linear, conv2d), a broadcast operand's gradient (pam_mul), pa_mean,
    a loss reduction and a norm's weight and bias gradients are the left fold in index
    order (docs/semantics.md §6), on graph and fused paths, for inputs where torch's own
    sum gives other bits (so the test can tell them apart)."""
    from torch_bridge import _compose, elementwise as PE, losses as PL

    def wide(*shape):           # a wide exponent range: the association shows in the bits
        return (rng.standard_normal(shape) * 2.0 ** rng.integers(-10, 11, shape)).astype(
            np.float32)

    def check(got, terms, axes, what, shape=None, then=lambda v: v):
        """``got`` is ``then`` of the left fold of ``terms`` over ``axes``, which torch's
        sum does not give."""
        def done(v):
            v = np.asarray(v, np.float32)
            return np.asarray(then(v.reshape(shape) if shape is not None else v), np.float32)
        want = done(left_fold(terms, axes))
        theirs = done(torch.from_numpy(terms).sum(tuple(axes)).numpy())
        assert not np.array_equal(theirs.view(np.int32), want.view(np.int32)), what
        got = npy(got)
        assert got.shape == want.shape, what
        assert np.array_equal(got.view(np.int32), want.view(np.int32)), what

    for fused in (True, False):
        with _compose.use(fused):
            x, w, b = t32(rng.standard_normal((2048, 4))), t32(rng.standard_normal((3, 4))), \
                t32(rng.standard_normal(3))
            D = wide(2048, 3)
            tb.pam_linear(x, w, b, "bf16").backward(torch.from_numpy(D))
            check(b.grad, D, (0,), f"linear bias, fused={fused}")
            X, W, B = (rng.standard_normal(s).astype(np.float32) for s in ((2048, 4), 4, 4))
            x, w, b = t32(X), t32(W), t32(B)
            D = wide(2048, 4)
            tb.pa_layer_norm(x, 4, w, b).backward(torch.from_numpy(D))
            check(b.grad, D, (0,), f"layer norm bias, fused={fused}")
            Y = npy(tb.pa_layer_norm(t32(X, grad=False), 4))      # before the gain
            dw = G.pam_mul(Y, np.broadcast_to(W, Y.shape), D, "float32", "approx")[1]
            check(w.grad, dw, (0,), f"layer norm weight, fused={fused}")
    x, w, b = t32(rng.standard_normal((8, 2, 16, 16))), t32(rng.standard_normal((3, 2, 3, 3))), \
        t32(rng.standard_normal(3))
    D = wide(8, 3, 16, 16)
    tb.pam_conv2d(x, w, b, padding=1, fmt="bf16").backward(torch.from_numpy(D))
    check(b.grad, D, (0, 2, 3), "conv2d bias")
    A, S = rng.standard_normal((2048, 3)).astype(np.float32), \
        rng.standard_normal((1, 3)).astype(np.float32)
    a, s = t32(A), t32(S)
    D = wide(2048, 3)
    tb.pam_mul(a, s, "bf16").backward(torch.from_numpy(D))
    ds = G.pam_mul(A, np.broadcast_to(S, A.shape), D, "bf16", "approx")[1]
    check(s.grad, ds, (0,), "pam_mul's broadcast operand", (1, 3))
    X = wide(4096)
    check(PE.pa_mean(t32(X)), X, (0,), "pa_mean",
          then=lambda v: emu.pa_div(v, np.float32(4096)))
    X = wide(2048, 3)
    check(PE.pa_mean(t32(X), 0), X, (0,), "pa_mean over dim 0",
          then=lambda v: emu.pa_div(v, np.float32(2048)))
    Y, T = wide(64, 64), wide(64, 64)
    terms = emu.pam_mul(Y - T, Y - T, "float32")
    check(PL.pa_mse_loss(t32(Y), t32(T), reduction="sum"), terms, (0, 1), "mse_loss sum")
    check(PL.pa_mse_loss(t32(Y), t32(T)), terms, (0, 1), "mse_loss mean",
          then=lambda v: emu.pa_div(v, np.float32(4096)))


@pytest.mark.parametrize("path", ["kernel", "slices"])
def test_conv2d_input_gradient_adds_patches_in_kernel_order(path, rng, monkeypatch):
    """conv2d's im2col backward (functional._Unfold) adds each input element's patch
    gradients into a zero image one kernel offset at a time, in row-major offset order
    (docs/semantics.md §6): the reference adds them one float32 add at a time; torch's CPU
    col2im gives the same bits.  Both implementations: the CPU's Numba kernel, and the
    slice adds that replace CUDA's col2im on the GPU (taken here under a monkeypatched
    backend check)."""
    from torch_bridge import functional as PF
    from torch_bridge.functional import _Unfold
    if path == "slices":
        monkeypatch.setattr(PF, "cuda_backend_active", lambda: True)
    for k, d, p, st in [((3, 3), (1, 1), (1, 1), (1, 1)), ((3, 2), (2, 1), (2, 0), (2, 3)),
                        ((5, 5), (1, 1), (2, 2), (1, 1)), ((4, 3), (1, 2), (1, 3), (3, 1))]:
        n, c, h, w = 2, 3, 11, 13
        X = (rng.standard_normal((n, c, h, w)) * 2.0 ** rng.integers(-20, 21, (n, c, h, w))
             ).astype(np.float32)
        x = t32(X)
        ho = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) // st[0] + 1
        wo = (w + 2 * p[1] - d[1] * (k[1] - 1) - 1) // st[1] + 1
        y = _Unfold.apply(x, k, d, p, st, (ho, wo))
        assert torch.equal(y, F.unfold(x, k, dilation=d, padding=p, stride=st))
        Gc = (rng.standard_normal(y.shape) * 2.0 ** rng.integers(-20, 21, y.shape)).astype(
            np.float32)
        got, = torch.autograd.grad(y, x, torch.from_numpy(Gc))
        ref = np.zeros((n, c, h + 2 * p[0], w + 2 * p[1]), np.float32)
        g6 = Gc.reshape(n, c, k[0], k[1], ho, wo)
        for i in range(k[0]):
            for j in range(k[1]):
                for a in range(ho):
                    for b in range(wo):
                        r, q = i * d[0] + a * st[0], j * d[1] + b * st[1]
                        ref[:, :, r, q] = ref[:, :, r, q] + g6[:, :, i, j, a, b]
        ref = ref[:, :, p[0]:p[0] + h, p[1]:p[1] + w]
        assert_bits_equal(npy(got), ref)
        x2 = t32(X)
        theirs, = torch.autograd.grad(F.unfold(x2, k, dilation=d, padding=p, stride=st), x2,
                                      torch.from_numpy(Gc))
        assert_bits_equal(npy(got), npy(theirs))


# --- dtypes, layouts, modes of autograd ---------------------------------------------

def test_bfloat16_float64_and_non_contiguous_inputs(rng):
    A = rng.standard_normal((8, 6)).astype(np.float32)
    B = rng.standard_normal((5, 8)).astype(np.float32)
    a = torch.tensor(A, dtype=torch.bfloat16, requires_grad=True)
    b = torch.tensor(B).t().requires_grad_()                       # non-contiguous (8, 5)
    assert not b.is_contiguous()
    y = tb.pam_matmul(a.t(), b, "bf16")
    assert y.dtype == torch.float32                                # promoted, as torch
    assert_bits_equal(npy(y), emu.pam_matmul(npy(a).T, B.T, "bf16"))
    y.sum().backward()
    assert a.grad.dtype == torch.bfloat16 and a.grad.shape == a.shape
    y16 = tb.pam_matmul(a.t(), b.detach().bfloat16(), "bf16")
    assert y16.dtype == torch.bfloat16
    d = torch.tensor(A, dtype=torch.float64)
    assert tb.pa_exp(d).dtype == torch.float64
    assert_bits_equal(npy(tb.pa_exp(d)), emu.pa_exp(A))


def test_zero_size_batches(rng):
    w = t32(rng.standard_normal((4, 3)))
    x = t32(np.zeros((0, 3)))
    y = tb.pam_linear(x, w, None, "bf16")
    assert y.shape == (0, 4)
    y.sum().backward()
    assert torch.equal(w.grad, torch.zeros(4, 3))
    img = t32(np.zeros((0, 2, 5, 5)))
    assert tb.pam_conv2d(img, t32(rng.standard_normal((3, 2, 3, 3)))).shape == (0, 3, 3, 3)
    assert tb.pa_softmax(t32(np.zeros((0, 7)))).shape == (0, 7)
    assert tb.pa_layer_norm(t32(np.zeros((0, 7))), (7,)).shape == (0, 7)


def test_no_grad_and_checkpointing_with_stochastic_rounding(rng):
    X = rng.standard_normal((5, 16)).astype(np.float32)
    W = rng.standard_normal((16, 16)).astype(np.float32)
    cfg = tb.PAMConfig("e8m3", rounding="stochastic")
    with torch.no_grad():
        y = tb.functional.linear(t32(X), t32(W), None, cfg)
    assert not y.requires_grad

    def block(x, w):
        return tb.functional.softmax(tb.functional.linear(x, w, None, cfg), -1, cfg)
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(7)
        x, w = t32(X), t32(W)
        out = torch.utils.checkpoint.checkpoint(block, x, w, use_reentrant=False) if ckpt \
            else block(x, w)
        out.square().sum().backward()
        grads.append((out.detach(), w.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_stochastic_rounding_draws_fresh_streams(rng):
    A = t32(rng.standard_normal((16, 32)), grad=False)
    B = t32(rng.standard_normal((32, 8)), grad=False)
    kw = dict(rounding="stochastic")
    torch.manual_seed(1)
    y1, y2 = tb.pam_matmul(A, B, "e8m2", **kw), tb.pam_matmul(A, B, "e8m2", **kw)
    torch.manual_seed(1)
    y3 = tb.pam_matmul(A, B, "e8m2", **kw)
    assert not torch.equal(y1, y2) and torch.equal(y1, y3)
    # every operand lands on one of its two neighbours on the e8m2 grid
    mag = np.abs(npy(A))
    lo = emu.quantize(mag, "e8m2", "toward_zero")
    hi = lo + np.exp2(np.floor(np.log2(lo)) - 2).astype(np.float32)
    got = np.abs(npy(tb.pam_mul(A, torch.ones(()), "e8m2", **kw)))
    assert np.all((got == lo) | (got == hi)) and (got == hi).any() and (got != mag).any()


def test_bad_arguments():
    x = torch.ones(2, 3)
    with pytest.raises(ValueError, match="fmt='bf17' is not a format"):
        tb.pam_matmul(x, x.t(), "bf17")
    with pytest.raises(ValueError, match="backward='mimic'"):
        tb.pam_matmul(x, x.t(), backward="mimic")
    with pytest.raises(TypeError, match="floating dtype"):
        tb.pam_matmul(x.long(), x.t())
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        tb.pam_matmul(np.ones((2, 2)), x)
    with pytest.raises(ValueError, match="contracted dimensions differ"):
        tb.pam_matmul(x, x)
    with pytest.raises(ValueError, match="does not fit weight.shape"):
        tb.pam_linear(x, torch.ones(4, 5))
    with pytest.raises(ValueError, match="normalized_shape"):
        tb.pa_layer_norm(x, (4,))
    with pytest.raises(ValueError, match="rounding='up'"):
        tb.pa_exp(x, rounding="up")

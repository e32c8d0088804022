"""The elementwise PA composites and the 'elementwise' op group of pam_mode."""
import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import emu
import emu.grad as G
import torch_bridge as tb
import torch_bridge.elementwise as PE
from torch_bridge import composites as D
from conftest import assert_bits_equal

CFG = tb.PAMConfig("bf16")
f32 = emu.float32


def npy(t):
    return t.detach().float().numpy()


@pytest.fixture
def x():
    torch.manual_seed(0)
    v = torch.randn(5, 7) * 3
    v[0, :3] = torch.tensor([0.0, -30.0, 30.0])
    return v


#: log2(e) less its powers of two 1 + 2^-1 - 2^-4 + 2^-8 (composites.exp_neg_parts)
LOG2E_R = np.float32(np.log2(np.e) - (1 + 2.0 ** -1 - 2.0 ** -4 + 2.0 ** -8))


def _exp_neg_parts(a):
    """(k, m): e^-a = paexp2(k) ·̂ m, k = floor(y), m = paexp2(y - k), y = -a·log2(e) as
    float32 sums of exact power-of-two PAMs and one PAM by the remainder."""
    a = np.minimum(a, np.float32(104))
    y = -((((a + emu.pam_mul(a, np.float32(0.5), f32)) - emu.pam_mul(a, np.float32(2 ** -4), f32))
           + emu.pam_mul(a, np.float32(2 ** -8), f32)) + emu.pam_mul(a, LOG2E_R, f32))
    k = np.floor(y)
    return k, emu.pa_exp2(y - k, f32)


def _exp_neg(a):
    k, m = _exp_neg_parts(a)
    return emu.pam_mul(emu.pa_exp2(k, f32), m, f32)


def _logistic(num, neg, k, m):
    """num·σ from e = 2^k ·̂ m: num ÷̂ (1 + e) where not ``neg``, (num ·̂ e) ÷̂ (1 + e)
    there, the product as exact power-of-two scalings of max(num, -104) ·̂ m."""
    e = emu.pam_mul(emu.pa_exp2(k, f32), m, f32)
    h = np.floor(emu.pam_mul(k, np.float32(0.5), f32))
    low = np.where(neg, np.maximum(num, np.float32(-104)), np.float32(0))
    p = emu.pam_mul(emu.pam_mul(emu.pam_mul(low, m, f32), emu.pa_exp2(h, f32), f32),
                    emu.pa_exp2(k - h, f32), f32)
    return emu.pa_div(np.where(neg, p, num), e + np.float32(1), f32)


def _times_sigmoid(num, u):
    return _logistic(num, u < 0, *_exp_neg_parts(np.abs(u)))


def _lead(v):
    """v's leading power of two (mantissa bits cleared)."""
    return (np.asarray(v, np.float32).view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)


def _times(v, d):
    """v·c as PAMs by c's powers of two (v itself for 1), added in order, then v ·̂ rest."""
    acc = None
    for p in d.pieces:
        t = v if abs(p) == 1 else emu.pam_mul(v, np.float32(abs(p)), f32)
        acc = t if acc is None else acc + t if p > 0 else acc - t
    return acc + emu.pam_mul(v, np.float32(d.rest), f32) if d.rest else acc


def _times_wide(v, d):
    h = emu.pam_mul(v, np.float32(1), f32)
    return _times(h, d) + emu.pam_mul(v - h, np.float32(sum(d.pieces) + d.rest), f32)


def _product(x, y, steps):
    """Babić's iteration: PAM(x, y) errs by dx·dy (docs/semantics.md §8)."""
    p = emu.pam_mul(x, y, f32)
    if steps == 0:
        return p
    px, py = _lead(x), _lead(y)
    q = emu.pam_mul(px, py, f32)
    low = p < q + q
    dx = np.where(low, x - px, (px + px) - x)
    dy = np.where(low, y - py, (py + py) - y)
    return p + _product(dx, dy, steps - 1)


def test_composites_are_their_emu_definitions(x):
    X = npy(x)
    one = np.float32(1)
    assert_bits_equal(npy(PE.pa_sigmoid(x)), _times_sigmoid(one, X))
    a = np.abs(X)
    s = np.minimum(a, one)
    s2 = emu.pam_mul(s, s, f32)
    d2 = s2 + s2
    small = emu.pa_div(emu.pam_mul(s, s2 + np.float32(15), f32), d2 + d2 + d2 + np.float32(15),
                       f32)
    e = _exp_neg(a + a)
    t = np.where(a < 1, small, one - emu.pa_div(e + e, e + one, f32))
    assert_bits_equal(npy(PE.pa_tanh(x)), np.where(X < 0, -t, t))
    assert_bits_equal(npy(PE.pa_silu(x)), _times_sigmoid(X, X))
    a = emu.pam_mul(np.minimum(np.abs(X), np.float32(12)), one, f32)      # tanh form
    w = _times_wide(_product(a, a, 3), D.GELU_B) + np.float32(D.GELU_A)
    wh = emu.pam_mul(w, one, f32)
    y = -(_product(a, wh, 3) + emu.pam_mul(a, w - wh, f32))
    k = np.floor(y)
    assert_bits_equal(npy(PE.pa_gelu(x, "tanh")),
                      _logistic(X, X < 0, k, emu.pa_exp2(y - k, f32)))
    a = emu.pam_mul(np.minimum(np.abs(X), np.float32(16)), one, f32)      # erf form
    s = _product(a, a, 3)
    den = (a + emu.pam_mul(a, np.float32(0.25), f32) + one) + _times_wide(s, D.ERF_Q2)
    num = emu.pam_mul(np.where(X < 0, a, one), np.float32(0.5), f32) + \
        _times_wide(np.where(X < 0, s, a), D.ERF_P)
    y = -_times_wide(s, D.LOG2E_HALF)
    k = np.floor(y)
    h = emu.pam_mul(emu.pa_div(num, den, f32),
                    emu.pam_mul(emu.pa_exp2(k, f32), emu.pa_exp2(y - k, f32), f32), f32)
    assert_bits_equal(npy(PE.pa_gelu(x)), np.where(X < 0, -h, emu.pam_mul(X, one - h, f32)))
    cube = emu.pam_mul(emu.pam_mul(X, X, f32), X, f32)
    assert_bits_equal(npy(PE.pa_pow(x, 3)), cube)
    assert_bits_equal(npy(PE.pa_pow(x, -2)), emu.pa_div(one, emu.pam_mul(X, X, f32), f32))
    ax = np.abs(X)
    assert_bits_equal(npy(PE.pa_pow(x.abs(), 0.5)), emu.pa_sqrt(ax, f32))
    assert_bits_equal(npy(PE.pa_pow(x.abs(), 1.5)),
                      emu.pa_exp2(emu.pam_mul(emu.pa_log2(ax, f32), np.float32(1.5), f32), f32))
    assert_bits_equal(npy(PE.pa_rsqrt(x.abs())), emu.pa_div(one, emu.pa_sqrt(ax, f32), f32))
    e = _exp_neg(np.abs(X))                               # log(1 + e) = e(6 + e)/(6 + 4e)
    sp = np.where(X < 0, 0, X) + emu.pa_div(emu.pam_mul(e, e + np.float32(6), f32),
                                            (e + e) + (e + e) + np.float32(6), f32)
    assert_bits_equal(npy(PE.pa_softplus(x)), np.where(X > 20, X, sp))
    row_sum = emu.fold_sum(X, -1, keepdims=True)
    assert_bits_equal(npy(PE.pa_mean(x, -1, True)), emu.pa_div(row_sum, np.float32(7), f32))
    w = torch.randn(7)
    sq = emu.fold_sum(emu.pam_mul(X, X, f32), -1, keepdims=True)
    ms = emu.pa_div(sq, np.float32(7), f32)
    ref = emu.pam_mul(emu.pa_div(X, emu.pa_sqrt(ms + np.float32(1e-6), f32), f32), npy(w), f32)
    assert_bits_equal(npy(PE.pa_rms_norm(x, 7, w, 1e-6)), ref)
    assert torch.isfinite(PE.pa_tanh(x)).all() and PE.pa_tanh(x)[0, 1] == -1


def test_pam_mode_routes_elementwise_calls(x):
    y = torch.rand(5, 7) + 0.5
    mask = (torch.rand(5, 7) > 0.5).long()
    norm = nn.RMSNorm(7, eps=1e-5)
    with tb.pam_mode(CFG):
        got = [x * y, torch.mul(x, 3.0), 2.5 * x, x / y, 1 / y, x ** 2, 2 ** x, y.sqrt(),
               torch.rsqrt(y), torch.exp(x), y.log(), torch.sigmoid(x), x.tanh(), F.gelu(x),
               F.gelu(x, approximate="tanh"), F.silu(x), F.softplus(x), x.mean(-1),
               torch.mean(x), F.rms_norm(x, (7,)), norm(x), mask * x, x.clone().mul_(y)]
    kw = {}
    want = [tb.pam_mul(x, y), tb.pam_mul(x, 3.0), tb.pam_mul(x, 2.5), tb.pa_div(x, y),
            tb.pa_div(1.0, y), tb.pam_mul(x, x), tb.pa_exp2(x), tb.pa_sqrt(y), PE.pa_rsqrt(y),
            tb.pa_exp(x), tb.pa_log(y), PE.pa_sigmoid(x), PE.pa_tanh(x), PE.pa_gelu(x),
            PE.pa_gelu(x, "tanh"), PE.pa_silu(x), PE.pa_softplus(x), PE.pa_mean(x, -1),
            PE.pa_mean(x), PE.pa_rms_norm(x, 7, **kw), PE.pa_rms_norm(x, 7, norm.weight, 1e-5),
            tb.pam_mul(mask.float(), x), tb.pam_mul(x, y)]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and torch.equal(g, w), i
    off = tb.PAMConfig("bf16", ops=set(tb.OP_GROUPS) - {"elementwise"})
    with tb.pam_mode(off):
        assert torch.equal(x * y, torch.mul(x, y)) and torch.equal(F.gelu(x), F.gelu(x))
    with tb.pam_mode(CFG):                  # dtypes follow torch's promotion
        assert (x.bfloat16() * 2.0).dtype == torch.bfloat16
        assert (x.bfloat16() * torch.tensor(2.0)).dtype == torch.bfloat16
        assert (torch.arange(3) * 2).dtype == torch.long          # integers: native
        assert torch.equal(torch.div(x, 2, rounding_mode="floor"), torch.floor(x / 2))


@pytest.mark.parametrize("kind", ["approx", "exact"])
def test_elementwise_backward(x, kind):
    cfg = tb.PAMConfig("bf16", backward=kind)
    xs = x.clone().requires_grad_()
    with tb.pam_mode(cfg):
        loss = (F.gelu(xs) * torch.sigmoid(xs) + torch.tanh(xs) / (1 + xs ** 2)).sum()
    loss.backward()
    assert torch.isfinite(xs.grad).all()
    ref = x.clone().requires_grad_()
    (F.gelu(ref) * torch.sigmoid(ref) + torch.tanh(ref) / (1 + ref ** 2)).sum().backward()
    assert not torch.equal(xs.grad, ref.grad)
    assert F.cosine_similarity(xs.grad.flatten(), ref.grad.flatten(), 0) > 0.9


def test_pow_and_gelu_arguments(x):
    with pytest.raises(TypeError, match="exponent must be a number"):
        PE.pa_pow(x, torch.tensor(2.0))
    with pytest.raises(ValueError, match="approximate='fast'"):
        PE.pa_gelu(x, "fast")
    with pytest.raises(ValueError, match="rms_norm: normalized_shape"):
        PE.pa_rms_norm(x, 5)
    assert torch.equal(PE.pa_pow(x, 0), torch.ones_like(x))


# --- products (einsum, conv1d) and norms (batch, group, instance) ------------------------

def test_einsum_is_one_pam_matmul_per_pair():
    from torch_bridge.contract import pam_einsum
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 4, 5), torch.randn(2, 6, 4, 5)
    attn = pam_einsum("bqhd,bkhd->bhqk", q, k, fmt="bf16")
    assert torch.equal(attn, tb.pam_matmul(q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1), "bf16"))
    a, b, c = torch.randn(2, 3, 4), torch.randn(4, 5), torch.randn(2, 5, 6)
    for eq, ops in (("bij,jk,bkl->bli", (a, b, c)), ("bij,bij->b", (a, a)), ("i,j", (b[0], b[1])),
                    ("bij,k->bik", (a, b[:, 0]))):
        ref = torch.einsum(eq, *ops)
        got = pam_einsum(eq, *ops)
        assert got.shape == ref.shape
        assert F.cosine_similarity(got.flatten(), ref.flatten(), 0) > 0.99
    assert pam_einsum("...ij,jk", a, b) is None and pam_einsum("ii->i", a[0, :3, :3]) is None
    with pytest.raises(ValueError, match="has 2 operand"):
        pam_einsum("ij,jk", a)
    with tb.pam_mode(CFG):
        assert torch.equal(torch.einsum("bqhd,bkhd->bhqk", q, k), attn)
        assert torch.equal(torch.einsum("ii->i", a[0, :3, :3]), a[0, :3, :3].diagonal())


def test_conv1d_is_a_height_one_conv2d():
    from torch_bridge.functional import pam_conv1d
    torch.manual_seed(0)
    x, w, bias = torch.randn(2, 4, 10), torch.randn(6, 2, 3), torch.randn(6)
    for kw in ({"groups": 2}, {"stride": 2, "padding": 1, "groups": 2},
               {"padding": "same", "dilation": 2, "groups": 2}):
        ref = F.conv1d(x, w, bias, **kw)
        got = pam_conv1d(x, w, bias, fmt="bf16", **kw)
        assert got.shape == ref.shape
        assert F.cosine_similarity(got.flatten(), ref.flatten(), 0) > 0.98
    with tb.pam_mode(CFG):
        assert torch.equal(nn.functional.conv1d(x, w, bias, groups=2),
                           pam_conv1d(x, w, bias, groups=2, fmt="bf16"))
        assert pam_conv1d(x[0], w, None, groups=2, fmt="bf16").shape == (6, 8)


def _fold(terms, shape):
    """emu's PAM matmul fold: float32 accumulation of the products in order."""
    acc = np.zeros(shape, np.float32)
    for t in terms:
        acc = acc + t
    return acc


def test_conv3d_is_the_pam_fold_over_the_kernel():
    """Each output folds over (channel, depth, row, column) of the kernel."""
    from torch_bridge.functional import pam_conv3d
    torch.manual_seed(0)
    x, w = torch.randn(2, 4, 5, 6, 5), torch.randn(6, 2, 2, 3, 2)
    s, p, d, groups = (2, 1, 1), (1, 0, 1), (1, 2, 1), 2
    y = pam_conv3d(x, w, None, s, p, d, groups, "bf16")
    assert y.shape == F.conv3d(x, w, None, s, p, d, groups).shape
    X = np.pad(npy(x), ((0, 0), (0, 0)) + tuple((q, q) for q in p))
    W, out = npy(w), y.shape[2:]
    for oc in range(6):
        g = oc // 3
        terms = (emu.pam_mul(W[oc, ci, i, j, k], X[:, g * 2 + ci,
                                                    i * d[0]: i * d[0] + s[0] * out[0]: s[0],
                                                    j * d[1]: j * d[1] + s[1] * out[1]: s[1],
                                                    k * d[2]: k * d[2] + s[2] * out[2]: s[2]],
                             "bf16")
                 for ci in range(2) for i in range(2) for j in range(3) for k in range(2))
        assert_bits_equal(npy(y[:, oc]), _fold(terms, (2, *out)))
    with tb.pam_mode(CFG):
        assert torch.equal(nn.functional.conv3d(x, w, None, s, p, d, groups), y)


@pytest.mark.parametrize("kw", [{}, {"stride": 2, "padding": 1, "output_padding": 1},
                                {"stride": (3, 2), "dilation": 2, "padding": (2, 0),
                                 "output_padding": (1, 0)}])
def test_conv_transpose_folds_over_the_flipped_kernel(kw):
    """out[z] folds over (input channel, kernel position from the last) of the terms
    w[c, o, i] ·̂ x[c, y] with y·s - p + i·d = z (the stuffed zeros add nothing)."""
    from torch_bridge.functional import pam_conv_transpose
    torch.manual_seed(0)
    x, w = torch.randn(2, 4, 4, 3), torch.randn(4, 3, 3, 2)
    y = pam_conv_transpose(x, w, None, groups=2, fmt="bf16", **kw)
    assert y.shape == F.conv_transpose2d(x, w, None, groups=2, **kw).shape
    s, p, d = (tb.functional.int_tuple("", kw.get(a, dflt), 2, 0) for a, dflt in
               (("stride", 1), ("padding", 0), ("dilation", 1)))
    X, W = npy(x), npy(w)
    for oc in range(6):
        g, o = divmod(oc, 3)
        terms = []
        for ci in range(2):
            for i in reversed(range(3)):
                for j in reversed(range(2)):
                    t = np.zeros((2, *y.shape[2:]), np.float32)
                    zy, zx = np.arange(4) * s[0] - p[0] + i * d[0], \
                        np.arange(3) * s[1] - p[1] + j * d[1]
                    oky, okx = (zy >= 0) & (zy < y.shape[2]), (zx >= 0) & (zx < y.shape[3])
                    prod = emu.pam_mul(W[g * 2 + ci, o, i, j], X[:, g * 2 + ci], "bf16")
                    t[:, zy[oky][:, None], zx[okx][None]] = prod[:, oky][:, :, okx]
                    terms.append(t)
        assert np.array_equal(npy(y[:, oc]), _fold(terms, t.shape))      # ±0 alike
    with tb.pam_mode(CFG):
        assert torch.equal(F.conv_transpose2d(x, w, None, groups=2, **kw), y)


def _native_window_sums(x, nd, kw):
    """torch's window sums (divisor 1); a 1-D pool as a height-1 2-D one."""
    if nd > 1:
        return getattr(F, f"avg_pool{nd}d")(x, **kw, divisor_override=1)
    kw2 = {k: (1, *v) if k == "kernel_size" else (1 if k == "stride" else 0, v)
           if k in ("stride", "padding") else v for k, v in kw.items()}
    return F.avg_pool2d(x[:, :, None], **kw2, divisor_override=1)[:, :, 0]


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_average_pooling_is_the_window_sum_pa_divided(nd):
    """Integer inputs make the float32 window sums exact: pooling is then pa_div of
    torch's sums by torch's window sizes, for every padding and ceil mode."""
    from torch_bridge.contract import pa_adaptive_avg_pool, pa_avg_pool
    torch.manual_seed(0)
    x = torch.randint(1, 9, (2, 3) + (7,) * nd).float()
    for kw in ({}, {"stride": 2, "padding": 1}, {"stride": 2, "padding": 1, "ceil_mode": True,
                                                 "count_include_pad": False}):
        kw = dict(kernel_size=(3,) * nd, **kw)
        y = pa_avg_pool(x, fmt="bf16", **kw)
        native = getattr(F, f"avg_pool{nd}d")(x, **kw)
        sums = _native_window_sums(x, nd, kw)
        assert torch.equal(y, tb.pa_div(sums, torch.round(sums / native), "bf16"))
    for m in (1, 3, 7):
        y = pa_adaptive_avg_pool(x, (m,) * nd, fmt="bf16")
        native = getattr(F, f"adaptive_avg_pool{nd}d")(x, m)
        size = [-(-(i + 1) * 7 // m) - i * 7 // m for i in range(m)]
        size = torch.tensor(functools.reduce(np.multiply, np.ix_(*[size] * nd)),
                            dtype=torch.float32)
        assert torch.equal(y, tb.pa_div(torch.round(native * size), size, "bf16")), m
    with tb.pam_mode(CFG):                  # group 'elementwise', in pa_fmt (float32)
        y, z = getattr(F, f"avg_pool{nd}d")(x, 3), getattr(nn, f"AdaptiveAvgPool{nd}d")(3)(x)
    assert torch.equal(y, pa_avg_pool(x, (3,) * nd))
    assert torch.equal(z, pa_adaptive_avg_pool(x, (3,) * nd))


@pytest.mark.parametrize("call,match", [
    (lambda x, w: tb.pam_conv2d(x, w, stride=0), r"conv2d: stride=0; expected an int >= 1"),
    (lambda x, w: tb.pam_conv2d(x, w, dilation=(1, 0)), r"dilation=\(1, 0\)"),
    (lambda x, w: tb.pam_conv2d(x, w, padding=-1), r"padding=-1; expected an int >= 0"),
    (lambda x, w: tb.pam_conv2d(x, w, padding="full"), r"padding='full'"),
    (lambda x, w: tb.pam_conv2d(x, w, groups=0), r"groups=0; expected an int >= 1"),
    (lambda x, w: tb.functional.pam_conv1d(x[0], w[..., 0], stride=(1, 1)), r"stride=\(1, 1\)"),
    (lambda x, w: tb.functional.pam_conv3d(x[None], w[None], stride=2, padding="same"),
     r"padding='same' needs stride 1"),
    (lambda x, w: tb.functional.pam_conv_transpose(x, w, stride=2, output_padding=2),
     r"output_padding=\(2, 2\) must be smaller than max\(stride, dilation\)"),
    (lambda x, w: tb.functional.pam_conv_transpose(x, w, padding="same"), r"padding='same'"),
    (lambda x, w: tb.contract.pa_avg_pool(x, (2, 0)), r"kernel_size=\(2, 0\)"),
    (lambda x, w: tb.contract.pa_avg_pool(x, (2, 2), stride=0), r"stride=0"),
    (lambda x, w: tb.contract.pa_avg_pool(x, (2, 2), padding=2), r"at most half"),
    (lambda x, w: tb.contract.pa_adaptive_avg_pool(x, (0, 2)), r"output_size=\(0, 2\)"),
])
def test_conv_and_pool_arguments_fail_before_any_work(call, match):
    x, w = torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3)
    with pytest.raises(ValueError, match=match):
        call(x, w)


def test_batch_norm_train_and_eval():
    from torch_bridge.norms import pa_batch_norm
    torch.manual_seed(0)
    bn, x = nn.BatchNorm2d(3), torch.randn(4, 3, 5, 5)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
    ref = bn(x)
    native_stats = bn.running_mean.clone(), bn.running_var.clone()
    bn.reset_running_stats()
    with tb.pam_mode(CFG):
        y = bn(x)
    rm, rv = torch.zeros(3), torch.ones(3)
    assert torch.equal(y, pa_batch_norm(x, rm, rv, bn.weight, bn.bias, True, 0.1, 1e-5))
    assert torch.equal(bn.running_mean, rm) and torch.equal(bn.running_var, rv)
    assert torch.allclose(rm, native_stats[0], atol=0.01) and torch.allclose(rv, native_stats[1],
                                                                             atol=0.02)
    assert F.cosine_similarity(y.flatten(), ref.flatten(), 0) > 0.99
    bn.eval()
    with tb.pam_mode(CFG):
        y = bn(x)
    sh = (1, 3, 1, 1)
    want = tb.pam_mul(tb.pa_div(x - rm.reshape(sh), tb.pa_sqrt(rv.reshape(sh) + 1e-5)),
                      bn.weight.reshape(sh)) + bn.bias.reshape(sh)
    assert torch.equal(y, want)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        pa_batch_norm(x[:1, :, :1, :1], rm, rv, training=True)


def test_group_and_instance_norm_are_layer_norms_of_groups():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 3, 3)
    gn, inorm = nn.GroupNorm(2, 4), nn.InstanceNorm2d(4, affine=True)
    with tb.pam_mode(CFG):
        g, i = gn(x), inorm(x)
    sh = (1, 4, 1, 1)
    want = tb.pa_layer_norm(x.reshape(2, 2, -1), 18).reshape(x.shape)
    assert torch.equal(g, tb.pam_mul(want, gn.weight.reshape(sh)) + gn.bias.reshape(sh))
    want = tb.pa_layer_norm(x.reshape(2, 4, -1), 9).reshape(x.shape)
    assert torch.equal(i, tb.pam_mul(want, inorm.weight.reshape(sh)) + inorm.bias.reshape(sh))


@pytest.mark.parametrize("cls,mode,kw", [
    (nn.GRU, "gru", {}), (nn.LSTM, "lstm", {"num_layers": 2, "bidirectional": True,
                                             "batch_first": True}),
    (nn.RNN, "rnn_tanh", {"num_layers": 2}), (nn.RNN, "rnn_relu", {"nonlinearity": "relu",
                                                                   "bias": False})])
def test_recurrent_layers(cls, mode, kw):
    """The cells' structure: with both groups off, pa_recurrent is torch's layer up to
    float rounding; under pam_mode the layer is pa_recurrent with the config."""
    from torch_bridge.recurrent import pa_recurrent
    torch.manual_seed(0)
    m, x = cls(6, 5, **kw), torch.randn(3, 4, 6, requires_grad=True)
    ref = m(x)
    h0 = torch.zeros(m.num_layers * (2 if m.bidirectional else 1), 3 if m.batch_first else 4, 5)
    hx = (h0, h0) if mode == "lstm" else h0
    args = (mode, x, hx, m._flat_weights, m.bias, m.num_layers, 0.0, False, m.bidirectional,
            m.batch_first)
    off = pa_recurrent(*args, tb.PAMConfig("bf16", ops={"softmax"}))
    assert torch.allclose(off[0], ref[0], atol=1e-6, rtol=0)
    with tb.pam_mode(CFG):
        y = m(x)
    want = pa_recurrent(*args, CFG)
    assert all(torch.equal(a, b) for a, b in zip(torch.utils._pytree.tree_leaves(y),
                                                 torch.utils._pytree.tree_leaves(want)))
    assert F.cosine_similarity(y[0].flatten(), ref[0].flatten(), 0) > 0.9
    y[0].sum().backward()
    assert torch.isfinite(x.grad).all()


def test_small_products_losses_and_composites_are_routed():
    from torch_bridge.losses import pa_log_softmax, pa_mse_loss, pa_nll_loss
    torch.manual_seed(0)
    a, b, m = torch.randn(5), torch.randn(5), torch.randn(3, 5)
    x, t = torch.randn(4, 6), torch.randint(6, (4,))
    A, B = torch.randn(2, 3, 4), torch.randn(3, 4, 5)
    w = torch.rand(6)
    with tb.pam_mode(CFG):
        got = [torch.mv(m, a), torch.dot(a, b), torch.outer(a, b), torch.tensordot(A, B, 2),
               torch.linalg.multi_dot([m.T, m, a]), F.log_softmax(x, -1),
               F.nll_loss(x, t, weight=w, ignore_index=int(t[0])), F.mse_loss(x, x.flip(0)),
               F.normalize(x, dim=-1), x.norm(dim=1), torch.inner(A, A[0, :2])]
    mm = lambda p, q: tb.pam_matmul(p, q, "bf16")                  # noqa: E731
    want = [mm(m, a), mm(a, b), mm(a[:, None], b[None]),
            mm(A.reshape(2, 12), B.reshape(12, 5)), mm(mm(m.T, m), a[:, None]).squeeze(-1),
            pa_log_softmax(x, -1), pa_nll_loss(x, t, w, int(t[0])), pa_mse_loss(x, x.flip(0)),
            tb.pa_div(x, PE.pa_vector_norm(x, -1, True).clamp_min(1e-12).expand_as(x)),
            PE.pa_vector_norm(x, 1), mm(A.reshape(6, 4), A[0, :2].T).reshape(2, 3, 2)]
    for i, (g, e) in enumerate(zip(got, want)):
        assert g.shape == e.shape and torch.equal(g, e), i
    ref = [F.log_softmax(x, -1), F.nll_loss(x, t, weight=w, ignore_index=int(t[0])),
           F.mse_loss(x, x.flip(0))]
    for g, r in zip(got[5:8], ref):
        assert F.cosine_similarity(g.flatten(), r.flatten(), 0) > 0.99 or \
            abs(float(g) - float(r)) < 0.1 * abs(float(r))
    with pytest.raises(ValueError, match="reduction='avg'"):
        pa_nll_loss(x, t, reduction="avg")


# --- exact derivatives of the composites, bit for bit against a chain of emu.grad ------------

FMT = emu.format("bf16")
#: the derivative kind of emu.grad in the oracle's chain
_KIND = ["exact"]


class _Node:
    """A value of the oracle's graph: forward by emu, backward by emu.grad (exact), the
    chain rule applied in reverse creation order as torch's engine runs it, float32
    gradient sums by torch, sums and broadcast reductions by emu.fold_sum as in the
    bridge's composites (docs/semantics.md §6)."""
    made = []

    def __init__(self, v, parents=()):
        self.v, self.parents, self.g = np.asarray(v, np.float32), parents, None
        _Node.made.append(self)


def _q(v):
    return np.asarray(emu.quantize(np.asarray(v, np.float32), FMT), np.float32)


def _red(g, shape):
    g = np.asarray(g, np.float32)
    lead = g.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(lead + d for d, s in enumerate(shape)
                                      if s == 1 and g.shape[lead + d] != 1)
    return np.asarray(emu.fold_sum(g, dims, keepdims=True), np.float32).reshape(shape) \
        if dims else g


def _c(v):
    return v if isinstance(v, _Node) else _Node(v)


def _pa2(op, a, b):
    a, b = _c(a), _c(b)
    A, B = _q(a.v), _q(b.v)
    return _Node(getattr(emu, op)(A, B, FMT), [
        (a, lambda g: _red(getattr(G, op)(A, B, _q(g), FMT, _KIND[0])[0], a.v.shape)),
        (b, lambda g: _red(getattr(G, op)(A, B, _q(g), FMT, _KIND[0])[1], b.v.shape))])


def _pa1(op, a):
    X = _q(a.v)
    return _Node(getattr(emu, op)(X, FMT), [(a, lambda g: getattr(G, op)(X, _q(g), FMT, _KIND[0]))])


def _lin(a, b=None, sign=1.0):
    """a + sign·b (float32), numbers allowed."""
    a, b = _c(a), _c(0.0 if b is None else b)
    t = torch.from_numpy(a.v) + sign * torch.from_numpy(b.v)
    return _Node(t.numpy(), [(a, lambda g: _red(g, a.v.shape)),
                             (b, lambda g: _red(sign * g, b.v.shape))])


def _where(cond, a, b):
    a, b = _c(a), _c(b)
    return _Node(np.where(cond, a.v, b.v), [(a, lambda g: _red(np.where(cond, g, 0), a.v.shape)),
                                            (b, lambda g: _red(np.where(cond, 0, g), b.v.shape))])


def _sum(a, dims):
    s = np.asarray(emu.fold_sum(a.v, dims, keepdims=True), np.float32)
    return _Node(s, [(a, lambda g: np.broadcast_to(g, a.v.shape).copy())])


def _backward(out, dy):
    out.g = dy
    for node in reversed(_Node.made):
        if node.g is None:
            continue
        for parent, fn in node.parents:
            g = fn(node.g)
            parent.g = g if parent.g is None else (torch.from_numpy(parent.g)
                                                   + torch.from_numpy(g)).numpy()


def _abs(x):
    return _where(x.v < 0, _lin(0.0, x, -1.0), x)


def _floor(a):
    """floor(a): a constant of the function (no gradient)."""
    return _Node(np.floor(a.v))


def _o_exp_neg_parts(a):
    a = _where(a.v <= 104, a, 104.0)
    y = _lin(_lin(_lin(_lin(a, _pa2("pam_mul", a, 0.5)), _pa2("pam_mul", a, 2.0 ** -4), -1.0),
                  _pa2("pam_mul", a, 2.0 ** -8)), _pa2("pam_mul", a, LOG2E_R))
    y = _lin(0.0, y, -1.0)
    k = _floor(y)
    return k, _pa1("pa_exp2", _lin(y, k, -1.0))


def _o_exp_neg(a):
    k, m = _o_exp_neg_parts(a)
    return _pa2("pam_mul", _pa1("pa_exp2", k), m)


def _neg(a):
    return _Node(-a.v, [(a, lambda g: -g)])


def _o_times(v, d):
    acc = None
    for p in d.pieces:
        t = v if abs(p) == 1 else _pa2("pam_mul", v, abs(p))
        acc = t if acc is None else _lin(acc, t, 1.0 if p > 0 else -1.0)
    return _lin(acc, _pa2("pam_mul", v, d.rest)) if d.rest else acc


def _o_times_wide(v, d):
    h = _pa2("pam_mul", v, 1.0)
    lo = _lin(v, h, -1.0)
    return _lin(_o_times(h, d), _pa2("pam_mul", lo, sum(d.pieces) + d.rest))


def _o_square(a, steps):
    """Babić's iteration for a·a, its nodes in the composite's order; approximate
    derivatives: the corrections are constants."""
    p = _pa2("pam_mul", a, a)
    if steps == 0:
        return p
    pa = _Node(_lead(a.v))
    q = _pa2("pam_mul", pa, pa)
    d = _where(p.v < q.v + q.v, _lin(a, pa, -1.0), _lin(_lin(pa, pa), a, -1.0))
    rest = _o_square(d, steps - 1)
    return _lin(p, rest if _KIND[0] == "exact" else _Node(rest.v))


def _gelu(x):
    neg = x.v < 0
    a = _where(neg, _neg(x), x)
    a = _pa2("pam_mul", _where(a.v <= 16, a, 16.0), 1.0)
    s = _o_square(a, 3)
    den = _lin(_lin(_o_times(a, D.ERF_Q1), 1.0), _o_times_wide(s, D.ERF_Q2))
    num = _lin(_pa2("pam_mul", _where(neg, a, 1.0), 0.5), _o_times_wide(_where(neg, s, a), D.ERF_P))
    y = _neg(_o_times_wide(s, D.LOG2E_HALF))
    k = _floor(y)
    m = _pa1("pa_exp2", _lin(y, k, -1.0))
    h = _pa2("pam_mul", _pa2("pa_div", num, den), _pa2("pam_mul", _pa1("pa_exp2", k), m))
    return _where(neg, _neg(h), _pa2("pam_mul", x, _lin(1.0, h, -1.0)))


def _silu(x):
    neg = x.v < 0
    a = _where(neg, _lin(0.0, x, -1.0), x)
    k, m = _o_exp_neg_parts(a)
    e = _pa2("pam_mul", _pa1("pa_exp2", k), m)
    h = _floor(_pa2("pam_mul", k, 0.5))
    nx = _neg(x)
    low = _where(neg, _neg(_where(nx.v <= 104, nx, 104.0)), 0.0)
    p = _pa2("pam_mul", _pa2("pam_mul", _pa2("pam_mul", low, m), _pa1("pa_exp2", h)),
             _pa1("pa_exp2", _lin(k, h, -1.0)))
    return _pa2("pa_div", _where(neg, p, x), _lin(e, 1.0))


def _softplus(x):
    neg = x.v < 0
    e = _o_exp_neg(_where(neg, _lin(0.0, x, -1.0), x))
    e2 = _lin(e, e)
    y = _lin(_where(neg, 0.0, x),
             _pa2("pa_div", _pa2("pam_mul", e, _lin(e, 6.0)), _lin(_lin(e2, e2), 6.0)))
    return _where(x.v > 20, x, y)


def _rms_norm(x, w):
    ms = _pa2("pa_div", _sum(_pa2("pam_mul", x, x), (-1,)), float(x.v.shape[-1]))
    return _pa2("pam_mul", _pa2("pa_div", x, _pa1("pa_sqrt", _lin(ms, 1e-6))), w)


def _batch_norm(x, w):                      # training statistics over (N, L) per channel
    n = float(x.v.shape[0] * x.v.shape[2])
    xc = _lin(x, _pa2("pa_div", _sum(x, (0, 2)), n), -1.0)
    var = _pa2("pa_div", _sum(_pa2("pam_mul", xc, xc), (0, 2)), n)
    return _pa2("pam_mul", _pa2("pa_div", xc, _pa1("pa_sqrt", _lin(var, 1e-5))), w)


def _huber(x, t):
    z = _abs(_lin(x, t, -1.0))
    quad = _pa2("pam_mul", _pa2("pam_mul", z, 0.5), z)
    return _where(z.v < 0.5, quad, _pa2("pam_mul", _lin(z, 0.25, -1.0), 0.5))


def _bce_logits(x, t):
    m = _lin(0.0, x, -1.0)
    sp = _lin(_where(m.v >= 0, m, 0.0),
              _pa1("pa_log", _lin(1.0, _pa1("pa_exp", _lin(0.0, _abs(x), -1.0)))))
    return _lin(_pa2("pam_mul", _lin(1.0, t, -1.0), x), sp)


def _kl_div(x, t):
    xlogx = _pa2("pam_mul", t, _pa1("pa_log", _c(np.where(t.v > 0, t.v, 1))))
    return _lin(_where(t.v > 0, xlogx, 0.0), _pa2("pam_mul", t, x), -1.0)


_EXACT = tb.PAMConfig("bf16", backward="exact")


@pytest.mark.parametrize("name", ["gelu", "silu", "softplus", "rms_norm", "batch_norm",
                                  "huber", "bce_logits", "kl_div"])
def test_exact_derivatives_are_emu_grad_chains(name):
    """The composites' exact backward (autograd through their PA Functions) equals the
    chain rule through emu.grad's Table 1 derivatives bit for bit, at every input."""
    from torch_bridge import losses as PL, norms as PN
    torch.manual_seed(1)
    x = (torch.randn(3, 4, 5) * 3).requires_grad_()
    aux = torch.rand(3, 4, 5) if name in ("huber", "bce_logits", "kl_div") else \
        torch.rand(5) + 0.5 if name == "rms_norm" else torch.rand(1, 4, 1) + 0.5
    if name == "kl_div":
        aux[0, 0] = 0.0                       # xlogy's zero
    kw = dict(fmt="bf16", backward="exact")
    y = {"gelu": lambda: PE.pa_gelu(x, **kw), "silu": lambda: PE.pa_silu(x, **kw),
         "softplus": lambda: PE.pa_softplus(x, **kw),
         "rms_norm": lambda: PE.pa_rms_norm(x, 5, aux, 1e-6, **kw),
         "batch_norm": lambda: PN.pa_batch_norm(x, None, None, aux.flatten(), None, True, **kw),
         "huber": lambda: PL.pa_huber_loss(x, aux, "none", 0.5, **kw),
         "bce_logits": lambda: PL.pa_binary_cross_entropy_with_logits(x, aux, None, "none", **kw),
         "kl_div": lambda: PL.pa_kl_div(x, aux, "none", **kw)}[name]()
    dy = torch.randn(y.shape)
    y.backward(dy)
    _Node.made = []
    X = _Node(npy(x))
    oracle = {"gelu": _gelu, "silu": _silu, "softplus": _softplus}.get(name)
    out = oracle(X) if oracle else {"rms_norm": _rms_norm, "batch_norm": _batch_norm,
                                    "huber": _huber, "bce_logits": _bce_logits,
                                    "kl_div": _kl_div}[name](X, _Node(npy(aux)))
    assert_bits_equal(npy(y), out.v)
    _backward(out, npy(dy))
    assert_bits_equal(npy(x.grad), X.g)


def test_approximate_gelu_derivative_takes_babic_corrections_as_constants():
    """With approximate derivatives GELU's Babić corrections are constants (o.detach):
    the chain of emu.grad's approximate derivatives with them so, bit for bit, and the
    square's derivative is PAM's (y, x); its mean relative error against GELU' over
    [-6, 6] is below the earlier A&S form's (11.6 %)."""
    torch.manual_seed(1)
    x = (torch.randn(3, 4, 5) * 3).requires_grad_()
    y = PE.pa_gelu(x, fmt="bf16", backward="approx")
    dy = torch.randn(y.shape)
    y.backward(dy)
    _Node.made = []
    _KIND[0] = "approx"
    try:
        X = _Node(npy(x))
        out = _gelu(X)
        assert_bits_equal(npy(y), out.v)
        _backward(out, npy(dy))
    finally:
        _KIND[0] = "exact"
    assert_bits_equal(npy(x.grad), X.g)
    t = torch.linspace(-6, 6, 4001)
    ta = t.clone().requires_grad_()
    PE.pa_gelu(ta, fmt="bf16").sum().backward()
    tr = t.double().requires_grad_()
    F.gelu(tr).sum().backward()
    ok = tr.grad.abs() > 1e-3
    assert ((ta.grad.double() - tr.grad).abs() / tr.grad.abs())[ok].mean() < 0.08


def test_rarer_products_losses_and_similarities_are_routed():
    from torch_bridge import contract as PC, losses as PL
    torch.manual_seed(0)
    x, t = torch.randn(4, 6), torch.rand(4, 6)
    p = torch.sigmoid(x)
    inp, b1, b2, m, v = torch.randn(3, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5), \
        torch.randn(3, 4), torch.randn(4)
    pw, lt = torch.rand(6) + 0.5, t.log()
    calls = [lambda: torch.addbmm(inp, b1, b2), lambda: inp.addbmm(b1, b2, beta=0.5, alpha=2),
             lambda: torch.addmv(inp[:, 0], m, v),
             lambda: F.binary_cross_entropy(p, t, weight=pw),
             lambda: F.binary_cross_entropy_with_logits(x, t, pos_weight=pw, reduction="sum"),
             lambda: F.kl_div(F.log_softmax(x, 1), t, reduction="batchmean"),
             lambda: F.kl_div(x, lt, reduction="none", log_target=True),
             lambda: F.huber_loss(x, t, delta=0.5, weight=pw.expand(4, 6)),
             lambda: F.smooth_l1_loss(x, t, beta=0.5),
             lambda: F.smooth_l1_loss(x, t, beta=0.0), lambda: F.l1_loss(x, t, reduction="sum"),
             lambda: F.mse_loss(x, t, weight=pw.expand(4, 6)), lambda: F.cosine_similarity(x, t),
             lambda: F.pairwise_distance(x, t, keepdim=True)]
    with tb.pam_mode(CFG):
        got = [c() for c in calls]
        log_p = F.log_softmax(x, 1)
    mm = dict(acc="float32", backward="approx", rounding="nearest_even")
    want = [inp + PC.pam_addbmm(b1, b2, "bf16", **mm),
            tb.pam_mul(inp, 0.5) + tb.pam_mul(PC.pam_addbmm(b1, b2, "bf16", **mm), 2.0),
            inp[:, 0] + tb.pam_matmul(m, v, "bf16"), PL.pa_binary_cross_entropy(p, t, pw),
            PL.pa_binary_cross_entropy_with_logits(x, t, None, "sum", pw),
            PL.pa_kl_div(log_p, t, "batchmean"), PL.pa_kl_div(x, lt, "none", True),
            PL.pa_huber_loss(x, t, delta=0.5, weight=pw.expand(4, 6)),
            PL.pa_smooth_l1_loss(x, t, beta=0.5),
            PL.pa_l1_loss(x, t), PL.pa_l1_loss(x, t, "sum"),
            PL.pa_mse_loss(x, t, weight=pw.expand(4, 6)),
            PE.pa_cosine_similarity(x, t), PE.pa_pairwise_distance(x, t, keepdim=True)]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and torch.equal(g, w), i
    for i, (g, c) in enumerate(zip(got, calls)):       # close to torch's
        r = c()
        assert (g - r).abs().max() <= 0.15 * r.abs().max() + 1e-3, i
    with pytest.raises(ValueError, match="reduction='avg'"):
        PL.pa_kl_div(x, t, "avg")
    with pytest.raises(ValueError, match="delta=0"):
        PL.pa_huber_loss(x, t, delta=0)

"""More PAM matmul products with a defined contraction order, and average pooling.

einsum, addbmm and interpolation reduce to :func:`torch_bridge.functional.pam_matmul` (emu's fold:
strictly increasing k in ``acc``), so their backward passes are the PAM matmul's,
approximate or exact (Table 1); the convolutions are in :mod:`torch_bridge.functional`.
Average pooling sums its windows in float32 and divides ÷̂ by the window size
(eqs. 14-17), as :func:`torch_bridge.elementwise.pa_mean`.  Sums are in emu.fold_sum's
order.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ._sums import fold_sum
from ._tensors import check_tensor
from .functional import int_tuple, pa_div, pam_matmul

__all__ = ["pam_einsum", "pam_addbmm", "pam_interpolate", "interpolation_table", "pa_avg_pool",
           "pa_adaptive_avg_pool"]


def _parse(equation: str, n: int):
    """(input subscripts, output subscripts), or None for what is left to torch
    (ellipsis, a letter repeated inside one operand: diagonals)."""
    eq = equation.replace(" ", "")
    if "." in eq:
        return None
    ins, _, out = eq.partition("->")
    subs = ins.split(",")
    if len(subs) != n:
        raise ValueError(f"einsum: equation {equation!r} has {len(subs)} operand(s), "
                         f"got {n} tensor(s)")
    if "->" not in eq:      # implicit output: the letters seen once, alphabetically
        out = "".join(sorted(c for c in set(ins) if c.isalpha() and ins.count(c) == 1))
    if any(len(set(s)) != len(s) for s in (*subs, out)):
        return None
    return subs, out


def _pair(a, sa, b, sb, out, mm):
    """``einsum(f'{sa},{sb}->{out}', a, b)`` as one batched PAM matmul: batch letters
    (in both and the output), a's free letters (M), the contracted letters (K, in the
    order they appear in ``sa``), b's free letters (N)."""
    def sum_away(t, s, other):             # letters nowhere else: summed before the product
        gone = [i for i, c in enumerate(s) if c not in other and c not in out]
        if not gone:
            return t, s
        kept = "".join(c for i, c in enumerate(s) if i not in gone)
        return fold_sum(t, gone, keepdim=False), kept
    a, sa = sum_away(a, sa, sb)
    b, sb = sum_away(b, sb, sa)
    batch = [c for c in sa if c in sb and c in out]
    contr = [c for c in sa if c in sb and c not in out]
    af = [c for c in sa if c not in sb]
    bf = [c for c in sb if c not in sa]
    size = {**dict(zip(sa, a.shape)), **dict(zip(sb, b.shape))}
    nb = [size[c] for c in batch]
    A = a.permute([sa.index(c) for c in batch + af + contr]).reshape(
        *nb, math.prod(size[c] for c in af), math.prod(size[c] for c in contr))
    B = b.permute([sb.index(c) for c in batch + contr + bf]).reshape(
        *nb, math.prod(size[c] for c in contr), math.prod(size[c] for c in bf))
    C = mm(A, B).reshape([*nb, *[size[c] for c in af], *[size[c] for c in bf]])
    have = batch + af + bf
    return C.permute([have.index(c) for c in out]) if have != list(out) else C


def pam_einsum(equation, *operands, fmt="float32", acc="float32", mul="pam", backward="approx",
               rounding="nearest_even"):
    """torch.einsum with PAM products: operands are combined left to right, each pair
    as one batched PAM matmul whose contraction runs over the contracted letters in
    the order they appear in the left operand's subscripts (row-major); letters of one
    operand that appear nowhere later are summed (float32, emu.fold_sum's order) first.
    Returns None for equations left to torch (ellipsis, repeated letters: no products or
    diagonals), and a single operand is torch's (a permutation or a sum, no multiply)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    parsed = _parse(equation, len(operands))
    if parsed is None or len(operands) < 2:
        return None
    subs, out = parsed

    def mm(x, y):
        return pam_matmul(x, y, fmt, acc=acc, mul=mul, backward=backward, rounding=rounding)
    t, s = operands[0], subs[0]
    for i in range(1, len(operands)):
        later = set(out).union(*subs[i + 1:])
        keep = "".join(dict.fromkeys(c for c in s + subs[i] if c in later))
        t, s = _pair(t, s, operands[i], subs[i], keep, mm), keep
    return t if s == out else t.permute([s.index(c) for c in out])


def pam_addbmm(a, b, fmt="float32", *, acc="float32", mul="pam", backward="approx",
               rounding="nearest_even"):
    """``Σ_i a[i] @ b[i]`` (torch.addbmm's product) as one PAM matmul whose fold runs
    over (batch, k) in that order: ``a`` laid out (n, B·k), ``b`` (B·k, p)."""
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"addbmm: batch1.shape={tuple(a.shape)} and batch2.shape="
                         f"{tuple(b.shape)} must be (B, n, k) and (B, k, p)")
    return pam_matmul(a.permute(1, 0, 2).reshape(a.shape[1], -1), b.reshape(-1, b.shape[2]),
                      fmt, acc=acc, mul=mul, backward=backward, rounding=rounding)


# --- interpolation (F.interpolate's linear modes): a PAM matmul per axis

#: F.interpolate's modes with weights, and their spatial dimensions
INTERPOLATION = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}
_CUBIC_A = -0.75                    # torch's cubic convolution coefficient


def interpolation_table(n: int, m: int, cubic: bool, align_corners: bool, scale=None):
    """The (m, n) float32 weights of one axis of torch's linear or cubic upsampling, from
    ``n`` inputs to ``m`` outputs (torch's CPU kernels, UpSample.h: its source index
    ``r·(j + 0.5) - 0.5`` with ``r = 1/scale`` or ``n/m``, or ``r·j`` with ``r = (n-1)/(m-1)``
    for align_corners; linear taps at floor and floor + 1 with weights ``1 - λ, λ``, the
    index clamped at 0; cubic taps floor - 1 ... floor + 2, clamped to the axis, with the
    cubic-convolution coefficients of A = -0.75).  Host arithmetic in float32, as torch's
    opmath: a constant of the sizes, not of the data."""
    f = np.float32
    if align_corners:
        r = f(n - 1) / f(m - 1) if m > 1 else f(0)
    else:
        r = f(1.0 / scale) if scale is not None and scale > 0 else f(n) / f(m)
    j = np.arange(m, dtype=np.float32)
    src = r * j if align_corners else r * (j + f(0.5)) - f(0.5)
    w = np.zeros((m, n), np.float32)
    rows = np.arange(m)
    if cubic:
        i = np.floor(src)
        t = src - i
        a = f(_CUBIC_A)

        def near(x):                # |x| <= 1
            return ((a + f(2)) * x - (a + f(3))) * x * x + f(1)

        def far(x):                 # 1 < |x| < 2
            return ((a * x - f(5) * a) * x + f(8) * a) * x - f(4) * a
        for k, c in enumerate((far(t + f(1)), near(t), near(f(1) - t), far(f(2) - t))):
            np.add.at(w, (rows, np.clip(i.astype(np.int64) - 1 + k, 0, n - 1)), c)
        return w
    if not align_corners:
        src = np.maximum(src, f(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n - 1)
    lam = np.clip(src - i0.astype(np.float32), f(0), f(1))
    np.add.at(w, (rows, i0), f(1) - lam)
    np.add.at(w, (rows, i0 + (i0 < n - 1)), lam)
    return w


def pam_interpolate(x, size=None, scale_factor=None, mode="bilinear", align_corners=None,
                    recompute_scale_factor=None, fmt="float32", *, acc="float32", mul="pam",
                    backward="approx", rounding="nearest_even"):
    """F.interpolate's ``linear``, ``bilinear``, ``bicubic`` and ``trilinear`` modes (no
    antialias) with PAM products: each spatial axis in turn, first to last, is one PAM
    matmul by that axis's weight table (:func:`interpolation_table`, torch's weights),
    ``y = x @ Wᵀ`` over the axis.  Output sizes and scales as torch's: ``size``, or
    ``floor(n·scale_factor)`` with ``1/scale_factor`` as the index scale unless
    ``recompute_scale_factor``."""
    nd = INTERPOLATION.get(mode)
    if nd is None:
        raise ValueError(f"mode={mode!r}; expected one of {sorted(INTERPOLATION)}")
    check_tensor(x, "input")
    if x.dim() != nd + 2 or (size is None) == (scale_factor is None):
        raise ValueError(f"interpolate: mode={mode!r} needs a {nd + 2}-D input and one of "
                         f"size, scale_factor; got input.shape={tuple(x.shape)}")
    ins = x.shape[2:]
    if size is not None:
        outs = (size,) * nd if isinstance(size, int) else tuple(size)
        scales = (None,) * nd
    else:
        scales = (float(scale_factor),) * nd if isinstance(scale_factor, (int, float)) \
            else tuple(float(s) for s in scale_factor)
        outs = tuple(math.floor(n * s) for n, s in zip(ins, scales))
        if recompute_scale_factor:
            scales = (None,) * nd
    y = x
    for d, (n, m, sc) in enumerate(zip(ins, outs, scales)):
        w = interpolation_table(n, m, mode == "bicubic", bool(align_corners), sc)
        wt = torch.from_numpy(np.ascontiguousarray(w.T)).to(x.device, x.dtype)
        y = pam_matmul(y.movedim(2 + d, -1), wt, fmt, acc=acc, mul=mul, backward=backward,
                       rounding=rounding).movedim(-1, 2 + d)
    return y


# --- average pooling: float32 window sums ÷̂ the window size

@functools.lru_cache(maxsize=256)
def _pool_windows(bounds, lengths, device):
    """The index_select indices (clamped into the input, shaped (outputs, window)) per
    spatial dimension, and the mask of the entries inside their window (None when every
    window is full): made once per pooling geometry."""
    idxs, mask = [], None
    for win, n in zip(bounds, lengths):
        k = max(b - a for a, b in win)
        idx = torch.tensor([[a + j for j in range(k)] for a, _ in win], device=device)
        ok = idx < torch.tensor([b for _, b in win], device=device)[:, None]
        idxs.append(idx.clamp(max=n - 1))
        mask = ok if mask is None else mask[..., None, None] & ok
    return tuple(idxs), None if bool(mask.all()) else mask


def _pool_sum(x, bounds):
    """Per spatial dimension ``bounds[i]`` = (start, stop) of each output's window (a
    list of int pairs, clipped to the input): the float32 sums of the windows, taken by
    index_select (no multiply) with the entries past a window's end masked to 0."""
    nd = len(bounds)
    idxs, mask = _pool_windows(tuple(tuple(w) for w in bounds), tuple(x.shape[2:]), x.device)
    for i, idx in enumerate(idxs):
        dim = 2 + 2 * i
        x = x.index_select(dim, idx.flatten()).unflatten(dim, idx.shape)
    if mask is not None:
        x = torch.where(mask, x, 0.0)
    return fold_sum(x, tuple(range(3, 3 + 2 * nd, 2)), keepdim=False)


def _pool_operand(op, x, nd):
    check_tensor(x, "input")
    if x.dim() not in (nd + 1, nd + 2):
        raise ValueError(f"{op}: input.shape={tuple(x.shape)}; expected {nd + 1} or "
                         f"{nd + 2} dimensions")
    return (x.unsqueeze(0), True) if x.dim() == nd + 1 else (x, False)


def pa_avg_pool(x, kernel_size, stride=None, padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None, fmt="float32", *,
                backward="approx", rounding="nearest_even", mul="pam"):
    """F.avg_pool1d/2d/3d (the dimension follows ``kernel_size``'s length; an int means
    2-D): each window's float32 sum ÷̂ its size — torch's window size (padding counted
    when ``count_include_pad``, never the ceil_mode overhang) or ``divisor_override``."""
    nd = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2
    op = f"avg_pool{nd}d"
    k = int_tuple(f"{op}: kernel_size", kernel_size, nd, 1)
    s = k if stride is None or stride == [] or stride == () else \
        int_tuple(f"{op}: stride", stride, nd, 1)
    p = int_tuple(f"{op}: padding", padding, nd, 0)
    if any(pp > kk // 2 for pp, kk in zip(p, k)):
        raise ValueError(f"{op}: padding={p} must be at most half of kernel_size={k}")
    if divisor_override is not None and (not isinstance(divisor_override, int)
                                         or isinstance(divisor_override, bool)
                                         or divisor_override < 1):
        raise ValueError(f"{op}: divisor_override={divisor_override!r}; expected None or "
                         f"an int >= 1")
    x, unbatched = _pool_operand(op, x, nd)
    bounds, sizes = [], []
    for n, kk, ss, pp in zip(x.shape[2:], k, s, p):
        out = (n + 2 * pp - kk + (ss - 1 if ceil_mode else 0)) // ss + 1
        if ceil_mode and (out - 1) * ss >= n + pp:
            out -= 1
        if out < 1:
            raise ValueError(f"{op}: input.shape={tuple(x.shape)} is smaller than "
                             f"kernel_size={k} with padding={p}")
        starts = [i * ss - pp for i in range(out)]
        sizes.append([min(a + kk, n + pp) - a for a in starts] if count_include_pad else
                     [min(a + kk, n) - max(a, 0) for a in starts])
        bounds.append([(max(a, 0), min(a + kk, n)) for a in starts])
    return _pool_divide(x, bounds, sizes, divisor_override, unbatched, fmt, backward, rounding,
                        mul)


def _pool_divide(x, bounds, sizes, divisor, unbatched, fmt, backward, rounding, mul):
    total = _pool_sum(x, bounds)
    if divisor is None:                 # the window sizes: host integers
        div = np.ones(())
        for sz in sizes:
            div = np.multiply.outer(div, sz)
        divisor = float(div.flat[0]) if (div == div.flat[0]).all() else \
            torch.tensor(div, dtype=total.dtype, device=total.device)
    y = pa_div(total, divisor, fmt, backward=backward, rounding=rounding, mul=mul).to(x.dtype)
    return y.squeeze(0) if unbatched else y


def pa_adaptive_avg_pool(x, output_size, fmt="float32", *, backward="approx",
                         rounding="nearest_even", mul="pam"):
    """F.adaptive_avg_pool1d/2d/3d (the dimension follows ``output_size``'s length; an
    int means 2-D, None keeps a size): output ``i`` averages input entries
    ``[floor(i·n/m), ceil((i+1)·n/m))`` as a float32 sum ÷̂ their count."""
    nd = len(output_size) if isinstance(output_size, (tuple, list)) else 2
    op = f"adaptive_avg_pool{nd}d"
    x, unbatched = _pool_operand(op, x, nd)
    sizes_in = x.shape[2:]
    outs = int_tuple(f"{op}: output_size", tuple(n if o is None else o for o, n in zip(
        output_size if isinstance(output_size, (tuple, list)) else (output_size,) * nd,
        sizes_in)), nd, 1)
    bounds = [[(i * n // m, -(-(i + 1) * n // m)) for i in range(m)]
              for n, m in zip(sizes_in, outs)]
    sizes = [[b - a for a, b in win] for win in bounds]
    return _pool_divide(x, bounds, sizes, None, unbatched, fmt, backward, rounding, mul)

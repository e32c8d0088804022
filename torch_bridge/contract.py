"""More PAM matmul products with a defined contraction order, and average pooling.

einsum, addbmm and the 1-D, 3-D and transposed convolutions reduce to
:func:`torch_bridge.functional.pam_matmul` (emu's fold: strictly increasing k in
``acc``), so their backward passes are the PAM matmul's, approximate or exact
(Table 1).  Average pooling sums its windows in float32 and divides ÷̂ by the window
size (eqs. 14-17), as :func:`torch_bridge.elementwise.pa_mean`.  Sums (and bias
gradients) are in emu.fold_sum's order.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch.nn import functional as F

from ._core import add, check_tensor, fold_sum
from .functional import _same_padding, pa_div, pam_conv2d, pam_matmul

__all__ = ["pam_einsum", "pam_addbmm", "conv_args", "pam_conv1d", "pam_conv3d",
           "pam_conv_transpose", "pa_avg_pool", "pa_adaptive_avg_pool"]


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


def pam_einsum(equation, *operands, fmt="float32", acc="float32", backward="approx",
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
        return pam_matmul(x, y, fmt, acc=acc, backward=backward, rounding=rounding)
    t, s = operands[0], subs[0]
    for i in range(1, len(operands)):
        later = set(out).union(*subs[i + 1:])
        keep = "".join(dict.fromkeys(c for c in s + subs[i] if c in later))
        t, s = _pair(t, s, operands[i], subs[i], keep, mm), keep
    return t if s == out else t.permute([s.index(c) for c in out])


def pam_addbmm(a, b, fmt="float32", *, acc="float32", backward="approx",
               rounding="nearest_even"):
    """``Σ_i a[i] @ b[i]`` (torch.addbmm's product) as one PAM matmul whose fold runs
    over (batch, k) in that order: ``a`` laid out (n, B·k), ``b`` (B·k, p)."""
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"addbmm: batch1.shape={tuple(a.shape)} and batch2.shape="
                         f"{tuple(b.shape)} must be (B, n, k) and (B, k, p)")
    return pam_matmul(a.permute(1, 0, 2).reshape(a.shape[1], -1), b.reshape(-1, b.shape[2]),
                      fmt, acc=acc, backward=backward, rounding=rounding)


def _ints(name, value, nd, low):
    """``value`` (an int or a sequence of ``nd`` ints, each >= ``low``) as a tuple."""
    vals = (value,) * nd if isinstance(value, int) and not isinstance(value, bool) else value
    if not (isinstance(vals, (tuple, list)) and len(vals) == nd and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= low for v in vals)):
        raise ValueError(f"{name}={value!r}; expected an int >= {low} or a sequence of "
                         f"{nd} such ints")
    return tuple(vals)


def conv_args(op, nd, stride, padding, dilation, groups, output_padding=None):
    """A convolution's arguments checked before any work and normalised to tuples of
    ``nd`` ints (``padding`` may stay 'same' or 'valid'; transposed convolutions give
    ``output_padding``, which must be below max(stride, dilation), as torch).
    ValueError naming the argument, its value and what is accepted."""
    stride, dilation = _ints(f"{op}: stride", stride, nd, 1), \
        _ints(f"{op}: dilation", dilation, nd, 1)
    if isinstance(padding, str) and output_padding is None:
        if padding not in ("same", "valid"):
            raise ValueError(f"{op}: padding={padding!r}; expected 'same', 'valid' or ints")
        if padding == "same" and stride != (1,) * nd:
            raise ValueError(f"{op}: padding='same' needs stride 1, got stride={stride}")
    else:
        padding = _ints(f"{op}: padding", padding, nd, 0)
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"{op}: groups={groups!r}; expected an int >= 1")
    if output_padding is None:
        return stride, padding, dilation
    output_padding = _ints(f"{op}: output_padding", output_padding, nd, 0)
    if any(o >= max(s, d) for o, s, d in zip(output_padding, stride, dilation)):
        raise ValueError(f"{op}: output_padding={output_padding} must be smaller than "
                         f"max(stride, dilation) in each dimension (stride={stride}, "
                         f"dilation={dilation})")
    return stride, padding, dilation, output_padding


def _conv_operands(op, nd, x, weight, groups, transposed=False):
    """(input batched, unbatched?) after the shape checks of an ``nd``-d convolution."""
    check_tensor(x, "input")
    check_tensor(weight, "weight")
    unbatched = x.dim() == nd + 1
    xb = x.unsqueeze(0) if unbatched else x
    channels = weight.shape[0] if transposed else weight.shape[1] * groups
    if xb.dim() != nd + 2 or weight.dim() != nd + 2 or xb.shape[1] != channels \
            or weight.shape[0] % groups:
        raise ValueError(f"{op}: input.shape={tuple(x.shape)}, weight.shape="
                         f"{tuple(weight.shape)} and groups={groups} do not fit (expected a "
                         f"{nd + 1}-D or {nd + 2}-D input and a {nd + 2}-D weight)")
    return xb, unbatched


def pam_conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
               fmt="float32", *, acc="float32", backward="approx", rounding="nearest_even"):
    """1-D convolution as :func:`pam_conv2d` on a height-1 image: each output folds
    over the kernel's (channel, position) entries in that order.  F.conv1d's arguments."""
    (stride,), padding, (dilation,) = conv_args("conv1d", 1, stride, padding, dilation, groups)
    x, unbatched = _conv_operands("conv1d", 1, x, weight, groups)
    pad = padding if isinstance(padding, str) else (0, padding[0])
    y = pam_conv2d(x.unsqueeze(-2), weight.unsqueeze(-2), bias, (1, stride), pad,
                   (1, dilation), groups, fmt, acc=acc, backward=backward,
                   rounding=rounding).squeeze(-2)
    return y.squeeze(0) if unbatched else y


def pam_conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
               fmt="float32", *, acc="float32", backward="approx", rounding="nearest_even"):
    """3-D convolution as :func:`pam_conv2d` over depth windows: the input's depth
    windows (Tensor.unfold) become ``kd`` extra channels per channel and the output
    depths extra batch entries, so each output folds over the kernel's (channel, depth,
    row, column) entries in that order — the order of ``weight.reshape(out, -1)``.
    F.conv3d's arguments."""
    stride, padding, dilation = conv_args("conv3d", 3, stride, padding, dilation, groups)
    x, unbatched = _conv_operands("conv3d", 3, x, weight, groups)
    kd = weight.shape[2]
    if padding == "same":
        x, padding = _same_padding(x, weight.shape[2:], dilation), (0, 0, 0)
    elif padding == "valid":
        padding = (0, 0, 0)
    x = F.pad(x, (0, 0, 0, 0, padding[0], padding[0]))
    cols = x.unfold(2, dilation[0] * (kd - 1) + 1, stride[0])[..., ::dilation[0]]
    n, c, do, h, w, _ = cols.shape                        # (N, C, Do, H, W, kd)
    x2 = cols.permute(0, 2, 1, 5, 3, 4).reshape(n * do, c * kd, h, w)
    w2 = weight.reshape(weight.shape[0], -1, *weight.shape[3:])
    y = pam_conv2d(x2, w2, None, stride[1:], padding[1:], dilation[1:], groups, fmt, acc=acc,
                   backward=backward, rounding=rounding)
    y = y.reshape(n, do, *y.shape[1:]).transpose(1, 2)
    if bias is not None:
        y = add(y, bias.reshape(1, -1, 1, 1, 1))
    return y.squeeze(0) if unbatched else y


_CONV = {1: pam_conv1d, 2: pam_conv2d, 3: pam_conv3d}


def pam_conv_transpose(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                       dilation=1, fmt="float32", *, acc="float32", backward="approx",
                       rounding="nearest_even"):
    """Transposed convolution (F.conv_transpose1d/2d/3d's arguments; the dimension
    follows ``weight``) as the direct convolution it equals: the input with ``stride-1``
    zeros stuffed between entries, padded by ``dilation·(k-1) - padding`` on each side
    (plus ``output_padding`` at the end; negative pads crop), convolved with stride 1
    by the kernel flipped in space with its in/out channels swapped per group.  Each
    output folds over (input channel, kernel position of the flipped kernel); the
    stuffed zeros contribute PAM products that are exact zeros."""
    nd = check_tensor(weight, "weight").dim() - 2
    if nd not in _CONV:
        raise ValueError(f"conv_transpose: weight.shape={tuple(weight.shape)}; expected "
                         f"3 to 5 dimensions")
    op = f"conv_transpose{nd}d"
    stride, padding, dilation, output_padding = conv_args(op, nd, stride, padding, dilation,
                                                          groups, output_padding)
    x, unbatched = _conv_operands(op, nd, x, weight, groups, transposed=True)
    if stride != (1,) * nd:
        z = x.new_zeros(*x.shape[:2], *((s - 1) * (n - 1) + n for s, n in
                                        zip(stride, x.shape[2:])))
        z[(..., *(slice(None, None, s) for s in stride))] = x
        x = z
    k = weight.shape[2:]
    pads = []
    for kk, d, p, o in reversed(list(zip(k, dilation, padding, output_padding))):
        pads += [d * (kk - 1) - p, d * (kk - 1) - p + o]
    cin, cog = weight.shape[:2]
    wc = weight.reshape(groups, cin // groups, cog, *k).transpose(1, 2) \
        .reshape(groups * cog, cin // groups, *k).flip(list(range(2, nd + 2)))
    y = _CONV[nd](F.pad(x, pads), wc, bias, 1, 0, dilation, groups, fmt, acc=acc,
                  backward=backward, rounding=rounding)
    return y.squeeze(0) if unbatched else y


# --- average pooling: float32 window sums ÷̂ the window size

def _pool_sum(x, bounds):
    """Per spatial dimension ``bounds[i]`` = (start, stop) of each output's window (a
    list of int pairs, clipped to the input): the float32 sums of the windows, taken by
    index_select (no multiply) with the entries past a window's end masked to 0."""
    nd = len(bounds)
    mask = None
    for i, win in enumerate(bounds):
        k = max(b - a for a, b in win)
        idx = torch.tensor([[a + j for j in range(k)] for a, _ in win], device=x.device)
        ok = idx < torch.tensor([b for _, b in win], device=x.device)[:, None]
        dim = 2 + 2 * i
        x = x.index_select(dim, idx.clamp(max=x.shape[dim] - 1).flatten()).unflatten(
            dim, idx.shape)
        mask = ok if mask is None else mask[..., None, None] & ok
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
                backward="approx", rounding="nearest_even"):
    """F.avg_pool1d/2d/3d (the dimension follows ``kernel_size``'s length; an int means
    2-D): each window's float32 sum ÷̂ its size — torch's window size (padding counted
    when ``count_include_pad``, never the ceil_mode overhang) or ``divisor_override``."""
    nd = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else 2
    op = f"avg_pool{nd}d"
    k = _ints(f"{op}: kernel_size", kernel_size, nd, 1)
    s = k if stride is None or stride == [] or stride == () else \
        _ints(f"{op}: stride", stride, nd, 1)
    p = _ints(f"{op}: padding", padding, nd, 0)
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
    return _pool_divide(x, bounds, sizes, divisor_override, unbatched, fmt, backward, rounding)


def _pool_divide(x, bounds, sizes, divisor, unbatched, fmt, backward, rounding):
    total = _pool_sum(x, bounds)
    if divisor is None:                 # the window sizes: host integers
        div = np.ones(())
        for sz in sizes:
            div = np.multiply.outer(div, sz)
        divisor = float(div.flat[0]) if (div == div.flat[0]).all() else \
            torch.tensor(div, dtype=total.dtype, device=total.device)
    y = pa_div(total, divisor, fmt, backward=backward, rounding=rounding).to(x.dtype)
    return y.squeeze(0) if unbatched else y


def pa_adaptive_avg_pool(x, output_size, fmt="float32", *, backward="approx",
                         rounding="nearest_even"):
    """F.adaptive_avg_pool1d/2d/3d (the dimension follows ``output_size``'s length; an
    int means 2-D, None keeps a size): output ``i`` averages input entries
    ``[floor(i·n/m), ceil((i+1)·n/m))`` as a float32 sum ÷̂ their count."""
    nd = len(output_size) if isinstance(output_size, (tuple, list)) else 2
    op = f"adaptive_avg_pool{nd}d"
    x, unbatched = _pool_operand(op, x, nd)
    sizes_in = x.shape[2:]
    outs = _ints(f"{op}: output_size", tuple(n if o is None else o for o, n in zip(
        output_size if isinstance(output_size, (tuple, list)) else (output_size,) * nd,
        sizes_in)), nd, 1)
    bounds = [[(i * n // m, -(-(i + 1) * n // m)) for i in range(m)]
              for n, m in zip(sizes_in, outs)]
    sizes = [[b - a for a, b in win] for win in bounds]
    return _pool_divide(x, bounds, sizes, None, unbatched, fmt, backward, rounding)

"""The functional API: PA primitives and composites, and config dispatchers.

Primitives (always piecewise affine; ``fmt``, ``backward``, ``rounding`` explicit):
``pam_matmul``, ``pam_linear``, the convolutions (``pam_conv1d``, ``pam_conv2d``,
``pam_conv3d``, ``pam_conv_transpose``: PAM matmuls over im2col patches), the
elementwise ``pam_mul``, ``pa_div``, ``pa_exp2``, ``pa_log2``, ``pa_exp``, ``pa_log``,
``pa_sqrt`` (each with a twin on checked :class:`~torch_bridge.config.Numerics` for the
composites: ``mul``, ``div``, ``exp2``, ``log2``, ``exp``, ``log``, ``sqrt``), and the
composites ``pa_softmax``, ``pa_layer_norm``, ``pa_cross_entropy``.  Composites are
built from the elementwise primitives and float32 additions, so their backward pass
runs through the graph that defines them with the chosen derivative kind at every
node (Kosson & Jaggi, section 2.5).

Dispatchers (what the modules, :func:`torch_bridge.pam_mode` and the trainers call):
``matmul``, ``linear``, ``conv2d``, ``softmax``, ``layer_norm``, ``cross_entropy``,
``scaled_dot_product_attention`` take a :class:`PAMConfig` and run the PA version of
an enabled op group, the native torch function otherwise (``config=None``: native).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import torch
from numba import prange
from torch.nn import functional as F

import emu
from emu import sizes
from emu.lowlevel import twins
from emu.registry import ops

from . import _compose
from . import composites as D
from ._functions import Constant, PABinary, PAMMatmul, PAUnary, constant_ok
from ._linear import LinearFunction
from ._recipes import RecipeMatmul, is_weight, states_for
from ._sums import add, expand, fold_sum
from ._backend import cuda_backend_active
from ._tensors import check_tensor, host_view
from .config import Numerics, PAMConfig, blocked, check_config, check_numerics

__all__ = ["pam_matmul", "pam_linear", "pam_conv2d", "conv_args", "pam_conv1d", "pam_conv3d",
           "pam_conv_transpose", "pa_softmax", "pa_layer_norm",
           "pa_cross_entropy", "matmul", "linear", "conv2d", "softmax", "layer_norm",
           "cross_entropy", "scaled_dot_product_attention"]   # + the registry's ops, below

# --- PAM matmul family ---------------------------------------------------------------

def pam_matmul(a, b, fmt="float32", *, acc="float32", mul="pam", backward="approx",
               rounding="nearest_even", recipe_states=None) -> torch.Tensor:
    """PAM matrix product with torch.matmul's shapes (1-D, 2-D, batched, broadcast).

    Operands are rounded into ``fmt``, products are PAM (eqs. 5-8), accumulation is
    emu's sequential fold in ``acc``.  Backward: ``"approx"`` (section 3.2: PAM matmuls
    of the transposes) or ``"exact"`` (Table 1), both computed by emu.grad.

    A scaling recipe ``fmt`` (emu.recipe) quantizes a product with a weight (a
    parameter or a view of one) by its three GEMMs' roles (torch_bridge._recipes; CPU
    tensors, approximate backward); ``recipe_states``: delayed scaling's
    :class:`~torch_bridge._recipes.RecipeStates` (None: the weight's own).
    """
    check_tensor(a, "a")
    check_tensor(b, "b")
    nm = check_numerics(fmt, backward, rounding, acc, mul)
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError(f"pam_matmul operands must have at least one dimension, got "
                         f"a.shape={tuple(a.shape)}, b.shape={tuple(b.shape)}")
    if isinstance(nm.fmt, emu.Recipe):
        return _recipe_matmul(a, b, nm, recipe_states)
    return PAMMatmul.apply(a, b, nm)


def _recipe_matmul(a, b, nm, states, b_weight=False):
    """pam_matmul in a recipe: the weight as ``b`` (``b_weight``, or a parameter or a view
    of one; a product whose weight is ``a``, as a convolution's, transposed), at least
    2-D; a product of activations in float32 operands."""
    if not b_weight and is_weight(a) and not is_weight(b) and a.dim() > 1 and b.dim() > 1:
        return _recipe_matmul(b.transpose(-1, -2), a.transpose(-1, -2), nm,
                              states).transpose(-1, -2)
    if not (b_weight or is_weight(b)) or b.dim() == 1:
        return PAMMatmul.apply(a, b, check_numerics(emu.float32, nm.backward, nm.rounding,
                                                    nm.acc, nm.mul))
    if nm.backward != "approx":
        raise ValueError(f"backward={nm.backward!r} with the recipe {nm.fmt.name}: a "
                         "recipe's backward is its dgrad and wgrad GEMMs ('approx')")
    if a.is_cuda or b.is_cuda:
        raise ValueError(f"fmt={nm.fmt.name}: scaling recipes run on CPU tensors for now "
                         "(emu.recipe_matmul); move the model to the CPU")
    r = nm.fmt
    if r.history and states is None:
        states = states_for(b, r)
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    c = RecipeMatmul.apply(a2, b, nm, states)
    return c.squeeze(-2) if a.dim() == 1 else c


def pam_linear(x, weight, bias=None, fmt="float32", *, acc="float32", mul="pam", backward="approx",
               rounding="nearest_even", recipe_states=None) -> torch.Tensor:
    """``x @ weight.T + bias`` with a PAM matmul over the flattened leading dimensions
    (so the weight gradient is one fold over every token); the bias add is float32, the
    bias gradient reduced in emu.fold_sum's order.  A recipe ``fmt`` quantizes ``weight``
    as the weight (:func:`pam_matmul`)."""
    check_tensor(x, "input")
    check_tensor(weight, "weight")
    if weight.dim() != 2 or x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input.shape={tuple(x.shape)} does not fit weight.shape="
                         f"{tuple(weight.shape)} (expected (..., {weight.shape[-1]}) and a "
                         f"2-D weight)")
    nm = check_numerics(fmt, backward, rounding, acc, mul)
    if (_compose.fusable(nm, x, weight, bias) and not blocked(nm.fmt)
            and x.numel() * weight.shape[0] <= sizes.SERIAL_WORK and x.numel()):
        return LinearFunction.apply(x, weight, bias, nm)     # the graph below, fused
    x2 = x.reshape(-1, x.shape[-1])
    if isinstance(nm.fmt, emu.Recipe):
        y = _recipe_matmul(x2, weight.t(), nm, recipe_states, b_weight=True)
    else:
        y = pam_matmul(x2, weight.t(), fmt, acc=acc, mul=mul, backward=backward,
                       rounding=rounding)
    y = y.reshape(*x.shape[:-1], weight.shape[0])
    return y if bias is None else add(y, bias)


def _same_padding(x, kernel, dilation):
    """F.pad arguments for padding='same' (stride 1), the extra pixel at the end."""
    pads = []
    for k, d in zip(reversed(kernel), reversed(dilation)):
        total = d * (k - 1)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads)


class _Unfold(torch.autograd.Function):
    """F.unfold (im2col: a gather, exact; ``out`` is the output's (rows, columns), from
    the caller) whose backward adds the patches' gradients in a defined order on every
    device: into a zero image, one kernel offset (i, j) at a time in row-major order,
    each offset's gradients as one strided slice add — per input element, its terms in
    the order of the kernel offsets that read it, the order of torch's CPU col2im;
    torch's CUDA col2im sums per element in its own order."""

    @staticmethod
    def forward(ctx, x, kernel, dilation, padding, stride, out):
        ctx.x_shape, ctx.kernel, ctx.dilation = x.shape, kernel, dilation
        ctx.padding, ctx.stride, ctx.out = padding, stride, out
        return F.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride)

    @staticmethod
    def backward(ctx, g):
        (n, c, h, w), (kh, kw), (dh, dw) = ctx.x_shape, ctx.kernel, ctx.dilation
        (ph, pw), (sh, sw), (ho, wo) = ctx.padding, ctx.stride, ctx.out
        g = g.reshape(n, c, kh, kw, ho, wo)
        if g.device.type == "cpu" and g.dtype == torch.float32 and not cuda_backend_active():
            dx = np.zeros((n, c, h + 2 * ph, w + 2 * pw), np.float32)
            _COL2IM[g.numel() > sizes.SERIAL_WORK](host_view(g.contiguous()), dx,
                                                   dh, dw, sh, sw)
            dx = torch.from_numpy(dx)
        else:
            dx = g.new_zeros(n, c, h + 2 * ph, w + 2 * pw)
            for i in range(kh):
                for j in range(kw):
                    dx[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                       j * dw:j * dw + sw * (wo - 1) + 1:sw] += g[:, :, i, j]
        return dx[:, :, ph:ph + h, pw:pw + w], None, None, None, None, None


def _col2im(g, dx, dh, dw, sh, sw):
    """_Unfold's backward on the CPU in one kernel: per (image, channel) plane, the kernel
    offsets in row-major order, each added at its strided positions (each position once
    per offset), so each entry's terms are added in the offsets' order, as the slice adds
    on other devices add them."""
    n, c, kh, kw, ho, wo = g.shape
    for p in prange(n * c):
        b, ch = p // c, p % c
        for i in range(kh):
            for j in range(kw):
                for oh in range(ho):
                    for ow in range(wo):
                        dx[b, ch, i * dh + oh * sh, j * dw + ow * sw] += g[b, ch, i, j, oh, ow]


_COL2IM = twins("torch_bridge col2im", _col2im)


def pam_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
               fmt="float32", *, acc="float32", mul="pam", backward="approx",
               rounding="nearest_even") -> torch.Tensor:
    """2-D convolution as PAM matmuls over im2col patches (F.unfold, its backward in a
    defined order: :class:`_Unfold`).

    Each output is the fold over the kernel's (channel, row, column) entries in that
    order — the order of ``weight.reshape(out, -1)``; the weight gradient folds over
    (batch, output position), the bias gradient (float32) over (batch, row, column).
    Accepts torch.nn.functional.conv2d's arguments.
    """
    stride, padding, dilation = conv_args("conv2d", 2, stride, padding, dilation, groups)
    check_tensor(x, "input")
    check_tensor(weight, "weight")
    unbatched = x.dim() == 3
    if unbatched:
        x = x.unsqueeze(0)
    if x.dim() != 4 or weight.dim() != 4:
        raise ValueError(f"conv2d expects a 3-D or 4-D input and a 4-D weight, got "
                         f"input.shape={tuple(x.shape)}, weight.shape={tuple(weight.shape)}")
    if not isinstance(groups, int) or groups < 1 or weight.shape[0] % groups \
            or x.shape[1] != weight.shape[1] * groups:
        raise ValueError(f"conv2d: input channels {x.shape[1]}, weight.shape="
                         f"{tuple(weight.shape)} and groups={groups!r} do not fit")
    kernel = tuple(weight.shape[2:])
    if isinstance(padding, str):
        if padding == "same":
            x = _same_padding(x, kernel, dilation)
        padding = (0, 0)
    n, _, h, w = x.shape
    ho = (h + 2 * padding[0] - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    wo = (w + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    cols = _Unfold.apply(x, kernel, dilation, padding, stride, (ho, wo))
    cols = cols.reshape(n, groups, weight[0].numel(), ho * wo)      # (N, G, C/G*kh*kw, L)
    wm = weight.reshape(groups, weight.shape[0] // groups, -1)      # (G, O/G, C/G*kh*kw)
    y = pam_matmul(wm, cols, fmt, acc=acc, mul=mul, backward=backward, rounding=rounding)
    y = y.reshape(n, weight.shape[0], ho, wo)
    if bias is not None:
        y = add(y, bias.reshape(1, -1, 1, 1))
    return y.squeeze(0) if unbatched else y


def int_tuple(name, value, nd, low):
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
    stride, dilation = int_tuple(f"{op}: stride", stride, nd, 1), \
        int_tuple(f"{op}: dilation", dilation, nd, 1)
    if isinstance(padding, str) and output_padding is None:
        if padding not in ("same", "valid"):
            raise ValueError(f"{op}: padding={padding!r}; expected 'same', 'valid' or ints")
        if padding == "same" and stride != (1,) * nd:
            raise ValueError(f"{op}: padding='same' needs stride 1, got stride={stride}")
    else:
        padding = int_tuple(f"{op}: padding", padding, nd, 0)
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"{op}: groups={groups!r}; expected an int >= 1")
    if output_padding is None:
        return stride, padding, dilation
    output_padding = int_tuple(f"{op}: output_padding", output_padding, nd, 0)
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
               fmt="float32", *, acc="float32", mul="pam", backward="approx", rounding="nearest_even"):
    """1-D convolution as :func:`pam_conv2d` on a height-1 image: each output folds
    over the kernel's (channel, position) entries in that order.  F.conv1d's arguments."""
    (stride,), padding, (dilation,) = conv_args("conv1d", 1, stride, padding, dilation, groups)
    x, unbatched = _conv_operands("conv1d", 1, x, weight, groups)
    pad = padding if isinstance(padding, str) else (0, padding[0])
    y = pam_conv2d(x.unsqueeze(-2), weight.unsqueeze(-2), bias, (1, stride), pad,
                   (1, dilation), groups, fmt, acc=acc, mul=mul, backward=backward,
                   rounding=rounding).squeeze(-2)
    return y.squeeze(0) if unbatched else y


def pam_conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
               fmt="float32", *, acc="float32", mul="pam", backward="approx", rounding="nearest_even"):
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
    y = pam_conv2d(x2, w2, None, stride[1:], padding[1:], dilation[1:], groups, fmt, acc=acc, mul=mul,
                   backward=backward, rounding=rounding)
    y = y.reshape(n, do, *y.shape[1:]).transpose(1, 2)
    if bias is not None:
        y = add(y, bias.reshape(1, -1, 1, 1, 1))
    return y.squeeze(0) if unbatched else y


_CONV = {1: pam_conv1d, 2: pam_conv2d, 3: pam_conv3d}


def pam_conv_transpose(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                       dilation=1, fmt="float32", *, acc="float32", mul="pam", backward="approx",
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
    y = _CONV[nd](F.pad(x, pads), wc, bias, 1, 0, dilation, groups, fmt, acc=acc, mul=mul,
                  backward=backward, rounding=rounding)
    return y.squeeze(0) if unbatched else y


# --- elementwise PA operations ------------------------------------------------------

def _operand(v, name, like):
    if isinstance(v, torch.Tensor):
        return check_tensor(v, name)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if isinstance(like, torch.Tensor):      # a number on the other operand's device
            return torch.tensor(float(v), dtype=like.dtype, device=like.device)
        return torch.tensor(float(v), dtype=torch.float32)
    raise TypeError(f"{name} must be a floating tensor or a Python number, got "
                    f"{type(v).__name__}")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _binary(op, doc):
    def on(a, b, nm: Numerics):
        # a float32 CPU tensor and a number: the same ops without a tensor of the number
        if _number(b) and isinstance(a, torch.Tensor) and constant_ok(op, nm, a):
            return Constant.apply(a, b, False, op, nm.fmt, nm.backward, nm.rounding)
        if _number(a) and isinstance(b, torch.Tensor) and constant_ok(op, nm, b):
            return Constant.apply(b, a, True, op, nm.fmt, nm.backward, nm.rounding)
        a = _operand(a, "a", b)
        b = _operand(b, "b", a)
        return PABinary.apply(a, b, op, nm)

    def f(a, b, fmt="float32", *, backward="approx", rounding="nearest_even", mul="pam"):
        return on(a, b, check_numerics(fmt, backward, rounding, mul=mul))
    f.__name__ = f.__qualname__ = op
    f.__doc__ = doc + ("\n\n    Elementwise with torch broadcasting; operands (tensors or "
                       "numbers) are rounded into ``fmt``; ``backward`` is 'approx' or "
                       "'exact' (Table 1, computed by emu.grad).")
    return f, on


def _unary(op, doc):
    def on(x, nm: Numerics):
        return PAUnary.apply(check_tensor(x, "x"), op, nm)

    def f(x, fmt="float32", *, backward="approx", rounding="nearest_even", mul="pam"):
        return on(x, check_numerics(fmt, backward, rounding, mul=mul))
    f.__name__ = f.__qualname__ = op
    f.__doc__ = doc + ("\n\n    Elementwise; ``x`` is rounded into ``fmt``; ``backward`` "
                       "is 'approx' or 'exact' (Table 1, computed by emu.grad).  ``mul`` "
                       "is checked and passed along as by every PA call; a constant "
                       "factor inside the definition (paexp's log2(e)) is PAM's.")
    return f, on


# one function per differentiable op of emu's registry (emu.OPS), named explicitly, and
# its twin on checked numerics (``mul(a, b, nm)``, ``nm`` a Numerics): what composites call
_OPS = {_op.name: _op for _op in ops(differentiable=True)}
(pam_mul, mul), (pa_div, div) = (_binary(n, _OPS[n].doc) for n in ("pam_mul", "pa_div"))
(pa_exp2, exp2), (pa_log2, log2), (pa_exp, exp), (pa_log, log), (pa_sqrt, sqrt) = (
    _unary(n, _OPS[n].doc) for n in ("pa_exp2", "pa_log2", "pa_exp", "pa_log", "pa_sqrt"))
__all__ += list(_OPS)       # a new registry op fails torch_bridge's import until named here


# --- composites ------------------------------------------------------------------------

#: the primitives the composites' graphs are made of (torch_bridge/_compose.GraphOps)
PRIMS = SimpleNamespace(mul=mul, div=div, exp=exp, exp2=exp2, log=log, log2=log2, sqrt=sqrt)


def log2e_float(fmt) -> float:
    """log2(e) rounded to ``fmt``: the constant of eqs. 18-19."""
    return float(np.uint32(fmt.consts.log2e32).view(np.float32))


def row_params(fmt, dtype) -> dict:
    """The numbers of the softmax rows (composites.exp_shifted): log2(e) in ``fmt``, the
    bound of the scaled logits (``dtype``'s largest finite value)."""
    return {"log2e": log2e_float(fmt), "ymax": float(torch.finfo(dtype).max)}


def along(desc, x, dim, nm: Numerics, **extra):
    """The row composite ``desc`` (softmax, log_softmax: torch_bridge/composites.py) of
    ``x`` along ``dim``: its fused kernels for a small float32 CPU tensor (``dim`` moved
    last), else its graph; the same bits.  ``extra``: further numbers of ``desc``
    (softmax's ``scale``)."""
    params = dict(row_params(nm.fmt, x.dtype), **extra)
    if x.dim() and _compose.composite(nm, x):
        last = dim % x.dim() == x.dim() - 1
        xm = x if last else x.movedim(dim, -1)
        y = _compose.run(_compose.plan(desc, (("x", "e"),), tuple(params)), [xm], xm.shape[-1],
                         nm, params)
        return y if last else y.movedim(-1, dim)
    return desc(_compose.GraphOps(PRIMS, nm, dim), x=x, **params)


def pa_softmax(x, dim=-1, fmt="float32", *, backward="approx", rounding="nearest_even", mul="pam"):
    """Softmax with PA operations (section 2.3): ``e ÷̂ Σ e`` with
    ``e = paexp2(x ·̂ log2e - k)``, ``k = floor(max(x ·̂ log2e))`` a constant (eq. 18
    with the overflow shift as a power of two; composites.softmax); the sum is float32
    in emu.fold_sum's order.  Rows that are entirely -inf give NaN, as torch.softmax."""
    check_tensor(x, "input")
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    if x.numel() == 0:
        return x.clone()
    return along(D.softmax, x, dim, nm)


def pa_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, fmt="float32", *,
                  backward="approx", rounding="nearest_even", mul="pam"):
    """Layer norm with PA operations (section 2.3): mean ``Σx ÷̂ n``, variance
    ``Σ (x-μ) ·̂ (x-μ) ÷̂ n``, ``(x-μ) ÷̂ pasqrt(var + eps)``, PAM gain, float32 bias; the
    sums, and the gain's and bias's gradients, in emu.fold_sum's order.  Float32 CPU
    tensors take the fused kernels."""
    check_tensor(x, "input")
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) > x.dim() or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(f"layer_norm: normalized_shape={shape} does not match the trailing "
                         f"dimensions of input.shape={tuple(x.shape)}")
    n = math.prod(shape)
    params = {"n": float(n), "eps": float(eps)}
    if (_compose.composite(nm, x, weight, bias)
            and all(t is None or t.shape == shape for t in (weight, bias))):
        given = {k: t for k, t in (("weight", weight), ("bias", bias)) if t is not None}
        p = _compose.plan(D.layer_norm, (("x", "e"),) + tuple((k, "c") for k in given),
                          ("n", "eps"), **{k: None for k in ("weight", "bias") if k not in given})
        return _compose.run(p, [x, *given.values()], n, nm, params)
    o = _compose.GraphOps(PRIMS, nm, tuple(range(-len(shape), 0)))
    return D.layer_norm(o, x=x, weight=weight, bias=bias, **params)


def pa_cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean",
                     label_smoothing=0.0, fmt="float32", *, backward="approx",
                     rounding="nearest_even", mul="pam"):
    """Cross-entropy with label smoothing, every multiply/divide/exp/log PA.

    ``-log p = (palog2(Σ e) - t) ÷̂ log2e`` with ``t = z ·̂ log2e - k``, ``e = paexp2(t)``
    and the constant shift ``k = floor(max(z ·̂ log2e))`` (eqs. 10, 18, 19, as in
    :func:`pa_softmax`); with class-index targets the loss
    of a sample is ``(1-ε) ·̂ w_y ·̂ (-log p_y) + (ε ÷̂ C) ·̂ Σ_c w_c ·̂ (-log p_c)``, with
    probability targets ``Σ_c w_c ·̂ q_c ·̂ (-log p_c)``, ``q = (1-ε) t + ε/C`` (torch's
    definitions).  ``reduction``: 'mean' (divided ÷̂ by the summed weights of the
    non-ignored targets), 'sum' or 'none'; sums in emu.fold_sum's order.  Arguments as
    F.cross_entropy.  Float32 CPU logits take the fused kernels (no gradient to the
    targets or the class weights there).
    """
    check_tensor(input, "input")
    nm = check_numerics(fmt, backward, rounding, mul=mul)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction={reduction!r}; expected 'mean', 'sum' or 'none'")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing={label_smoothing!r} must lie in [0, 1]")
    if input.dim() == 0:
        raise ValueError("cross_entropy: input must have a class dimension")
    n_classes = input.shape[0] if input.dim() == 1 else input.shape[1]
    z = input.unsqueeze(0) if input.dim() == 1 else input.movedim(1, -1)
    out_shape = z.shape[:-1]
    z = z.reshape(-1, n_classes)
    probs = target.is_floating_point()
    if probs:
        t = target.unsqueeze(0) if input.dim() == 1 else target.movedim(1, -1)
        if t.shape[:-1] != out_shape or t.shape[-1] != n_classes:
            raise ValueError(f"cross_entropy: probability target.shape={tuple(target.shape)} "
                             f"must equal input.shape={tuple(input.shape)}")
        t = t.reshape(-1, n_classes).to(z.dtype)
    else:
        if target.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise TypeError(f"target must hold class indices (an integer dtype) or "
                            f"probabilities (floating), got {target.dtype}")
        t = target.reshape(-1).long()
        if t.numel() != z.shape[0]:
            raise ValueError(f"cross_entropy: target.shape={tuple(target.shape)} does not "
                             f"match input.shape={tuple(input.shape)}")
        valid = t != ignore_index
        if (valid & ((t < 0) | (t >= n_classes))).any():
            raise ValueError(f"cross_entropy: target holds class indices outside "
                             f"[0, {n_classes}) that are not ignore_index={ignore_index}")
        t = torch.where(valid, t, 0)
    if weight is not None:
        check_tensor(weight, "weight")
        if weight.shape != (n_classes,):
            raise ValueError(f"weight.shape={tuple(weight.shape)}; expected ({n_classes},)")
    eps = float(label_smoothing)
    if probs:
        q = t if eps == 0 else t * (1 - eps) + eps / n_classes   # target smoothing: data prep
    smooth = not probs and eps > 0
    params = row_params(nm.fmt, z.dtype)
    if smooth:
        params.update(keep=1.0 - eps,
                      smooth_c=float(emu.pa_div(eps, float(n_classes), nm.fmt)))
    if (_compose.composite(nm, z, weight, q if probs else None)
            and not (weight is not None and weight.requires_grad)
            and not (probs and q.requires_grad)):
        # the targets and class weights take no gradient here
        given = [("weight", "c", "f", False)] if weight is not None else []
        given += [("q", "e", "f", False)] if probs else [("target", "r", "i"),
                                                          ("valid", "r", "b")]
        tensors = ([weight] if weight is not None else []) + ([q] if probs else [t, valid])
        p = _compose.plan(D.cross_entropy, (("z", "e"), *given), tuple(params), smooth=smooth)
        loss = _compose.run(p, [z, *tensors], n_classes, nm, params)
    else:
        loss = D.cross_entropy(_compose.GraphOps(PRIMS, nm), z=z, weight=weight,
                               q=q if probs else None, target=None if probs else t[:, None],
                               valid=None if probs else valid[:, None], smooth=smooth,
                               **params).squeeze(-1)
    denom = None
    if not probs:
        wy = torch.ones_like(loss) if weight is None else weight.to(loss.dtype)[t]
        denom = fold_sum(torch.where(valid, wy, 0.0), 0, keepdim=False)
    if reduction == "none":
        return loss.reshape(out_shape)
    total = fold_sum(loss, 0, keepdim=False)
    if reduction == "sum":
        return total
    if denom is None:
        denom = float(loss.shape[0])
    return div(total, denom.detach() if isinstance(denom, torch.Tensor) else denom, nm)


# --- dispatchers ------------------------------------------------------------------------

def _on(config: PAMConfig | None, op: str) -> bool:
    return check_config(config) is not None and config.enabled(op)


def _mm_kw(config):
    return dict(acc=config.acc, mul=config.mul, backward=config.kind("matmul"),
                rounding=config.rounding)


def _pa_kw(config, op):
    return dict(fmt=config.pa_fmt, backward=config.kind(op), rounding=config.rounding,
                mul=config.mul)


def autocast_operands(*ts):
    """The operands as torch's CPU autocast hands them to a matmul-family op (linear,
    matmul, convolution, attention are on its lower-precision list): floating tensors
    cast to the autocast dtype when autocast is on, so PA results keep torch's dtypes."""
    if not torch.is_autocast_enabled("cpu"):
        return ts
    dtype = torch.get_autocast_dtype("cpu")
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                 for t in ts)


def matmul(a, b, config: PAMConfig | None = None):
    """torch.matmul, as a PAM matmul when ``config`` enables 'matmul'."""
    if not _on(config, "matmul"):
        return torch.matmul(a, b)
    a, b = autocast_operands(a, b)
    return pam_matmul(a, b, config.fmt, **_mm_kw(config))


def linear(x, weight, bias=None, config: PAMConfig | None = None, *, recipe_states=None):
    """F.linear, as a PAM linear layer when ``config`` enables 'matmul' (``recipe_states``:
    delayed scaling's states, :func:`pam_linear`)."""
    if not _on(config, "matmul"):
        return F.linear(x, weight, bias)
    x, weight, bias = autocast_operands(x, weight, bias)
    return pam_linear(x, weight, bias, config.fmt, recipe_states=recipe_states,
                      **_mm_kw(config))


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
           config: PAMConfig | None = None):
    """F.conv2d, as PAM matmuls when ``config`` enables 'matmul'."""
    if not _on(config, "matmul"):
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    x, weight, bias = autocast_operands(x, weight, bias)
    return pam_conv2d(x, weight, bias, stride, padding, dilation, groups, config.fmt,
                      **_mm_kw(config))


def softmax(x, dim=-1, config: PAMConfig | None = None):
    """torch.softmax, PA when ``config`` enables 'softmax'."""
    if not _on(config, "softmax"):
        return torch.softmax(x, dim)
    return pa_softmax(x, dim, **_pa_kw(config, "softmax"))


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5,
               config: PAMConfig | None = None):
    """F.layer_norm, PA when ``config`` enables 'layernorm'."""
    if not _on(config, "layernorm"):
        return F.layer_norm(x, normalized_shape, weight, bias, eps)
    return pa_layer_norm(x, normalized_shape, weight, bias, eps, **_pa_kw(config, "layernorm"))


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean",
                  label_smoothing=0.0, config: PAMConfig | None = None):
    """F.cross_entropy, PA when ``config`` enables 'loss'."""
    if not _on(config, "loss"):
        return F.cross_entropy(input, target, weight, ignore_index=ignore_index,
                               reduction=reduction, label_smoothing=label_smoothing)
    return pa_cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing,
                            **_pa_kw(config, "loss"))


def _repeat_heads(t, rep):
    """``t.repeat_interleave(rep, -3)`` by :func:`expand`: the gradient sums each group's
    ``rep`` heads in emu.fold_sum's order."""
    shape = (*t.shape[:-2], rep, *t.shape[-2:])
    return expand(t.unsqueeze(-3), shape).reshape(*t.shape[:-3], -1, *t.shape[-2:])


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *,
                                 config: PAMConfig | None = None):
    """F.scaled_dot_product_attention with PAM batched matmuls ('matmul') and a PA
    softmax whose logit scaling is a PAM ('softmax').  Dropout stays native (a
    select and a constant scale).  A query row whose keys are all masked gives 0, as
    torch's attention does (not NaN, as a softmax of -inf would).  The gradients of a
    float mask and of GQA's shared key/value heads are summed in emu.fold_sum's order."""
    if not (_on(config, "matmul") or _on(config, "softmax")):
        return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                              is_causal, scale=scale, enable_gqa=enable_gqa)
    query, key, value, attn_mask = autocast_operands(query, key, value, attn_mask)
    L, S = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        key, value = _repeat_heads(key, rep), _repeat_heads(value, rep)
    s = matmul(query, key.transpose(-2, -1), config)
    # the logit scale as the softmax's own first PAM (one node): where no float mask is
    # added between them, PAM(s, scale) then -inf masks is -inf masks then PAM (PAM(-inf,
    # c) = -inf; with 0 < scale <= 1 no finite logit becomes -inf), the same bits
    pa = _on(config, "softmax")
    fold = pa and 0 < scale <= 1 and s.numel() and (attn_mask is None
                                                    or attn_mask.dtype == torch.bool)
    if not fold:
        s = pam_mul(s, scale, **_pa_kw(config, "softmax")) if pa else s * scale
    if is_causal:
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool, device=s.device).triu(1),
                          float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            s = s.masked_fill(~attn_mask, float("-inf"))
        else:
            s = add(s, attn_mask)
    # rows with every key masked: torch's attention gives 0 there (its safe softmax);
    # softmax on zeros keeps NaN out of the forward and the backward, then the rows are 0
    def rows(t):
        if not fold:
            return softmax(t, -1, config)
        return along(D.softmax, t, -1, check_numerics(**_pa_kw(config, "softmax")),
                     scale=scale)
    dead = (s == float("-inf")).all(-1, keepdim=True)
    if dead.any():
        p = rows(s.masked_fill(dead, 0.0)).masked_fill(dead, 0.0)
    else:
        p = rows(s)
    if dropout_p > 0:
        p = F.dropout(p, dropout_p)
    return matmul(p, value, config)

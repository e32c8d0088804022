"""pam_mode: run unmodified models on emulated PA hardware via a TorchFunctionMode.

Inside ``with pam_mode(config):`` these torch functions are routed to their PA
versions when their op group is enabled (otherwise, and for non-floating or non-CPU
operands, they run natively):

* ``matmul``: torch.matmul / torch.linalg.matmul / Tensor.matmul / ``@``, torch.mm,
  torch.bmm, torch.addmm, torch.baddbmm, torch.addmv, torch.addbmm, torch.mv, dot,
  inner, outer/ger (and their Tensor methods), F.linear, F.conv1d, F.conv2d, F.conv3d,
  F.conv_transpose1d/2d/3d,
  torch.einsum and tensordot (:mod:`torch_bridge.contract`), linalg.multi_dot (left to
  right), F.interpolate's linear, bilinear, bicubic and trilinear modes (a PAM matmul per
  axis by torch's weight table), the batched matmuls of F.scaled_dot_product_attention and
  F.multi_head_attention_forward;
* ``softmax``: softmax and log_softmax (F., torch., torch.special., Tensor.), and the
  softmax and logit scaling inside scaled_dot_product_attention;
* ``layernorm``: F.layer_norm, F.rms_norm, F.batch_norm, F.group_norm, F.instance_norm
  (:mod:`torch_bridge.norms`);
* ``loss``: F.cross_entropy, F.nll_loss, F.mse_loss, F.l1_loss, F.huber_loss,
  F.smooth_l1_loss, F.binary_cross_entropy (with_logits), F.kl_div
  (:mod:`torch_bridge.losses`);
* ``elementwise``: ``*`` and ``/`` (torch.mul/div/multiply/divide/true_divide, their
  Tensor methods, reflected and in-place forms), ``**`` / pow with a number exponent
  or a positive number base, exp, exp2, log, log2, sqrt, rsqrt, reciprocal, sigmoid,
  tanh (torch. and Tensor., in-place too; torch.special.expit and exp2), torch.mean /
  Tensor.mean, the 2-norm (torch.norm, Tensor.norm, linalg.vector_norm), F.gelu, F.silu,
  F.softplus, F.cosine_similarity, F.pairwise_distance (p=2), F.avg_pool1d/2d/3d and
  F.adaptive_avg_pool1d/2d/3d — through the PA primitives, :mod:`torch_bridge.elementwise`
  and :mod:`torch_bridge.contract`;
* ``matmul`` and ``elementwise``: torch.gru / lstm / rnn_tanh / rnn_relu (nn.GRU,
  nn.LSTM, nn.RNN on padded input), :mod:`torch_bridge.recurrent`.

Other functions of torch.nn.functional and torch.functional that are written in Python
(e.g. F.normalize) run their body under the mode, so the calls inside are routed.
Only these torch functions are intercepted (:func:`torch_bridge.audit` lists what a
given model still runs natively).  Code inside a handler runs without the mode, so the
composites' own float32 additions stay additions.

Activation checkpointing: autograd runs backward without the forward's function
modes, so a checkpointed block would be recomputed natively.  This module therefore
wraps torch.utils.checkpoint's recomputation (``_CheckpointFrame`` for the
non-reentrant variant, ``CheckpointFunction`` for the reentrant one): the PAM modes
active when the block ran forward are re-entered while it is recomputed, so a
checkpointed model gives the same bits as an unchecked one.
"""
from __future__ import annotations

import functools
import inspect
import math
import types
from contextlib import ExitStack, contextmanager

import torch
from torch.nn import functional as F
from torch.overrides import (TorchFunctionMode, _get_current_function_mode_stack,
                             get_testing_overrides)
from torch.utils import checkpoint as _ckpt

from . import contract as PC
from . import elementwise as PE
from . import functional as PF
from . import losses as PL
from . import norms as PN
from . import recurrent as PR
from ._sums import add
from ._tensors import FLOATS
from .compiling import eager_under_compile
from .config import PAMConfig, check_config
from .functional import _mm_kw, _pa_kw

__all__ = ["pam_mode"]


def _floating(*ts):
    return all(isinstance(t, torch.Tensor) and t.dtype in FLOATS
               and t.device.type in ("cpu", "cuda") for t in ts)


def _scaled(x, factor, cfg):
    """``factor * x`` as a PAM by a constant (addmm/baddbmm alpha, beta)."""
    if factor == 1:
        return x
    return PF.pam_mul(x, float(factor), **_pa_kw(cfg, "matmul"))


_T = torch.Tensor


def _matmul(cfg, a, b, *, out=None):
    if out is not None or not _floating(a, b):
        return NotImplemented
    return PF.matmul(a, b, cfg)


def _rmatmul(cfg, a, b):
    return _matmul(cfg, b, a)


def _addmm(cfg, inp, m1, m2, *, beta=1, alpha=1, out=None):
    if out is not None or not _floating(inp, m1, m2):
        return NotImplemented
    inp, m1, m2 = PF.autocast_operands(inp, m1, m2)
    prod = _scaled(PF.matmul(m1, m2, cfg), alpha, cfg)
    return prod if beta == 0 else add(_scaled(inp, beta, cfg), prod)


def _linear(cfg, x, weight, bias=None):
    if not _floating(x, weight):
        return NotImplemented
    return PF.linear(x, weight, bias, cfg)


def _conv2d(cfg, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if not _floating(x, weight):
        return NotImplemented
    return PF.conv2d(x, weight, bias, stride, padding, dilation, groups, cfg)


def _conv1d(cfg, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if not _floating(x, weight):
        return NotImplemented
    x, weight, bias = PF.autocast_operands(x, weight, bias)
    return PF.pam_conv1d(x, weight, bias, stride, padding, dilation, groups, cfg.fmt,
                         acc=cfg.acc, backward=cfg.kind("matmul"), rounding=cfg.rounding)


def _conv3d(cfg, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if not _floating(x, weight):
        return NotImplemented
    x, weight, bias = PF.autocast_operands(x, weight, bias)
    return PF.pam_conv3d(x, weight, bias, stride, padding, dilation, groups, cfg.fmt,
                         **_mm_kw(cfg))


def _conv_transpose(cfg, x, weight, bias=None, stride=1, padding=0, output_padding=0,
                    groups=1, dilation=1):
    if not _floating(x, weight):
        return NotImplemented
    x, weight, bias = PF.autocast_operands(x, weight, bias)
    return PF.pam_conv_transpose(x, weight, bias, stride, padding, output_padding, groups,
                                 dilation, cfg.fmt, **_mm_kw(cfg))


def _addbmm(cfg, inp, b1, b2, *, beta=1, alpha=1, out=None):
    """torch.addbmm: the batch-summed product as one PAM fold over (batch, k)."""
    if out is not None or not _floating(inp, b1, b2):
        return NotImplemented
    inp, b1, b2 = PF.autocast_operands(inp, b1, b2)
    prod = _scaled(PC.pam_addbmm(b1, b2, cfg.fmt, **_mm_kw(cfg)), alpha, cfg)
    return prod if beta == 0 else add(_scaled(inp, beta, cfg), prod)


def _einsum(cfg, equation, *operands):
    ops = operands[0] if len(operands) == 1 and isinstance(operands[0], (list, tuple)) \
        else operands
    if not isinstance(equation, str) or not ops or not _floating(*ops):
        return NotImplemented
    y = PC.pam_einsum(equation, *PF.autocast_operands(*ops), fmt=cfg.fmt, acc=cfg.acc,
                      backward=cfg.kind("matmul"), rounding=cfg.rounding)
    return NotImplemented if y is None else y


def _outer(cfg, a, b, *, out=None):
    if out is not None or not _floating(a, b) or a.dim() != 1 or b.dim() != 1:
        return NotImplemented
    return PF.matmul(a[:, None], b[None, :], cfg)


def _tensordot(cfg, a, b, dims=2, out=None):
    """As torch.tensordot: an int ``dims`` contracts a's last and b's first dims."""
    if out is not None or not _floating(a, b):
        return NotImplemented
    if isinstance(dims, int):
        da, db = list(range(a.dim() - dims, a.dim())), list(range(dims))
    elif isinstance(dims, (list, tuple)) and len(dims) == 2:
        da, db = ([d] if isinstance(d, int) else list(d) for d in dims)
    else:
        return NotImplemented
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    sa = [next(letters) for _ in range(a.dim())]
    sb = [next(letters) for _ in range(b.dim())]
    for i, j in zip(da, db):
        sb[j % b.dim()] = sa[i % a.dim()]
    keep = [c for c in sa if c not in sb] + [c for c in sb if c not in sa]
    return _einsum(cfg, f"{''.join(sa)},{''.join(sb)}->{''.join(keep)}", a, b)


def _inner(cfg, a, b, *, out=None):
    if out is not None or not _floating(a, b) or a.dim() == 0 or b.dim() == 0:
        return NotImplemented
    return _tensordot(cfg, a, b, ([a.dim() - 1], [b.dim() - 1]))


def _multi_dot(cfg, tensors, *, out=None):
    """torch.linalg.multi_dot, multiplied left to right (torch picks the cheapest order;
    here the order, and so the bits, are fixed)."""
    if out is not None or not _floating(*tensors) or len(tensors) < 2:
        return NotImplemented
    first, last = tensors[0].dim() == 1, tensors[-1].dim() == 1
    ts = [tensors[0][None] if first else tensors[0], *tensors[1:-1],
          tensors[-1][:, None] if last else tensors[-1]]
    y = ts[0]
    for t in ts[1:]:
        y = PF.matmul(y, t, cfg)
    y = y.squeeze(-1) if last else y
    return y.squeeze(0) if first else y


def _interpolate(cfg, x, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None, antialias=False):
    """The modes with weights; nearest (a gather), antialias and anything torch would
    refuse run torch's own F.interpolate (its body under the mode)."""
    nd = PC.INTERPOLATION.get(mode)
    if (nd is None or antialias or not _floating(x) or x.dim() != nd + 2
            or (size is None) == (scale_factor is None)):
        return NotImplemented
    return PC.pam_interpolate(x, size, scale_factor, mode, align_corners,
                              recompute_scale_factor, cfg.fmt, **_mm_kw(cfg))


def _sdpa(cfg, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    if not _floating(q, k, v):
        return NotImplemented
    return PF.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale,
                                           enable_gqa, config=cfg)


def _softmax_impl(cfg, x, dim, dtype):
    if not (cfg.enabled("softmax") and _floating(x)):
        return NotImplemented
    if dtype is not None:
        x = x.to(dtype)
    return PF.pa_softmax(x, dim, **_pa_kw(cfg, "softmax"))


def _f_softmax(cfg, x, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        dim = F._get_softmax_dim("softmax", x.dim(), _stacklevel)
    return _softmax_impl(cfg, x, dim, dtype)


def _t_softmax(cfg, x, dim, dtype=None, **_):
    return _softmax_impl(cfg, x, dim, dtype)


def _layer_norm(cfg, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    if not _floating(x):
        return NotImplemented
    return PF.layer_norm(x, normalized_shape, weight, bias, eps, cfg)


def _cross_entropy(cfg, input, target, weight=None, size_average=None, ignore_index=-100,
                   reduce=None, reduction="mean", label_smoothing=0.0):
    if not _floating(input):
        return NotImplemented
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    return PF.cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing,
                            cfg)


_NO_HAND_OFF = {name: (lambda *_: False) for name in
                ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")}
#: torch's Python-level composites whose bodies run under the mode when not handled
_COMPOSITE_MODULES = ("torch.nn.functional", "torch.functional")


@functools.cache
def _body(f):
    """``f`` (a torch function written in Python) whose first statement no longer hands
    the call back to the active mode: run under the mode, the torch calls inside it are
    routed (torch's code, not a copy of it), e.g. F.multi_head_attention_forward's
    F.linear, bmm and softmax, or F.normalize's norm and division."""
    g = dict(f.__globals__, **_NO_HAND_OFF)
    body = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, f.__closure__)
    body.__kwdefaults__ = f.__kwdefaults__
    return body


def _composite(func) -> bool:
    """Whether ``func`` is one of torch's Python composites whose body runs under the
    mode (remembered per function: asked for every call the mode does not handle)."""
    try:
        return _COMPOSITES[func]
    except KeyError:
        pass
    except TypeError:           # unhashable: asked each time
        return _is_composite(func)
    c = _COMPOSITES[func] = _is_composite(func)
    return c


def _is_composite(func) -> bool:
    return (isinstance(func, types.FunctionType)
            and getattr(func, "__module__", None) in _COMPOSITE_MODULES
            and any(n in _NO_HAND_OFF for n in func.__code__.co_names))


_COMPOSITES: dict = {}


def _mha(cfg, *args, **kwargs):
    if not (cfg.enabled("matmul") or cfg.enabled("softmax")):
        return NotImplemented
    with _PAMMode(cfg):
        return _body(F.multi_head_attention_forward)(*args, **kwargs)


# --- group "elementwise": a model's own products, quotients, powers, exp/log/sqrt, means and
# activations, through the PA primitives and the composites of torch_bridge.elementwise

def _ew(cfg):
    return _pa_kw(cfg, "elementwise")


def _real(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _binary_operands(a, b):
    """``(a, b)`` cast to torch's result dtype for a PA binary op, or None (run natively):
    CPU tensors or real numbers, at least one tensor, a floating result."""
    if (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype is b.dtype
            and a.is_cpu and b.is_cpu and a.dtype in FLOATS):     # the common case, cheaply
        return a, b
    if not (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)):
        return None
    for v in (a, b):
        if isinstance(v, torch.Tensor):
            if v.device.type != "cpu" or v.is_complex():
                return None
        elif not _real(v):
            return None
    dtype = torch.result_type(a, b)
    if dtype not in FLOATS:
        return None
    return tuple(v.to(dtype) if isinstance(v, torch.Tensor) else v for v in (a, b))


def _before_write(x, *operands):
    """``x``, or a copy of it where autograd records: an in-place op is run out of place
    and its result copied into ``x``, and the PA Function must not have saved the very
    tensor that the copy then overwrites (native in-place ops keep what their derivative
    reads, so they work with backward)."""
    if torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad
                                       for v in (x, *operands)):
        return x.clone()
    return x


def _binary(op, swap=False, inplace=False):
    def handler(cfg, a, b, *, out=None, rounding_mode=None):
        if out is not None or rounding_mode is not None:
            return NotImplemented
        ops = _binary_operands(*((b, a) if swap else (a, b)))
        if ops is None:
            return NotImplemented
        if inplace:
            if ops[0].dtype != a.dtype:         # torch refuses to cast into the target
                return NotImplemented
            ops = (_before_write(ops[0], ops[1]), ops[1])
        y = op(*ops, **_ew(cfg))
        return (b if swap else a).copy_(y) if inplace else y
    return handler


def _unary(op, inplace=False):
    def handler(cfg, x, *, out=None):
        if out is not None or not _floating(x):
            return NotImplemented
        y = op(_before_write(x) if inplace else x, **_ew(cfg))
        return x.copy_(y) if inplace else y
    return handler


def _pow(cfg, a, b, *, out=None):
    if out is not None:
        return NotImplemented
    if _floating(a) and _real(b):
        return PE.pa_pow(a, b, **_ew(cfg))
    if _real(a) and a > 0 and _floating(b):        # base ** x = paexp2(x ·̂ log2(base))
        return PF.pa_exp2(PF.pam_mul(b, math.log2(a), **_ew(cfg)), **_ew(cfg))
    return NotImplemented


def _rpow(cfg, a, b):
    return _pow(cfg, b, a)


def _mean(cfg, x, dim=None, keepdim=False, *, dtype=None, out=None):
    if out is not None or not _floating(x) or (dtype is not None and dtype not in FLOATS):
        return NotImplemented
    return PE.pa_mean(x if dtype is None else x.to(dtype), dim, keepdim, **_ew(cfg))


def _gelu(cfg, x, approximate="none"):
    if not _floating(x):
        return NotImplemented
    return PE.pa_gelu(x, approximate, **_ew(cfg))


def _silu(cfg, x, inplace=False):
    if not _floating(x):
        return NotImplemented
    y = PE.pa_silu(_before_write(x) if inplace else x, **_ew(cfg))
    return x.copy_(y) if inplace else y


def _softplus(cfg, x, beta=1.0, threshold=20.0):
    if not _floating(x):
        return NotImplemented
    return PE.pa_softplus(x, beta, threshold, **_ew(cfg))


def _rms_norm(cfg, x, normalized_shape, weight=None, eps=None):
    if not _floating(x):
        return NotImplemented
    return PE.pa_rms_norm(x, normalized_shape, weight, eps, **_norm_kw(cfg))


def _norm_kw(cfg):
    return _pa_kw(cfg, "layernorm")


def _batch_norm(cfg, x, running_mean, running_var, weight=None, bias=None, training=False,
                momentum=0.1, eps=1e-5):
    if not _floating(x) or momentum is None:        # None: cumulative average, torch's
        return NotImplemented
    return PN.pa_batch_norm(x, running_mean, running_var, weight, bias, training, momentum,
                            eps, **_norm_kw(cfg))


def _group_norm(cfg, x, num_groups, weight=None, bias=None, eps=1e-5):
    if not _floating(x):
        return NotImplemented
    return PN.pa_group_norm(x, num_groups, weight, bias, eps, **_norm_kw(cfg))


def _instance_norm(cfg, x, running_mean=None, running_var=None, weight=None, bias=None,
                   use_input_stats=True, momentum=0.1, eps=1e-5):
    if not _floating(x) or not use_input_stats or running_mean is not None:
        return NotImplemented                     # tracked running statistics: torch's
    return PN.pa_group_norm(x, x.shape[1], weight, bias, eps, **_norm_kw(cfg))


def _recurrent(mode):
    def handler(cfg, input, hx, params, has_biases, num_layers, dropout, train,
                bidirectional, batch_first=None):
        if batch_first is None or not _floating(input):    # packed sequences: torch's
            return NotImplemented
        if not (cfg.enabled("matmul") or cfg.enabled("elementwise")):
            return NotImplemented
        return PR.pa_recurrent(mode, input, hx, list(params), has_biases, num_layers,
                               dropout, train, bidirectional, batch_first, cfg)
    return handler


def _norm(cfg, x, p="fro", dim=None, keepdim=False, dtype=None, out=None):
    if out is not None or dtype is not None or not _floating(x) or p not in (2, "fro"):
        return NotImplemented
    return PE.pa_vector_norm(x, dim, keepdim, **_ew(cfg))


def _vector_norm(cfg, x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    return _norm(cfg, x, ord if ord != "fro" else None, dim, keepdim, dtype, out)


def _log_softmax(cfg, x, dim=None, _stacklevel=3, dtype=None):
    if not _floating(x):
        return NotImplemented
    if dim is None:
        dim = F._get_softmax_dim("log_softmax", x.dim(), _stacklevel)
    if dtype is not None:
        x = x.to(dtype)
    return PL.pa_log_softmax(x, dim, **_pa_kw(cfg, "softmax"))


def _loss_kw(cfg):
    return _pa_kw(cfg, "loss")


def _bad_weight(input, weight):
    """torch's weighted mse/l1/huber need a weight of the input's shape (else: its error)."""
    return weight is not None and weight.shape != input.shape


def _reduction(size_average, reduce, reduction):
    if size_average is not None or reduce is not None:
        return torch.nn._reduction.legacy_get_string(size_average, reduce)
    return reduction


def _nll_loss(cfg, input, target, weight=None, size_average=None, ignore_index=-100,
              reduce=None, reduction="mean"):
    if not _floating(input):
        return NotImplemented
    return PL.pa_nll_loss(input, target, weight, ignore_index,
                          _reduction(size_average, reduce, reduction), **_loss_kw(cfg))


def _mse_loss(cfg, input, target, size_average=None, reduce=None, reduction="mean",
              weight=None):
    if not _floating(input, target) or input.shape != target.shape or _bad_weight(input, weight):
        return NotImplemented
    return PL.pa_mse_loss(input, target, _reduction(size_average, reduce, reduction),
                          **_loss_kw(cfg), weight=weight)


def _bce(cfg, input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    if not _floating(input, target) or input.shape != target.shape:
        return NotImplemented
    return PL.pa_binary_cross_entropy(input, target, weight,
                                      _reduction(size_average, reduce, reduction), **_loss_kw(cfg))


def _bce_logits(cfg, input, target, weight=None, size_average=None, reduce=None,
                reduction="mean", pos_weight=None):
    if not _floating(input, target) or input.shape != target.shape:
        return NotImplemented
    return PL.pa_binary_cross_entropy_with_logits(
        input, target, weight, _reduction(size_average, reduce, reduction), pos_weight,
        **_loss_kw(cfg))


def _kl_div(cfg, input, target, size_average=None, reduce=None, reduction="mean",
            log_target=False):
    if not _floating(input, target):
        return NotImplemented
    return PL.pa_kl_div(input, target, _reduction(size_average, reduce, reduction), log_target,
                        **_loss_kw(cfg))


def _l1_loss(cfg, input, target, size_average=None, reduce=None, reduction="mean",
             weight=None):
    if not _floating(input, target) or _bad_weight(input, weight):
        return NotImplemented
    return PL.pa_l1_loss(input, target, _reduction(size_average, reduce, reduction),
                         **_loss_kw(cfg), weight=weight)


def _huber_loss(cfg, input, target, reduction="mean", delta=1.0, weight=None):
    if not _floating(input, target) or _bad_weight(input, weight):
        return NotImplemented
    return PL.pa_huber_loss(input, target, reduction, delta, **_loss_kw(cfg), weight=weight)


def _smooth_l1_loss(cfg, input, target, size_average=None, reduce=None, reduction="mean",
                    beta=1.0):
    if not _floating(input, target):
        return NotImplemented
    return PL.pa_smooth_l1_loss(input, target, _reduction(size_average, reduce, reduction),
                                beta, **_loss_kw(cfg))


def _avg_pool(nd):
    def handler(cfg, x, kernel_size, stride=None, padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
        if not _floating(x):
            return NotImplemented
        k = (kernel_size,) * nd if isinstance(kernel_size, int) else kernel_size
        return PC.pa_avg_pool(x, k, stride, padding, ceil_mode, count_include_pad,
                              divisor_override, **_ew(cfg))
    return handler


def _adaptive_avg_pool(nd):
    def handler(cfg, x, output_size):
        if not _floating(x):
            return NotImplemented
        size = (output_size,) * nd if isinstance(output_size, int) or output_size is None \
            else output_size
        return PC.pa_adaptive_avg_pool(x, size, **_ew(cfg))
    return handler


def _cosine_similarity(cfg, x1, x2, dim=1, eps=1e-8):
    if not _floating(x1, x2):
        return NotImplemented
    return PE.pa_cosine_similarity(x1, x2, dim, eps, **_ew(cfg))


def _pairwise_distance(cfg, x1, x2, p=2.0, eps=1e-6, keepdim=False):
    if p != 2 or not _floating(x1, x2) or x1.dim() == 0 or x2.dim() == 0:
        return NotImplemented
    return PE.pa_pairwise_distance(x1, x2, eps, keepdim, **_ew(cfg))


_mul, _div = _binary(PF.pam_mul), _binary(PF.pa_div)
_ELEMENTWISE = {
    torch.mul: _mul, torch.multiply: _mul, _T.mul: _mul, _T.multiply: _mul, _T.__mul__: _mul,
    _T.__rmul__: _binary(PF.pam_mul, swap=True),
    _T.mul_: _binary(PF.pam_mul, inplace=True), _T.__imul__: _binary(PF.pam_mul, inplace=True),
    torch.div: _div, torch.divide: _div, torch.true_divide: _div, _T.div: _div,
    _T.divide: _div, _T.true_divide: _div, _T.__truediv__: _div,
    _T.__rtruediv__: _binary(PF.pa_div, swap=True),
    _T.div_: _binary(PF.pa_div, inplace=True), _T.__itruediv__: _binary(PF.pa_div, inplace=True),
    torch.pow: _pow, _T.pow: _pow, _T.__pow__: _pow, _T.__rpow__: _rpow,
    torch.mean: _mean, _T.mean: _mean,
    F.gelu: _gelu, F.silu: _silu, F.softplus: _softplus,
    F.cosine_similarity: _cosine_similarity, F.pairwise_distance: _pairwise_distance,
    F.avg_pool1d: _avg_pool(1), F.avg_pool2d: _avg_pool(2), F.avg_pool3d: _avg_pool(3),
    F.adaptive_avg_pool1d: _adaptive_avg_pool(1), F.adaptive_avg_pool2d: _adaptive_avg_pool(2),
    F.adaptive_avg_pool3d: _adaptive_avg_pool(3),
    torch.norm: _norm, _T.norm: _norm, torch.linalg.vector_norm: _vector_norm,
}
for _fn, _op in {"exp": PF.pa_exp, "log": PF.pa_log, "sqrt": PF.pa_sqrt, "exp2": PF.pa_exp2,
                 "log2": PF.pa_log2, "rsqrt": PE.pa_rsqrt, "reciprocal": PE.pa_reciprocal,
                 "sigmoid": PE.pa_sigmoid, "tanh": PE.pa_tanh}.items():
    _ELEMENTWISE[getattr(torch, _fn)] = _ELEMENTWISE[getattr(_T, _fn)] = _unary(_op)
    _ELEMENTWISE[getattr(_T, _fn + "_")] = _unary(_op, inplace=True)
# torch.special's spellings of the same functions
_ELEMENTWISE[torch.special.expit] = _ELEMENTWISE[torch.sigmoid]
_ELEMENTWISE[torch.special.exp2] = _ELEMENTWISE[torch.exp2]

_HANDLERS = {
    torch.matmul: _matmul, _T.matmul: _matmul, _T.__matmul__: _matmul, _T.__rmatmul__: _rmatmul,
    torch.linalg.matmul: _matmul, torch.mm: _matmul, _T.mm: _matmul, torch.bmm: _matmul,
    _T.bmm: _matmul,
    torch.mv: _matmul, _T.mv: _matmul, torch.dot: _matmul, _T.dot: _matmul,
    torch.inner: _inner, torch.outer: _outer, torch.ger: _outer, _T.outer: _outer,
    torch.tensordot: _tensordot, torch.linalg.multi_dot: _multi_dot,
    torch.addmm: _addmm, _T.addmm: _addmm, torch.baddbmm: _addmm, _T.baddbmm: _addmm,
    torch.addmv: _addmm, _T.addmv: _addmm, torch.addbmm: _addbmm, _T.addbmm: _addbmm,
    F.linear: _linear, F.conv1d: _conv1d, F.conv2d: _conv2d, F.conv3d: _conv3d,
    F.conv_transpose1d: _conv_transpose, F.conv_transpose2d: _conv_transpose,
    F.conv_transpose3d: _conv_transpose, torch.einsum: _einsum, F.interpolate: _interpolate,
    F.scaled_dot_product_attention: _sdpa, F.multi_head_attention_forward: _mha,
    F.softmax: _f_softmax, torch.softmax: _t_softmax, _T.softmax: _t_softmax,
    torch.special.softmax: _t_softmax, torch.special.log_softmax: _log_softmax,
    F.layer_norm: _layer_norm, F.cross_entropy: _cross_entropy, F.rms_norm: _rms_norm,
    F.log_softmax: _log_softmax, torch.log_softmax: _log_softmax,
    _T.log_softmax: _log_softmax, F.nll_loss: _nll_loss, F.mse_loss: _mse_loss,
    F.binary_cross_entropy: _bce, F.binary_cross_entropy_with_logits: _bce_logits,
    F.kl_div: _kl_div, F.l1_loss: _l1_loss, F.huber_loss: _huber_loss,
    F.smooth_l1_loss: _smooth_l1_loss,
    **{getattr(torch, m): _recurrent(m) for m in ("gru", "lstm", "rnn_tanh", "rnn_relu")},
    F.batch_norm: _batch_norm, F.group_norm: _group_norm, F.instance_norm: _instance_norm,
    **_ELEMENTWISE,
}
_LOSSES = (_cross_entropy, _nll_loss, _mse_loss, _bce, _bce_logits, _kl_div, _l1_loss,
           _huber_loss, _smooth_l1_loss)
_GROUP = {**{h: "matmul" for h in (_conv1d, _conv3d, _conv_transpose, _addbmm, _einsum, _outer,
                                   _tensordot, _inner, _multi_dot, _interpolate)},
          **{h: "layernorm" for h in (_layer_norm, _rms_norm, _batch_norm, _group_norm,
                                      _instance_norm)},
          _log_softmax: "softmax", **{h: "loss" for h in _LOSSES},
          **{h: "elementwise" for h in _ELEMENTWISE.values()}}


@functools.cache
def _required(func) -> tuple[str, ...]:
    """The names of ``func``'s parameters that have no default, in order: torch's own
    signature for a function written in Python, else the one torch.overrides' table
    states for a builtin (``torch.addmm(input, mat1, mat2, ...)``)."""
    sig = func if isinstance(func, types.FunctionType) else _signatures().get(func)
    if sig is None:
        return ()
    return tuple(p.name for p in inspect.signature(sig).parameters.values()
                 if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD)


@functools.cache
def _signatures():
    return get_testing_overrides()


def _positional(func, args, kwargs):
    """``(args, kwargs)`` with the required parameters given by keyword (``torch.addmm(b,
    mat1=m1, mat2=m2)``) moved into ``args``: the handlers name them as they like, and
    take torch's names only for the parameters with defaults."""
    kwargs = dict(kwargs)
    for name in _required(func)[len(args):]:
        if name not in kwargs:
            break
        args = (*args, kwargs.pop(name))
    return args, kwargs


class _PAMMode(TorchFunctionMode):
    def __init__(self, config: PAMConfig):
        super().__init__()
        self.config = config

    @eager_under_compile                # torch.compile: a graph break, run eagerly
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is not None:
            group = _GROUP.get(handler)
            if group is None or self.config.enabled(group):
                pos, kw = _positional(func, args, kwargs) if kwargs else (args, kwargs)
                out = handler(self.config, *pos, **kw)
                if out is not NotImplemented:
                    return out
        if _composite(func):            # e.g. F.normalize: route what its body calls
            with self:                  # (torch took the mode off its stack for this call)
                return _body(func)(*args, **kwargs)
        return func(*args, **kwargs)


def _under_forward_modes(fn):
    """``fn`` run under the PAM modes active now (when a checkpointed block runs
    forward), for its recomputation during backward; ``fn`` itself if there are none."""
    configs = [m.config for m in _get_current_function_mode_stack() if isinstance(m, _PAMMode)]
    if not configs:
        return fn

    @functools.wraps(fn)
    def recompute(*args, **kwargs):
        with ExitStack() as stack:
            for cfg in configs:
                stack.enter_context(_PAMMode(cfg))
            return fn(*args, **kwargs)
    return recompute


def _wrap_checkpointing():
    frame_init = _ckpt._CheckpointFrame.__init__

    @functools.wraps(frame_init)
    def init(self, recompute_fn, *args, **kwargs):
        frame_init(self, _under_forward_modes(recompute_fn), *args, **kwargs)

    reentrant = _ckpt.CheckpointFunction.forward

    @functools.wraps(reentrant)
    def forward(ctx, run_function, *args):
        return reentrant(ctx, _under_forward_modes(run_function), *args)
    _ckpt._CheckpointFrame.__init__ = init
    _ckpt.CheckpointFunction.forward = staticmethod(forward)


_wrap_checkpointing()


@contextmanager
def pam_mode(config: PAMConfig | None):
    """Route the torch functions listed in this module's docstring through PA versions.

    ``config=None`` (or ``fmt=None``, or no ops): nothing changes.  Modes nest; the
    innermost decides.  Works under autograd, ``torch.no_grad`` and checkpointing.
    """
    check_config(config)
    if config is None or config.fmt is None or not config.ops:
        yield
        return
    with _PAMMode(config):
        yield

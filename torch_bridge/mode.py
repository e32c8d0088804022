"""pam_mode: run unmodified models on emulated PA hardware via a TorchFunctionMode.

Inside ``with pam_mode(config):`` these torch functions are routed to their PA
versions when their op group is enabled (otherwise, and for non-floating or non-CPU
operands, they run natively):

* ``matmul``: torch.matmul / Tensor.matmul / ``@``, torch.mm, torch.bmm, torch.addmm,
  torch.baddbmm (and their Tensor methods), F.linear, F.conv2d, the batched matmuls of
  F.scaled_dot_product_attention and F.multi_head_attention_forward;
* ``softmax``: F.softmax, torch.softmax, Tensor.softmax, and the softmax and logit
  scaling inside scaled_dot_product_attention;
* ``layernorm``: F.layer_norm; ``loss``: F.cross_entropy.

Elementwise ``*`` and ``/`` of a model's own code (e.g. a GELU, the pooling of a
sentence encoder) stay native: only the listed functions are intercepted.
"""
from __future__ import annotations

import types
from contextlib import contextmanager

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from . import functional as PF
from ._core import FLOATS
from .config import PAMConfig, check_config

__all__ = ["pam_mode"]


def _floating(*ts):
    return all(isinstance(t, torch.Tensor) and t.dtype in FLOATS
               and t.device.type in ("cpu", "cuda") for t in ts)


def _scaled(x, factor, cfg):
    """``factor * x`` as a PAM by a constant (addmm/baddbmm alpha, beta)."""
    if factor == 1:
        return x
    return PF.pam_mul(x, float(factor), cfg.pa_fmt, backward=cfg.kind("matmul"),
                      rounding=cfg.rounding)


def _matmul(cfg, a, b, *, out=None):
    if out is not None or not _floating(a, b):
        return NotImplemented
    return PF.matmul(a, b, cfg)


def _rmatmul(cfg, a, b):
    return _matmul(cfg, b, a)


def _addmm(cfg, inp, m1, m2, *, beta=1, alpha=1, out=None):
    if out is not None or not _floating(inp, m1, m2):
        return NotImplemented
    prod = _scaled(PF.matmul(m1, m2, cfg), alpha, cfg)
    return prod if beta == 0 else _scaled(inp, beta, cfg) + prod


def _linear(cfg, x, weight, bias=None):
    if not _floating(x, weight):
        return NotImplemented
    return PF.linear(x, weight, bias, cfg)


def _conv2d(cfg, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if not _floating(x, weight):
        return NotImplemented
    return PF.conv2d(x, weight, bias, stride, padding, dilation, groups, cfg)


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
    return PF.pa_softmax(x, dim, cfg.pa_fmt, backward=cfg.kind("softmax"),
                         rounding=cfg.rounding)


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


def _mha_body():
    """F.multi_head_attention_forward whose first statement no longer hands the call
    back to the active mode: run under the mode, its own F.linear, bmm, softmax and
    scaled_dot_product_attention calls are routed (torch's code, not a copy of it)."""
    f = F.multi_head_attention_forward
    g = dict(f.__globals__, has_torch_function=lambda *_: False)
    body = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, f.__closure__)
    body.__kwdefaults__ = f.__kwdefaults__
    return body


_MHA = _mha_body()


def _mha(cfg, *args, **kwargs):
    if not (cfg.enabled("matmul") or cfg.enabled("softmax")):
        return NotImplemented
    with _PAMMode(cfg):
        return _MHA(*args, **kwargs)


_T = torch.Tensor
_HANDLERS = {
    torch.matmul: _matmul, _T.matmul: _matmul, _T.__matmul__: _matmul, _T.__rmatmul__: _rmatmul,
    torch.mm: _matmul, _T.mm: _matmul, torch.bmm: _matmul, _T.bmm: _matmul,
    torch.addmm: _addmm, _T.addmm: _addmm, torch.baddbmm: _addmm, _T.baddbmm: _addmm,
    F.linear: _linear, F.conv2d: _conv2d, F.scaled_dot_product_attention: _sdpa,
    F.multi_head_attention_forward: _mha,
    F.softmax: _f_softmax, torch.softmax: _t_softmax, _T.softmax: _t_softmax,
    F.layer_norm: _layer_norm, F.cross_entropy: _cross_entropy,
}
_GROUP = {_layer_norm: "layernorm", _cross_entropy: "loss"}


class _PAMMode(TorchFunctionMode):
    def __init__(self, config: PAMConfig):
        super().__init__()
        self.config = config

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is not None:
            group = _GROUP.get(handler)
            if group is None or self.config.enabled(group):
                out = handler(self.config, *args, **kwargs)
                if out is not NotImplemented:
                    return out
        return func(*args, **kwargs)


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

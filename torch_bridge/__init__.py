"""torch_bridge — PyTorch drop-ins that run models on emulated PAM hardware (CPU, CUDA).

Kosson & Jaggi, "Multiplication-Free Transformer Training via Piecewise Affine
Operations": every number comes from :mod:`emu` (forward) and :mod:`emu.grad`
(backward, exact or approximate derivatives of Table 1).

* :class:`PAMConfig` — format, op groups (matmul, softmax, layernorm, loss,
  optimizer, elementwise), derivative kind per group, rounding; ``None``: native torch.
* :func:`convert` — swap a model's Linear/Conv2d/LayerNorm/MultiheadAttention/
  Softmax/CrossEntropyLoss (and transformers' Conv1D) for the drop-ins
  (:mod:`torch_bridge.modules`), in place.
* :func:`pam_mode` — a TorchFunctionMode that routes the matmuls, convolutions,
  einsum, attention, softmax, norms, losses, recurrent layers and elementwise
  arithmetic of unmodified models (:mod:`torch_bridge.mode` lists them).
* :func:`audit` — the multiplies of a model that still run natively under a config
  (the function shadows its module: import names from ``torch_bridge.audit``);
  :mod:`torch_bridge.classification` classifies every aten op for it.
* :mod:`torch_bridge.functional` — the PA primitives (convolutions included) and
  composites; more composites
  in :mod:`~torch_bridge.elementwise`, :mod:`~torch_bridge.norms`,
  :mod:`~torch_bridge.losses`, :mod:`~torch_bridge.contract` (einsum, addbmm, average
  pooling) and
  :mod:`~torch_bridge.recurrent` (GRU, LSTM, RNN).
* :class:`PAAdamW`, :class:`PASGD` — optimizers with PA arithmetic.
* :mod:`torch_bridge.memory` — memory-saving activations (few-bit backward, inverted
  and PA activations); ``convert(model, fewbit=3)`` swaps them in (docs/memory.md).

See docs/torch_bridge.md.
"""
import emu.registry

from . import functional, memory
from .audit import AuditReport, audit
from .config import OP_GROUPS, PAMConfig
from .convert import convert
from .functional import (pa_cross_entropy, pa_layer_norm, pa_softmax, pam_conv2d, pam_linear,
                         pam_matmul)
from .mode import pam_mode
from .modules import (PACrossEntropyLoss, PALayerNorm, PAMConv2d, PAMLinear,
                      PAMultiheadAttention, PASoftmax)
from .optim import PAAdamW, PASGD, make_optimizer

# the elementwise primitives: one per differentiable op of emu's registry (emu.OPS)
_ELEMENTWISE = [op.name for op in emu.registry.ops(differentiable=True)]
globals().update({name: getattr(functional, name) for name in _ELEMENTWISE})

__all__ = ["PAMConfig", "OP_GROUPS", "convert", "pam_mode", "audit", "AuditReport", "functional",
           "memory", "pam_matmul", "pam_linear", "pam_conv2d", *_ELEMENTWISE, "pa_softmax",
           "pa_layer_norm", "pa_cross_entropy", "PAMLinear", "PAMConv2d", "PALayerNorm",
           "PASoftmax", "PAMultiheadAttention", "PACrossEntropyLoss", "PAAdamW", "PASGD",
           "make_optimizer"]

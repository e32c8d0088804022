"""Training that cannot learn says so (issue 30).

Two causes stop a PA training run without any error: the operands of the PAM matmuls
flush to zero or saturate in a narrow format (PA operations read subnormals as zero,
docs/semantics.md section 3: at e4m3 every gradient below 2^-6 is lost), and a loss that
does not move.  :func:`watch` measures the first while the first steps run, by hooks on
the model's linear and convolution layers, and :meth:`Watch.close` reports both, one
:class:`LearningWarning` per cause, naming the remedy.
"""
from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from .config import blocked

#: a share of one layer's nonzero operands (activations, weights or gradients) that
#: flush or saturate at or above this stops that layer from learning
RATE = 0.5
#: a first epoch whose training loss falls by less than this share did not learn
LOSS_MOVE = 0.02
#: fewer steps than this say nothing about the loss
MIN_LOSS_STEPS = 8

REMEDY = ("Remedy: a scaled recipe (an OCP MX format, e.g. mxfp8_e4m3, scales each block "
          "of 32 operands; fp8_current scales each tensor, e5m2 for gradients), more "
          "exponent bits for the gradients (e5m2: smallest normal 2^-14), or loss scaling; "
          "docs/formats.md.")


class LearningWarning(UserWarning):
    """A training run that cannot learn (flushed or saturated operands, a flat loss)."""


class Watch:
    """Counts, per layer and operand kind, the nonzero PAM operands below the format's
    smallest normal (flushed) or above its largest value (saturated), over the first
    ``steps`` training forward passes; then :meth:`close` warns."""

    def __init__(self, model: nn.Module, config, steps: int):
        fmt = getattr(config, "fmt", None)
        # MX formats scale every block: their elements' range says nothing
        self.fmt = None if (config is None or "matmul" not in config.ops
                            or blocked(fmt)) else fmt
        self.steps, self.seen, self.closed = steps, 0, False
        self.counts = {}                # (layer, kind) -> [flushed, saturated, nonzero]
        self.hooks = [model.register_forward_pre_hook(self._step)]
        if self.fmt is not None:
            self.hooks += [m.register_forward_hook(self._layer(name or type(m).__name__))
                           for name, m in model.named_modules()
                           if isinstance(m, (nn.Linear, nn.Conv2d))]

    def _step(self, module, inputs):
        if torch.is_grad_enabled() and module.training:
            if self.seen == self.steps:
                self.close()
            else:
                self.seen += 1

    def _count(self, layer, kind, t):
        a = t.detach().abs()
        nonzero = a > 0
        c = self.counts.setdefault((layer, kind), [0, 0, 0])
        c[0] += int((nonzero & (a < self.fmt.smallest_normal)).sum())
        c[1] += int((a > self.fmt.max).sum())
        c[2] += int(nonzero.sum())

    def _layer(self, name):
        def hook(module, inputs, output):
            if not (torch.is_grad_enabled() and module.training) or self.closed:
                return
            self._count(name, "activations", inputs[0])
            self._count(name, "weights", module.weight)
            if output.requires_grad:
                output.register_hook(lambda g: None if self.closed else
                                     self._count(name, "gradients", g))
        return hook

    def close(self, losses=()):
        """Stop watching; warn once per cause found: operands of a kind that flush (or
        saturate) at :data:`RATE` or more in some layer, and, given the first epoch's
        step ``losses``, a loss that fell by less than :data:`LOSS_MOVE`."""
        if self.closed:
            return
        self.closed = True
        for h in self.hooks:
            h.remove()
        for i, what in enumerate(("flush to zero", "saturate")):
            for kind in ("gradients", "activations", "weights"):
                worst = max(((c[i] / c[2], layer) for (layer, k), c in self.counts.items()
                             if k == kind and c[2]), default=(0.0, ""))
                if worst[0] >= RATE:
                    bound = (f"below {self.fmt.name}'s smallest normal "
                             f"2^{math.log2(self.fmt.smallest_normal):g}, which PA operations "
                             "read as zero" if i == 0 else
                             f"above {self.fmt.name}'s largest value {self.fmt.max:g}")
                    warnings.warn(
                        f"PAM operands {what}: {100 * worst[0]:.0f} % of the nonzero {kind} "
                        f"of layer '{worst[1]}' in the first {self.seen} steps lie {bound}; "
                        f"this layer cannot learn. {REMEDY}", LearningWarning, stacklevel=2)
        if len(losses) >= MIN_LOSS_STEPS and math.isfinite(sum(losses)):    # diverged: said
            k = len(losses) // 4
            first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
            if not first - last > LOSS_MOVE * abs(first):
                warnings.warn(
                    f"the training loss did not fall in the first {len(losses)} steps "
                    f"({first:.4g} -> {last:.4g}): the model is not learning. If operands "
                    f"flush or saturate in a narrow format: {REMEDY} Else: check the "
                    "learning rate.", LearningWarning, stacklevel=2)


def watch(model: nn.Module, config, steps: int = 100) -> Watch:
    """Watch ``model`` (converted under ``config``) for its first ``steps`` training
    forward passes; it warns at the next one, or at :meth:`Watch.close`."""
    return Watch(model, config, steps)

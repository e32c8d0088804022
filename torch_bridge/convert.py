"""convert(): swap a model's torch layers for the PA drop-ins, keeping its weights."""
from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from .config import PAMConfig, check_config
from .modules import PAModule, drop_ins

__all__ = ["convert"]


_KEEP = object()        # convert(model, fewbit=3): PAM layers stay as they are


def _target(module: nn.Module, config):
    """The module that should stand where ``module`` is (``module`` if unchanged)."""
    if config is _KEEP:
        return module
    if isinstance(module, PAModule):
        if config is None:
            return module.to_native()
        module.config = config
        return module
    if config is None:
        return module
    for native, (drop_in, groups) in drop_ins().items():
        if isinstance(module, native) and any(config.enabled(g) for g in groups):
            return drop_in.from_module(module, config)
    return module


def convert(model: nn.Module, config: PAMConfig | None = _KEEP, *, skip=(),
            fewbit: int | None = None, inverted: bool = False, pa: int | None = None,
            activation_weight: str = "uniform") -> nn.Module:
    """Replace nn.Linear, nn.Conv2d, nn.LayerNorm, nn.MultiheadAttention, nn.Softmax,
    nn.CrossEntropyLoss and transformers' Conv1D (GPT-2) in ``model`` (in place) by the
    torch_bridge drop-ins for the op
    groups ``config`` enables.  Parameters, buffers and hooks are shared, not copied,
    so optimizers built on the model keep working.

    ``config=None`` turns converted modules back into the plain torch ones.  ``skip``:
    qualified submodule names (as in ``model.named_modules()``) to leave alone with
    everything inside them, e.g. a classifier head.  Returns the model (a new object only if ``model`` itself is a
    converted layer).

    Memory-saving activations (docs/memory.md): ``fewbit=k`` (k-bit backward),
    ``inverted=True`` (inverted activations), ``pa=P`` (P-piece PA GELU/SiLU), with
    ``activation_weight`` ("uniform" or "normal") choosing the few-bit tables; the
    rule is torch_bridge.memory.convert_activations', and ``skip`` applies to it too.
    Given only activation options (no ``config``), the other layers are left as they
    are.
    """
    from .memory.convert import activation_replacer
    act = activation_replacer(fewbit, inverted, pa, activation_weight)
    if config is _KEEP and fewbit is None and not inverted and pa is None:
        config = None                               # convert(model): back to plain torch
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if config is not _KEEP:
        check_config(config)
    if not isinstance(skip, (str, Iterable)):
        raise TypeError(f"skip must be a submodule name or an iterable of them, got {skip!r}")
    skip = {skip} if isinstance(skip, str) else set(skip)
    names = {name for name, _ in model.named_modules()}
    unknown = sorted(skip - names)
    if unknown:
        raise ValueError(f"skip: no submodule named {unknown} in the model")
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            qual = f"{name}.{child_name}" if name else child_name
            if any(qual == s or qual.startswith(s + ".") for s in skip):
                continue
            new = _target(child, config)
            if new is child and act(child) is not None:
                new = act(child)
            if new is not child:
                setattr(module, child_name, new)
    if "" in skip:
        return model
    new = _target(model, config)
    if new is model and act(model) is not None:
        return act(model)
    return new

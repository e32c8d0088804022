"""convert(): swap a model's torch layers for the PA drop-ins, keeping its weights."""
from __future__ import annotations

from torch import nn

from .config import PAMConfig
from .modules import DROP_INS, _PAModule

__all__ = ["convert"]


def _target(module: nn.Module, config: PAMConfig | None):
    """The module that should stand where ``module`` is (``module`` if unchanged)."""
    if isinstance(module, _PAModule):
        if config is None:
            return module.to_native()
        module.config = config
        return module
    if config is None:
        return module
    for native, (drop_in, groups) in DROP_INS.items():
        if isinstance(module, native) and any(config.enabled(g) for g in groups):
            return drop_in.from_module(module, config)
    return module


def convert(model: nn.Module, config: PAMConfig | None = None, *, skip=()) -> nn.Module:
    """Replace nn.Linear, nn.Conv2d, nn.LayerNorm, nn.MultiheadAttention, nn.Softmax and
    nn.CrossEntropyLoss in ``model`` (in place) by the torch_bridge drop-ins for the op
    groups ``config`` enables.  Parameters, buffers and hooks are shared, not copied,
    so optimizers built on the model keep working.

    ``config=None`` turns converted modules back into the plain torch ones.  ``skip``:
    qualified submodule names (as in ``model.named_modules()``) to leave alone with
    everything inside them, e.g. a classifier head.  Returns the model (a new object only if ``model`` itself is a
    converted layer).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if config is not None and not isinstance(config, PAMConfig):
        raise TypeError(f"config must be a torch_bridge.PAMConfig or None, got "
                        f"{type(config).__name__}")
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
            if new is not child:
                setattr(module, child_name, new)
    return model if "" in skip else _target(model, config)

"""Swap the activation modules of an existing model for memory-saving drop-ins."""
from __future__ import annotations

from torch import nn

from .fewbit import FewBitActivation
from .inverted import INVERTIBLE, InvertedActivation
from .pa import PA_ACTIVATIONS, PAActivation
from .packing import check_bits
from .solver import check_weight

# transformers.activations classes -> activation name.  GELUActivation/GELUTanh call
# F.gelu, so the forward is unchanged; NewGELU/FastGELU (and the *_python variants)
# spell the same function out in tensor ops, which rounds differently by a few ulp.
_TRANSFORMERS = {"GELUActivation": "gelu", "GELUTanh": "gelu_tanh",
                 "PytorchGELUTanh": "gelu_tanh", "NewGELUActivation": "gelu_tanh",
                 "FastGELUActivation": "gelu_tanh", "SiLUActivation": "silu",
                 "MishActivation": "mish"}


def _classify(m: nn.Module):
    """(activation name, parameters) of a supported activation module, else None."""
    if isinstance(m, nn.ReLU):
        return "relu", {}
    if isinstance(m, nn.LeakyReLU):
        return "leaky_relu", {"negative_slope": m.negative_slope}
    if isinstance(m, nn.GELU):
        return ("gelu" if m.approximate == "none" else "gelu_tanh"), {}
    if isinstance(m, nn.SiLU):
        return "silu", {}
    if isinstance(m, nn.Sigmoid):
        return "sigmoid", {}
    if isinstance(m, nn.Tanh):
        return "tanh", {}
    if isinstance(m, nn.SELU):
        return "selu", {}
    if isinstance(m, nn.ELU):
        return "elu", {"alpha": m.alpha}
    if isinstance(m, nn.Softplus):
        return "softplus", {"beta": m.beta, "threshold": m.threshold}
    if isinstance(m, nn.Mish):
        return "mish", {}
    if type(m).__module__ == "transformers.activations" and type(m).__name__ in _TRANSFORMERS:
        return _TRANSFORMERS[type(m).__name__], {}
    return None


def activation_replacer(fewbit: int | None = None, inverted: bool = False,
                        pa: int | None = None, weight: str = "uniform"):
    """The rule of :func:`convert_activations` as a function ``module -> replacement
    or None`` (validated here; torch_bridge.convert applies it next to its own swaps)."""
    fewbit = None if fewbit is None else check_bits(fewbit, "fewbit")
    if not isinstance(inverted, bool):
        raise TypeError(f"inverted must be True or False, got {inverted!r}")
    if pa is not None and (isinstance(pa, bool) or not isinstance(pa, int) or pa < 2):
        raise ValueError(f"pa={pa!r} must be None or a number of pieces >= 2")
    check_weight(weight)

    def replacement(m):
        kind = _classify(m)
        if kind is None:
            return None
        name, params = kind
        if pa is not None and name in PA_ACTIVATIONS:
            new = PAActivation(name, pa)
        elif inverted and name in INVERTIBLE:
            new = InvertedActivation(name)
        elif fewbit is not None:
            new = FewBitActivation(name, fewbit, weight, **params)
        else:
            return None
        return new.train(m.training)

    return replacement


def convert_activations(model: nn.Module, fewbit: int | None = None, inverted: bool = False,
                        pa: int | None = None, weight: str = "uniform") -> nn.Module:
    """Replace the activation modules of ``model`` in place; returns ``model``.

    Per activation, the first option that applies wins:

    * ``pa=P``: GELU and SiLU become P-piece PA activations (:class:`PAActivation`,
      a different forward function, exact P-level backward);
    * ``inverted=True``: GELU (both forms), SiLU and Mish become inverted activations
      (:class:`InvertedActivation`);
    * ``fewbit=k``: every supported activation (nn.ReLU, LeakyReLU, GELU, SiLU,
      Sigmoid, Tanh, SELU, ELU, Softplus, Mish and transformers' GELUActivation,
      GELUTanh, NewGELU, FastGELU, SiLUActivation, MishActivation) becomes a
      :class:`FewBitActivation` with k bits and the table for ``weight``.

    All None/False leaves the model unchanged.  Functional calls (``F.relu(x)`` in a
    forward method) cannot be swapped; use the functional forms there.  If ``model``
    itself is an activation module, the replacement is returned instead.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    replacement = activation_replacer(fewbit, inverted, pa, weight)
    root = replacement(model)
    if root is not None:
        return root
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            new = replacement(child)
            if new is not None:
                setattr(parent, child_name, new)
    return model

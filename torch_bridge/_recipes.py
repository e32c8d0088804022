"""Matmuls in a scaling recipe (emu.recipe: NVFP4, float8 current/delayed/block scaling,
MX as a recipe): a training step's three GEMMs, each an emu.recipe_matmul with its own
roles (docs/torch_bridge.md "Scaling recipes", docs/semantics.md §10b).

* forward ``C = A·B``: A as ``act``, B as ``weight``;
* input gradient (dgrad) ``dA = dC·Bᵀ``: dC as ``grad`` along N, B as ``weight`` along N;
* weight gradient (wgrad) ``dB = Aᵀ·dC``: A as ``act`` along M, dC as ``grad`` along M.

A recipe quantizes the matmuls that have a weight (a parameter, or a view of one, as
``b``: linear and convolution layers), as float8 training stacks do; a product of two
activations (attention) runs in float32 operands with the same multiplier and
accumulator.  Delayed scaling keeps one :class:`emu.RecipeState` per role in a
:class:`RecipeStates` (module buffers under ``convert``; per weight under ``pam_mode``).
"""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.weak import WeakIdKeyDictionary

import emu
from emu.recipes import ROLES

from ._sums import grad_out
from ._tensors import as_float32, host_view

__all__ = ["RecipeMatmul", "RecipeStates", "GEMM_ROLES", "is_weight", "states_for"]

#: the roles of the operands of a training step's three GEMMs
GEMM_ROLES = {"forward": ("act", "weight"), "dgrad": ("grad", "weight"),
              "wgrad": ("act", "grad")}


def is_weight(t: torch.Tensor) -> bool:
    """Whether ``t`` is a parameter or a view of one (``weight.t()``, a reshaped kernel)."""
    while t is not None:
        if isinstance(t, torch.nn.Parameter):
            return True
        t = t._base
    return False


class RecipeStates:
    """Delayed scaling's state of one weight's GEMMs: per role (act, weight, grad) the
    amax history (most recent first) and the encode scale, in two float32 tensors
    ``amax`` (3, H) and ``scale`` (3,) updated in place (a module's buffers: saved by
    ``state_dict`` and restored exactly)."""

    def __init__(self, amax: torch.Tensor, scale: torch.Tensor):
        self.amax, self.scale = amax, scale

    @classmethod
    def new(cls, recipe: emu.Recipe, device=None) -> "RecipeStates":
        """The states before the first step: zero histories, scale 1 (emu.RecipeState)."""
        return cls(torch.zeros(3, recipe.history, device=device),
                   torch.ones(3, device=device))

    def get(self, role: str) -> emu.RecipeState:
        i = ROLES.index(role)
        return emu.RecipeState(host_view(self.amax[i].cpu()).copy(),
                               np.float32(self.scale[i].item()))

    def put(self, role: str, state: emu.RecipeState) -> None:
        i = ROLES.index(role)
        with torch.no_grad():
            self.amax[i].copy_(torch.from_numpy(state.amax))
            self.scale[i].fill_(float(state.scale))


#: pam_mode's states, per weight (a module's buffers hold them under convert)
_STATES = WeakIdKeyDictionary()


def states_for(weight: torch.Tensor, recipe: emu.Recipe) -> RecipeStates:
    """The delayed-scaling states of ``weight``'s GEMMs under pam_mode (made on first use;
    they live as long as the weight)."""
    base = weight
    while base._base is not None:
        base = base._base
    st = _STATES.get(base)
    if st is None or st.amax.shape[1] != recipe.history:
        st = _STATES[base] = RecipeStates.new(recipe, base.device)
    return st


def _quantized(x: np.ndarray, r: emu.Recipe, role: str, axis: int, state):
    """With delayed scaling ``x`` quantized as ``role`` along ``axis`` by ``state`` (an
    emu.RecipeState; the result's ``.history`` is the next one); else ``x`` itself
    (emu.recipe_matmul quantizes it, padding shapes its blocks do not divide)."""
    if not r.history:
        return x
    return emu.recipe_quantize(x, r, role, axis=axis, history=state)


def _np(t: torch.Tensor) -> np.ndarray:
    return host_view(as_float32(t))


class RecipeMatmul(torch.autograd.Function):
    """``a @ b`` (at least 2-D, batch axes broadcast) in the recipe ``nm.fmt``, forward
    and backward by :data:`GEMM_ROLES` (``nm``: the call's Numerics; ``states``: a
    :class:`RecipeStates` for delayed scaling, else None).  In the backward, A and B are
    quantized by the states their forward used; dC's grad state advances once."""

    @staticmethod
    def forward(ctx, a, b, nm, states):
        r, mul = nm.fmt, nm.mul or "pam"
        # the states this step's operands are quantized by (the backward's too)
        used = {role: states.get(role) for role in ("act", "weight")} if r.history else {}
        qa = _quantized(_np(a), r, "act", -1, used.get("act"))
        qb = _quantized(_np(b), r, "weight", -2, used.get("weight"))
        if r.history:
            states.put("act", qa.history)
            states.put("weight", qb.history)
        ctx.used = used
        c = emu.recipe_matmul(qa, qb, r, nm.acc, mul=mul, roles=GEMM_ROLES["forward"])
        ctx.save_for_backward(a, b)
        ctx.nm, ctx.states = nm, states
        ctx.operands = [(a.shape, a.dtype), (b.shape, b.dtype)]
        return torch.from_numpy(c).to(torch.promote_types(a.dtype, b.dtype))

    @staticmethod
    def backward(ctx, dc):
        nm, states = ctx.nm, ctx.states
        r, mul = nm.fmt, nm.mul or "pam"
        a, b = ctx.saved_tensors
        need = ctx.needs_input_grad[:2]
        G = _np(dc)
        used = {**ctx.used, "grad": states.get("grad")} if r.history else {}
        dA = dB = qg = None
        if need[0]:     # dgrad: dC along N, B along N
            qg = _quantized(G, r, "grad", -1, used.get("grad"))
            qbt = _quantized(np.swapaxes(_np(b), -1, -2), r, "weight", -2, used.get("weight"))
            dA = emu.recipe_matmul(qg, qbt, r, nm.acc, mul=mul, roles=GEMM_ROLES["dgrad"])
        if need[1]:     # wgrad: A along M, dC along M
            qat = _quantized(np.swapaxes(_np(a), -1, -2), r, "act", -1, used.get("act"))
            qg = _quantized(G, r, "grad", -2, used.get("grad"))
            dB = emu.recipe_matmul(qat, qg, r, nm.acc, mul=mul, roles=GEMM_ROLES["wgrad"])
        if r.history:       # delayed scaling is tensorwise: either axis gives the same state
            states.put("grad", qg.history)
        return (_grad(dA, ctx.operands[0]), _grad(dB, ctx.operands[1]), None, None)


def _grad(g, operand):
    """An emu gradient (numpy) as :func:`grad_out` makes it, or None."""
    return None if g is None else grad_out(torch.from_numpy(np.ascontiguousarray(g)), operand)

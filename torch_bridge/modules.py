"""nn.Module drop-ins: subclasses of the torch modules that run on emulated PA hardware.

Each keeps its base class's parameters, buffers and arguments and adds a ``config``
(:class:`PAMConfig`); ``config=None`` or a config that leaves the module's op group
off gives exactly the base class's behaviour.  ``from_module`` turns an existing
module into the drop-in without copying its parameters (what :func:`convert` uses).
"""
from __future__ import annotations

import sys
from functools import cache

from torch import nn
from torch.nn import functional as F

import emu

from . import functional as PF
from ._recipes import RecipeStates
from .compiling import eager_under_compile
from .config import PAMConfig, check_config


class PAModule:
    """Mixin: a ``config`` attribute, conversion from the native module, repr.

    Under ``torch.compile`` a drop-in runs eagerly: its ``forward`` is wrapped by
    :func:`torch_bridge.compiling.eager_under_compile` (a graph break around it), so
    Dynamo never specialises on a config it does not guard."""
    config: PAMConfig | None
    _native: type

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not getattr(cls.forward, "_torchdynamo_disable", False):
            cls.forward = eager_under_compile(cls.forward)

    @classmethod
    def from_module(cls, module: nn.Module, config: PAMConfig | None):
        """The drop-in for ``module``, sharing its parameters, buffers and hooks."""
        if not isinstance(module, cls._native):
            raise TypeError(f"{cls.__name__}.from_module expects a {cls._native.__name__}, "
                            f"got {type(module).__name__}")
        new = cls.__new__(cls)
        new.__dict__.update(module.__dict__)
        new.config = check_config(config)
        return new

    def to_native(self) -> nn.Module:
        """The plain torch module, sharing this module's parameters."""
        new = self._native.__new__(self._native)
        new.__dict__.update({k: v for k, v in self.__dict__.items() if k != "config"})
        return new

    def extra_repr(self):
        cfg = "native" if self.config is None else self.config.describe()
        return f"{super().extra_repr()}, config={cfg}"


class PAMLinear(PAModule, nn.Linear):
    """nn.Linear with a PAM matmul (forward and backward) when config enables 'matmul'.

    Under a delayed-scaling recipe (``fmt="fp8_delayed"``) the amax histories and scales
    of its three roles are the buffers ``recipe_amax`` (3, history) and ``recipe_scale``
    (3,): ``state_dict`` saves them and a run resumes exactly."""
    _native = nn.Linear

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *,
                 config: PAMConfig | None = None):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.config = check_config(config)
        self._recipe_buffers()

    @classmethod
    def from_module(cls, module, config):
        new = super().from_module(module, config)
        new._recipe_buffers()
        return new

    def _recipe_buffers(self):
        """The delayed-scaling states in this module's buffers (made if missing or of
        another history length), or None without delayed scaling."""
        r = getattr(self.config, "fmt", None)
        if not (isinstance(r, emu.Recipe) and r.history and self.config.enabled("matmul")):
            return None
        amax = getattr(self, "recipe_amax", None)
        if amax is None or tuple(amax.shape) != (3, r.history):
            st = RecipeStates.new(r, self.weight.device)
            self.register_buffer("recipe_amax", st.amax)
            self.register_buffer("recipe_scale", st.scale)
        return RecipeStates(self.recipe_amax, self.recipe_scale)

    def forward(self, x):
        states = self._recipe_buffers()
        if states is None:
            return PF.linear(x, self.weight, self.bias, self.config)
        return PF.linear(x, self.weight, self.bias, self.config, recipe_states=states)


class PAMConv2d(PAModule, nn.Conv2d):
    """nn.Conv2d as PAM matmuls over im2col patches when config enables 'matmul'."""
    _native = nn.Conv2d

    def __init__(self, *args, config: PAMConfig | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.config = check_config(config)

    def _conv_forward(self, x, weight, bias):
        if self.padding_mode != "zeros":
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return PF.conv2d(x, weight, bias, self.stride, 0, self.dilation, self.groups,
                             self.config)
        return PF.conv2d(x, weight, bias, self.stride, self.padding, self.dilation,
                         self.groups, self.config)


class PALayerNorm(PAModule, nn.LayerNorm):
    """nn.LayerNorm with PA mean/variance/sqrt/division and a PAM gain ('layernorm')."""
    _native = nn.LayerNorm

    def __init__(self, *args, config: PAMConfig | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.config = check_config(config)

    def forward(self, x):
        return PF.layer_norm(x, self.normalized_shape, self.weight,
                             self.bias, self.eps, self.config)


class PASoftmax(PAModule, nn.Softmax):
    """nn.Softmax with paexp and PA division ('softmax')."""
    _native = nn.Softmax

    def __init__(self, dim=None, *, config: PAMConfig | None = None):
        super().__init__(dim)
        self.config = check_config(config)

    def forward(self, x):
        dim = self.dim if self.dim is not None else F._get_softmax_dim("softmax", x.dim(), 5)
        return PF.softmax(x, dim, self.config)


class PACrossEntropyLoss(PAModule, nn.CrossEntropyLoss):
    """nn.CrossEntropyLoss (label smoothing included) with PA operations ('loss')."""
    _native = nn.CrossEntropyLoss

    def __init__(self, *args, config: PAMConfig | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.config = check_config(config)

    def forward(self, input, target):
        return PF.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction,
                                self.label_smoothing, self.config)


class PAMultiheadAttention(PAModule, nn.MultiheadAttention):
    """nn.MultiheadAttention with PAM projections and attention matmuls ('matmul') and
    a PA softmax with PAM scaling ('softmax'); every argument of the base class works.

    It runs torch's own multi-head attention under :func:`torch_bridge.pam_mode` limited
    to those two groups, so masks, biases, dropout and ``need_weights`` behave as in torch.
    """
    _native = nn.MultiheadAttention

    def __init__(self, *args, config: PAMConfig | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.config = check_config(config)

    def forward(self, *args, **kwargs):
        from .mode import pam_mode
        cfg = self.config
        if cfg is not None:
            cfg = cfg.replace(ops=cfg.ops & {"matmul", "softmax"})
        with pam_mode(cfg):
            return super().forward(*args, **kwargs)

    def extra_repr(self):
        cfg = "native" if self.config is None else self.config.describe()
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, config={cfg}"


#: native module class -> drop-in, and the op groups that make a conversion worthwhile
DROP_INS = {nn.Linear: (PAMLinear, {"matmul"}), nn.Conv2d: (PAMConv2d, {"matmul"}),
            nn.LayerNorm: (PALayerNorm, {"layernorm"}), nn.Softmax: (PASoftmax, {"softmax"}),
            nn.MultiheadAttention: (PAMultiheadAttention, {"matmul", "softmax"}),
            nn.CrossEntropyLoss: (PACrossEntropyLoss, {"loss"})}


@cache
def _hf_conv1d_drop_in(conv1d: type) -> type:
    """The drop-in for transformers' Conv1D (GPT-2's linear layers: ``x @ W + b`` with
    the weight stored (in, out)): a PAM linear layer on ``W.t()`` when 'matmul' is on."""
    def forward(self, x):
        return PF.linear(x, self.weight.t(), self.bias, self.config)

    def extra_repr(self):
        cfg = "native" if self.config is None else self.config.describe()
        return f"nf={self.nf}, nx={self.nx}, config={cfg}"
    return type("PAMConv1D", (PAModule, conv1d), {
        "_native": conv1d, "forward": forward, "extra_repr": extra_repr,
        "__repr__": nn.Module.__repr__, "__module__": __name__,
        "__doc__": _hf_conv1d_drop_in.__doc__})


def drop_ins() -> dict:
    """DROP_INS, plus transformers' Conv1D once transformers is imported (a model that
    holds one has imported it)."""
    hf = sys.modules.get("transformers.pytorch_utils")
    conv1d = getattr(hf, "Conv1D", None)
    if conv1d is None:
        return DROP_INS
    return {**DROP_INS, conv1d: (_hf_conv1d_drop_in(conv1d), {"matmul"})}

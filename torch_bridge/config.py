"""PAMConfig: which operations of a model run on emulated PA hardware, and how."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import emu
import emu.mx
from emu.lowlevel import ROUNDING, ROUNDING_ALIASES

from ._recipes import GEMM_ROLES

__all__ = ["OP_GROUPS", "PAMConfig", "check_config", "Numerics", "check_numerics"]

#: The operation groups of the paper's Table 3, in its order, then "elementwise": the
#: products, quotients, powers, exp/log/sqrt and activations of a model's own code.
OP_GROUPS = ("matmul", "softmax", "layernorm", "loss", "optimizer", "elementwise")
_KINDS = ("approx", "exact")


def _fmt(value, name, allow_none=False):
    if value is None and allow_none:
        return None
    try:
        return emu.format(value, argname=name)
    except ValueError as exc:
        if allow_none:
            raise ValueError(f"{exc} (or None for native torch behaviour)") from None
        raise


def operand_format(value, argname: str = "fmt"):
    """The matmul operand format ``fmt`` takes: an emu format, an OCP MX type (emu.mx),
    a scaling recipe (emu.recipe: ``nvfp4``, ``fp8_current``, ``fp8_delayed``,
    ``fp8_block``, ...) or None; ValueError naming ``argname`` otherwise."""
    if value is None or isinstance(value, (emu.Format, emu.mx.MXFormat, emu.Recipe)):
        return value
    if isinstance(value, str) and value.strip().lower().startswith("mx"):
        return emu.mx.mx_format(value, argname=argname)
    try:
        return emu.format(value, argname=argname)
    except ValueError as exc:
        if isinstance(value, str) and value.strip().lower().split("/")[0] in _RECIPE_NAMES:
            return emu.recipe(value, argname=argname)
        raise ValueError(f"{exc}; or an OCP MX type (e.g. 'mxfp8_e4m3', 'mxfp4/16'), a "
                         f"scaling recipe ({', '.join(_RECIPE_NAMES)}, with /-parameters: "
                         "docs/semantics.md §10b), or None for native torch") from None


_RECIPE_NAMES = [n for n in emu.RECIPES if not n.startswith("mx")] + \
    ["fp8_tensorwise", "fp8_rowwise"]


def blocked(fmt) -> bool:
    """Whether ``fmt`` scales its operands in blocks (an MX type or a recipe): no
    per-element format, so no fused composite and no range diagnostics."""
    return isinstance(fmt, (emu.mx.MXFormat, emu.Recipe))


@dataclass(frozen=True)
class PAMConfig:
    """How a model runs on emulated piecewise-affine hardware (Kosson & Jaggi).

    fmt: number format of the PAM matmul operands — linear, convolution and the
        attention batched matmuls, forward and backward (``"bf16"``, ``"e8m4"``,
        ``"float32"``, any ``emu.format``), or an OCP MX type (``"mxfp8_e4m3"``,
        ``"mxfp6_e2m3"``, ``"mxfp4"``, ``"mxint8"``; ``"mxfp4/16"`` for blocks of 16):
        operands MX-quantized in blocks along the contraction axis, gradients along
        their last axis, round to nearest only (docs/semantics.md, "MX block
        formats"), or a scaling recipe (``"nvfp4"``, ``"fp8_current"``,
        ``"fp8_delayed"``, ``"fp8_block"``, ``"fp8_rowwise"``, with /-parameters;
        an ``emu.Recipe``): the products with a weight run as the recipe's forward,
        dgrad and wgrad GEMMs (emu.recipe_matmul, each with its roles' formats and
        scales), the products of activations in float32 operands; CPU tensors,
        ``backward`` 'approx' for matmuls (docs/torch_bridge.md "Scaling recipes").
        ``None``: no change at all, every op native.
    backward: ``"approx"`` (the paper's approximate/mimic derivative) or ``"exact"``
        (the true piecewise-constant derivative, Table 1), or a mapping from op group
        to kind, e.g. ``{"loss": "exact"}`` (unlisted groups: approx).
    ops: the op groups that are piecewise affine: ``"matmul"``, ``"softmax"``
        (attention softmax, its scaling and the PAM gains that go with it),
        ``"layernorm"`` (layer and RMS norm), ``"loss"`` (cross-entropy with label
        smoothing), ``"optimizer"`` (PAAdamW / PASGD), ``"elementwise"`` (under
        pam_mode: a model's own ``*``, ``/``, powers, exp/log/sqrt/rsqrt, means and
        activations); the others stay native torch.
    rounding: how operands are rounded into the formats: ``"nearest_even"``,
        ``"stochastic"`` (a fresh stream per call, drawn from torch's RNG, so
        ``torch.manual_seed`` makes runs reproducible) or ``"toward_zero"``.
    acc: accumulator format of the PAM matmuls (emu's ``acc``), float32 by default.
    pa_fmt: format of the elementwise PA operations inside softmax, layer norm,
        loss and optimizer.  float32 by default, like the paper's Table 3 (its
        narrow-mantissa study, Appendix D, narrows only the matmul inputs).
    mul: the multiplier (a name of ``emu.MULTIPLIERS`` such as ``"lmul"``, ``"exact"``,
        ``"cpam2-unbiased"``, a spelling such as ``"pam+2"``, or an ``emu.Multiplier``)
        of every product the enabled groups make: the matmuls (in ``fmt``), and the
        elementwise products of softmax, norms, losses, optimizers and the elementwise
        group (in ``pa_fmt``), forward and backward (``exact``: the multiplier's own
        derivative).  PA division, exp, log and sqrt stay as defined.  ``"pam"`` by
        default.  With an MX ``fmt`` the products follow the element format's rule
        (emu.mx_matmul; not ``float``, and mxint8 takes PAM only).  A multiplier must be
        defined in each format it runs in (ValueError).
        Its products bypass the fused PAM kernels of the composites and the optimizer
        (the same bits as their graphs, slower).
    """
    fmt: object = "bf16"
    backward: object = field(default="approx", compare=False)
    ops: Iterable[str] = OP_GROUPS
    rounding: str = "nearest_even"
    acc: object = "float32"
    pa_fmt: object = "float32"
    mul: object = "pam"
    _kinds: tuple = field(default=(), init=False, repr=False)

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)     # noqa: E731 (frozen)
        set_("fmt", operand_format(self.fmt))
        set_("acc", _fmt(self.acc, "acc").accumulator("acc"))
        set_("pa_fmt", _fmt(self.pa_fmt, "pa_fmt"))
        ops = [self.ops] if isinstance(self.ops, str) else self.ops
        try:
            ops = frozenset(ops)
        except TypeError:
            raise ValueError(f"ops={self.ops!r}; expected a set of names from "
                             f"{OP_GROUPS}") from None
        bad = sorted(map(str, ops - set(OP_GROUPS)))
        if bad:
            raise ValueError(f"ops: unknown op group(s) {bad}; expected names from {OP_GROUPS}")
        set_("ops", ops)
        if isinstance(self.backward, str):
            kinds = {op: self.backward for op in OP_GROUPS}
        elif isinstance(self.backward, Mapping):
            bad = sorted(map(str, set(self.backward) - set(OP_GROUPS)))
            if bad:
                raise ValueError(f"backward: unknown op group(s) {bad}; expected names "
                                 f"from {OP_GROUPS}")
            kinds = {op: self.backward.get(op, "approx") for op in OP_GROUPS}
        else:
            raise ValueError(f"backward={self.backward!r}; expected 'approx', 'exact' or a "
                             f"mapping from op group {OP_GROUPS} to one of them")
        for op, kind in kinds.items():
            if kind not in _KINDS:
                raise ValueError(f"backward[{op!r}]={kind!r}; expected one of {_KINDS}")
        set_("backward", kinds if not isinstance(self.backward, str) else self.backward)
        set_("_kinds", tuple(kinds[op] for op in OP_GROUPS))
        key = self.rounding.lower() if isinstance(self.rounding, str) else None
        key = ROUNDING_ALIASES.get(key, key)
        if key not in ROUNDING:
            raise ValueError(f"rounding={self.rounding!r}; expected one of {sorted(ROUNDING)} "
                             f"(aliases {sorted(ROUNDING_ALIASES)})")
        set_("rounding", key)
        if blocked(self.fmt) and key != "nearest_even":
            raise ValueError(f"rounding={self.rounding!r} with fmt={self.fmt.name}: MX and "
                             "recipe quantization round to nearest even only")
        if isinstance(self.fmt, emu.Recipe) and kinds["matmul"] != "approx":
            raise ValueError(f"backward['matmul']='exact' with fmt={self.fmt.name}: a "
                             "recipe's backward is its dgrad and wgrad GEMMs ('approx')")
        set_("mul", emu.multiplier(self.mul))
        if self.mul != _PAM:
            self._check_mul()

    def _check_mul(self):
        """What a multiplier other than PAM supports so far (the class docstring)."""
        if self.fmt is None:
            return
        mm_fmt = self.fmt
        if isinstance(self.fmt, emu.Recipe) and "matmul" in self.ops:
            for gemm, roles in GEMM_ROLES.items():
                try:
                    self.fmt.multiplier(self.mul, roles)
                except ValueError as exc:
                    raise ValueError(f"fmt={self.fmt.name}, {gemm} GEMM: {exc}") from None
            mm_fmt = emu.float32            # the products of activations (attention)
        elif isinstance(self.fmt, emu.mx.MXFormat) and "matmul" in self.ops:
            try:
                mm_fmt = emu.mx.mx_element_multiplier(self.fmt, self.mul)[1]
            except ValueError as exc:
                raise ValueError(f"fmt={self.fmt.name}: {exc}") from None
        # ValueError where the multiplier is not defined in a format it would run in
        for fmt, argname, on in ((mm_fmt, "fmt", "matmul" in self.ops),
                                 (self.pa_fmt, "pa_fmt", bool(self.ops - {"matmul"}))):
            try:
                if on:
                    self.mul.params(fmt)
            except ValueError as exc:
                raise ValueError(f"{argname}={fmt.name}: {exc}") from None

    def enabled(self, op: str) -> bool:
        """Whether op group ``op`` runs piecewise affine under this config."""
        if op not in OP_GROUPS:
            raise ValueError(f"op={op!r}; expected one of {OP_GROUPS}")
        return self.fmt is not None and op in self.ops

    def kind(self, op: str) -> str:
        """The derivative kind ('approx' or 'exact') of op group ``op``."""
        if op not in OP_GROUPS:
            raise ValueError(f"op={op!r}; expected one of {OP_GROUPS}")
        return self._kinds[OP_GROUPS.index(op)]

    def replace(self, **changes) -> "PAMConfig":
        """A copy with some fields changed (validated again)."""
        if isinstance(self.backward, dict) and "backward" not in changes:
            changes["backward"] = dict(self.backward)
        return replace(self, **changes)

    def __hash__(self):
        return hash((self.fmt, self._kinds, self.ops, self.rounding, self.acc, self.pa_fmt,
                     self.mul))

    def describe(self) -> str:
        """One line for tables and logs, e.g. 'bfloat16 all-ops approx (exact: loss)'."""
        if self.fmt is None or not self.ops:
            return "native"
        ops = "all-ops" if self.ops == set(OP_GROUPS) else "+".join(
            op for op in OP_GROUPS if op in self.ops)
        groups = [op for op in OP_GROUPS if op in self.ops and op != "optimizer"] or ["matmul"]
        exact = [op for op in groups if self.kind(op) == "exact"]
        if not exact or len(exact) == len(groups):
            bwd = "exact" if exact else "approx"
        else:
            bwd = f"approx (exact: {','.join(exact)})"
        pa = "" if self.pa_fmt == emu.float32 else f" pa_fmt={self.pa_fmt.name}"
        rnd = "" if self.rounding == "nearest_even" else f" {self.rounding}"
        mul = "" if self.mul == _PAM else f" mul={self.mul}"
        return f"{self.fmt.name} {ops} {bwd}{pa}{rnd}{mul}"


def check_config(config):
    """``config`` if it is a PAMConfig or None, else a TypeError naming it."""
    if config is not None and not isinstance(config, PAMConfig):
        raise TypeError(f"config must be a torch_bridge.PAMConfig or None, got "
                        f"{type(config).__name__} {config!r}")
    return config


class Numerics(NamedTuple):
    """The checked numerics of a PA call (:func:`check_numerics`): what the primitives'
    autograd Functions and the composites pass along."""
    fmt: object         #: operand format (an emu format, or an MX type for matmuls)
    backward: str       #: derivative kind: 'approx' or 'exact'
    rounding: str       #: a canonical rounding name (emu.lowlevel.ROUNDING)
    acc: object         #: matmul accumulator format
    mul: object = None  #: the products' emu.Multiplier; None for PAM


def check_numerics(fmt, backward, rounding, acc=None, mul=None) -> Numerics:
    """``fmt``, ``backward``, ``rounding``, ``acc`` (None: float32) and the products'
    ``mul`` (None: PAM) validated through PAMConfig's checks, ValueError naming the bad
    one (remembered per argument tuple: every PA call of a model asks again with the
    same few)."""
    key = (fmt, backward, rounding, acc, mul)
    try:
        return _NUMERICS[key]
    except (KeyError, TypeError):       # TypeError: an unhashable argument, checked below
        pass
    if backward not in _KINDS:
        raise ValueError(f"backward={backward!r}; expected one of {_KINDS}")
    cfg = PAMConfig(fmt=fmt, rounding=rounding, acc=emu.float32 if acc is None else acc,
                    **({} if mul is None else dict(mul=mul, ops=("matmul",))))
    if cfg.fmt is None:
        raise ValueError("fmt=None; the PA primitives need a format (use the dispatchers "
                         "with config=None for native torch)")
    out = Numerics(cfg.fmt, backward, cfg.rounding, cfg.acc,
                   None if cfg.mul == _PAM else cfg.mul)
    try:
        if len(_NUMERICS) < 256:
            _NUMERICS[key] = out
    except TypeError:
        pass
    return out


_NUMERICS: dict = {}
_PAM = emu.MULTIPLIERS["pam"]

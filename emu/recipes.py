"""Low-precision scaling recipes as data: NVFP4, float8 current, delayed and block
scaling, and the OCP MX types of :mod:`emu.mx` (docs/semantics.md §10b).

A :class:`Recipe` holds, per role (``"act"``, ``"weight"``, ``"grad"``), an element
format and a block shape, and for every role the scale format, the scale rule, the
optional per-tensor float32 scale (NVFP4's second level) and, for delayed scaling, the
length and reduction of the amax history.  A block shape ``(r, c)`` has ``c`` elements
along the quantized axis (``0``: the whole axis) and ``r`` along the other one of the
last two axes (``1``: every row on its own; ``0``: the whole tensor, only with
``c = 0``).  Scale rules: ``"ocp"`` (emu.mx: ``2^(floor(log2 amax) - emax)`` as E8M0),
``"decode"`` (NVFP4, torchao's numerics: the decode scale ``amax / max_elem`` rounded
into E4M3) and ``"encode"`` (float8, torchao's numerics: the encode scale
``max_elem / amax`` in float32, its reciprocal the decode scale).

Names (:func:`recipe`): a family, then ``/``-separated parameters, each at most once;
``Recipe.name`` writes only those that differ from the family's defaults, in this
order:

================  ==============================================  =====================
family            defaults                                        parameters
================  ==============================================  =====================
``nvfp4``         e2m1 in 1x16 blocks, E4M3 block scales, a        ``/<n>`` block,
                  float32 per-tensor scale                         ``/single`` (none)
``fp8_current``   tensorwise, float32 scales, hybrid (e4m3 act     ``/e4m3 /e5m2
                  and weight, e5m2 grad)                           /hybrid``, ``/rowwise``,
                                                                   ``/pow2``, ``/m<k>``
``fp8_delayed``   as fp8_current, the scale from an amax           as fp8_current but
                  history of 1024 steps, reduction max             rowwise; ``/h<n>``,
                                                                   ``/most_recent``
``fp8_block``     e4m3, 1x128 act and grad, 128x128 weight         ``/<n>`` (1xn, nxn),
                  (DeepSeek-V3), float32 scales                    ``/pow2``
``mxfp8_e4m3``    emu.mx (1x32, E8M0 scales); every MX type        ``/<n>`` block
================  ==============================================  =====================

``/pow2`` rounds float32 scales down to a power of two, ``/m<k>`` divides them by 2^k
(margin), ``/<n>`` is a block size in [1, 2^20].  Aliases: ``mxfp8``, ``mxfp6``,
``mxfp4`` (emu.mx's), ``fp8_tensorwise`` (= ``fp8_current``), ``fp8_rowwise``
(= ``fp8_current/e4m3/rowwise/pow2``, torchao's ROWWISE).

:func:`recipe_quantize` gives a :class:`Quantized` (float32 element values, float32
decode scales, the tensor scale, the next amax history); :func:`recipe_dequantize`
its values; :func:`recipe_matmul` the scaled matmul with any multiplier.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np

from .formats import (Format, float4_e2m1fn, float8_e4m3fn, float8_e5m2, float8_e8m0fnu,
                      float32, format)
from .matmul import matmul
from .multipliers import Multiplier, multiplier
from .multipliers import mul as emu_mul
from .mx import MAX_BLOCK, MX_TYPES, MXFormat, mx_element_multiplier, mx_quantize, mx_type
from .ops import from_bits, quantize

__all__ = ["Recipe", "recipe", "RECIPES", "ROLES", "RecipeState", "Quantized",
           "recipe_quantize", "recipe_dequantize", "recipe_matmul"]

ROLES = ("act", "weight", "grad")
RULES = ("ocp", "decode", "encode")
REDUCTIONS = ("max", "most_recent")
SCALE_FORMATS = (float8_e8m0fnu, float8_e4m3fn, float32)
#: the scale format each rule produces
_RULE_SCALE = {"ocp": float8_e8m0fnu, "decode": float8_e4m3fn, "encode": float32}
MAX_HISTORY = 1 << 20
MAX_MARGIN = 64
#: torchao float8's floor on amax (torchao/float8/float8_utils.py EPS), in float64
AMAX_EPS = 1e-12

_E4, _E5 = float8_e4m3fn, float8_e5m2
#: mxint8's elements k / 64 (|k| <= 127) are values of e3m6 with bias 1 (emu/mx.py)
_MXINT8_GRID = Format(3, 6, bias=1)


def _mx_elem(name: str) -> Format:
    elem = MX_TYPES[name]
    return _MXINT8_GRID if elem == "int8" else elem


def _rows(n: int) -> tuple:
    return ((1, n),) * 3


#: the families: every field of a Recipe but ``family``, at its default
_FAMILIES: dict[str, dict] = {
    "nvfp4": dict(elem=(float4_e2m1fn,) * 3, block=_rows(16), scale=float8_e4m3fn,
                  rule="decode", tensor_scale=True),
    "fp8_current": dict(elem=(_E4, _E4, _E5), block=((0, 0),) * 3, scale=float32,
                        rule="encode"),
    "fp8_delayed": dict(elem=(_E4, _E4, _E5), block=((0, 0),) * 3, scale=float32,
                        rule="encode", history=1024),
    "fp8_block": dict(elem=(_E4,) * 3, block=((1, 128), (128, 128), (1, 128)),
                      scale=float32, rule="encode"),
    **{mx: dict(elem=(_mx_elem(mx),) * 3, block=_rows(32), scale=float8_e8m0fnu, rule="ocp")
       for mx in MX_TYPES},
}
_DEFAULTS = dict(tensor_scale=False, pow2=False, margin=0, history=0, reduce="max")
_ALIASES = {"fp8_tensorwise": "fp8_current", "fp8_rowwise": "fp8_current/e4m3/rowwise/pow2"}

# --- the parameters: which families take them and the fields they set -------------
_ELEMS = {"hybrid": (_E4, _E4, _E5), "e4m3": (_E4,) * 3, "e5m2": (_E5,) * 3}
_GRAINS = {"tensorwise": ((0, 0),) * 3, "rowwise": ((1, 0),) * 3}
_FP8 = ("fp8_current", "fp8_delayed", "fp8_block")
_BLOCKED = ("nvfp4", "fp8_block", *MX_TYPES)


def _block_shapes(family: str, n: int) -> tuple:
    """The block shapes of ``family`` with block size ``n``."""
    return ((1, n), (n, n), (1, n)) if family == "fp8_block" else _rows(n)


_ACCEPTED = ("a family of " + ", ".join(_FAMILIES) + " (aliases mxfp8, mxfp6, mxfp4, "
             + ", ".join(_ALIASES) + "), then '/'-separated parameters: /<block> "
             "(nvfp4, fp8_block, MX), /e4m3 /e5m2 /hybrid and /pow2 /m<margin> "
             "(fp8_*), /rowwise (fp8_current), /h<history> /most_recent (fp8_delayed), "
             "/single (nvfp4)")


def _parse(spec: str, argname: str) -> dict:
    """The fields of the recipe named ``spec``; ValueError naming ``argname``."""
    head, *tokens = spec.strip().lower().split("/")
    if head in _ALIASES:
        head, *more = _ALIASES[head].split("/")
        tokens = more + tokens
    try:
        family = mx_type(head) if head.startswith("mx") else head
    except ValueError:
        family = head
    if family not in _FAMILIES:
        raise ValueError(f"{argname}={spec!r}: unknown recipe family {head!r}; expected "
                         f"{_ACCEPTED}")
    out = dict(_DEFAULTS, family=family, **_FAMILIES[family])
    seen = set()

    def take(tok, kind, families):
        if family not in families:
            raise ValueError(f"{argname}={spec!r}: parameter /{tok} does not apply to "
                             f"{family}; expected {_ACCEPTED}")
        if kind in seen:
            raise ValueError(f"{argname}={spec!r}: two {kind} parameters")
        seen.add(kind)

    def number(tok, what, lo, hi):
        value = int(tok)
        if not lo <= value <= hi:
            raise ValueError(f"{argname}={spec!r}: {what} {value} is outside [{lo}, {hi}]")
        return value

    for tok in tokens:
        digits = tok[1:].lstrip("-").isdigit()
        if tok.lstrip("-").isdigit():
            take(tok, "block", _BLOCKED)
            out["block"] = _block_shapes(family, number(tok, "block", 1, MAX_BLOCK))
        elif tok in _ELEMS:
            take(tok, "element", _FP8)
            out["elem"] = _ELEMS[tok]
        elif tok in _GRAINS:
            take(tok, "granularity", ("fp8_current",))
            out["block"] = _GRAINS[tok]
        elif tok == "pow2":
            take(tok, "pow2", _FP8)
            out["pow2"] = True
        elif tok[:1] == "m" and digits:
            take(tok, "margin", _FP8)
            out["margin"] = number(tok[1:], "margin", 0, MAX_MARGIN)
        elif tok[:1] == "h" and digits:
            take(tok, "history", ("fp8_delayed",))
            out["history"] = number(tok[1:], "history length", 1, MAX_HISTORY)
        elif tok in REDUCTIONS:
            take(tok, "reduction", ("fp8_delayed",))
            out["reduce"] = tok
        elif tok == "single":
            take(tok, "single", ("nvfp4",))
            out["tensor_scale"] = False
        else:
            raise ValueError(f"{argname}={spec!r}: unknown parameter /{tok}; expected "
                             f"{_ACCEPTED}")
    return out


def _compose(f: dict) -> str:
    """The canonical name of the fields ``f`` (a family's defaults left out)."""
    family = f["family"]
    base = dict(_DEFAULTS, **_FAMILIES[family])
    name = family
    if f["block"] != base["block"] and family in _BLOCKED:
        name += f"/{f['block'][0][1]}"
    if f["elem"] != base["elem"]:
        name += "".join(f"/{k}" for k, v in _ELEMS.items() if v == f["elem"])
    if f["block"] != base["block"] and family == "fp8_current":
        name += "".join(f"/{k}" for k, v in _GRAINS.items() if v == f["block"])
    name += "/pow2" * (f["pow2"] and not base["pow2"])
    name += f"/m{f['margin']}" * (f["margin"] != base["margin"])
    name += f"/h{f['history']}" * (f["history"] != base["history"])
    name += f"/{f['reduce']}" * (f["reduce"] != base["reduce"])
    name += "/single" * (base["tensor_scale"] and not f["tensor_scale"])
    return name


@dataclass(frozen=True)
class Recipe:
    """A scaling recipe (module docstring): ``elem`` and ``block`` per role (act, weight,
    grad), ``scale`` (float8_e8m0fnu, float8_e4m3fn or float32), ``rule`` (ocp, decode,
    encode), ``tensor_scale`` (a float32 per-tensor scale, decode rule), ``pow2`` and
    ``margin`` (encode rule: the scale rounded down to a power of two; divided by
    2^margin), ``history`` (0: current scaling; else the amax history length) and
    ``reduce`` (max or most_recent).  Build one with :func:`recipe`; a Recipe made
    directly must be one a name describes."""
    family: str
    elem: tuple
    block: tuple
    scale: Format
    rule: str
    tensor_scale: bool = False
    pow2: bool = False
    margin: int = 0
    history: int = 0
    reduce: str = "max"

    def __post_init__(self):
        if self.family not in _FAMILIES:
            raise ValueError(f"family={self.family!r}: expected one of {list(_FAMILIES)}")
        elem = self.elem
        if not (isinstance(elem, tuple) and len(elem) == 3
                and all(isinstance(e, Format) and e.signed for e in elem)):
            raise ValueError(f"elem={elem!r}: expected a tuple of 3 signed Formats "
                             f"(one per role {ROLES})")
        blk = self.block
        if not (isinstance(blk, tuple) and len(blk) == 3
                and all(isinstance(b, tuple) and len(b) == 2 for b in blk)):
            raise ValueError(f"block={blk!r}: expected 3 (rows, cols) pairs, one per role "
                             f"{ROLES}")
        for role, (r, c) in zip(ROLES, blk):
            for v in (r, c):
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_BLOCK:
                    raise ValueError(f"block={blk!r}: role {role}: {v!r} is not an int in "
                                     f"[0, {MAX_BLOCK}] (0: the whole extent)")
            if r == 0 and c != 0:
                raise ValueError(f"block={blk!r}: role {role}: rows 0 (the whole tensor) "
                                 f"needs cols 0, got {c}")
        if not isinstance(self.scale, Format) or self.scale not in SCALE_FORMATS:
            raise ValueError(f"scale={getattr(self.scale, 'name', self.scale)!r}: expected one of "
                             f"{[s.name for s in SCALE_FORMATS]}")
        if self.rule not in RULES:
            raise ValueError(f"rule={self.rule!r}: expected one of {list(RULES)}")
        if self.scale != _RULE_SCALE[self.rule]:
            raise ValueError(f"scale={self.scale.name}: rule {self.rule!r} makes "
                             f"{_RULE_SCALE[self.rule].name} scales")
        for name in ("tensor_scale", "pow2"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: expected a bool")
        for name, hi in (("margin", MAX_MARGIN), ("history", MAX_HISTORY)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
                raise ValueError(f"{name}={v!r}: expected an int in [0, {hi}]")
        if self.family == "fp8_delayed" and self.history == 0:
            raise ValueError("history=0: fp8_delayed needs a history of at least 1 step")
        if self.reduce not in REDUCTIONS:
            raise ValueError(f"reduce={self.reduce!r}: expected one of {list(REDUCTIONS)}")
        mine = {f.name: getattr(self, f.name) for f in fields(self)}
        if _parse(_compose(mine), "recipe") != mine:
            raise ValueError(f"{self!r} is no recipe a name describes (nearest: "
                             f"{_compose(mine)!r}); build recipes with emu.recipe(name)")

    @property
    def name(self) -> str:
        """The canonical name: ``recipe(r.name) == r``."""
        return _compose({f.name: getattr(self, f.name) for f in fields(self)})

    def __str__(self) -> str:
        return self.name

    @property
    def pow2_scales(self) -> bool:
        """Whether every scale is a power of two (E8M0, or float32 under ``/pow2``):
        recipe_matmul applies those as exponent adds, exactly."""
        return self.rule == "ocp" or self.pow2

    def element(self, role: str = "act") -> Format:
        """The element format of ``role``."""
        return self.elem[_role(role)]

    def block_of(self, role: str = "act") -> tuple:
        """The block shape ``(rows, cols)`` of ``role``."""
        return self.block[_role(role)]

    def multiplier(self, mul="pam", roles=("act", "weight")) -> Multiplier:
        """The multiplier ``mul`` of a :func:`recipe_matmul` on ``roles``, or the
        ValueError that call would raise before any work (torch_bridge checks each of a
        training step's three GEMMs with it)."""
        if not (isinstance(roles, tuple) and len(roles) == 2):
            raise ValueError(f"roles={roles!r}: expected a pair of roles from {list(ROLES)}")
        return _multipliers(self, mul, self.element(roles[0]), self.element(roles[1]))[0]

    def current(self) -> "Recipe":
        """The recipe with current scaling in place of delayed scaling (itself if it
        has no history): the same elements, margin and ``/pow2``."""
        if not self.history:
            return self
        return Recipe("fp8_current", self.elem, self.block, self.scale, self.rule,
                      self.tensor_scale, self.pow2, self.margin)


def _role(role) -> int:
    if role not in ROLES:
        raise ValueError(f"role={role!r}: expected one of {list(ROLES)}")
    return ROLES.index(role)


def recipe(spec, *, argname: str = "recipe") -> Recipe:
    """The :class:`Recipe` named ``spec`` (the grammar of the module docstring), or
    ``spec`` itself; ValueError naming ``argname`` for a malformed name, TypeError for
    what is neither a str nor a Recipe."""
    if isinstance(spec, Recipe):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"{argname}={spec!r}: expected a recipe name (str) or an "
                        "emu.Recipe")
    return Recipe(**_parse(spec, argname))


#: the families at their defaults, by name
RECIPES: dict[str, Recipe] = {name: recipe(name) for name in _FAMILIES}


# --- state of delayed scaling --------------------------------------------------------

class RecipeState(NamedTuple):
    """Delayed scaling's state for one role of one tensor: ``amax``, float32 of the
    recipe's history length, most recent first, and ``scale``, the float32 encode scale
    the next quantization uses (Transformer Engine's ``amax_history`` and ``scale``)."""
    amax: np.ndarray
    scale: np.float32

    @classmethod
    def initial(cls, r) -> "RecipeState":
        """The state before the first step: a history of zeros and scale 1."""
        r = recipe(r)
        if not r.history:
            raise ValueError(f"recipe={r.name!r} keeps no amax history (fp8_delayed does)")
        return cls(np.zeros(r.history, np.float32), np.float32(1))


def _check_state(state, r: Recipe) -> RecipeState:
    if state is None:
        return RecipeState.initial(r)
    if not r.history:
        raise ValueError(f"history given, but recipe={r.name!r} keeps no amax history")
    ok = isinstance(state, RecipeState) and isinstance(state.amax, np.ndarray) \
        and state.amax.dtype == np.float32 and state.amax.shape == (r.history,)
    scale = np.float32(state.scale) if ok else None
    if not ok or not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"history must be a RecipeState with amax float32 of shape "
                         f"({r.history},) and a finite positive scale (RecipeState.initial"
                         f"(recipe) or the .history of the last quantization), got "
                         f"{state!r:.200}")
    return RecipeState(state.amax, scale)


# --- quantize / dequantize ---------------------------------------------------------------

class Quantized(NamedTuple):
    """A tensor quantized by a recipe.  ``elements``: float32 element values of the
    tensor's shape; ``scales``: float32 decode scales (values of the scale format), one
    per block, of the tensor's ndim with each axis shortened to its number of blocks;
    ``tensor_scale``: the float32 per-tensor scale or None; ``history``: delayed
    scaling's state after this step, else None.  The value of element ``i`` of block
    ``b`` is ``elements[i] · scales[b] (· tensor_scale)``."""
    elements: np.ndarray
    scales: np.ndarray
    tensor_scale: np.float32 | None
    history: RecipeState | None
    recipe: Recipe
    role: str
    axis: int


class _Layout(NamedTuple):
    split: tuple        # the shape with every axis i as (blocks_i, extent_i)
    reduce: tuple       # the axes of ``split`` that run inside a block (extent > 1)
    scales: tuple       # the scales' shape: blocks per axis
    reps: tuple         # the extent of a block along each axis


def _as_array(x, argname: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"{argname} must be a real numeric array, got dtype {a.dtype}")
    if a.ndim == 0 or a.size == 0:
        raise ValueError(f"{argname} must have at least one dimension and one element, "
                         f"got shape {a.shape}")
    return np.ascontiguousarray(a, dtype=np.float32)


def _axis(axis, ndim: int) -> int:
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)) \
            or not -ndim <= axis < ndim:
        raise ValueError(f"axis={axis!r} is out of range for an array of {ndim} dimensions")
    return int(axis) % ndim


def _extents(r: Recipe, role: str, shape: tuple, axis: int) -> tuple:
    """A block's extent along each axis of ``shape`` (quantized along ``axis``)."""
    rows, cols = r.block_of(role)
    nd = len(shape)
    other = None
    if rows > 1:
        if nd < 2 or axis < nd - 2:
            raise ValueError(f"recipe {r.name!r}, role {role}: a {rows}x{cols} tile needs the "
                             f"quantized axis among the last two; got axis={axis} of shape "
                             f"{shape}")
        other = nd - 1 if axis == nd - 2 else nd - 2
    return tuple((cols or n) if i == axis else n if rows == 0 else rows if i == other else 1
                 for i, n in enumerate(shape))


def _layout(r: Recipe, role: str, shape: tuple, axis: int) -> _Layout:
    """The blocks of ``role`` on an array of ``shape`` quantized along ``axis``;
    ValueError where blocks do not divide the shape (MX goes through emu.mx)."""
    reps = _extents(r, role, shape, axis)
    for i, (n, g) in enumerate(zip(shape, reps)):
        if n % g:
            raise ValueError(f"recipe {r.name!r}, role {role}: blocks of {g} along axis {i} "
                             f"do not divide x.shape={shape} (axis={axis}, block "
                             f"{'x'.join(map(str, r.block_of(role)))})")
    scales = tuple(n // g for n, g in zip(shape, reps))
    split = tuple(v for pair in zip(scales, reps) for v in pair)
    return _Layout(split, tuple(2 * i + 1 for i, g in enumerate(reps) if g > 1), scales, reps)


def _amax(xs: np.ndarray, lay: _Layout) -> np.ndarray:
    """max |x| per block, keepdims on the split view (NaN wherever a NaN is)."""
    a = np.abs(xs)
    return a.max(axis=lay.reduce, keepdims=True) if lay.reduce else a


def _encode_scale(amax, r: Recipe, elem: Format) -> np.ndarray:
    """float32 encode scales: RN32(max_elem / max(amax, 1e-12)) (float64 quotient, as
    torchao), divided by 2^margin, rounded down to a power of two under /pow2."""
    s = (elem.max / np.maximum(np.asarray(amax, np.float64), AMAX_EPS)).astype(np.float32)
    return _finish_scale(s, r)


def _finish_scale(s, r: Recipe):
    if r.margin:
        s = s * np.float32(2.0 ** -r.margin)
    if r.pow2:      # 2^floor(log2 s) from the exponent (torchao: exp2(floor(log2 s)))
        _, e = np.frexp(s)
        s = np.where(np.isfinite(s) & (s > 0), np.ldexp(np.float32(1), e - 1), s)
    return np.asarray(s, np.float32)


def _quantize_encode(x, lay, r, role, elem, state):
    xs = x.reshape(lay.split)
    if r.history:
        s = np.float32(state.scale)
        amax = np.abs(x).max()
        hist = np.concatenate([[amax], state.amax[:-1]]).astype(np.float32)
        red = hist.max() if r.reduce == "max" else hist[0]
        # Transformer Engine: a zero or non-finite amax keeps the scale
        new = _encode_scale(red, r, elem) if np.isfinite(red) and red > 0 else s
        state = RecipeState(hist, np.float32(new))
        s = np.full((1,) * len(lay.split), s)
    else:
        s = _encode_scale(_amax(xs, lay), r, elem)
        state = None
    e = quantize(xs * s, elem, overflow="saturate").reshape(x.shape)
    return e, np.float32(1) / s, None, state


def _quantize_decode(x, lay, r, role, elem):
    """NVFP4 (torchao nvfp4_quantize): s = E4M3(clamp(RN32(amax / max_elem) [/ t],
    2^-6, 448)), elements RN_elem(x · RN32([1/t] / s)), saturating."""
    xs = x.reshape(lay.split)
    amax = _amax(xs, lay)
    smax, smin = np.float32(r.scale.max), np.float32(r.scale.smallest_normal)
    u = amax / np.float32(elem.max)
    t = None
    if r.tensor_scale:
        tamax = amax.max()
        t = np.float32(tamax) / np.float32(r.scale.max * elem.max)
        if t == 0:          # an all-zero (or all-tiny) tensor: torchao's 0/0 is NaN
            t = np.float32(1)
        u = u / t
    s = quantize(np.clip(u, smin, smax), r.scale)
    rcp = (np.float32(1) / t if t is not None else np.float32(1)) / s
    e = quantize(xs * rcp, elem, overflow="saturate")
    bad = ~np.isfinite(amax)
    if t is not None and not np.isfinite(t):
        bad = np.ones_like(bad)
    if bad.any():           # a block with a NaN or ±inf: NaN scale, +0 elements
        s = np.where(bad, np.float32(np.nan), s)
        e = np.where(bad, np.float32(0), e)
    return e.reshape(x.shape), s, t


def recipe_quantize(x, recipe, role: str = "act", *, axis: int = -1,
                    history: RecipeState | None = None) -> Quantized:
    """Quantize ``x`` (numpy, converted to float32) by ``recipe`` (a name or a
    :class:`Recipe`) as ``role`` (act, weight, grad) with its blocks' ``cols`` along
    ``axis`` (docs/semantics.md §10b).  ``history``: delayed scaling's
    :class:`RecipeState` (None: :meth:`RecipeState.initial`); the result's ``.history``
    is the state for the next step.  Blocks must divide the shape except for MX, whose
    last block may be shorter (emu.mx)."""
    r = _recipe(recipe)
    idx = _role(role)
    xa = _as_array(x, "x")
    ax = _axis(axis, xa.ndim)
    state = _check_state(history, r) if (r.history or history is not None) else None
    elem = r.elem[idx]
    if r.rule == "ocp":
        e, codes = mx_quantize(xa, r.family, r.block[idx][1], ax)
        return Quantized(e, from_bits(codes, float8_e8m0fnu), None, None, r, role, ax)
    lay = _layout(r, role, xa.shape, ax)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):    # IEEE specials
        if r.rule == "decode":
            e, s, t = _quantize_decode(xa, lay, r, role, elem)
            state = None
        else:
            e, s, t, state = _quantize_encode(xa, lay, r, role, elem, state)
    return Quantized(e, np.asarray(s, np.float32).reshape(lay.scales), t, state, r, role, ax)


def _expand(scales, shape, reps):
    """Block scales repeated to every element of ``shape`` (a last, shorter block cut)."""
    s = scales
    for i, (g, n) in enumerate(zip(reps, shape)):
        if g > 1 and s.shape[i] > 1:
            s = np.repeat(s, g, axis=i)
        if s.shape[i] > n:
            s = s.take(np.arange(n), axis=i)
    return s


def _reps(q: Quantized) -> tuple:
    return _extents(q.recipe, q.role, q.elements.shape, q.axis)


def recipe_dequantize(q: Quantized) -> np.ndarray:
    """The float32 values of ``q``: ``RN32(elements · S)`` with ``S`` the block's decode
    scale, or ``RN32(scale · tensor_scale)`` with a per-tensor scale (torchao's NVFP4
    ``get_hp_scales``); NaN in a block whose scale is NaN."""
    if not isinstance(q, Quantized):
        raise TypeError(f"q must be the Quantized of emu.recipe_quantize, got "
                        f"{type(q).__name__}")
    s = q.scales if q.tensor_scale is None else q.scales * np.float32(q.tensor_scale)
    with np.errstate(invalid="ignore", over="ignore"):
        return (q.elements * _expand(s, q.elements.shape, _reps(q))).astype(np.float32)


# --- the matmul -----------------------------------------------------------------------------

def _recipe(spec) -> Recipe:
    return recipe(spec, argname="recipe")


def _multipliers(r: Recipe, mul, ea: Format, eb: Format):
    """(multiplier, the format of its rule for the element products); ValueError naming
    ``mul`` before any work where the recipe's products or scales cannot take it."""
    m = multiplier(mul)
    if r.rule == "ocp":
        m, mf = mx_element_multiplier(MXFormat(r.family, r.block[0][1]), m)
    elif m.kind in ("float", "table"):
        raise ValueError(f"mul={str(m)!r} with recipe {r.name!r}: recipe products take every "
                         "multiplier but 'float' and tables (scales are no encodings)")
    elif ea == eb or m.kind in ("pam", "exact") and not m.offset:
        mf = ea if ea == eb else _joint(ea, eb)  # PAM's and exact's products need no format
    else:
        raise ValueError(f"mul={str(m)!r} with elements {ea.name} x {eb.name}: a multiplier "
                         "with a constant needs one element format; use pam or exact")
    try:
        m.params(mf)
        m.params(float32)
    except ValueError as exc:
        raise ValueError(f"mul={str(m)!r} with recipe {r.name!r}: {exc}") from None
    return m, mf


def _joint(ea: Format, eb: Format) -> Format:
    """A format holding every value of both (the IEEE eXmY of the larger E and M, where it
    does; else float32): the rule format of a product of two element formats, whose PAM
    and exact products do not depend on it, and which lets emu.matmul see that e4m3 x e5m2
    products are exact in float32 (its fast fused step)."""
    f = Format(max(ea.exp_bits, eb.exp_bits), max(ea.man_bits, eb.man_bits))
    holds = all(f.max >= e.max and f.smallest_subnormal <= e.smallest_subnormal
                for e in (ea, eb))
    return f if holds else float32


def _operand(x, r: Recipe, role: str, argname: str, k_axis_from_end: int):
    """``x`` quantized by ``r`` as ``role`` along K, or ``x`` itself if it already is."""
    if isinstance(x, Quantized):
        nd = x.elements.ndim
        if x.recipe != r or x.role != role or nd < 2 or x.axis != nd - k_axis_from_end:
            raise ValueError(f"{argname} is quantized by {x.recipe.name!r} as {x.role} along "
                             f"axis {x.axis} of {nd}; recipe_matmul needs {r.name!r} as {role} "
                             f"along axis {-k_axis_from_end}")
        return x
    xa = _as_array(x, argname)
    if xa.ndim < 2:
        raise ValueError(f"{argname} must have at least 2 dimensions, got shape {xa.shape}")
    return xa


def recipe_matmul(a, b, recipe, acc="float32", *, mul="pam", roles=("act", "weight")):
    """``a @ b`` in a recipe (docs/semantics.md §10b): ``a`` (..., M, K) quantized along
    K as ``roles[0]``, ``b`` (..., K, N) along K as ``roles[1]`` (either may be given
    as a :class:`Quantized` of that recipe, role and axis).  Per K-block, the partial
    product ``P`` is emu.matmul's fold of ``mul`` on the elements into ``acc`` from +0
    (by the element format's rule); the block's scale ``S = s_a · s_b`` (exact for
    power-of-two scales, else ``mul`` in float32), then ``C`` is the fold over blocks in
    increasing order of ``RN_acc(C + mul(P, S))`` from +0; a per-tensor scale pair is
    applied last, ``mul(C, mul(t_a, t_b))`` in float32.  Returns float32."""
    r = _recipe(recipe)
    acc = format(acc, argname="acc").accumulator("acc")
    if not (isinstance(roles, tuple) and len(roles) == 2):
        raise ValueError(f"roles={roles!r}: expected a pair of roles from {list(ROLES)}")
    ia, ib = _role(roles[0]), _role(roles[1])
    m, mf = _multipliers(r, mul, r.elem[ia], r.elem[ib])
    a = _operand(a, r, roles[0], "a", 1)
    b = _operand(b, r, roles[1], "b", 2)
    ashape = a.elements.shape if isinstance(a, Quantized) else a.shape
    bshape = b.elements.shape if isinstance(b, Quantized) else b.shape
    if ashape[-1] != bshape[-2]:
        raise ValueError(f"recipe_matmul: contracted dimensions differ: a.shape={ashape}, "
                         f"b.shape={bshape}")
    try:
        np.broadcast_shapes(ashape[:-2], bshape[:-2])
    except ValueError:
        raise ValueError(f"recipe_matmul: batch dimensions do not broadcast: a.shape="
                         f"{ashape}, b.shape={bshape}") from None
    K = ashape[-1]
    ga, gb = (r.block[i][1] or K for i in (ia, ib))
    if ga != gb:
        raise ValueError(f"recipe {r.name!r}: roles {roles} have K-blocks {ga} and {gb}; "
                         "recipe_matmul needs one K-block")
    M, N = ashape[-2], bshape[-1]
    if not isinstance(a, Quantized):
        a = _padded(a, r.block[ia], -1, r)
    if not isinstance(b, Quantized):
        b = _padded(b, r.block[ib], -2, r)
    qa = a if isinstance(a, Quantized) else recipe_quantize(a, r, roles[0], axis=-1)
    qb = b if isinstance(b, Quantized) else recipe_quantize(b, r, roles[1], axis=-2)
    K = qa.elements.shape[-1]

    nb = -(-K // ga)
    ea, eb = qa.elements, qb.elements
    if nb * ga != K:        # MX's shorter last block: zero elements add nothing
        ea = np.concatenate([ea, np.zeros(ea.shape[:-1] + (nb * ga - K,), np.float32)], -1)
        eb = np.concatenate([eb, np.zeros(eb.shape[:-2] + (nb * ga - K, eb.shape[-1]),
                                          np.float32)], -2)
    Mp, Np = ea.shape[-2], eb.shape[-1]
    sa = _expand(qa.scales, qa.scales.shape[:-2] + (Mp, nb),
                 (1,) * (qa.scales.ndim - 2) + (_reps(qa)[-2], 1))
    sb = _expand(qb.scales, qb.scales.shape[:-2] + (nb, Np),
                 (1,) * (qb.scales.ndim - 1) + (_reps(qb)[-1],))
    c = _blocked(ea, eb, sa, sb, ga, r.pow2_scales, acc, m, mf)
    if c is None:
        ea = np.swapaxes(ea.reshape(ea.shape[:-1] + (nb, ga)), -3, -2)     # (..., nb, M, g)
        eb = eb.reshape(eb.shape[:-2] + (nb, ga, Np))                        # (..., nb, g, N)
        p = matmul(ea, eb, float32, acc, mul=m, mul_fmt=mf)                  # (..., nb, M, N)
        c = _scale_fold(p, np.swapaxes(sa, -1, -2), sb, r.pow2_scales, acc, m)
    if r.tensor_scale:
        ts = emu_mul(qa.tensor_scale, qb.tensor_scale, float32, m)
        c = emu_mul(c, ts, float32, m)
    return np.asarray(c[..., :M, :N], np.float32)


def _padded(x: np.ndarray, block: tuple, k_axis: int, r: Recipe) -> np.ndarray:
    """``x`` with +0 appended along K (``k_axis``) to a multiple of the block's ``cols``
    and along the other of its last two axes to a multiple of its ``rows``: a zero adds
    nothing to a block's amax or its sum, so these are the blocks a shorter last block
    would make (MX's, which emu.mx quantizes itself, are left alone)."""
    if r.rule == "ocp":
        return x
    rows, cols = block
    other = -2 if k_axis == -1 else -1
    pad = [(0, 0)] * x.ndim
    for axis, g in ((k_axis, cols), (other, rows if rows > 1 else 0)):
        if g and x.shape[axis] % g:
            pad[axis] = (0, -x.shape[axis] % g)
    return np.pad(x, pad) if any(p[1] for p in pad) else x


_EXACT = multiplier("exact")


def _blocked(ea, eb, sa, sb, kb: int, pow2: bool, acc: Format, m: Multiplier, mf: Format):
    """Steps 1-3 of §10b in one pass (emu/_kernels_recipes.py BLOCKED_F32) where it gives
    the bits of emu.matmul's per-block fold then :func:`_scale_fold`: a float32
    accumulator, finite elements, and products that are pattern sums with one constant
    staying in float32's normal range, or exact in float32 (``exact``), and blocks of
    fewer than 256 (and more than one); else None.
    ``ea`` (..., M, K), ``eb`` (..., K, N) element values, K a multiple of ``kb``; ``sa``
    (..., M, nb), ``sb`` (..., nb, N) block scales."""
    from . import _kernels as KB
    from . import _scalar_mul as SM
    from ._kernels_mul import exact_ok
    from . import _kernels_recipes as KR
    from ._kernels_recipes import BLOCKED_F32, micro_kernel
    from ._scalar import ABS32, INF32, ONE32
    from .host import _pick
    from .shapes import batch_index
    mp = m.params(mf)
    exact = mp.kind == SM.EXACT
    if acc != float32 or not (exact or (mp.kind == SM.SUM and mp.k == 0)):
        return None
    if ea.shape[-1] // kb == 1 or kb >= 256:
        return None         # few blocks: emu.matmul's register-blocked kernel per block is faster
    scaling, pre = KR.POW2 if pow2 else KR.MUL, None
    if pow2 and not exact:      # its own checks, in the pass that scales
        pre = _prescaled(ea, eb, sa, sb, kb, int(mp.c32))
    if pre is not None:
        a, b = pre
        scaling = KR.PRESCALED
    else:
        a = np.ascontiguousarray(ea, np.float32).view(np.int32)
        b = np.ascontiguousarray(eb, np.float32).view(np.int32)
        ua, ub = a & ABS32, b & ABS32
        if ua.size and ua.max() >= INF32 or ub.size and ub.max() >= INF32:
            return None
        if exact:
            if not exact_ok(a, b, mf):
                return None
        elif not _normal_products(ua, ub, int(mp.c32)):
            return None
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    nb = K // kb
    t = int(np.prod(batch, dtype=np.int64))
    ia = batch_index(a.shape[:-2], batch)
    ib = batch_index(b.shape[:-2], batch)
    u32 = lambda x, shape: np.ascontiguousarray(                            # noqa: E731
        np.broadcast_to(x, shape), np.float32).reshape((-1,) + shape[-2:]).view(np.uint32)
    sa3 = np.ascontiguousarray(np.swapaxes(u32(sa, a.shape[:-2] + (M, nb)), -1, -2))
    sb3 = u32(sb, b.shape[:-2] + (nb, N))
    out = np.empty((t, M, N), np.float32)
    if not exact and kb % KB.KG == 0 and kb >= 32:
        # the register-blocked micro-kernel's products (emu.matmul's, packed as it packs);
        # shorter blocks: its epilogue per QR x PW tile costs as much as BLOCKED_F32's
        # slower products (2026-11-28, 1024^3, 1 thread: mxfp8 (32) 46 ms against 62,
        # nvfp4 (16) 114 against 113)
        fc = float32.consts
        a3 = a.reshape(-1, M, K)
        if M % KB.QR:
            a3 = np.concatenate([a3, np.zeros((a3.shape[0], -M % KB.QR, K), np.int32)], 1)
        am, sta = KB.matmul_prepare_a(a3, fc)
        bpk, bmk, stb = KB.matmul_prepare_b(b.reshape(-1, K, N), fc, int(mp.c32), KB.NO_TABLE, 0)
        micro_kernel()(a3, am, sta, bpk, bmk, stb, ia, ib, out, fc,
                       SM.MulParams(SM.SUM, mp.c32, KB.NO_TABLE, 0), KB.float_consts(fc),
                       KB.NO_OFFSETS, sa3, sb3, kb, scaling, fc, m.params(float32))
        return out.reshape(tuple(batch) + (M, N))
    # BLOCKED_F32's B: packed for the pattern sum, with its zero mask (exact: b itself)
    bp = b if exact else (b.astype(np.int64) - ONE32 + int(mp.c32)).astype(np.int32)
    bm = b if exact else np.where(b & ABS32 != 0, np.int32(-1), np.int32(0))
    _pick(*(BLOCKED_F32[par] for par in (True, False)), out)(
        a.reshape(-1, M, K), bp.reshape(-1, K, N), bm.reshape(-1, K, N), sa3, sb3, ia, ib,
        out, kb, exact, scaling, float32.consts, m.params(float32))
    return out.reshape(tuple(batch) + (M, N))


def _normal_products(ua, ub, c32: int) -> bool:
    """Whether every pattern-sum product (constant ``c32``) of the non-zero magnitude
    patterns ``ua``, ``ub`` is a normal float32."""
    nz_a, nz_b = ua[ua > 0], ub[ub > 0]
    return not (nz_a.size and nz_b.size) or _normal_range(
        int(nz_a.min()), int(nz_a.max()), int(nz_b.min()), int(nz_b.max()), c32)


def _normal_range(lo_a: int, hi_a: int, lo_b: int, hi_b: int, c32: int) -> bool:
    """Whether the pattern sums (constant ``c32``) of magnitude patterns in [lo_a, hi_a]
    and [lo_b, hi_b] are normal float32s."""
    from ._scalar import ONE32
    return (lo_a + lo_b - ONE32 + c32 >= float32.consts.minnorm32
            and hi_a + hi_b - ONE32 + c32 <= float32.consts.max32)


def _prescaled(ea, eb, sa, sb, kb: int, c32: int):
    """The elements times their power-of-two block scales (int32 patterns), where that
    gives recipe_matmul's bits with the scales left out (or None).  Scaling normal
    operands by 2^e adds e to the exponent of their pattern sums, and, with every term a
    normal float32 (a multiple of 2^-149) and no partial sum overflowing in either
    domain, to the exponent of every rounded partial sum of a K-block (a sum below
    2^-126 is then exact), so each scaled block sum is ``RN(P s_a s_b)`` itself.  Needs:
    finite elements, every non-zero scaled element normal, every product normal in
    both domains, and K-block sums bounded by 2 kb max|a| max|b| < 2^127 in both (a
    pattern-sum product is at most twice the exact one)."""
    from ._kernels_recipes import prescale
    f32 = lambda x: np.ascontiguousarray(x, np.float32)                  # noqa: E731
    a, lo_a, hi_a, bad_a, elo_a, ehi_a = prescale(
        f32(ea).reshape((-1,) + ea.shape[-2:]), f32(sa).reshape((-1,) + sa.shape[-2:]), kb, True)
    b, lo_b, hi_b, bad_b, elo_b, ehi_b = prescale(
        f32(eb).reshape((-1,) + eb.shape[-2:]), f32(sb).reshape((-1,) + sb.shape[-2:]), kb, False)
    if bad_a.any() or bad_b.any():
        return None
    val = lambda u: float(np.int32(u).view(np.float32))                   # noqa: E731
    least = lambda x: int(x.min(initial=0x7FFFFFFF))                      # noqa: E731
    most = lambda x: int(x.max(initial=0))                                # noqa: E731
    for la, ha, lb, hb in ((least(lo_a), most(hi_a), least(lo_b), most(hi_b)),      # scaled
                           (least(elo_a), most(ehi_a), least(elo_b), most(ehi_b))):  # not
        if la > ha or lb > hb:      # an all-zero operand: no product
            continue
        if not _normal_range(la, ha, lb, hb, c32) or 2.0 * kb * val(ha) * val(hb) >= 2.0 ** 127:
            return None
    return a.reshape(ea.shape), b.reshape(eb.shape)


def _scale_fold(p, sa, sb, pow2: bool, acc: Format, m: Multiplier) -> np.ndarray:
    """Steps 2-3 of §10b on the partial products ``p`` (..., nb, M, N) with the block
    scales ``sa`` (..., nb, M|1) and ``sb`` (..., nb, N|1): each ``T_b`` (an exponent add
    for ``pow2`` scales, else ``mul(P, mul(s_a, s_b))`` in float32) folded over b in
    increasing order from +0 as ``RN_acc(C + T_b)``, one pass (emu/_kernels_recipes.py)."""
    from ._kernels_recipes import MUL, POW2, SCALE_FOLD
    from .host import _pick
    *batch, nb, M, N = p.shape
    t = int(np.prod(batch, dtype=np.int64))
    u32 = lambda x, shape: np.ascontiguousarray(                            # noqa: E731
        np.broadcast_to(x, tuple(batch) + shape), np.float32).reshape((t,) + shape) \
        .view(np.uint32)
    out = np.empty((t, M, N), np.uint32)
    _pick(*(SCALE_FOLD[par] for par in (True, False)), out)(
        u32(p, (nb, M, N)), u32(sa, (nb, M)), u32(sb, (nb, N)), out, POW2 if pow2 else MUL,
        float32.consts, acc.consts, m.params(float32), _EXACT.params(float32))
    return out.view(np.float32).reshape(tuple(batch) + (M, N))

"""The registry of RTL units: one :class:`Unit` entry per unit, and everything named
after units derives from it — ``rtl.make_unit``, the ``--unit`` choices of ``pamsim
verilog``, ``pamsim verify`` and ``pamsim fpga``, the simulator harnesses and cocotb
runs of sim.rtl_sim, costs.units and the parametrised tests.  Adding a unit is its
component, one entry here and its cocotb bench (CONTRIBUTING.md, "Adding an RTL unit").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import emu

from . import vectors as V
from .ieee import FloatAdder, FloatMultiplier
from .mac import PAMDotArray, PAMMac
from .multipliers import multiplier_unit, product_format
from .pa import LMulMultiplier, PADivider, PAMMultiplier, PASqrt

__all__ = ["Unit", "UNITS", "OPERANDS", "COMB_BENCH", "comb_units", "comb_kinds", "comb_operands"]

#: input ports of a combinational unit of each arity (output: ``y``)
OPERANDS = ("a", "b")
#: the cocotb bench of every combinational unit
COMB_BENCH = "sim.tb.test_comb"


@dataclass(frozen=True)
class Unit:
    """One RTL unit.

    ``name``: its ``--unit`` name.  ``cls``: the Amaranth component.  ``kind``:
    ``"comb"`` (combinational, ports ``OPERANDS[:arity]`` and ``y``, one result per
    operand set; ``cls.kind`` names its Verilog module ``{cls.kind}_{fmt}``) or
    ``"stream"`` (clocked, stream in/out, checked by matrix products).
    ``arity``: operands per result (comb) or per stream element.  ``golden``: comb only,
    the emu operation it equals, called ``golden(*operands, fmt)`` on values of ``fmt``.
    ``vectors``: comb only, its stress construction ``vectors(rng, fmt, n)`` -> ``arity``
    arrays of encodings (rtl/vectors.py).  ``bench``: the cocotb test module (sim/tb)
    that checks it against emu; every combinational unit has the generic one,
    :data:`COMB_BENCH`, driven by these entries.  ``options``: the keyword options
    :func:`rtl.make_unit` accepts beyond ``fmt``, with their defaults, passed to
    ``build`` (default: ``cls(fmt)``); a combinational unit's options reach ``golden``,
    ``vectors`` and ``out`` as keywords too.  ``out``: comb only, ``out(fmt, **options)``
    the format of ``y`` (default ``fmt``).
    """
    name: str
    cls: type
    description: str
    kind: str
    arity: int
    golden: Callable | None = None
    vectors: Callable | None = None
    bench: str | None = None
    options: dict = field(default_factory=dict)
    build: Callable | None = None
    out: Callable | None = None

    def __post_init__(self):
        if self.kind not in ("comb", "stream"):
            raise ValueError(f"unit {self.name!r}: kind={self.kind!r}; expected 'comb' or "
                             "'stream'")
        if self.kind == "comb" and (self.golden is None or self.vectors is None
                                    or self.arity not in range(1, len(OPERANDS) + 1)):
            raise ValueError(f"combinational unit {self.name!r} needs a golden model, a "
                             f"vector generator and an arity in 1..{len(OPERANDS)}")
        if self.kind == "comb" and self.bench is None:
            object.__setattr__(self, "bench", COMB_BENCH)
        if self.bench is None:
            raise ValueError(f"stream unit {self.name!r} needs its cocotb bench module")

    def make(self, fmt, **options):
        """The component for ``fmt``; ``options`` (a subset of :attr:`options`) override
        the defaults."""
        kw = {**self.options, **options}
        return (self.build or self.cls)(fmt, **kw)

    def out_format(self, fmt, **options) -> emu.Format:
        """The format of a combinational unit's ``y``."""
        return emu.format(fmt) if self.out is None else self.out(fmt, **{**self.options,
                                                                          **options})


def _mac(fmt, acc, stages, mul, mul_instance=None):
    return PAMMac(fmt, acc, stages, multiplier=mul, mul_instance=mul_instance)


def _array(fmt, rows, cols, acc, stages, mul, mul_instance=None):
    return PAMDotArray(rows, cols, fmt, acc, stages, multiplier=mul, mul_instance=mul_instance)


def _mul_golden(a, b, fmt, mul="pam"):
    return emu.mul(a, b, fmt, mul)


def _mul_vectors(rng, fmt, n, mul="pam"):
    if emu.multiplier(mul).kind in ("exact", "float"):
        return V.fmul_pairs(rng, fmt, n)
    return V.pam_boundary_pairs(rng, fmt, n, op="mul")


UNITS: dict[str, Unit] = {u.name: u for u in (
    Unit("mul", PAMMultiplier, "PAM multiplier, or with --mul any of emu's registry (pam+N, "
         "lmul-N, cpamK-*, exact, float, table:NAME) (combinational)",
         "comb", 2, _mul_golden, _mul_vectors, options={"mul": "pam"},
         build=multiplier_unit, out=product_format),
    Unit("lmul", LMulMultiplier, "L-Mul multiplier: PAM plus 2^-l(M) (combinational)", "comb",
         2, partial(emu.mul, mul="lmul"), partial(V.pam_boundary_pairs, op="mul")),
    Unit("div", PADivider, "PA divider (combinational)", "comb", 2,
         emu.pa_div, partial(V.pam_boundary_pairs, op="div")),
    Unit("sqrt", PASqrt, "PA square root (combinational)", "comb", 1,
         emu.pa_sqrt, V.sqrt_operands),
    Unit("add", FloatAdder, "IEEE adder, RNE, subnormals kept (combinational)", "comb", 2,
         emu.fp_add, V.add_pairs),
    Unit("fmul", FloatMultiplier, "IEEE multiplier, RNE, subnormals flushed (combinational)",
         "comb", 2, partial(emu.fp_mul, subnormals=False), V.fmul_pairs),
    Unit("mac", PAMMac, "pipelined multiply-accumulate, PAM or any mul= of emu's registry "
         "(stream in/out)",
         "stream", 2, bench="sim.tb.test_pam_mac",
         options={"acc": "float32", "stages": 2, "mul": "pam", "mul_instance": None},
         build=_mac),
    Unit("array", PAMDotArray, "rows x cols grid of MACs (PAM or any mul=) computing "
         "a tile of A.B", "stream", 2, bench="sim.tb.test_pam_dot_array",
         options={"rows": 4, "cols": 4, "acc": "float32", "stages": 2, "mul": "pam",
                  "mul_instance": None}, build=_array),
)}


def comb_units() -> tuple[str, ...]:
    """Names of the combinational units, in registry order."""
    return tuple(n for n, u in UNITS.items() if u.kind == "comb")


def comb_kinds(fmt) -> list[str]:
    """Vector kinds of a combinational bench: every operand set for 8-bit formats,
    else corners (all sets of special encodings), boundaries (the unit's stress
    construction) and uniform random encodings."""
    return ["exhaustive"] if emu.format(fmt).width <= 8 else ["corners", "boundaries", "random"]


_KINDS = ("exhaustive", "corners", "boundaries", "random")


def comb_operands(unit: str, fmt, kind: str, vectors: int = 100_000, seed: int = 0,
                  **options):
    """Operand encodings (``arity`` arrays) of ``kind`` for combinational ``unit``.

    ``vectors``: total of corners + boundaries + random; what the corners leave splits
    evenly between boundaries and random.  Random draws come from
    :func:`rtl.vectors.unit_rng`, so they depend on ``seed`` and the unit's name only.
    ``options``: the unit's own (``mul``), passed to its boundary construction.
    """
    u = UNITS[unit]
    f = emu.format(fmt)
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r}; expected one of {_KINDS}")
    if kind == "exhaustive":
        return V.exhaustive(f, u.arity)
    corners = V.corner_operands(f, u.arity)
    if kind == "corners":
        return corners
    rest = max(int(vectors) - corners[0].size, 2)
    rng = V.unit_rng(seed, unit, kind)
    if kind == "boundaries":
        return u.vectors(rng, f, rest // 2, **options)
    return V.random_operands(rng, f, rest - rest // 2, u.arity)

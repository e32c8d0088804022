"""RTL for every multiplier of emu's registry (docs/semantics.md §11, issue 24):
:func:`multiplier_unit` builds the combinational unit of ``emu.mul(a, b, fmt, mul)``,
:data:`MAC_MULTIPLIERS` says how :class:`~rtl.PAMMac` takes each kind.

* ``pam``, ``lmul`` and their offsets ``pam±N``/``lmul±N``, ``cpamK-*``: PAM's adder with
  the constant and the correction ROM (:class:`~rtl.pa.PatternSumMultiplier`);
* ``float``: :class:`~rtl.FloatMultiplier`; ``exact``: :class:`~rtl.ExactMultiplier`
  (rounded into ``fmt``), and in the MAC the fused step (:class:`~rtl.ExactProduct`,
  exact and normalised, into the accumulator's one rounding);
* ``table:NAME``: :class:`TableMultiplier`, a ROM of the 2^(2w) table entries in the
  table's result format (an imported Verilog multiplier can stand in for the ROM:
  :func:`imported_verilog`).
"""
from __future__ import annotations

import hashlib
import json
from typing import Callable, NamedTuple

import numpy as np
from amaranth.hdl import Cat, Instance, Module, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

import emu
import emu.multipliers as EM

from ._float import FloatLayout, WideFormat, Widen, as_format, wide_encodings, wide_format
from ._names import mul_slug
from .ieee import ExactMultiplier, ExactProduct, FloatAdder, FloatMultiplier
from .pa import LMulMultiplier, PAMMultiplier, PatternSumMultiplier

__all__ = ["TableMultiplier", "multiplier_unit", "mul_slug", "mul_module_name",
           "product_format", "MAC_MULTIPLIERS", "MacMultiplier", "imported_verilog",
           "imported_table", "check_rtl_multiplier"]


def check_rtl_multiplier(fmt, mul, argname: str = "mul") -> emu.Multiplier:
    """The registry multiplier ``mul`` if it has RTL in ``fmt``, else ValueError naming
    ``argname``: every kind has RTL; a cpam needs a table for ``fmt``'s mantissa width
    and a table multiplier an operand format of its own."""
    try:
        m = emu.multiplier(mul)
    except (ValueError, TypeError):
        raise ValueError(f"{argname}={mul!r}; expected a multiplier of emu's registry: "
                         f"{list(emu.MULTIPLIERS)}, pam/lmul with an offset ('pam+3'), "
                         "cpamK:T or table:NAME") from None
    f = as_format(fmt, "fmt")                  # a bad format is named as such first
    try:
        m.params(f)
    except ValueError as exc:
        raise ValueError(f"{argname}={str(m)!r} has no RTL for fmt={f.name}: {exc}") from None
    return m


def product_format(fmt, mul) -> emu.Format:
    """The format of the combinational unit's ``y``: ``fmt``, or a table's result
    format."""
    m = emu.multiplier(mul)
    return EM.table_of(m).out if m.kind == "table" else as_format(fmt, "fmt")


def mul_module_name(fmt, mul) -> str:
    """Verilog module name of ``multiplier_unit(fmt, mul)`` without building it (PAM,
    L-Mul and float keep theirs: ``pam_mul_``, ``lmul_``, ``fp_mul_``)."""
    m = emu.multiplier(mul)
    f = as_format(fmt, "fmt").name
    fixed = {"pam": "pam_mul", "lmul": "lmul", "float": "fp_mul"}
    return f"{fixed.get(str(m), mul_slug(m) + '_mul')}_{f}"


def imported_verilog(mul) -> dict | None:
    """For a table multiplier saved by ``pamsim multiplier import``: ``verilog`` (path),
    ``verilog_sha256`` and ``top`` from its saved metadata; None for other tables.
    ValueError if the file is gone or no longer has the stored SHA-256."""
    m = emu.multiplier(mul)
    if m.kind != "table":
        return None
    path = EM.table_dir() / f"{m.table}.npz"
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as z:
        info = json.loads(str(z["info"]))
    if "verilog" not in info:
        return None
    from pathlib import Path
    src = Path(info["verilog"])
    if not src.is_file():
        raise ValueError(f"mul={str(m)!r} was imported from {src}, which is gone")
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    if sha != info["verilog_sha256"]:
        raise ValueError(f"mul={str(m)!r}: {src} changed since its import (SHA-256 "
                         f"{sha[:12]}, imported {info['verilog_sha256'][:12]}); import it again")
    return {k: info[k] for k in ("verilog", "verilog_sha256", "top")}


class TableMultiplier(wiring.Component):
    """A table multiplier ``table:NAME`` (operands of at most 8 bits): ``y`` is the
    table's entry at ``(a, b)``, a ROM of 2^(2w) words addressed ``{a, b}``, in the
    table's result format ``out`` (``out_fmt`` overrides it with a
    :class:`~rtl._float.WideFormat` holding every entry as a normal number, the MAC's).
    Exactly ``emu.mul(a, b, fmt, mul)``.  ``registered``: a synchronous ROM (the
    output one clock later, block RAM on an FPGA), the MAC's product register.
    ``instance``: instantiate that Verilog module (ports a, b, y) instead of the ROM,
    e.g. the imported multiplier the table came from (synthesis only)."""

    def __init__(self, fmt, mul, *, out_fmt=None, registered: bool = False,
                 instance: str | None = None):
        self.fmt = as_format(fmt, "fmt")
        self.mul = check_rtl_multiplier(self.fmt, mul)
        if self.mul.kind != "table":
            raise ValueError(f"mul={str(self.mul)!r} is not a table multiplier")
        self.table = EM.table_of(self.mul)
        self.out_fmt = self.table.out if out_fmt is None else out_fmt
        if not isinstance(registered, bool):
            raise TypeError(f"registered={registered!r}: expected a bool")
        if instance is not None and (registered or not (
                out_fmt is None or isinstance(out_fmt, WideFormat))):
            raise ValueError("instance= is combinational, its results in the table's own "
                             "result format or widened (a WideFormat)")
        self.registered, self.instance = registered, instance
        self.kind = f"{mul_slug(self.mul)}_mul"
        super().__init__({"a": In(FloatLayout(self.fmt)), "b": In(FloatLayout(self.fmt)),
                          "y": Out(FloatLayout(self.out_fmt))})

    @property
    def module_name(self) -> str:
        return f"{self.kind}_{self.fmt.name}"

    def contents(self) -> np.ndarray:
        """The ROM words: the entries' encodings in ``out_fmt``, row ``a``."""
        v = self.table.values.reshape(-1)
        if isinstance(self.out_fmt, WideFormat):
            return wide_encodings(v, self.out_fmt)
        return emu.to_bits(v, self.out_fmt).astype(np.uint64)

    def elaborate(self, platform):
        m = Module()
        y = self.y.as_value()
        if self.instance is not None:
            raw = Signal(self.table.out.width)
            m.submodules.imported = Instance(self.instance, i_a=self.a.as_value(),
                                             i_b=self.b.as_value(), o_y=raw)
            if self.out_fmt is self.table.out:
                m.d.comb += y.eq(raw)
            else:                               # a widening stage (rtl._float.Widen)
                m.submodules.widen = widen = Widen(self.table.out, self.out_fmt)
                m.d.comb += [widen.a.as_value().eq(raw), y.eq(widen.y.as_value())]
            return m
        w = self.fmt.width
        m.submodules.rom = rom = Memory(shape=unsigned(self.out_fmt.width), depth=1 << (2 * w),
                                        init=[int(x) for x in self.contents()])
        port = rom.read_port(domain="sync" if self.registered else "comb")
        m.d.comb += [port.addr.eq(Cat(self.b.as_value(), self.a.as_value())), y.eq(port.data)]
        return m


def multiplier_unit(fmt, mul="pam"):
    """The combinational unit of ``emu.mul(a, b, fmt, mul)`` (ports ``a``, ``b``, ``y``;
    ``y`` in :func:`product_format`)."""
    m = check_rtl_multiplier(fmt, mul)
    if str(m) == "pam":
        return PAMMultiplier(fmt)
    if str(m) == "lmul":
        return LMulMultiplier(fmt)
    if m.kind in ("pam", "lmul", "cpam"):
        return PatternSumMultiplier(fmt, m)
    if m.kind == "float":
        return FloatMultiplier(fmt)
    if m.kind == "exact":
        return ExactMultiplier(fmt)
    return TableMultiplier(fmt, m)


class MacMultiplier(NamedTuple):
    """How the MAC takes a kind: ``build(in_fmt, mul, acc_fmt, registered)`` -> (the
    product unit, whether it registers its output itself, the accumulator adder)."""
    build: Callable
    description: str


def _plain(in_fmt, mul, acc, registered):
    # no such product is subnormal (PAM-style flush, float FTZ): b_daz is exact
    return (multiplier_unit(in_fmt, mul), False,
            FloatAdder(acc, b_fmt=in_fmt, b_daz=True))


def _fused(in_fmt, mul, acc, registered):
    p = ExactProduct(in_fmt)
    return p, False, FloatAdder(acc, b_fmt=p.out_fmt, b_daz=True)


def _table_adder(mul, acc):
    """``(wide, add)``: the accumulator's adder for a table's results, and the WideFormat
    they are widened into where it needs them normal (None: its own format, subnormals
    as they are)."""
    out = EM.table_of(mul).out
    if FloatAdder.takes_subnormal_b(acc, out):
        return None, FloatAdder(acc, b_fmt=out, b_daz=False)
    wide = wide_format(out.man_bits, out.emin - out.man_bits, out.emax)
    return wide, FloatAdder(acc, b_fmt=wide, b_daz=True)


def _table(in_fmt, mul, acc, registered):
    wide, add = _table_adder(mul, acc)              # the ROM holds widened results
    return TableMultiplier(in_fmt, mul, out_fmt=wide, registered=registered), registered, add


def imported_table(in_fmt, mul, acc, instance: str):
    """The MAC's product unit and adder for table multiplier ``mul`` computed by the
    Verilog module ``instance`` (ports a, b, y: the imported multiplier itself)."""
    wide, add = _table_adder(mul, acc)              # widened by a stage (rtl._float.Widen)
    return TableMultiplier(in_fmt, mul, out_fmt=wide, instance=instance), False, add


#: emu's multiplier kinds -> how PAMMac builds them.  Every registry kind has RTL.
MAC_MULTIPLIERS: dict[str, MacMultiplier] = {
    "pam": MacMultiplier(_plain, "PAM (pam±N: the constant in its adder)"),
    "lmul": MacMultiplier(_plain, "L-Mul, PAM plus 2^-l(M) (lmul±N)"),
    "cpam": MacMultiplier(_plain, "corrected PAM: the adder plus a 4^K-entry ROM"),
    "float": MacMultiplier(_plain, "IEEE multiplier, RNE, subnormals flushed"),
    "exact": MacMultiplier(_fused, "fused: the exact product, one rounding into acc"),
    "table": MacMultiplier(_table, "a ROM of the table (block RAM with stages >= 2)"),
}

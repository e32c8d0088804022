"""Pipelined multiply-accumulate and an output-stationary array of them, with PAM or
another multiplier of emu's registry (:data:`MAC_MULTIPLIERS`).

A dot product streamed through :class:`PAMMac` equals one entry of
``emu.matmul(A, B, fmt=in_fmt, acc=acc_fmt, mul=multiplier)`` bit for bit (with
``"pam"``, the default, ``emu.pam_matmul``): the products are ``emu.mul(a, b, in_fmt,
multiplier)`` and are added in stream order, from +0.0, by a :class:`~rtl.FloatAdder`
that rounds the exact sum of accumulator and product once into ``acc_fmt``
(docs/semantics.md §5 and "Multipliers"); ``exact`` is fused: the exact product, one
rounding.
"""
from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from emu.multipliers import multiplier as registry_multiplier

from ._float import FloatLayout, as_format
from .multipliers import MAC_MULTIPLIERS, check_rtl_multiplier, imported_table, mul_slug

__all__ = ["PAMMac", "PAMDotArray", "MAX_STAGES", "MAX_ARRAY_SIDE", "MAC_MULTIPLIERS",
           "check_stages", "check_side", "check_multiplier", "mac_module_name",
           "array_module_name"]

MAX_STAGES = 3
MAX_ARRAY_SIDE = 32


def check_multiplier(spec, fmt=None) -> str:
    """The registry name (``str(emu.multiplier(spec))``) of ``spec``, else ValueError
    naming ``multiplier=``; with ``fmt``, also that it has RTL in ``fmt`` (a cpam table
    for its mantissa width, a table of its operands).  Every kind of emu's registry has
    RTL (:data:`MAC_MULTIPLIERS`)."""
    try:
        m = registry_multiplier(spec)
    except (ValueError, TypeError):
        raise ValueError(f"multiplier={spec!r}; expected a multiplier of emu's registry: "
                         f"{list(PAMMac.MULTIPLIERS)}, pam/lmul with an offset ('pam+3'), "
                         "cpamK:T or table:NAME") from None
    if fmt is not None:
        check_rtl_multiplier(fmt, m, "multiplier")
    return str(m)


def _prefix(multiplier) -> str:
    return mul_slug(check_multiplier(multiplier))


def mac_module_name(in_fmt, acc_fmt, stages: int, multiplier: str = "pam") -> str:
    """Verilog module name of ``PAMMac(in_fmt, acc_fmt, stages, multiplier)`` (the
    simulator harness names modules without building them)."""
    return (f"{_prefix(multiplier)}_mac_{as_format(in_fmt, 'in_fmt').name}_"
            f"{as_format(acc_fmt, 'acc_fmt').name}_s{stages}")


def array_module_name(rows: int, cols: int, in_fmt, acc_fmt, stages: int,
                      multiplier: str = "pam") -> str:
    """Verilog module name of ``PAMDotArray(rows, cols, in_fmt, acc_fmt, stages,
    multiplier)``."""
    return (f"{_prefix(multiplier)}_dot_array_{rows}x{cols}_{as_format(in_fmt, 'in_fmt').name}"
            f"_{as_format(acc_fmt, 'acc_fmt').name}_s{stages}")


def check_stages(stages) -> int:
    """``stages`` if it is a pipeline depth the MAC supports, else ValueError (sim's
    harness checks its arguments with it too)."""
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= MAX_STAGES:
        raise ValueError(
            f"stages={stages!r}: expected an int in [1, {MAX_STAGES}] (1: multiply and "
            "accumulate in one cycle; 2: + a product register; 3: + an input register). "
            "The accumulation itself is a one-cycle loop: splitting it would need several "
            "interleaved partial sums, i.e. another summation order than emu.pam_matmul's")
    return stages


def check_side(name: str, v) -> int:
    """``v`` if it is an array side (``name``: rows or cols) the array supports."""
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_ARRAY_SIDE:
        raise ValueError(f"{name}={v!r}: expected an int in [1, {MAX_ARRAY_SIDE}]")
    return v


class PAMMac(wiring.Component):
    """Pipelined multiply-accumulate (PAM by default) with a stream interface.

    ``i_stream`` (always ready): payload ``a``, ``b`` (:class:`FloatLayout` of
    ``in_fmt``), ``first`` (start a new dot product: the accumulator is taken as
    +0.0 for this element) and ``last`` (passed through).  ``o_stream`` (no
    backpressure): for every accepted element, ``stages`` cycles later, ``result``
    is the accumulator after adding that element's product, with ``last`` copied.
    One element per cycle, back to back or with gaps.  After reset the accumulator
    is +0.0, as if ``first`` had been given.

    ``stages``: 1 = multiply and accumulate in one cycle; 2 = register the product
    (default); 3 = also register the inputs.

    ``multiplier``: any multiplier of emu's registry (a name, or an ``emu.Multiplier``;
    :data:`MAC_MULTIPLIERS`); the results are then ``emu.matmul(..., mul=multiplier)``'s.
    ``"pam"`` (default), ``"lmul"``, offsets and ``cpamK-*``: PAM's adder with the
    constant and correction ROM; ``"float"``: :class:`FloatMultiplier` (RNE, subnormals
    flushed), the float MAC costs/ compares against; ``"exact"``: fused, the exact
    product (:class:`~rtl.ExactProduct`) rounded once with the accumulator;
    ``"table:NAME"``: a ROM of the table (with ``stages >= 2`` read synchronously in
    place of the product register).  :attr:`multiplier` is the registry name.
    """

    #: the named multipliers (emu.MULTIPLIERS); offsets, cpamK:T and tables work too
    MULTIPLIERS = ("pam", "lmul", "float", "exact", "cpam1-unbiased", "cpam2-minimax",
                   "pam+N", "lmul-N", "table:NAME")

    def __init__(self, in_fmt, acc_fmt="float32", stages: int = 2, multiplier="pam", *,
                 mul_instance: str | None = None):
        self.in_fmt = as_format(in_fmt, "in_fmt")
        self.acc_fmt = as_format(acc_fmt, "acc_fmt")
        self.stages = check_stages(stages)
        self.multiplier = check_multiplier(multiplier, self.in_fmt)
        # an imported table multiplier's own Verilog module in place of the ROM
        # (costs/units.py adds its file to the design)
        if mul_instance is not None and not self.multiplier.startswith("table:"):
            raise ValueError(f"mul_instance={mul_instance!r} needs a table multiplier, not "
                             f"{self.multiplier!r}")
        self.mul_instance = mul_instance
        in_layout = data.StructLayout({"a": FloatLayout(self.in_fmt), "b": FloatLayout(self.in_fmt),
                                       "first": 1, "last": 1})
        out_layout = data.StructLayout({"result": FloatLayout(self.acc_fmt), "last": 1})
        super().__init__({"i_stream": In(stream.Signature(in_layout, always_ready=True)),
                          "o_stream": Out(stream.Signature(out_layout, always_ready=True))})

    @property
    def module_name(self) -> str:
        return mac_module_name(self.in_fmt, self.acc_fmt, self.stages, self.multiplier)

    def elaborate(self, platform):
        m = Module()
        mul = registry_multiplier(self.multiplier)
        if self.mul_instance is not None:
            mul, registered, add = imported_table(self.in_fmt, mul, self.acc_fmt,
                                                  self.mul_instance)
        else:
            mul, registered, add = MAC_MULTIPLIERS[mul.kind].build(
                self.in_fmt, mul, self.acc_fmt, self.stages >= 2)
        m.submodules.mul, m.submodules.add = mul, add
        valid, pay = self.i_stream.valid, self.i_stream.payload
        if self.stages >= 3:                               # input register
            valid_r, pay_r = Signal(), Signal.like(pay)
            m.d.sync += [valid_r.eq(valid), pay_r.eq(pay)]
            valid, pay = valid_r, pay_r
        m.d.comb += [mul.a.eq(pay.a), mul.b.eq(pay.b)]
        prod, first, last = mul.y, pay.first, pay.last
        if self.stages >= 2:                               # product register
            valid_p, prod_p = Signal(), Signal.like(mul.y)
            first_p, last_p = Signal(), Signal()
            m.d.sync += [valid_p.eq(valid), first_p.eq(first), last_p.eq(last)]
            if registered:                                 # a synchronous ROM is the register
                prod_p = mul.y
            else:
                m.d.sync += prod_p.eq(mul.y)
            valid, prod, first, last = valid_p, prod_p, first_p, last_p
        acc = self.o_stream.payload.result                 # the accumulator register
        m.d.comb += [add.a.eq(Mux(first, 0, acc.as_value())), add.b.eq(prod)]
        with m.If(valid):
            m.d.sync += [acc.eq(add.y), self.o_stream.payload.last.eq(last)]
        m.d.sync += self.o_stream.valid.eq(valid)
        return m


class PAMDotArray(wiring.Component):
    """A ``rows x cols`` tile of C = A·B from a grid of :class:`PAMMac`s (PAM by default).

    Output-stationary with broadcast operands: each cycle ``i_stream`` carries one
    column ``a`` (``rows`` values) of A and one row ``b`` (``cols`` values) of B for
    the same k; MAC (i, j) accumulates ``a[i] ·̂ b[j]``.  ``first``/``last`` delimit a
    tile's k range as for :class:`PAMMac`, and ``o_stream.payload.c[i][j]`` follows
    each accepted column ``stages`` cycles later; at ``last`` it is the tile of
    ``emu.matmul(A, B, in_fmt, acc_fmt, mul=multiplier)`` (``multiplier`` as for
    :class:`PAMMac`; default ``"pam"``: ``emu.pam_matmul``).  A systolic version would
    pass operands between neighbours to shorten the broadcast nets of large arrays;
    the sums, and so the results, would be the same.
    """

    def __init__(self, rows: int, cols: int, in_fmt, acc_fmt="float32", stages: int = 2,
                 multiplier="pam", *, mul_instance: str | None = None):
        self.rows, self.cols = check_side("rows", rows), check_side("cols", cols)
        self.in_fmt = as_format(in_fmt, "in_fmt")
        self.acc_fmt = as_format(acc_fmt, "acc_fmt")
        self.stages = check_stages(stages)
        self.multiplier = check_multiplier(multiplier, self.in_fmt)
        self.mul_instance = mul_instance                   # as PAMMac's
        fin, facc = FloatLayout(self.in_fmt), FloatLayout(self.acc_fmt)
        in_layout = data.StructLayout({"a": data.ArrayLayout(fin, rows),
                                       "b": data.ArrayLayout(fin, cols),
                                       "first": 1, "last": 1})
        out_layout = data.StructLayout({"c": data.ArrayLayout(data.ArrayLayout(facc, cols), rows),
                                        "last": 1})
        super().__init__({"i_stream": In(stream.Signature(in_layout, always_ready=True)),
                          "o_stream": Out(stream.Signature(out_layout, always_ready=True))})

    @property
    def module_name(self) -> str:
        return array_module_name(self.rows, self.cols, self.in_fmt, self.acc_fmt, self.stages,
                                 self.multiplier)

    def elaborate(self, platform):
        m = Module()
        pay = self.i_stream.payload
        for i in range(self.rows):
            for j in range(self.cols):
                mac = PAMMac(self.in_fmt, self.acc_fmt, self.stages, self.multiplier,
                             mul_instance=self.mul_instance)
                m.submodules[f"mac_{i}_{j}"] = mac
                m.d.comb += [mac.i_stream.valid.eq(self.i_stream.valid),
                             mac.i_stream.payload.a.eq(pay.a[i]),
                             mac.i_stream.payload.b.eq(pay.b[j]),
                             mac.i_stream.payload.first.eq(pay.first),
                             mac.i_stream.payload.last.eq(pay.last),
                             self.o_stream.payload.c[i][j].eq(mac.o_stream.payload.result)]
                if i == 0 and j == 0:
                    m.d.comb += [self.o_stream.valid.eq(mac.o_stream.valid),
                                 self.o_stream.payload.last.eq(mac.o_stream.payload.last)]
        return m

"""Build units by name and emit synthesizable Verilog (``pamsim verilog``)."""
from __future__ import annotations

from amaranth.back import verilog as _verilog
from amaranth.hdl import Const

from ._float import as_format
from .ieee import FloatAdder, FloatMultiplier
from .mac import PAMDotArray, PAMMac
from .pa import PADivider, PAMMultiplier

__all__ = ["UNITS", "make_unit", "verilog"]

#: CLI name -> (class, one-line description)
UNITS = {
    "mul": (PAMMultiplier, "PAM multiplier (combinational)"),
    "div": (PADivider, "PA divider (combinational)"),
    "add": (FloatAdder, "IEEE adder, RNE, subnormals kept (combinational)"),
    "fmul": (FloatMultiplier, "IEEE multiplier, RNE, subnormals flushed (combinational)"),
    "mac": (PAMMac, "pipelined PAM multiply-accumulate (stream in/out)"),
    "array": (PAMDotArray, "rows x cols grid of PAM MACs computing a tile of A.B"),
}


def make_unit(unit: str, fmt, *, acc=None, stages=None, rows=None, cols=None):
    """The component named ``unit`` (a key of :data:`UNITS`) for format ``fmt``.

    ``acc`` (accumulation format, default float32), ``stages`` (default 2) apply to
    ``mac`` and ``array``; ``rows``/``cols`` (default 4) to ``array`` only.
    Options that do not apply to ``unit`` are rejected, not ignored.
    """
    if unit not in UNITS:
        raise ValueError(f"unit={unit!r}: expected one of {sorted(UNITS)}")
    fmt = as_format(fmt, "fmt")
    given = {k for k, v in (("acc", acc), ("stages", stages), ("rows", rows), ("cols", cols))
             if v is not None}
    allowed = {"mac": {"acc", "stages"}, "array": {"acc", "stages", "rows", "cols"}}.get(unit, set())
    if given - allowed:
        raise ValueError(f"unit={unit!r} takes no {'/'.join(sorted(given - allowed))} option; "
                         f"{'it takes ' + '/'.join(sorted(allowed)) if allowed else 'only fmt'}")
    if unit == "mac":
        return PAMMac(fmt, "float32" if acc is None else acc, 2 if stages is None else stages)
    if unit == "array":
        return PAMDotArray(4 if rows is None else rows, 4 if cols is None else cols, fmt,
                           "float32" if acc is None else acc, 2 if stages is None else stages)
    return UNITS[unit][0](fmt)


def verilog(component, name: str | None = None) -> str:
    """Synthesizable Verilog of a unit (``module <name>``, default ``component.module_name``).

    Ports are the component's signature members with ``__`` joining paths (e.g.
    ``i_stream__payload``); clocked units add ``clk`` and ``rst`` (synchronous,
    active high).  Struct fields appear as named wires (``\\a.exp``) for debugging.
    """
    name = component.module_name if name is None else name
    if not isinstance(name, str) or not (name.isascii() and name.isidentifier()):
        raise ValueError(f"name={name!r} is not a Verilog identifier; expected ASCII "
                         "letters, digits and '_', not starting with a digit")
    # always-ready streams have a constant ``ready``, which is not a port
    ports = [v.as_value() if hasattr(v, "as_value") else v
             for _, _, v in component.signature.flatten(component)]
    ports = [p for p in ports if not isinstance(p, Const)]
    return _verilog.convert(component, name=name, ports=ports, emit_src=False)

"""Build units by name (rtl/registry.py) and emit synthesizable Verilog (``pamsim verilog``)."""
from __future__ import annotations

from amaranth.back import rtlil as _rtlil
from amaranth.back import verilog as _verilog
from amaranth.hdl import Const

from ._float import as_format
from .registry import UNITS

__all__ = ["make_unit", "rtlil", "verilog"]


def make_unit(unit: str, fmt, **options):
    """The component named ``unit`` (a key of :data:`rtl.UNITS`) for format ``fmt``.

    ``options`` are the unit's registry options (``mac``: ``acc``, default float32, and
    ``stages``, default 2; ``array``: also ``rows``/``cols``, default 4); ``None``
    means the default.  Options that do not apply to ``unit`` are rejected, not ignored.
    """
    if unit not in UNITS:
        raise ValueError(f"unit={unit!r}: expected one of {sorted(UNITS)}")
    fmt = as_format(fmt, "fmt")
    u = UNITS[unit]
    given = {k: v for k, v in options.items() if v is not None}
    extra = sorted(set(given) - set(u.options))
    if extra:
        allowed = "/".join(sorted(u.options))
        raise ValueError(f"unit={unit!r} takes no {'/'.join(extra)} option; "
                         f"{'it takes ' + allowed if allowed else 'only fmt'}")
    return u.make(fmt, **given)


def verilog(component, name: str | None = None) -> str:
    """Synthesizable Verilog of a unit (``module <name>``, default ``component.module_name``).

    Ports are the component's signature members with ``__`` joining paths (e.g.
    ``i_stream__payload``); clocked units add ``clk`` and ``rst`` (synchronous,
    active high).  Struct fields appear as named wires (``\\a.exp``) for debugging.
    """
    name, ports = _top(component, name)
    return _verilog.convert(component, name=name, ports=ports, emit_src=False)


def rtlil(component, name: str | None = None) -> str:
    """The unit of :func:`verilog` as RTLIL text, for synthesis: a ROM's contents are one
    ``$meminit`` cell, which yosys maps in seconds, where the Verilog's 65,536 ``initial``
    assignments of a 2^16-entry table kept it busy past 9 minutes."""
    name, ports = _top(component, name)
    return _rtlil.convert(component, name=name, ports=ports, emit_src=False)


def _top(component, name):
    """The module name (checked) and ports of a unit."""
    name = component.module_name if name is None else name
    if not isinstance(name, str) or not (name.isascii() and name.isidentifier()):
        raise ValueError(f"name={name!r} is not a Verilog identifier; expected ASCII "
                         "letters, digits and '_', not starting with a digit")
    # always-ready streams have a constant ``ready``, which is not a port
    ports = [v.as_value() if hasattr(v, "as_value") else v
             for _, _, v in component.signature.flatten(component)]
    return name, [p for p in ports if not isinstance(p, Const)]

"""Verilog identifiers of emu's registry multipliers (shared by the units and the MAC)."""
from __future__ import annotations

import hashlib
import re

import emu


def mul_slug(mul) -> str:
    """A Verilog-identifier form of a multiplier's name: ``pam``, ``lmul``, ``fp``
    (float), ``exact``, ``pam_p3``, ``lmul_m1``, ``cpam2_unbiased``, ``table_NAME``;
    names given as data (``cpamK:...``, table paths) get a hash."""
    m = emu.multiplier(mul)
    if m.kind == "float":
        return "fp"
    if m.kind in ("pam", "lmul", "exact"):
        return m.kind + (f"_{'p' if m.offset > 0 else 'm'}{abs(m.offset)}" if m.offset else "")
    if m.kind == "cpam" and isinstance(m.table, str):
        return f"cpam{m.k}_{m.table}"
    digest = hashlib.sha256(str(m).encode()).hexdigest()[:8]
    if m.kind == "cpam":
        return f"cpam{m.k}_t{digest}"
    name = re.sub(r"\W", "_", m.table)
    return f"table_{name}" if name == m.table else f"table_{name[-24:]}_{digest}"

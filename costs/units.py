"""The rtl/ units by name, their synthesis, and the PAM-vs-float sweep (``pamsim fpga``).

Units are built by ``rtl.make_unit`` and emitted by ``rtl.verilog`` (issue 3's Python
API); ``rtl`` is imported only when a unit is needed, so costs/ works without it.
Names are those of rtl's registry (``rtl.UNITS``, as ``pamsim verilog --unit``), plus
the :data:`BASELINES` costs/ adds: ``fmac``, the same MAC with the IEEE multiplier, the
float baseline of ``mac`` (:func:`float_mac`: ``rtl.PAMMac(..., multiplier="float")``).
"""
from __future__ import annotations

import emu

from .fpga import TARGETS, Design, SynthResult, _check_target, fit, synthesize

__all__ = ["BASELINES", "catalog", "unit_design", "synthesize_unit", "sweep", "SWEEP_UNITS",
           "SWEEP_FORMATS", "FMAX_TARGETS", "compare", "float_mac"]

#: units costs/ adds to rtl's registry: float baselines that are no rtl unit of their own
BASELINES = {
    "fmac": "pipelined float multiply-accumulate (rtl.PAMMac with the IEEE multiplier)",
}
SWEEP_UNITS = ("mul", "fmul", "add", "mac", "fmac")
# smallest first, so a cut-short sweep has the cheap formats complete
SWEEP_FORMATS = ("float8_e4m3fn", "bfloat16", "float16", "float32")
#: Targets the sweep places and routes for Fmax (bounds its time; nextpnr has no
#: Xilinx 7-series flow here).
FMAX_TARGETS = ("ecp5",)


def _rtl():
    """rtl/, imported on use (amaranth is part of the rtl extra)."""
    try:
        import rtl
    except ImportError as exc:                                    # pragma: no cover
        raise RuntimeError("the rtl package is needed to build units: install pamsim's "
                           "rtl extra (amaranth)") from exc
    return rtl


def catalog() -> dict[str, str]:
    """Every unit name costs/ synthesizes -> its description: rtl's registry
    (``rtl.UNITS``, class named) and :data:`BASELINES`."""
    return {**{n: f"{u.description}, rtl.{u.cls.__name__}" for n, u in _rtl().UNITS.items()},
            **BASELINES}


def _check_unit(unit: str) -> str:
    names = catalog()
    if unit not in names:
        raise ValueError(f"unit={unit!r}; expected one of {list(names)}")
    return unit


#: a table multiplier alone is a combinational ROM: synthesized in LUTs up to 2^12 words
#: (fp6 operands), refused above (e4m3: 2^16 words, ~1 Mbit)
ROM_LUT_MAX_BITS = 12


def unit_design(unit: str, fmt, *, acc=None, stages=None, rows=None, cols=None,
                mul=None) -> Design:
    """The Verilog :class:`~costs.fpga.Design` of a unit, built and emitted by rtl/
    (RTLIL where it holds a table multiplier's ROM: rtl.rtlil).

    ``mul`` (units ``mul``, ``mac``, ``array``): a multiplier of emu's registry.  A table
    multiplier imported from Verilog (``pamsim multiplier import``) is that Verilog file
    as given (found by the path and SHA-256 its import stored): alone for ``mul``,
    instantiated in place of the ROM in ``mac``/``array``."""
    _check_unit(unit)
    fmt = emu.format(fmt)
    rtl = _rtl()
    if unit == "fmac":
        if rows is not None or cols is not None or mul is not None:
            raise ValueError("unit='fmac' takes no rows/cols/mul option")
        comp = float_mac(fmt, "float32" if acc is None else acc, 2 if stages is None else stages)
        return Design.from_verilog(rtl.verilog(comp, comp.module_name), comp.module_name)
    from rtl.multipliers import imported_verilog
    src = None
    if mul is not None and unit in ("mul", "mac", "array"):
        rtl.multipliers.check_rtl_multiplier(fmt, mul)
        src = imported_verilog(mul)
    if src is not None:
        from pathlib import Path
        text = Path(src["verilog"]).read_text()
        if unit == "mul":
            return Design.from_verilog(text, src["top"])
        comp = rtl.make_unit(unit, fmt, acc=acc, stages=stages, rows=rows, cols=cols, mul=mul,
                             mul_instance=src["top"])
        return Design.from_verilog(rtl.verilog(comp, comp.module_name) + "\n" + text,
                                   comp.module_name)
    rom = mul is not None and str(mul).startswith("table:")
    if rom and unit == "mul" and 2 * fmt.width > ROM_LUT_MAX_BITS:
        raise ValueError(f"unit='mul' of mul={mul!r} is a combinational ROM of "
                         f"2^{2 * fmt.width} words, which FPGA block RAM cannot read (and LUTs "
                         "would not hold); synthesize unit='mac', whose synchronous ROM is "
                         "block RAM")
    comp = rtl.make_unit(unit, fmt, acc=acc, stages=stages, rows=rows, cols=cols, mul=mul)
    if rom:                             # the table's ROM: RTLIL (rtl.rtlil)
        return Design(rtl.rtlil(comp, comp.module_name), comp.module_name, "rtlil")
    return Design.from_verilog(rtl.verilog(comp, comp.module_name), comp.module_name)


def float_mac(in_fmt, acc_fmt="float32", stages: int = 2):
    """The float baseline of ``rtl.PAMMac``: the same component (stream interface,
    pipeline, ``FloatAdder`` accumulator) with ``rtl.FloatMultiplier`` (RNE, subnormals
    flushed) in place of the PAM multiplier, i.e. mixed-precision float MAC hardware."""
    return _rtl().PAMMac(emu.format(in_fmt), emu.format(acc_fmt, argname="acc"), stages,
                         multiplier="float")


def synthesize_unit(unit: str, fmt, target: str = "ecp5", *, acc=None, stages=None,
                    rows=None, cols=None, mul=None, **kwargs) -> SynthResult:
    """:func:`costs.fpga.synthesize` of a named unit (kwargs: device, dsp, pnr, ...)."""
    _check_target(target)               # before the design is built
    return synthesize(unit_design(unit, fmt, acc=acc, stages=stages, rows=rows, cols=cols,
                                  mul=mul), target, **kwargs)


def sweep(units=SWEEP_UNITS, fmts=SWEEP_FORMATS, targets=TARGETS, *, acc="float32",
          dsp: bool = True, fmax_targets=FMAX_TARGETS, jobs: int = 1,
          progress: bool = True) -> list[dict]:
    """Synthesize every (unit, format, target), placing and routing for Fmax on
    ``fmax_targets``; one row per result (see ``summary_row``), ``jobs`` tool runs at a
    time.  A unit that cannot be synthesized/placed gets a row with ``error`` instead.
    """
    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    from .fpga import summary_row
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")
    acc = emu.format(acc, argname="acc")
    jobs_list = [(_check_unit(u), emu.format(f), _check_target(t))
                 for f in fmts for u in units for t in targets]

    def one(job):
        unit, fmt, target = job
        mac = unit in ("mac", "fmac")
        label = f"{unit} {fmt.name}" + (f"->{acc.name}" if mac else "")
        try:
            r = synthesize_unit(unit, fmt, target, dsp=dsp, pnr=target in fmax_targets,
                                **({"acc": acc} if mac else {}))
        except RuntimeError as exc:             # tool failures
            return {"unit": label, "kind": unit, "fmt": fmt.name, "target": target,
                    "error": str(exc).splitlines()[0]}
        return dict(summary_row(label, r), kind=unit, fmt=fmt.name, result=r)

    with ThreadPoolExecutor(jobs) as pool:      # the work is in yosys/nextpnr processes
        return list(tqdm(pool.map(one, jobs_list), total=len(jobs_list), desc="synthesis",
                         disable=not progress))


def compare(rows: list[dict]) -> list[dict]:
    """PAM against float, per (format, target): multiplier resources, and MACs per device
    and peak MAC/s.  Without a measured ``fmac`` the float MAC is estimated by
    substitution: resources of ``mac`` - ``mul`` + ``fmul`` (same pipeline and adder),
    fitted to the device; its Fmax is then unknown."""
    by = {(r["kind"], r["fmt"], r["target"]): r for r in rows if "error" not in r}
    out = []
    for (kind, fmt, target), pam in sorted(by.items()):
        if kind != "mul" or ("fmul", fmt, target) not in by:
            continue
        fm = by["fmul", fmt, target]
        row = {"fmt": fmt, "target": target,
               "mul_logic": pam["logic"], "fmul_logic": fm["logic"], "fmul_dsps": fm["dsps"],
               "mul_fmax": pam["fmax_mhz"], "fmul_fmax": fm["fmax_mhz"]}
        mac = by.get(("mac", fmt, target))
        if mac is not None:
            row.update(mac_fit=mac["fit"], mac_limit=mac["limit"], mac_gops=mac["peak_gops"])
            fmac = by.get(("fmac", fmt, target))
            if fmac is not None:
                row.update(fmac_fit=fmac["fit"], fmac_limit=fmac["limit"],
                           fmac_gops=fmac["peak_gops"], fmac_source="measured")
            else:
                est = _substitute(mac["result"], pam["result"], fm["result"])
                row.update(fmac_fit=est.count, fmac_limit=est.limit, fmac_gops=None,
                           fmac_source="estimated: mac - mul + fmul")
        out.append(row)
    return out


def _substitute(mac: SynthResult, mul: SynthResult, fmul: SynthResult):
    """Device fit of a MAC whose PAM multiplier is replaced by the float multiplier."""
    import copy
    est = copy.deepcopy(mac)
    for field in ("luts", "carry", "ffs", "dsps", "brams", "muxes", "lutram", "logic"):
        setattr(est.resources, field, getattr(mac.resources, field)
                - getattr(mul.resources, field) + getattr(fmul.resources, field))
    est.fmax_mhz = None
    return fit(est)

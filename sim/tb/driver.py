"""cocotb side of the slot harnesses (sim/rtl_sim.py): packing, drivers, reports.

A harness port holds ``slots`` values, slot 0 in the least significant bits; a
stream payload is the unit's struct (first field lowest).  Values cross the VPI as
binary strings built and parsed with numpy, one string per port and step.  A step
writes every slot, waits ``slots`` clock cycles in the simulator (one ``await``) and
reads every captured output.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import Timer

import emu
from rtl import registry
from rtl import vectors as V
from sim.rtl_sim import CLOCK_NS, Harness

__all__ = ["harness", "params", "job_path", "write_report", "pack", "unpack", "same_encoding",
           "comb_units", "comb_kinds", "comb_vectors", "CombTB", "StreamTB", "ElementStream",
           "prefix_sums", "dot_results"]


_CHUNK = 64       # steps packed at a time (bounds numpy's temporaries)


def harness() -> Harness:
    return Harness.from_json(os.environ["PAMSIM_HARNESS"])


def params() -> dict:
    return json.loads(os.environ.get("PAMSIM_PARAMS") or "{}")


def job_path() -> str | None:
    return os.environ.get("PAMSIM_JOB") or None


def write_report(entry: dict) -> None:
    """Append one test's numbers to the run's report (read by sim.rtl_sim.run_cocotb)."""
    path = os.environ.get("PAMSIM_REPORT")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(entry) + "\n")


def pack(fields, slots: int) -> list[str]:
    """Binary strings, one per step, of ``fields`` = [(values, width), ...]; each
    ``values`` is flat (steps * slots), slot-major within a step."""
    parts = []
    for values, width in fields:
        v = np.asarray(values, np.uint64).reshape(-1, slots)
        parts.append(((v[..., None] >> np.arange(width, dtype=np.uint64)) & 1).astype(np.uint8))
    bits = np.concatenate(parts, axis=2).reshape(parts[0].shape[0], -1)[:, ::-1]
    rows = (bits + ord("0")).tobytes()
    n = bits.shape[1]
    return [rows[i * n:(i + 1) * n].decode() for i in range(bits.shape[0])]


def unpack(strings: list[str], widths: list[int], slots: int) -> list[np.ndarray]:
    """Inverse of :func:`pack`: one flat uint64 array per field width.

    X or Z bits (an undriven or uninitialised output) raise ``AssertionError``."""
    n = slots * sum(widths)
    raw = np.frombuffer("".join(strings).encode(), np.uint8).reshape(len(strings), n)
    bits = raw[:, ::-1] - ord("0")
    if (bits > 1).any():
        step, pos = np.argwhere(bits > 1)[0]
        raise AssertionError(f"output bit {pos} is {chr(raw[step, n - 1 - pos])} at step {step}")
    bits = bits.reshape(len(strings) * slots, -1)
    out, off = [], 0
    for w in widths:
        weights = np.uint64(1) << np.arange(w, dtype=np.uint64)
        out.append((bits[:, off:off + w].astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64))
        off += w
    return out


def same_encoding(got, want, fmt) -> np.ndarray:
    """Equal encodings, or both NaN (NaNs compare by class)."""
    got, want = np.asarray(got, np.uint64), np.asarray(want, np.uint64)
    return (got == want) | (V.nan_mask(got, fmt) & V.nan_mask(want, fmt))


def comb_units() -> list[str]:
    """Combinational units a run checks: parameter ``units``, else every unit of the
    harness."""
    spec = os.environ.get("PAMSIM_HARNESS")
    if not spec:                                      # imported outside a simulation
        return []
    return list(params().get("units") or Harness.from_json(spec).units)


def comb_kinds() -> list[str]:
    """Vector kinds of a combinational bench for the harness's format
    (rtl.registry.comb_kinds)."""
    spec = os.environ.get("PAMSIM_HARNESS")
    if not spec:                                      # imported outside a simulation
        return []
    return registry.comb_kinds(Harness.from_json(spec).fmt)


def comb_vectors(unit: str, kind: str):
    """Operand encodings of ``kind`` for ``unit`` (rtl.registry.comb_operands).
    Parameters: ``vectors`` (total of corners + boundaries + random, default 100,000),
    ``seed``."""
    p = params()
    h = harness()
    return registry.comb_operands(unit, h.fmt, kind, int(p.get("vectors", 100_000)),
                                  int(p.get("seed", 0)), **h.unit_options(unit))


def _examples(mask, *columns):
    bad = np.flatnonzero(~mask)[:8]
    return [" ".join(f"{name}={int(col[i]):#x}" for name, col in columns) for i in bad]


class _SlotTB:
    """Clock and stepping shared by the benches.

    :meth:`start` starts the clock low and raises ``restart`` for its first rising
    edge (at 1 ns), which sets the harness's slot counter to 0; steps then begin
    half a cycle after a rising edge, in the high phase, so no write coincides with
    an edge, and each step of ``slots`` cycles holds exactly ``slots`` rising edges.
    """

    unit = None                                      # the combinational unit clocked

    def __init__(self, dut):
        self.dut = dut
        self.h = harness()
        self.slots = self.h.slots

    async def start(self):
        for u in self.h.units:                       # clock only the unit under test
            getattr(self.dut, f"{u}_en").value = int(u == self.unit)
        self.dut.restart.value = 1
        Clock(self.dut.clk, CLOCK_NS, unit="ns").start(start_high=False)
        await Timer(CLOCK_NS * 750, "ps")
        self.dut.restart.value = 0

    async def step(self):
        await Timer(CLOCK_NS * self.h.cycles, "ns")


class CombTB(_SlotTB):
    """Combinational unit ``unit`` of the harness (ports ``<unit>_<operand>`` for its
    operands ``a`` [, ``b``] and ``<unit>_y``): each step applies and captures
    ``slots`` operand sets."""

    def __init__(self, dut, unit: str):
        super().__init__(dut)
        self.unit = unit
        self.fmt = emu.format(self.h.fmt)
        self.options = self.h.unit_options(unit)           # the mul unit's multiplier
        self.out_fmt = registry.UNITS[unit].out_format(self.fmt, **self.options)
        self.operands = registry.OPERANDS[:registry.UNITS[self.unit].arity]
        self.ports_in = [[getattr(dut, p) for p in self.h.lane_ports(f"{self.unit}_{o}")]
                         for o in self.operands]
        self.ports_y = [getattr(dut, p) for p in self.h.lane_ports(f"{self.unit}_y")]

    def golden(self, *operands):
        """Expected output encodings for operand encodings ``operands``: the unit's
        registry golden model (rtl.UNITS) on their values; for the float32 adder,
        numpy's float32 ``+`` (IEEE binary32, a reference independent of emu)."""
        f = self.fmt
        if self.unit == "add" and f == emu.float32:
            a, b = operands
            with np.errstate(all="ignore"):
                return (a.view(np.float32) + b.view(np.float32)).view(np.uint32)
        op = registry.UNITS[self.unit].golden
        return emu.to_bits(op(*(emu.from_bits(x, f) for x in operands), f, **self.options),
                           self.out_fmt)

    async def apply(self, *operands) -> np.ndarray:
        """Outputs for operand encodings ``operands``: each step fills every slot of
        every lane (lane l takes slots l*C .. l*C + C-1 of the step)."""
        n, N, C, K, w = len(operands[0]), self.slots, self.h.cycles, self.h.lanes, self.fmt.width
        steps = -(-n // N)
        pad = np.zeros(steps * N - n, np.uint32)
        operands = [np.concatenate([x, pad]) for x in operands]
        out = []
        for s0 in range(0, steps, _CHUNK):
            lo, hi = s0 * N, (s0 + _CHUNK) * N
            # one string per (step, lane): pack treats a lane's C slots as one row
            strings = [pack([(x[lo:hi], w)], C) for x in operands]
            for s in range(len(strings[0]) // K):
                for ports, st in zip(self.ports_in, strings):
                    for lane in range(K):
                        ports[lane].value = st[s * K + lane]
                await self.step()
                out += [str(p.value) for p in self.ports_y]
        return unpack(out, [self.out_fmt.width], C)[0][:n]

    async def check(self, kind: str, *operands) -> None:
        """Apply ``operands``, compare every output with :meth:`golden`, report, assert."""
        operands = [np.asarray(x, np.uint32) for x in operands]
        await self.start()
        t0 = time.perf_counter()
        got = await self.apply(*operands)
        t1 = time.perf_counter()
        want = self.golden(*operands)
        ok = same_encoding(got, want, self.out_fmt)
        t2 = time.perf_counter()
        n = int(operands[0].size)
        tag = "".join(f"-{v}" for v in self.options.values() if v != "pam")
        entry = {"test": f"{self.unit}{tag}-{self.fmt.name}-{kind}", "unit": self.unit,
                 **self.options, "fmt": self.fmt.name, "kind": kind, "vectors": n,
                 "mismatches": int((~ok).sum()), "seconds": t2 - t0, "sim_seconds": t1 - t0,
                 "slots": self.slots,
                 "examples": _examples(ok, *zip(self.operands, operands), ("rtl", got),
                                       ("emu", want))}
        write_report(entry)
        assert entry["mismatches"] == 0, (
            f"{entry['mismatches']} of {n} outputs differ from emu: {entry['examples']}")


class StreamTB(_SlotTB):
    """The stream unit of a ``mac``/``array`` harness: one element (or idle cycle)
    per slot, outputs captured every cycle."""

    def __init__(self, dut):
        super().__init__(dut)
        self.in_fmt = emu.format(self.h.fmt)
        self.acc_fmt = emu.format(self.h.acc)

    async def reset(self):
        """Start the clock, then one step with ``rst`` high and no valid input."""
        await self.start()
        self.dut.rst.value = 1
        self.dut.i_valid.value = 0
        self.dut.i_payload.value = 0
        await self.step()
        self.dut.rst.value = 0

    async def run(self, stream: "ElementStream", out_widths):
        """Drive ``stream``'s payload fields and valid bits, one cycle per slot, then
        idle until the pipeline has drained.  Returns the output fields (widths
        ``out_widths``, payload order) and valid bits, flat per cycle."""
        fields, valid = stream.fields, stream.valid
        N = self.slots
        cycles = len(valid)
        steps = -(-(cycles + self.h.stages + 1) // N)
        total = steps * N

        def padded(v):
            return np.concatenate([np.asarray(v, np.uint64), np.zeros(total - cycles, np.uint64)])
        fields = [(padded(v), w) for v, w in fields]
        valid = padded(valid)
        outs, ovs = [], []
        dut = self.dut
        for s0 in range(0, steps, _CHUNK):
            lo, hi = s0 * N, (s0 + _CHUNK) * N
            for p, v in zip(pack([(x[lo:hi], w) for x, w in fields], N),
                            pack([(valid[lo:hi], 1)], N)):
                dut.i_payload.value = p
                dut.i_valid.value = v
                await self.step()
                outs.append(str(dut.o_payload.value))
                ovs.append(str(dut.o_valid.value))
        return unpack(outs, out_widths, N), unpack(ovs, [1], N)[0]


class ElementStream:
    """Sequences of elements (dot products, tiles) streamed one after another into a
    single stream input, back to back (``gap_rate`` 0) or with random idle cycles
    whose payloads are random junk the unit must ignore; ``first``/``last`` mark
    each sequence.  ``values``: [(flat per-element encodings, width), ...] in payload
    order; ``lengths``: elements per sequence.  ``skip_first``: the first sequence
    relies on the accumulators' reset value (+0.0) instead of ``first``."""

    def __init__(self, values, lengths, rng=None, gap_rate: float = 0.0,
                 skip_first: bool = False):
        self.lengths = np.asarray(lengths, np.int64)
        t = int(self.lengths.sum())
        if gap_rate:
            pos = np.cumsum(rng.geometric(1 - gap_rate, t)) - 1   # idle cycles before each
        else:
            pos = np.arange(t)
        self.cycles = int(pos[-1]) + 1 if t else 0

        def junk(width):
            if rng is None:
                return np.zeros(self.cycles, np.uint64)
            return rng.integers(0, 1 << width, self.cycles, dtype=np.uint64)
        ends = np.cumsum(self.lengths)
        head = np.zeros(t, np.uint64)
        tail = np.zeros(t, np.uint64)
        head[ends - self.lengths] = 1
        tail[ends - 1] = 1
        if skip_first and t:
            head[0] = 0
        self.fields = []
        for v, w in list(values) + [(head, 1), (tail, 1)]:
            x = junk(w)
            x[pos] = np.asarray(v, np.uint64)
            self.fields.append((x, w))
        self.valid = np.zeros(self.cycles, np.uint64)
        self.valid[pos] = 1

    def split(self, outputs, ovalid):
        """The captured outputs of the valid cycles, split per sequence: a list of
        lists of arrays (one per output field).  Asserts one output per element."""
        rows = np.flatnonzero(ovalid)
        t = int(self.lengths.sum())
        assert rows.size == t, f"{rows.size} valid outputs for {t} valid inputs"
        ends = np.cumsum(self.lengths)
        return [[o[rows[e - k:e]] for o in outputs] for e, k in zip(ends, self.lengths)]


def prefix_sums(a, b, lengths, fmt, acc) -> np.ndarray:
    """emu's running accumulator after every element of many dot products, as
    encodings of ``acc``: for dot product d (``lengths[d]`` elements of the flat
    operands ``a``, ``b``) and position i, ``emu.pam_matmul(a_d[:i+1], b_d[:i+1], fmt,
    acc)``.

    Row r of ``L`` holds the products ``pam_mul(a_d[k], b_d[k])`` for k <= i and +0
    elsewhere; ``L @ ones`` under emu.pam_matmul is that fold (``pam_mul(p, 1) = p``
    for every product, and adding a +0 product leaves emu's accumulator unchanged,
    docs/semantics.md §5).  Chunks of rows keep ``L`` small."""
    lengths = np.asarray(lengths, np.int64)
    p = emu.pam_mul(a, b, fmt)
    width = int(lengths.max())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)      # per element
    pos = np.arange(p.size) - starts
    col = np.arange(width)
    out = np.empty(p.size, np.uint32)
    ones = np.ones(width, np.float32)
    for lo in range(0, p.size, 8192):
        hi = min(lo + 8192, p.size)
        idx = np.minimum(starts[lo:hi, None] + col, p.size - 1)
        L = np.where(col <= pos[lo:hi, None], p[idx], np.float32(0))
        out[lo:hi] = emu.to_bits(emu.pam_matmul(L, ones, fmt, acc), acc)
    return out


def dot_results(a, b, lengths, fmt, acc) -> np.ndarray:
    """``emu.pam_matmul(a_d, b_d, fmt, acc)`` of every dot product d as ``acc``
    encodings, in one batched call (operands zero-padded: 0 ·̂ 0 = +0 changes nothing)."""
    lengths = np.asarray(lengths, np.int64)
    width = int(lengths.max())
    pos = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    row = np.repeat(np.arange(lengths.size), lengths)
    A = np.zeros((lengths.size, 1, width), np.float32)
    B = np.zeros((lengths.size, width, 1), np.float32)
    A[row, 0, pos] = a
    B[row, pos, 0] = b
    return emu.to_bits(emu.pam_matmul(A, B, fmt, acc).reshape(-1), acc)

"""The device's bits at scale (issue 27, step 1): emu's CUDA kernels against its CPU
kernels on many operands, every format, every multiplier.

``python -m sim.gpu_bits --out DIR [--per-format N] [--deadline S]`` runs, until the
deadline, in this order:

1. **every operand pair of every format of at most 8 bits**, through every binary op
   (both derivative kinds where the op has them), and for every registry multiplier
   and a table multiplier through emu.mul, its exact derivative (emu.grad.mul) and the
   matmul kernel (a 2^w x 1 by 1 x 2^w outer product: K = 1);
2. **matmuls whose shapes cross every tile edge** of the CUDA kernel (TM = TN = 64,
   TK = 16: sizes 1, 15-17, 63-65, 127-129) with every multiplier, every accumulator
   kind (float32, bf16, fp16, the fp8 steps), both derivatives;
3. **random operands, round robin over the formats**, until each has ``--per-format``
   operands: a third random float32 patterns (every class, NaN payloads), a third
   random encodings of the format, a third values next to the format's rounding
   boundaries; through quantize (four rounding/subnormal/overflow policies, the
   stochastic stream included), to_bits, every unary and binary op and their
   derivatives.

Every result is compared with the CPU's bit for bit (NaNs by class, as the tests do).
A case the CPU refuses must be refused on the device too.  It writes ``bits.jsonl``
(one line per case: what, operands, mismatches, first mismatches) and prints a summary.
Runs under ``NUMBA_ENABLE_CUDASIM=1`` too (tiny sizes: a smoke test of this script).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from numba import cuda

import emu
import emu.grad
from emu.registry import ops

EIGHT_BIT = [n for n, f in {**emu.FORMATS, **emu.P3109_FORMATS}.items()
             if f.width <= 8 and n != "float8_e8m0fnu"]
ACCS = ["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "e3m2"]
EDGES = [1, 15, 16, 17, 63, 64, 65, 127, 128, 129]


def same(a, b) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != np.float32:
        return a == b
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


class Log:
    def __init__(self, out: Path):
        self.f = open(out / "bits.jsonl", "w")
        self.cases = self.bad = self.refused = 0
        self.gaps: dict[str, int] = {}         # the CPU runs it, the device refuses it
        self.operands: dict[str, int] = {}

    def compare(self, what, fmt, n, cpu_fn, gpu_fn, inputs=()):
        """Run both sides; compare every output array."""
        self.cases += 1
        rec = {"what": what, "fmt": fmt, "n": int(n)}
        try:
            want = cpu_fn()
        except (ValueError, TypeError) as exc:
            try:
                gpu_fn()
                rec.update(status="MISMATCH", detail=f"CPU refuses ({exc}), device does not")
                self.bad += 1
            except (ValueError, TypeError):
                rec.update(status="refused")
                self.refused += 1
            self.f.write(json.dumps(rec) + "\n")
            return
        try:
            got = gpu_fn()
        except (ValueError, TypeError) as exc:
            rec.update(status="device refuses", detail=str(exc)[:300])
            self.gaps[str(exc)[:120]] = self.gaps.get(str(exc)[:120], 0) + 1
            self.f.write(json.dumps(rec) + "\n")
            return
        except Exception as exc:                       # noqa: BLE001 (logged as a failure)
            rec.update(status="ERROR", detail=f"{type(exc).__name__}: {exc}"[:400])
            self.bad += 1
            self.f.write(json.dumps(rec) + "\n")
            self.f.flush()
            return
        if not isinstance(want, tuple):
            want, got = (want,), (got,)
        diff = 0
        first = []
        for w, g in zip(want, got):
            if w is None:
                continue
            g = g.copy_to_host() if hasattr(g, "copy_to_host") else np.asarray(g)
            w = np.asarray(w)
            if g.shape != w.shape:
                diff += w.size
                first.append(f"shape {g.shape} != {w.shape}")
                continue
            ok = same(g, w)
            diff += int((~ok).sum())
            for idx in np.argwhere(~ok)[:4]:
                idx = tuple(idx)
                ins = [f"{np.float32(np.broadcast_to(x, w.shape)[idx]).view(np.uint32):#010x}"
                       for x in inputs]
                first.append(f"in {ins} got {np.asarray(g[idx]).view(np.uint32):#010x} "
                             f"want {np.asarray(w[idx]).view(np.uint32):#010x}")
        rec.update(status="ok" if diff == 0 else "MISMATCH", mismatches=diff, first=first[:8])
        self.bad += diff > 0
        self.operands[fmt] = self.operands.get(fmt, 0) + int(n)
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()


def dev(x):
    return cuda.to_device(np.ascontiguousarray(x))


def all_values(fmt):
    f = emu.format(fmt)
    return emu.from_bits(np.arange(1 << f.width, dtype=np.uint32), fmt)


def pairs(fmt):
    v = all_values(fmt)
    a, b = np.meshgrid(v, v, indexing="ij")
    return a.ravel(), b.ravel()


def binary_ops():
    """(label, function name, keyword arguments) of every binary op."""
    for op in ops(2):
        if op.name == "fp_mul_daz":
            yield op.name, "fp_mul", {"subnormals": False}
        else:
            yield op.name, op.name, {}


def exhaustive(log, deadline, rng, formats):
    for fmt in [f for f in EIGHT_BIT if f in formats]:
        a, b = pairs(fmt)
        dy = rng.permutation(np.tile(all_values(fmt), a.size // (1 << emu.format(fmt).width)))
        for label, name, kw in binary_ops():
            fn = getattr(emu, name)
            log.compare(f"{label} all pairs", fmt, a.size, lambda: fn(a, b, fmt, **kw),
                        lambda: fn(dev(a), dev(b), fmt, **kw), (a, b))
        for op in ops(2, differentiable=True):
            g = getattr(emu.grad, op.name)
            for kind in ("exact", "approx"):
                log.compare(f"d{op.name} {kind} all pairs", fmt, a.size,
                            lambda: g(a, b, dy, fmt, kind),
                            lambda: g(dev(a), dev(b), dev(dy), fmt, kind), (a, b, dy))
        v = all_values(fmt)
        A, B = v[:, None].copy(), v[None, :].copy()
        muls = list(emu.MULTIPLIERS)
        if fmt.startswith("float8"):       # a table multiplier: one ROM lookup per product
            muls.append(emu.table_multiplier(lambda x, y: x * y * 0.75 + 2 ** -9, fmt,
                                             name=f"gpu_bits_{fmt}"))
        for mul in muls:
            log.compare(f"matmul outer mul={mul}", fmt, v.size ** 2,
                        lambda: emu.matmul(A, B, fmt, mul=mul),
                        lambda: emu.matmul(dev(A), dev(B), fmt, mul=mul), (A, B))
            log.compare(f"mul all pairs mul={mul}", fmt, a.size,
                        lambda: emu.mul(a, b, fmt, mul=mul),
                        lambda: emu.mul(dev(a), dev(b), fmt, mul=mul), (a, b))
            log.compare(f"dmul exact all pairs mul={mul}", fmt, a.size,
                        lambda: emu.grad.mul(a, b, dy, fmt, mul=mul),
                        lambda: emu.grad.mul(dev(a), dev(b), dev(dy), fmt, mul=mul), (a, b, dy))
        if time.time() > deadline:
            return


def specials(x, rng, fmt):
    v = all_values(fmt) if emu.format(fmt).width <= 8 else emu.quantize(
        np.array([0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-45, 3e38, 1, -1], np.float32),
        fmt)
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, flat.size // 8 + 1, replace=False)
    flat[idx] = rng.choice(v, idx.size)
    return x


def matmuls(log, deadline, rng, formats):
    shapes = [(m, k, n) for m in EDGES for k in (1, 16, 17, 129) for n in (1, 63, 65)]
    shapes = shapes[::3] + [(129, 129, 129), (64, 16, 64), (2, 1000, 3)]
    for fmt in [f for f in ("float32", "bfloat16", "float8_e4m3fn") if f in formats]:
        for acc in ACCS:
            for mul in emu.MULTIPLIERS:
                for m, k, n in shapes[:: max(1, len(emu.MULTIPLIERS) // 3)]:
                    if time.time() > deadline:      # per case: a case compiles kernels
                        return
                    A = specials(rng.standard_normal((m, k)).astype(np.float32), rng, fmt)
                    B = specials(rng.standard_normal((k, n)).astype(np.float32), rng, fmt)
                    G = rng.standard_normal((m, n)).astype(np.float32)
                    what = f"matmul {m}x{k}x{n} acc={acc} mul={mul}"
                    log.compare(what, fmt, m * k * n,
                                lambda: emu.matmul(A, B, fmt, acc, mul=mul),
                                lambda: emu.matmul(dev(A), dev(B), fmt, acc, mul=mul))
                    for kind in ("approx", "exact"):
                        log.compare(f"d{what} {kind}", fmt, 2 * m * k * n,
                                    lambda: emu.grad.matmul(A, B, G, fmt, acc, kind, mul=mul),
                                    lambda: emu.grad.matmul(dev(A), dev(B), dev(G), fmt, acc,
                                                            kind, mul=mul))


def operands(fmt, rng, n):
    """Random float32 patterns, random encodings of fmt, values by its rounding
    boundaries."""
    f = emu.format(fmt)
    k = n // 3
    pat = rng.integers(0, 2 ** 32, k, dtype=np.uint64).astype(np.uint32).view(np.float32)
    if f.width <= 16:
        enc = emu.from_bits(rng.integers(0, 1 << f.width, k, dtype=np.uint32), fmt)
    else:
        enc = rng.integers(0, 2 ** 32, k, dtype=np.uint64).astype(np.uint32).view(np.float32)
    base = emu.quantize((rng.standard_normal(n - 2 * k) * 4).astype(np.float32), fmt)
    with np.errstate(over="ignore", invalid="ignore"):
        near = (base * (1 + rng.uniform(-1, 1, base.size) * f.eps)).astype(np.float32)
    return rng.permutation(np.concatenate([pat, enc, near]))


def random_cases(fmt, rng, n):
    """(label, cpu fn, device fn, inputs) for one chunk of n operands of fmt."""
    x, y, dy = operands(fmt, rng, n), operands(fmt, rng, n), operands(fmt, rng, n)
    dx, dyy, ddy = dev(x), dev(y), dev(dy)
    for rounding, sub, over in [("nearest_even", True, None), ("toward_zero", True, None),
                                ("stochastic", True, None), ("nearest_even", False, "saturate")]:
        seed = int(rng.integers(0, 2 ** 62)) if rounding == "stochastic" else None
        yield (f"quantize {rounding} sub={sub} {over}",
               lambda: emu.quantize(x, fmt, rounding, sub, over, seed),
               lambda: emu.quantize(dx, fmt, rounding, sub, over, seed), (x,))
    q = emu.quantize(x, fmt)
    yield "to_bits", lambda: emu.to_bits(q, fmt), lambda: emu.to_bits(dev(q), fmt), (q,)
    for op in ops(1):
        fn = getattr(emu, op.name)
        yield op.name, lambda: fn(x, fmt), lambda: fn(dx, fmt), (x,)
        if op.differentiable:
            g = getattr(emu.grad, op.name)
            for kind in ("exact", "approx"):
                yield (f"d{op.name} {kind}", lambda: g(x, dy, fmt, kind),
                       lambda: g(dx, ddy, fmt, kind), (x, dy))
    for label, name, kw in binary_ops():
        fn = getattr(emu, name)
        yield label, lambda: fn(x, y, fmt, **kw), lambda: fn(dx, dyy, fmt, **kw), (x, y)
    for op in ops(2, differentiable=True):
        g = getattr(emu.grad, op.name)
        for kind in ("exact", "approx"):
            yield (f"d{op.name} {kind}", lambda: g(x, y, dy, fmt, kind),
                   lambda: g(dx, dyy, ddy, fmt, kind), (x, y, dy))


def random(log, deadline, rng, per_format, chunk, formats):
    fmts = formats
    while time.time() < deadline:
        todo = [f for f in fmts if log.operands.get(f, 0) < per_format]
        if not todo:
            return
        for fmt in todo:
            for what, cpu_fn, gpu_fn, ins in random_cases(fmt, rng, chunk):
                log.compare(f"random {what}", fmt, chunk, cpu_fn, gpu_fn, ins)
            if time.time() > deadline:
                return


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.gpu_bits", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for bits.jsonl")
    p.add_argument("--per-format", type=float, default=1e8,
                   help="random operands per format (default 1e8)")
    p.add_argument("--chunk", type=int, default=1 << 22,
                   help="operands per random case (default 4194304)")
    p.add_argument("--deadline", type=float, default=300, help="seconds (default 300)")
    p.add_argument("--parts", default="exhaustive,matmul,random",
                   help="which parts, comma separated (default all three)")
    p.add_argument("--formats", default=",".join([*emu.FORMATS, *emu.P3109_FORMATS]),
                   help="comma separated (default every format)")
    args = p.parse_args(argv)
    fmts = args.formats.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    deadline = start + args.deadline
    rng = np.random.default_rng(27)
    log = Log(args.out)
    parts = {"exhaustive": lambda: exhaustive(log, deadline, rng, fmts),
             "matmul": lambda: matmuls(log, deadline, rng, fmts),
             "random": lambda: random(log, deadline, rng, args.per_format, args.chunk, fmts)}
    done = []
    for name in args.parts.split(","):
        if time.time() > deadline:
            break
        t = time.time()
        parts[name]()
        done.append(f"{name} {time.time() - t:.0f} s")
    print(f"gpu_bits: {log.cases} cases, {log.bad} with mismatches or errors, "
          f"{log.refused} refused by both; parts: {', '.join(done)}; "
          f"{'deadline reached' if time.time() > deadline else 'complete'}")
    for why, n in log.gaps.items():
        print(f"  the device refuses {n} case(s) the CPU runs: {why}")
    for fmt, n in sorted(log.operands.items()):
        print(f"  {fmt:22s} {n:>14,d} operands compared")
    return 1 if log.bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""cocotb bench: rtl.PAMMac against emu.matmul(..., mul=the harness's multiplier)
(``pam``: emu.pam_matmul), bit for bit (NaNs by class).

Random dot products of lengths 1..256 (specials mixed into a share of them) are
streamed back to back and with random idle cycles carrying junk payloads; the
first one relies on the reset accumulator instead of ``first``.  *Every* output is
checked: after each element the result equals emu's running accumulator (the
fold over that prefix, :func:`sim.tb.driver.prefix_sums` of emu's products), at
``last`` it equals ``emu.matmul(a, b, in_fmt, acc, mul=mul)`` of the whole dot
product, and ``last`` is passed through.  ``matmul_job`` runs whole matrix products
for sim.rtl_matmul.
"""
import time
from pathlib import Path

import cocotb
import numpy as np

import emu
from rtl import vectors as V
from sim.tb import driver

#: stream flows: idle-cycle probability before each element
FLOWS = {"back_to_back": 0.0, "random_gaps": 0.35}


def products(a, b, fmt, mul):
    """``emu.mul(a, b, fmt, mul)`` and ones, as operands whose PAM products are those
    products: every product of a multiplier with RTL is a value of ``fmt`` and never
    subnormal (rtl.mac.MAC_MULTIPLIERS), and ``pam_mul(p, 1) = p`` for those (1.0 a
    normal value of ``fmt``, which prefix_sums' own ``L @ ones`` assumes as well), so
    sim.tb.driver's PAM fold (:func:`~sim.tb.driver.prefix_sums`) folds ``mul``'s
    products."""
    return emu.mul(a, b, fmt, mul), np.ones(np.shape(a), np.float32)


def folds_as_pam(mul) -> bool:
    """Whether ``mul``'s products are values of the operand format, never subnormal, so
    :func:`products` and the PAM fold give emu's running accumulator: every kind but the
    fused ``exact`` and ``table`` multipliers (whose products are in another format)."""
    return emu.multiplier(mul).kind not in ("exact", "table")


def prefix_results(a, b, lengths, fmt, acc, mul) -> np.ndarray:
    """emu's running accumulator after every element, as ``acc`` encodings, each from
    ``emu.matmul`` of exactly that prefix (one call per prefix length): for the fused
    and table multipliers, whose products no PAM fold reproduces."""
    lengths = np.asarray(lengths, np.int64)
    starts = np.cumsum(lengths) - lengths
    out = np.empty(int(lengths.sum()), np.uint32)
    for n in range(1, int(lengths.max()) + 1):
        d = np.flatnonzero(lengths >= n)
        idx = starts[d][:, None] + np.arange(n)
        c = emu.matmul(a[idx][:, None, :], b[idx][:, :, None], fmt, acc, mul=mul)
        out[starts[d] + n - 1] = emu.to_bits(c.reshape(-1), acc)
    return out


def special_counts(x, fmt) -> dict:
    """How many operand values of each special class ``x`` holds (a bench's report)."""
    x = np.asarray(x, np.float32)
    return {"zero": int((x == 0).sum()),
            "subnormal": int(((x != 0) & (np.abs(x) < fmt.smallest_normal)).sum()),
            "inf_nan": int((~np.isfinite(x)).sum()), "max": int((np.abs(x) == fmt.max).sum())}


def dot_results(a, b, lengths, fmt, acc, mul) -> np.ndarray:
    """``emu.matmul(a_d, b_d, fmt, acc, mul=mul)`` of every dot product d as ``acc``
    encodings, one emu.matmul call per length: no zero padding, so the reference is
    emu.matmul of exactly the streamed operands (a padded +0 product would turn a −0
    accumulator into +0)."""
    lengths = np.asarray(lengths, np.int64)
    ends = np.cumsum(lengths)
    out = np.empty(lengths.size, np.uint32)
    for k in np.unique(lengths):
        d = np.flatnonzero(lengths == k)
        idx = (ends[d] - k)[:, None] + np.arange(k)
        out[d] = emu.to_bits(emu.matmul(a[idx][:, None, :], b[idx][:, :, None], fmt, acc,
                                        mul=mul).reshape(-1), acc)
    return out


class PAMMacTB(driver.StreamTB):
    """One PAMMac fed one element per slot."""

    async def stream(self, a, b, lengths, rng=None, gap_rate=0.0, skip_first=False):
        """Stream dot products (flat operand encodings); per dot product, the
        (results, last flags) of its elements."""
        w = self.in_fmt.width
        s = driver.ElementStream([(a, w), (b, w)], lengths, rng, gap_rate, skip_first)
        outs, ovalid = await self.run(s, [self.acc_fmt.width, 1])
        return s.split(outs, ovalid)


@cocotb.test()
@cocotb.parametrize(flow=list(FLOWS))
async def dot_products_match_emu(dut, flow):
    """Parameters: ``dots`` (default 1000), ``max_len`` (256), ``seed``."""
    p = driver.params()
    n, max_len = int(p.get("dots", 1000)), int(p.get("max_len", 256))
    rng = np.random.default_rng([int(p.get("seed", 0)), list(FLOWS).index(flow)])
    tb = PAMMacTB(dut)
    fin, facc = tb.in_fmt, tb.acc_fmt
    lengths = rng.integers(1, max_len + 1, n)
    lengths[:2] = [1, max_len]                        # both extremes, always
    ops = V.dot_operands(rng, fin, lengths)
    a = emu.to_bits(np.concatenate([x for x, _ in ops]), fin)
    b = emu.to_bits(np.concatenate([y for _, y in ops]), fin)
    await tb.reset()
    t0 = time.perf_counter()
    per_dot = await tb.stream(a, b, lengths, rng, FLOWS[flow], skip_first=True)
    t1 = time.perf_counter()
    xa = np.concatenate([x for x, _ in ops])
    xb = np.concatenate([y for _, y in ops])
    mul = tb.h.mul
    if folds_as_pam(mul):
        want = driver.prefix_sums(*products(xa, xb, fin, mul), lengths, fin, facc)
    else:
        want = prefix_results(xa, xb, lengths, fin, facc, mul)
    whole = dot_results(xa, xb, lengths, fin, facc, mul)
    ends = np.cumsum(lengths)
    assert driver.same_encoding(want[ends - 1], whole, facc).all(), "emu's prefix fold"
    got = np.concatenate([r for r, _ in per_dot])
    last = np.concatenate([f for _, f in per_dot])
    ok = driver.same_encoding(got, want, facc) & (last == np.isin(np.arange(got.size), ends - 1))
    ok_whole = driver.same_encoding(got[ends - 1], whole, facc)
    bad = int((~ok).sum())
    examples = [f"element {i} (dot {int(np.searchsorted(ends, i, 'right'))}): rtl {int(got[i]):#x} "
                f"last {int(last[i])}, emu {int(want[i]):#x}" for i in np.flatnonzero(~ok)[:8]]
    t2 = time.perf_counter()
    driver.write_report({"test": f"mac-{mul}-{fin.name}-{facc.name}-{flow}", "unit": "mac",
                         "mul": mul, "fmt": fin.name, "acc": facc.name, "kind": flow, "dots": n,
                         "vectors": int(lengths.sum()), "mismatches": bad,
                         "dot_mismatches": int((~ok_whole).sum()),
                         "specials": special_counts(np.concatenate([xa, xb]), fin),
                         "seconds": t2 - t0, "sim_seconds": t1 - t0, "examples": examples})
    assert bad == 0, f"{bad} outputs differ from emu: {examples}"


@cocotb.test(skip=driver.job_path() is None)
async def matmul_job(dut):
    """sim.rtl_matmul: every entry of C (batch, i, j) as one dot product, k in
    increasing order, back to back; writes the results next to the job file."""
    job = np.load(driver.job_path())
    a3, b3 = job["a"], job["b"]
    nb, m, k = a3.shape
    n = b3.shape[2]
    a = np.broadcast_to(a3[:, :, None, :], (nb, m, n, k)).reshape(-1)
    b = np.broadcast_to(np.swapaxes(b3, 1, 2)[:, None, :, :], (nb, m, n, k)).reshape(-1)
    tb = PAMMacTB(dut)
    await tb.reset()
    t0 = time.perf_counter()
    s = driver.ElementStream([(a, tb.in_fmt.width), (b, tb.in_fmt.width)], np.full(nb * m * n, k))
    (res, last), ovalid = await tb.run(s, [tb.acc_fmt.width, 1])
    c = res[(ovalid == 1) & (last == 1)].astype(np.uint32)
    assert c.size == nb * m * n, f"{c.size} results for {nb * m * n} dot products"
    np.save(Path(driver.job_path()).with_name("result.npy"), c)
    driver.write_report({"test": "matmul_job", "vectors": int(a.size),
                         "seconds": time.perf_counter() - t0})

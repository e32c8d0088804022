"""cocotb bench: rtl.PAMDotArray against emu.matmul(..., mul=the harness's multiplier)
(``pam``: emu.pam_matmul), bit for bit (NaNs by class).

Random tiles A (rows x k) and B (k x cols), k in 1..``max_k``, specials mixed into
a share of them, are streamed one k-step per cycle, back to back and with random
idle cycles carrying junk payloads.  Every output is checked: after step k the
tile equals ``emu.matmul(A[:, :k+1], B[:k+1, :], in_fmt, acc, mul=mul)`` (emu's
running sums, :func:`sim.tb.driver.prefix_sums` of emu's products; the final tile
also by a direct emu.matmul call).  ``matmul_job`` runs whole matrix products for
sim.rtl_matmul(unit="array").
"""
import time
from pathlib import Path

import cocotb
import numpy as np

import emu
from rtl import vectors as V
from sim.tb import driver
from sim.tb.test_pam_mac import folds_as_pam, prefix_results, products, special_counts

FLOWS = {"back_to_back": 0.0, "random_gaps": 0.35}


class PAMDotArrayTB(driver.StreamTB):
    """One rows x cols PAMDotArray fed one k-step (a column of A, a row of B) per slot."""

    async def stream(self, a_cols, b_rows, lengths, rng=None, gap_rate=0.0, skip_first=False):
        """``a_cols`` (steps, rows) and ``b_rows`` (steps, cols) encodings of all tiles'
        k-steps; returns per tile the (steps, rows, cols) outputs and last flags."""
        h, w = self.h, self.in_fmt.width
        values = [(a_cols[:, i], w) for i in range(h.rows)] + \
                 [(b_rows[:, j], w) for j in range(h.cols)]
        s = driver.ElementStream(values, lengths, rng, gap_rate, skip_first)
        outs, ovalid = await self.run(s, [self.acc_fmt.width] * (h.rows * h.cols) + [1])
        tiles = s.split(outs, ovalid)
        return [(np.stack(t[:-1], axis=1).reshape(-1, h.rows, h.cols), t[-1]) for t in tiles]


@cocotb.test()
@cocotb.parametrize(flow=list(FLOWS))
async def tiles_match_emu(dut, flow):
    """Parameters: ``tiles`` (default 200), ``max_k`` (64), ``seed``."""
    p = driver.params()
    n, max_k = int(p.get("tiles", 200)), int(p.get("max_k", 64))
    rng = np.random.default_rng([int(p.get("seed", 0)), list(FLOWS).index(flow)])
    tb = PAMDotArrayTB(dut)
    R, C, fin, facc = tb.h.rows, tb.h.cols, tb.in_fmt, tb.acc_fmt
    ks = rng.integers(1, max_k + 1, n)
    ks[:2] = [1, max_k]
    tiles = []
    for k in ks:
        rate = 0.03 if rng.random() < 0.3 else 0.0
        tiles.append((V.random_values(rng, fin, (R, k), rate), V.random_values(rng, fin, (k, C), rate)))
    a_cols = emu.to_bits(np.concatenate([A.T for A, _ in tiles]), fin)
    b_rows = emu.to_bits(np.concatenate([B for _, B in tiles]), fin)
    await tb.reset()
    t0 = time.perf_counter()
    got = await tb.stream(a_cols, b_rows, ks, rng, FLOWS[flow], skip_first=True)
    t1 = time.perf_counter()
    # emu's tile after every k-step: the running sums of every entry (r, c) of every
    # tile, as one batch of dot products a = A[r, :], b = B[:, c]
    ea = np.concatenate([np.repeat(A, C, axis=0).reshape(-1) for A, _ in tiles])
    eb = np.concatenate([np.tile(B.T, (R, 1)).reshape(-1) for _, B in tiles])
    mul = tb.h.mul
    if folds_as_pam(mul):
        prefix = driver.prefix_sums(*products(ea, eb, fin, mul), np.repeat(ks, R * C), fin, facc)
    else:
        prefix = prefix_results(ea, eb, np.repeat(ks, R * C), fin, facc, mul)
    bad, examples, off = 0, [], 0
    for t, ((A, B), (out, last)) in enumerate(zip(tiles, got)):
        k = A.shape[1]
        want = prefix[off:off + R * C * k].reshape(R, C, k).transpose(2, 0, 1)
        off += R * C * k
        ok = driver.same_encoding(out, want, facc).all(axis=(1, 2)) & (last == (np.arange(k) == k - 1))
        ok[-1] &= driver.same_encoding(
            out[-1], emu.to_bits(emu.matmul(A, B, fin, facc, mul=mul), facc), facc).all()
        if not ok.all():
            bad += int((~ok).sum())
            i = int(np.flatnonzero(~ok)[0])
            examples.append(f"tile {t} (k={k}) step {i}: rtl {out[i].tolist()} emu {want[i].tolist()}")
    t2 = time.perf_counter()
    driver.write_report({"test": f"array-{mul}-{R}x{C}-{fin.name}-{facc.name}-{flow}",
                         "unit": "array", "mul": mul,
                         "fmt": fin.name, "acc": facc.name, "kind": flow, "tiles": n,
                         "vectors": int(ks.sum()) * R * C, "mismatches": bad,
                         "specials": special_counts(np.concatenate([ea, eb]), fin),
                         "seconds": t2 - t0, "sim_seconds": t1 - t0, "examples": examples[:4]})
    assert bad == 0, f"{bad} tile steps differ from emu: {examples[:4]}"


@cocotb.test(skip=driver.job_path() is None)
async def matmul_job(dut):
    """sim.rtl_matmul(unit="array"): C in rows x cols tiles (zero-padded), each
    streamed over all k; writes C's entries next to the job file."""
    job = np.load(driver.job_path())
    a3, b3 = job["a"], job["b"]
    nb, m, k = a3.shape
    n = b3.shape[2]
    tb = PAMDotArrayTB(dut)
    R, C = tb.h.rows, tb.h.cols
    mt, nt = -(-m // R), -(-n // C)
    A = np.zeros((nb, mt * R, k), np.uint32)
    B = np.zeros((nb, k, nt * C), np.uint32)
    A[:, :m], B[:, :, :n] = a3, b3
    # tile (batch, ti, tj): k-steps of A[ti rows].T and B[:, tj cols]
    a_cols = np.broadcast_to(A.reshape(nb, mt, 1, R, k).transpose(0, 1, 2, 4, 3),
                             (nb, mt, nt, k, R)).reshape(-1, R)
    b_rows = np.broadcast_to(B.reshape(nb, 1, k, nt, C).transpose(0, 1, 3, 2, 4),
                             (nb, mt, nt, k, C)).reshape(-1, C)
    await tb.reset()
    t0 = time.perf_counter()
    tiles = await tb.stream(a_cols, b_rows, np.full(nb * mt * nt, k))
    c = np.stack([out[-1] for out, _ in tiles]).reshape(nb, mt, nt, R, C)
    c = c.transpose(0, 1, 3, 2, 4).reshape(nb, mt * R, nt * C)[:, :m, :n]
    np.save(Path(driver.job_path()).with_name("result.npy"), c.reshape(-1).astype(np.uint32))
    driver.write_report({"test": "matmul_job", "vectors": nb * m * n * k,
                         "seconds": time.perf_counter() - t0})

"""CPU kernels of emu.recipe_matmul (docs/semantics.md §10b): the epilogue of steps 2-3
(each K-block's partial product scaled and folded into the accumulator in one pass, with
the scalar definitions of emu/_scalar_mul.py) and, where its preconditions hold, steps
1-3 in one pass with a float32 accumulator; each a parallel and a serial twin."""
import numpy as np
from numba import prange
from numba.extending import register_jitable

from . import _scalar as S
from . import _scalar_mul as SM
from . import _kernels as K
from ._kernels import as_f32, as_i32, twins
from ._numba_cache import drop_stale, njit_variant
from ._tiles import CLEAN, SKIP

drop_stale(__file__)

#: how a K-block's sum P is scaled before it is folded (``scaling``): T = mul(P, mul(s_a,
#: s_b)) by the multiplier; RN(P s_a s_b) for power-of-two scales; T = P, the elements
#: having been scaled before (recipes._prescaled: the same bits)
MUL, POW2, PRESCALED = 0, 1, 2


def _scale_fold(p, sa, sb, out, scaling, f32c, fca, mp, mpx):
    """``out[t, i, j]`` = the fold over blocks b, increasing, from +0, of
    ``RN_acc(c + T)`` with ``T = p[t, b, i, j]`` scaled by ``sa[t, b, i]`` and
    ``sb[t, b, j]``: exactly (``scaling`` POW2: powers of two, one rounding to float32)
    or (MUL) by the multiplier ``mp`` in float32, ``mul(P, mul(s_a, s_b))``.  The fold's step is the
    matmul's exact step (``mpx``), SM.mac with the factor 1.  Uint32 patterns."""
    nt, nb, m, n = p.shape
    if fca.man_bits == 23 and fca.exp_bits == 8:        # float32: fold_row's plain add
        for task in prange(nt * m):
            t = task // m
            i = task % m
            c32 = np.zeros(n, np.float32)
            for b in range(nb):
                fold_row(c32, p[t, b, i].view(np.float32), sa[t, b, i], sb[t, b], n, scaling,
                         f32c, mp)
            for j in range(n):
                v = c32[j]
                out[t, i, j] = np.uint32(S.QNAN32) if v != v else np.uint32(as_i32(v))
        return
    for task in prange(nt * m):
        t = task // m
        i = task % m
        c = np.zeros(n, np.int64)
        for b in range(nb):
            a = np.int64(sa[t, b, i])
            fa = np.float64(as_f32(np.int32(np.uint32(a))))
            for j in range(n):
                x = np.int64(p[t, b, i, j])
                if scaling == POW2:
                    v = np.float32(np.float64(as_f32(np.int32(np.uint32(x)))) * fa
                                   * np.float64(as_f32(np.int32(np.uint32(sb[t, b, j])))))
                    y = np.int64(S.QNAN32) if v != v else np.int64(as_i32(v)) & S.M32
                else:
                    s = SM.product(a, np.int64(sb[t, b, j]), f32c, mp)
                    y = SM.product(x, s, f32c, mp)
                c[j] = SM.mac(c[j], y, np.int64(S.ONE32), f32c, fca, mpx)
        for j in range(n):
            out[t, i, j] = np.uint32(c[j] & S.M32)


SCALE_FOLD = twins("recipe scale_fold", _scale_fold)


@njit_variant("recipe prescale", parallel=True)
def prescale(e, s, kb, along_rows):
    """``e`` (n, R, C) float32 elements times their block scales ``s``: (n, R, C / kb)
    along each row's C (``along_rows``), else (n, R / kb, C) along each column's R; the
    product's int32 pattern and, per row of ``e``, the smallest non-zero and the largest
    magnitude pattern of the products, whether a product is not finite or a non-zero
    element's product not a normal float32, and the smallest non-zero and largest magnitude
    pattern of the elements (recipes._prescaled; loops LLVM vectorises)."""
    n, R, C = e.shape
    out = np.empty((n, R, C), np.int32)
    lo = np.empty((n, R), np.int32)
    hi = np.empty((n, R), np.int32)
    bad = np.empty((n, R), np.bool_)
    elo = np.empty((n, R), np.int32)
    ehi = np.empty((n, R), np.int32)
    m = np.int32(S.ABS32)
    for t in prange(n * R):
        b = t // R
        r = t % R
        o = out[b, r]
        x = e[b, r]
        if along_rows:
            for blk in range(C // kb):
                sc = s[b, r, blk]
                for c in range(blk * kb, blk * kb + kb):
                    o[c] = as_i32(x[c] * sc)
        else:
            sr = s[b, r // kb]
            for c in range(C):
                o[c] = as_i32(x[c] * sr[c])
        mn, mx, hit, emn, emx = m, np.int32(0), np.int32(0), m, np.int32(0)
        for c in range(C):
            u = o[c] & m
            v = as_i32(x[c]) & m
            mn = min(mn, u if v != 0 else m)
            mx = max(mx, u)
            # not finite (a zero element times an inf or NaN scale too), or not normal
            hit |= np.int32(u >= np.int32(S.INF32)) | (np.int32(v != 0) & np.int32(u < np.int32(0x800000)))
            emn = min(emn, v if v != 0 else m)
            emx = max(emx, v)
        lo[b, r], hi[b, r], bad[b, r], elo[b, r], ehi[b, r] = mn, mx, hit != 0, emn, emx
    return out, lo, hi, bad, elo, ehi


@register_jitable(inline="always")      # a call per row: 2x the fold's time at K-blocks of 32
def fold_row(out, p, s_a, sb, n, scaling, f32c, mp):
    """``out[j] += T_j`` in float32 for j < n: ``T_j`` the partial product ``p[j]`` scaled
    by ``s_a`` and ``sb[j]`` (uint32 patterns) as ``scaling`` says (:data:`MUL`, ...); a
    pattern sum with one constant (PAM, L-Mul, offsets) without branches, so the loop
    vectorises."""
    a = np.int64(s_a)
    if scaling == PRESCALED:
        for j in range(n):
            out[j] += p[j]
    elif scaling == POW2:
        fa = np.float64(as_f32(np.int32(np.uint32(a))))
        for j in range(n):
            out[j] += np.float32(np.float64(p[j]) * fa
                                 * np.float64(as_f32(np.int32(np.uint32(sb[j])))))
    elif mp.kind == SM.SUM and mp.k == 0:
        c32 = np.int64(mp.c32)
        for j in range(n):
            s = S.pam_sum32(a, sb[j], f32c, c32)
            out[j] += as_f32(np.int32(S.pam_sum32(np.uint32(as_i32(p[j])), s, f32c, c32)))
    else:
        for j in range(n):
            s = SM.product(a, np.int64(sb[j]), f32c, mp)
            x = np.int64(as_i32(p[j])) & S.M32
            out[j] += as_f32(np.int32(np.uint32(SM.product(x, s, f32c, mp) & S.M32)))


@register_jitable
def _column(A, ba, r0, nr, k):
    """A[ba, r0:r0 + 4, k] (rows past ``nr`` read as +0) and each one's mask: -1, 0 for a
    zero (its products are masked to +0)."""
    a0 = A[ba, r0, k]
    a1 = A[ba, r0 + 1, k] if nr > 1 else np.int32(0)
    a2 = A[ba, r0 + 2, k] if nr > 2 else np.int32(0)
    a3 = A[ba, r0 + 3, k] if nr > 3 else np.int32(0)
    return (a0, a1, a2, a3, np.int32(-1) if a0 & S.ABS32 else np.int32(0),
            np.int32(-1) if a1 & S.ABS32 else np.int32(0),
            np.int32(-1) if a2 & S.ABS32 else np.int32(0),
            np.int32(-1) if a3 & S.ABS32 else np.int32(0))


RB = 4          # rows of C a task's k loop updates together (one load of B's slice; 4 coded)
RT = 32         # rows of C per task: B's K-block slice serves all of them from cache
CB = 256        # columns of C per task (RT x CB sums; 2026-11-28, 1 thread: within 10 % of
                # RT 4-128, CB 64-512, this the fastest)


def _blocked_f32(A, Bp, Bm, sa, sb, ia, ib, C, kb, exact, scaling, f32c, mp):
    """recipe_matmul with a float32 accumulator in one pass, each K-block's partial
    product scaled and folded while it is in cache (the same bits as the batched
    emu.matmul then :func:`_scale_fold`; callers check the preconditions).

    A (nA, M, K) int32 element patterns; B as ``Bp`` (nB, K, N): for a pattern sum
    ``b - ONE32 + c``, the product ``(a + Bp) & Bm`` (``Bm`` -1, 0 where b is zero), where
    no product leaves float32's normal range and no element is inf or NaN; ``exact``:
    ``Bp`` is b, each product exact in float32.  A zero product adds +0, which changes no
    float32 sum that starts at +0.  ``sa`` (nA, nb, M), ``sb`` (nB, nb, N): the block
    scales as in :func:`_scale_fold`; ``mp`` the multiplier's float32 params (the scale
    products)."""
    nout, M, N = C.shape
    K = A.shape[2]
    nb = K // kb
    nti = (M + RT - 1) // RT
    ntj = (N + CB - 1) // CB
    for t in prange(nout * nti * ntj):
        bo = t // (nti * ntj)
        bi = (t // ntj) % nti
        bj = t % ntj
        ba = ia[bo]
        bb = ib[bo]
        rt = bi * RT
        mt = min(M, rt + RT) - rt
        c0 = bj * CB
        nc = min(N, c0 + CB) - c0
        acc = np.empty((RB, CB), np.float32)
        out = np.zeros((RT, CB), np.float32)
        # per K-block, B's slice (kb x CB) stays in cache across the task's row groups
        for b, r0 in np.ndindex(nb, (mt + RB - 1) // RB):
            r0 = rt + r0 * RB
            nr = min(M, r0 + RB) - r0
            r0_, r1_, r2_, r3_ = acc[0], acc[1], acc[2], acc[3]
            for j in range(CB):     # (a loop: numba's slice assignment is not vectorised)
                r0_[j] = r1_[j] = r2_[j] = r3_[j] = 0
            k = b * kb
            while k < (b + 1) * kb:
                # RB rows at once, and with a pattern sum two k: one load of B's slices
                # (and of the accumulators) for four (eight) products
                a0, a1, a2, a3, m0, m1, m2, m3 = _column(A, ba, r0, nr, k)
                bpk = Bp[bb, k, c0:c0 + nc]
                bmk = Bm[bb, k, c0:c0 + nc]
                if exact:
                    f0, f1, f2, f3 = as_f32(a0), as_f32(a1), as_f32(a2), as_f32(a3)
                    for j in range(nc):
                        x = as_f32(bpk[j])
                        r0_[j] += f0 * x
                        r1_[j] += f1 * x
                        r2_[j] += f2 * x
                        r3_[j] += f3 * x
                    k += 1
                elif k + 1 < (b + 1) * kb:
                    e0, e1, e2, e3, n0, n1, n2, n3 = _column(A, ba, r0, nr, k + 1)
                    bpl = Bp[bb, k + 1, c0:c0 + nc]
                    bml = Bm[bb, k + 1, c0:c0 + nc]
                    for j in range(nc):
                        y = bpk[j]
                        m = bmk[j]
                        z = bpl[j]
                        w = bml[j]
                        r0_[j] = (r0_[j] + as_f32(np.int32((a0 + y) & (m & m0)))) \
                            + as_f32(np.int32((e0 + z) & (w & n0)))
                        r1_[j] = (r1_[j] + as_f32(np.int32((a1 + y) & (m & m1)))) \
                            + as_f32(np.int32((e1 + z) & (w & n1)))
                        r2_[j] = (r2_[j] + as_f32(np.int32((a2 + y) & (m & m2)))) \
                            + as_f32(np.int32((e2 + z) & (w & n2)))
                        r3_[j] = (r3_[j] + as_f32(np.int32((a3 + y) & (m & m3)))) \
                            + as_f32(np.int32((e3 + z) & (w & n3)))
                    k += 2
                else:
                    for j in range(nc):
                        y = bpk[j]
                        m = bmk[j]
                        r0_[j] += as_f32(np.int32((a0 + y) & (m & m0)))
                        r1_[j] += as_f32(np.int32((a1 + y) & (m & m1)))
                        r2_[j] += as_f32(np.int32((a2 + y) & (m & m2)))
                        r3_[j] += as_f32(np.int32((a3 + y) & (m & m3)))
                    k += 1
            for r in range(nr):
                fold_row(out[r0 - rt + r], acc[r], sa[ba, b, r0 + r], sb[bb, b, c0:c0 + nc],
                         nc, scaling, f32c, mp)
        for r in range(mt):
            for j in range(nc):
                v = out[r, j]
                C[bo, rt + r, c0 + j] = np.float32(np.nan) if v != v else v


BLOCKED_F32 = twins("recipe blocked_f32", _blocked_f32)


RMB = 64        # rows of C per task of the micro-kernel path (a multiple of QR)
RNB = 256       # its columns (a multiple of PW dividing NB: one B statistics block)


def _micro(run_tile, task_modes):
    """The one pass on emu/_kernels.py's register-blocked micro-kernel (its pattern-sum
    product with a float32 accumulator: ``K.blocked(0)``'s tile runner and modes): per
    K-block, each QR x PW tile of the task's sums starts at +0, takes the block's
    products in k order, and is scaled and folded into the task's results
    (:func:`fold_row`) while it is in cache.  K-blocks are multiples of KG (mode
    groups never straddle them).  PRESCALED: a run of K-blocks whose groups are all in
    one mode is one call of the micro-kernel with ``blocks``, each block's sums added
    to the results in its registers; other blocks as above."""
    QR, PW, NB, NV, KG = K.QR, K.PW, K.NB, K.NV, K.KG
    mk_clean, mk_a, mk_b, mk_ab = (K._micro_kernel(ma, mb, blocks=True) for ma, mb in (
        (False, False), (True, False), (False, True), (True, True)))

    @register_jitable(inline="always")
    def block_mode(modes, q, b, kb):
        """Row block q's mode in K-block b: its groups' one mode, else -1."""
        g0 = b * kb // KG
        m = modes[q, g0]
        for g in range(g0 + 1, g0 + kb // KG):
            if modes[q, g] != m:
                return -1
        return m

    @njit_variant(f"recipe micro lanes={K.W}", parallel=True)
    def kernel(A, Am, sta, Bp, Bm, stb, ia, ib, C, fc, mp, fx, Ao, sa, sb, kb, scaling, f32c,
               mps):
        """C (nout, M, N) of A (nA, Mq, K) and B packed by matmul_prepare_a/_b with the
        multiplier ``mp`` (one constant), ``sa`` (nA, nb, M) and ``sb`` (nB, nb, N) the
        block scales, ``mps`` the multiplier's float32 params."""
        nout, M, N = C.shape
        Kd = A.shape[2]
        nq = A.shape[1] // QR
        ng = (Kd + K.KG - 1) // K.KG
        npan = Bp.shape[1]
        qt = RMB // QR
        pt = RNB // PW
        c32 = np.int64(mp.c32)
        one = S.ONE32 - c32
        nti = (nq + qt - 1) // qt
        ntj = (npan + pt - 1) // pt
        flc = K.flush_consts(fc)
        kcb = kb * max(1, K.KC // kb)       # whole K-blocks per pass
        for t in prange(nout * nti * ntj):
            bo, ba, bb, q0, nql, p0, npl = K.task_span(t, nti, ntj, qt, pt, nq, npan, ia, ib)
            modes = task_modes(sta, stb, ba, bb, q0, nql, (p0 * PW) // NB, ng, fc, mp)
            acc = np.zeros((npl, nql * QR, PW), np.float32)
            out = np.zeros((npl, nql * QR, PW), np.float32)
            accf = acc.reshape(-1)
            outf = out.reshape(-1)
            af = A[ba].reshape(-1)
            amf = Am[ba].reshape(-1)
            for kc0 in range(0, Kd, kcb):
                for p in range(npl):
                    bpf = Bp[bb, p0 + p].reshape(-1)
                    bmf = Bm[bb, p0 + p].reshape(-1)
                    c0 = (p0 + p) * PW
                    nc = min(PW, N - c0)
                    for q in range(nql):
                        off = (p * nql + q) * QR * PW
                        b = kc0 // kb
                        while b * kb < min(Kd, kc0 + kcb):
                            m = block_mode(modes, q, b, kb) if scaling == PRESCALED else -1
                            b1 = b + 1
                            while b1 * kb < min(Kd, kc0 + kcb) and m != -1 and \
                                    block_mode(modes, q, b1, kb) == m:
                                b1 += 1
                            ka = b * kb
                            nk = (b1 - b) * kb
                            ao = (q0 + q) * QR * Kd + ka
                            if m == CLEAN:
                                mk_clean(outf, off, bpf, ka * PW, bmf, ka * NV, af, amf, af,
                                         ao, Kd, nk, af, kb, flc)
                            elif m == K._MASK_A:
                                mk_a(outf, off, bpf, ka * PW, bmf, ka * NV, af, amf, af, ao,
                                     Kd, nk, af, kb, flc)
                            elif m == K._MASK_B:
                                mk_b(outf, off, bpf, ka * PW, bmf, ka * NV, af, amf, af, ao,
                                     Kd, nk, af, kb, flc)
                            elif m == K._MASK_AB:
                                mk_ab(outf, off, bpf, ka * PW, bmf, ka * NV, af, amf, af, ao,
                                      Kd, nk, af, kb, flc)
                            elif m != SKIP:     # block by block: the tile's sums, folded
                                for bk in range(b, b1):
                                    run_tile(acc, accf, p, q, modes, bk * kb, bk * kb + kb, A,
                                             af, amf, af, Bp, bpf, bmf, ba, bb, q0, p0, Kd,
                                             fc, c32, one, 0, 0, fx, flc)
                                    for r in range(QR):
                                        i = (q0 + q) * QR + r
                                        ro = off + r * PW
                                        sums = accf[ro:ro + PW]     # (3-D views cost more)
                                        if i < M:
                                            fold_row(outf[ro:ro + PW], sums, sa[ba, bk, i],
                                                     sb[bb, bk, c0:c0 + nc], nc, scaling,
                                                     f32c, mps)
                                        for j in range(PW):     # the next block's from +0
                                            sums[j] = 0
                            # (SKIP, PRESCALED: sums of +0 change nothing)
                            b = b1
            K.store_tiles(C, bo, out, q0, nql, p0, npl)
    return kernel


_MICRO = []


def micro_kernel():
    """The micro-kernel one pass (built once)."""
    if not _MICRO:
        k = K.blocked(0)
        _MICRO.append(_micro(k.run_tile, k.task_modes))
    return _MICRO[0]

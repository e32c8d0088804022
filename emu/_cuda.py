"""CUDA kernels (numba-cuda) built on the scalar definitions of emu/_scalar.py.

Every kernel calls the same ``register_jitable`` functions as the CPU kernels: the
elementwise ones are built from the op registry (emu/registry.py), like the CPU
kernels, and the rest call ``S.quantize``, ``S.operand``,
``G.pam_mul_da``, ...: the only logic added here is the
iteration order, the shared-memory tiling of the PAM matmul and its fast paths,
whose preconditions make them produce the scalar definition's bits (the proof is in
the comments and docs/gpu.md; tests compare bit for bit with the CPU kernels).

The same source runs three ways: compiled for a GPU, compiled to PTX without a GPU
(tests/test_cuda_ptx.py), and as plain Python under Numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``, tests/test_cuda_sim.py).  Under the simulator integer
scalars are NumPy int32/uint32 that wrap silently, so everything here widens with
``np.int64`` before adding bit patterns, exactly like emu/_scalar.py.

Arrays handed to the kernels are 1-D: contiguous ``uint32`` views of float32 data
for the elementwise kernels, and flat views of an operand's whole storage plus
element strides for the matmul (transposed and broadcast operands need no copy).
Shapes, strides, streams and array families are handled by emu/cuda_backend.py and
emu/device.py.
"""
from __future__ import annotations

import numpy as np

# numba-cuda <= 0.30 registers an overload for np.row_stack at its first compile;
# numpy 2.5 removed that alias of np.vstack
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

from numba import config, cuda  # noqa: E402
from numba.extending import register_jitable

from . import _scalar as S
from . import _scalar_grad as G
from . import _scalar_mul as SM
from . import _scalar_mx as X
from ._kernels_grad import binary_step
from ._tiles import CLEAN, GENERAL, MASKED, SKIP, tile_mode
from .registry import ops

SIM = bool(config.ENABLE_CUDASIM)

# --- float32 <-> bit pattern reinterpretation -------------------------------------
#
# Plain Python for the simulator (which runs the kernels as Python); on the CUDA
# target an @overload replaces each by libdevice's register move (or the add).

def as_f32(bits):
    """The float32 whose pattern is the low 32 bits of the integer ``bits``."""
    return np.uint32(np.int64(bits) & S.M32).view(np.float32)


def f32_bits(x):
    """The float32 pattern of ``x`` as a non-negative int64."""
    return np.int64(np.float32(x).view(np.uint32))


def f32_add(a, b):
    """IEEE binary32 a + b (RNE, subnormals kept): the float32 accumulator's step.

    Overflow to inf and inf - inf = NaN are results here.  NumPy reports them with the
    same warning as an integer wraparound, which the simulator tests turn into errors,
    so this float add alone runs with them silenced.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        return np.float32(a) + np.float32(b)


if not SIM:
    from numba.cuda import libdevice
    from numba.cuda.extending import overload

    @overload(as_f32, target="cuda")
    def _as_f32_cuda(bits):
        def impl(bits):
            return libdevice.int_as_float(np.int32(bits))      # np.int32 truncates
        return impl

    @overload(f32_bits, target="cuda")
    def _f32_bits_cuda(x):
        def impl(x):
            return np.int64(libdevice.float_as_int(x)) & S.M32
        return impl

    @overload(f32_add, target="cuda")
    def _f32_add_cuda(a, b):
        def impl(a, b):
            return a + b            # add.f32: RNE, no FTZ (no fastmath)
        return impl


# --- launch configuration -----------------------------------------------------------

THREADS = 256           # elementwise kernels: threads per block
MAX_BLOCKS = 1 << 16    # grid-stride loops cover any size
if SIM:
    # The simulator runs every thread as a Python thread: few threads, same code.
    THREADS = 8
    MAX_BLOCKS = 2


def blocks_for(n: int, threads: int = THREADS) -> int:
    return max(1, min(MAX_BLOCKS, -(-n // threads)))


# --- elementwise ------------------------------------------------------------------

@cuda.jit
def quantize(x, out, fc, mode, subnormals, saturate, key):
    """out[i] = quantize(x[i]); element i draws rand32(key, i), the CPU's stream."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[i] = S.quantize(x[i], fc, mode, subnormals, saturate, key, i)


@cuda.jit
def to_bits(x, out, fc):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[i] = S.f32_to_bits(S.quantize(x[i], fc, S.RNE, True, False, 0, 0), fc)


@cuda.jit
def from_bits(b, out, fc, bad):
    """Decode encodings; ``bad[0]`` is set to 1 if any lies outside [0, 2^width)."""
    limit = np.int64(1) << (1 + fc.exp_bits + fc.man_bits)
    for i in range(cuda.grid(1), b.size, cuda.gridsize(1)):
        v = np.int64(b[i])          # uint64 beyond 2^63 wraps negative: still flagged
        if v < 0 or v >= limit:
            bad[0] = 1
            out[i] = S.QNAN32
        else:
            out[i] = S.bits_to_f32(v, fc)


def _unary(op):
    @cuda.jit
    def kernel(x, out, fc):
        for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
            out[i] = op(S.operand(x[i], fc), fc)
    return kernel


def _binary(op):
    @cuda.jit
    def kernel(x, y, out, fc):
        for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
            out[i] = op(S.operand(x[i], fc), S.operand(y[i], fc), fc)
    return kernel


# one kernel per op of the registry (emu/registry.py), as the CPU kernels
UNARY = {op.name: _unary(op.scalar) for op in ops(1)}
BINARY = {op.name: _binary(op.scalar) for op in ops(2)}

# --- any multiplier of the registry (emu.mul, emu.grad.mul; emu/_kernels_mul.py) ------

@cuda.jit
def mul(x, y, out, fc, mkind, c32, table, mk):
    """out[i] = the product of the multiplier (MulParams' fields) of the rounded operands."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[i] = SM.product_of(S.operand(x[i], fc), S.operand(y[i], fc), fc, mkind, c32, table,
                               mk)


@cuda.jit
def mul_grad(x, y, d, outa, outb, fc, mkind, c32, table, mk):
    """Its exact (δA, δB) at δY = d, every operand rounded first."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        a, b, g = S.operand(x[i], fc), S.operand(y[i], fc), S.operand(d[i], fc)
        outa[i] = SM.product_da_of(a, b, g, fc, mkind, c32, table, mk)
        outb[i] = SM.product_db_of(a, b, g, fc, mkind, c32, table, mk)


# --- exact derivatives (emu/_scalar_grad.py, Table 1) --------------------------------
#
# The twins of emu/_kernels_grad.py's elementwise kernels: every operand, the gradient
# included, is rounded to fmt (RNE) first, then the scalar definition is applied (a
# unary op's derivative op_dx(x, dy, fc) is a binary op's kernel).

def _grad_binary(op_a, op_b):
    step = binary_step(op_a, op_b)

    @cuda.jit
    def kernel(a, b, d, outa, outb, fc):
        for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
            step(a, b, d, outa, outb, i, fc, False)
    return kernel


GRAD_UNARY = {op.name: _binary(*op.grads) for op in ops(1, differentiable=True)}
GRAD_BINARY = {op.name: _grad_binary(*op.grads) for op in ops(2, differentiable=True)}


def _make_matmul_grad(f32acc):
    """The exact matmul gradient folds of emu/_kernels_grad.py:

        out[b, p, c] = fold over r = 0..R-1 (increasing) from +0.0 of
                       acc ⊕ pam_mul_da(x[ix[b], p, c], w[iw[b], r, c], g[b, p, r])

    (``general``: the multiplier's (MulParams' fields) SM.product_da_of(x, w, g), or
    SM.product_db_of(w, x, g) where x is the product's second operand, ``own_first``
    False: matmul_grad_mul) on contiguous patterns already rounded to fmt (emu/grad.py
    quantizes them), one thread per output with c fastest, so the x and w reads of a
    warp are coalesced and its g read is one broadcast.  Every term takes the scalar
    definition (the CPU kernel's integer fast path is an optimisation of the same bits,
    not used here); a narrow accumulator adds it with the forward kernel's narrow_add.
    """
    step = _f32_grad_step if f32acc else _fmt_grad_step
    store = _f32_store if f32acc else _fmt_store
    zero = np.float32(0) if f32acc else np.int64(0)

    @cuda.jit
    def kernel(g, x, w, ix, iw, out, P, R, C, fc, fca, mkind, c32, table, mk, general,
               own_first):
        n = out.size
        for t in range(cuda.grid(1), n, cuda.gridsize(1)):
            c = np.int64(t) % C
            p = (np.int64(t) // C) % P
            bo = np.int64(t) // (C * P)
            xv = np.int64(x[(np.int64(ix[bo]) * P + p) * C + c])
            wbase = np.int64(iw[bo]) * R * C + c
            gbase = (bo * P + p) * R
            acc = zero
            for r in range(R):
                wv = np.int64(w[wbase + r * C])
                d = np.int64(g[gbase + r])
                if not general:
                    term = G.pam_mul_da(xv, wv, d, fc)
                elif own_first:
                    term = SM.product_da_of(xv, wv, d, fc, mkind, c32, table, mk)
                else:
                    term = SM.product_db_of(wv, xv, d, fc, mkind, c32, table, mk)
                acc = step(acc, term, fca)
            out[t] = store(acc)
    return kernel


@register_jitable
def _f32_grad_step(acc, term, fca):
    return f32_add(acc, as_f32(term))


@register_jitable
def _fmt_grad_step(acc, term, fca):
    """One step of a narrow accumulator: narrow_add (below) as in the forward kernel,
    S.fp_add for 23 significant bits."""
    if fca.man_bits <= 21:
        return narrow_add(acc, term, fca)
    return S.fp_add(acc, term, fca)


# --- the E8M0 scale type and MX blocks (emu/_scalar_mx.py, like emu/_kernels_mx.py) ---

@cuda.jit
def e8m0(x, out, to_bits):
    """out[i] = the E8M0 code of x[i] (``to_bits``) or its value's float32 pattern."""
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        c = X.e8m0_code(x[i])
        if to_bits:
            out[i] = c
        else:
            out[i] = X.e8m0_value(c)


@cuda.jit
def e8m0_from_bits(b, out, bad):
    """Decode E8M0 codes; ``bad[0]`` is set to 1 if any lies outside [0, 256)."""
    for i in range(cuda.grid(1), b.size, cuda.gridsize(1)):
        v = np.int64(b[i])
        if v < 0 or v > X.E8M0_NAN:
            bad[0] = 1
            out[i] = S.QNAN32
        else:
            out[i] = X.e8m0_value(v)


@cuda.jit
def mx_quantize(x, out, scales, ntask, nb, n, inner, block, efc, emax, int8, values, f32c):
    """One thread per MX block of x viewed as (outer, n, inner), blocks along n
    (X.mx_block: the block's amax, its scale code, then its elements)."""
    for t in range(cuda.grid(1), ntask, cuda.gridsize(1)):
        X.mx_block(x, out, scales, t, nb, n, inner, block, efc, emax, int8, values, f32c)


@cuda.jit
def mx_dequantize(p, scales, out, nb, n, inner, block, f32c):
    for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
        out[i] = X.mx_dequantize_at(p, scales, i, nb, n, inner, block, f32c)


# --- layout: strided gather ---------------------------------------------------------

MAXDIM = 8      # dimensions of a strided view after merging (emu/device.py gather_layout)


@cuda.jit
def gather(src, out, shape, strides):
    """out[i] = src[offset of the C-order multi-index i over ``shape``].

    ``src`` is a flat view of a whole storage, ``shape``/``strides`` (elements,
    >= 0, 0 for broadcast dimensions) are padded to MAXDIM.  The store converts the
    dtype (float16/float64/integers to float32: exact or RNE, as numpy's astype).
    """
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        r = np.int64(i)
        off = np.int64(0)
        for d in range(MAXDIM - 1, -1, -1):
            n = shape[d]
            off += (r % n) * strides[d]
            r //= n
            if r == 0:          # the outer coordinates (padding included) are all 0
                break
        out[i] = src[off]


# --- PAM matmul ----------------------------------------------------------------------
#
# C[b, i, j] = fold over k = 0..K-1 (increasing) of acc <- acc ⊕ pam_mul(A[b,i,k], B[b,k,j]),
# acc starting at +0.0 (docs/semantics.md §5).  A block computes a TM x TN tile of C
# with (TM // R)^2 threads, each owning R x R outputs (rows ty + (TM // R) r, columns
# tx + (TN // R) c); k advances in tiles of TK staged in shared memory, and inside a tile in increasing
# k, so every output sees its products in the defined order.
#
# float32 accumulation adds the product to a float32 register with the GPU's add.f32
# (IEEE binary32, RNE, subnormals kept: no fastmath, so no FTZ, and no FMA contraction
# since there is no multiply) — numpy float32 `+`, like the CPU kernel.  The product
# itself comes from one of four per-tile modes chosen from per-tile operand statistics
# (operand_stats below), uniformly for the whole block:
#
# CLEAN, MASKED, SKIP or GENERAL, as emu/_tiles.py defines them (CLEAN and MASKED add
# c(a) = |a| - ONE32 + sign(a)·2^31 = a - ONE32 mod 2^32 to b's pattern).
#
# Narrow accumulation (acc a format other than float32) adds with `narrow_add`: a float32
# add made round-to-odd by 2Sum, then S.quantize into acc (emu/_kernels_acc.py has the
# proof; accumulators with 23 significant bits use S.fp_add, the spec's integer adder).
# SKIP blocks run as MASKED: a narrow accumulator can hold -0, and -0 + +0 = +0.
#
# NaN results are canonicalised when C is stored.  Operands are rounded to fmt (RNE,
# `S.operand`) while staged, as the CPU rounds them before its kernel.

TM_LOG = 6       # TK, TM, TN as shifts: staging index arithmetic without sign fix-ups
if SIM:
    # The simulator runs each of a block's threads as a Python thread: the same code
    # on 16 x 16 tiles of 4 x 4 threads (CI time; the 64 x 64 tiles ran on an H200)
    TM_LOG = 4
TK_LOG = 4
TM = 1 << TM_LOG     # rows of C per block
TN = TM              # columns of C per block
TK = 1 << TK_LOG     # k per shared-memory stage
R = 4            # outputs per thread in each direction (TM // R x TN // R threads)
TPB = (TM // R) * (TN // R)
TMP = TM + 1     # padded shared-memory rows: conflict-free stores of k-fast operands
TNP = TN + 1
AS_SIZE = TK * TMP
BS_SIZE = TK * TNP
assert TM * TK % TPB == 0
NT = 4           # batch-offset terms per operand (emu/cuda_backend.py _batch_terms)


@register_jitable
def _batch_offset(bo, terms):
    """Element offset of output batch ``bo`` in an operand: a sum over (div, mod, stride)
    terms of ((bo // div) % mod) * stride (broadcast batch dimensions have no term)."""
    off = np.int64(0)
    for t in range(NT):
        off += ((np.int64(bo) // terms[3 * t]) % terms[3 * t + 1]) * terms[3 * t + 2]
    return off


@register_jitable
def _staged(e, kfast):
    """``(k, row or column)`` of element e of a TK x TM tile staged by a thread block:
    consecutive e run along k where the operand's k stride is 1 (``kfast``), else along
    the other index, so that consecutive threads read consecutive addresses."""
    if kfast:
        return e & (TK - 1), e >> TK_LOG
    return e >> TM_LOG, e & (TM - 1)        # TM == TN


@register_jitable
def _offset(a, c32):
    """c(a): what CLEAN/MASKED add (mod 2^32) to b's pattern to get a ·̂ b, ``c32`` the
    pattern-sum multiplier's constant (PAM: 0)."""
    a = np.int64(a)
    return ((a & S.ABS32) - S.ONE32 + np.int64(c32) + (a & S.SIGN32)) & S.M32


@cuda.jit
def operand_stats(X, terms, s_row, s_k, rows, K, nout, stats, fc):
    """Per (output batch, tile of TM rows, tile of TK k): statistics of the operand
    rounded to fmt: stats[t, 0] = min |x| over normal x (INF32 if none),
    stats[t, 1] = max |x|, stats[t, 2] = 1 if a zero or subnormal occurs.

    Used for A (rows = M) and for B (rows = N, the columns; TN == TM).  One thread per
    tile: this pass reads every element once, the matmul reads it N/TN times.
    """
    nrt = (rows + TM - 1) // TM
    nkt = (K + TK - 1) // TK
    ntile = nout * nrt * nkt
    for t in range(cuda.grid(1), ntile, cuda.gridsize(1)):
        kt = t % nkt
        rt = (t // nkt) % nrt
        bo = t // (nkt * nrt)
        base = _batch_offset(bo, terms)
        mn = np.int64(S.INF32)
        mx = np.int64(0)
        z = 0
        for r in range(rt * TM, min(rows, rt * TM + TM)):
            for k in range(kt * TK, min(K, kt * TK + TK)):
                u = S.operand(X[base + r * s_row + k * s_k], fc) & S.ABS32
                if u < fc.minnorm32:
                    z = 1
                elif u < mn:
                    mn = u
                if u > mx:
                    mx = u
        stats[t, 0] = mn
        stats[t, 1] = mx
        stats[t, 2] = z


def _make_matmul(f32acc):
    acc_t = np.float32 if f32acc else np.int64
    step = _f32_step if f32acc else _fmt_step
    store = _f32_store if f32acc else _fmt_store

    @cuda.jit
    def kernel(A, at, sai, sak, B, bt, sbk, sbj, C, M, N, K, nout, astat, bstat, fc, fca,
               mkind, c32, table, mk):
        # the multiplier (emu/_scalar_mul.py MulParams' fields); one that is not a
        # pattern sum with one constant takes GENERAL blocks only
        constant = mkind == SM.SUM and mk == 0
        # [kk * TMP + ii]; indexed with np.uint32 so no negative-index wraparound code
        As = cuda.shared.array(AS_SIZE, np.uint32)
        Bs = cuda.shared.array(BS_SIZE, np.uint32)
        acc = cuda.local.array((R, R), acc_t)
        av = cuda.local.array(R, np.int64)
        bv = cuda.local.array(R, np.int64)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tid = ty * (TN // R) + tx
        nbi = (M + TM - 1) // TM
        nbj = (N + TN - 1) // TN
        nkt = (K + TK - 1) // TK
        ntile = nout * nbi * nbj
        # coalesced staging: consecutive threads read consecutive addresses
        a_kfast = sak == 1
        b_kfast = sbk == 1 and sbj != 1
        for t in range(cuda.blockIdx.x, ntile, cuda.gridDim.x):
            bj = t % nbj
            bi = (t // nbj) % nbi
            bo = t // (nbj * nbi)
            i0 = bi * TM
            j0 = bj * TN
            abase = _batch_offset(bo, at)
            bbase = _batch_offset(bo, bt)
            for r in range(R):
                for c in range(R):
                    acc[r, c] = 0
            for kt in range(nkt):
                k0 = kt * TK
                kn = min(TK, K - k0)
                sa = (bo * nbi + bi) * nkt + kt
                sb = (bo * nbj + bj) * nkt + kt
                mode = GENERAL
                if constant:
                    mode = tile_mode(astat[sa, 0], astat[sa, 1], astat[sa, 2],
                                     bstat[sb, 0], bstat[sb, 1], bstat[sb, 2], fc, c32)
                if not f32acc and mode == SKIP:
                    mode = MASKED
                cuda.syncthreads()              # the previous tile's reads are done
                if mode != SKIP:
                    for q in range(TM * TK // TPB):
                        e = tid + q * TPB
                        kk, ii = _staged(e, a_kfast)
                        v = np.int64(0)         # padding: +0, or c(1.0) in CLEAN mode
                        if i0 + ii < M and kk < kn:
                            v = S.operand(A[abase + (i0 + ii) * sai + (k0 + kk) * sak], fc)
                            if f32acc and mode == CLEAN:
                                v = _offset(v, c32)
                        As[np.uint32(kk * TMP + ii)] = v
                    for q in range(TN * TK // TPB):
                        e = tid + q * TPB
                        kk, jj = _staged(e, b_kfast)
                        v = np.int64(S.ONE32)   # padding: 1.0, products of padding stay finite
                        if j0 + jj < N and kk < kn:
                            v = S.operand(B[bbase + (k0 + kk) * sbk + (j0 + jj) * sbj], fc)
                        Bs[np.uint32(kk * TNP + jj)] = v
                cuda.syncthreads()
                if mode == SKIP:
                    continue
                for kk in range(kn):
                    ka = np.uint32(kk * TMP + ty)
                    kb = np.uint32(kk * TNP + tx)
                    for r in range(R):
                        av[r] = np.int64(As[ka + np.uint32(r * (TM // R))])
                    for c in range(R):
                        bv[c] = np.int64(Bs[kb + np.uint32(c * (TN // R))])
                    step(acc, av, bv, mode, fc, fca, mkind, c32, table, mk)
            for r in range(R):
                i = i0 + ty + r * (TM // R)
                for c in range(R):
                    j = j0 + tx + c * (TN // R)
                    if i < M and j < N:
                        C[(bo * M + i) * N + j] = store(acc[r, c])
    return kernel


@register_jitable
def _f32_step(acc, av, bv, mode, fc, fca, mkind, c32, table, mk):
    """acc[r, c] += a_r ·̂ b_c in float32 for one k (av holds c(a) in CLEAN mode) by a
    pattern sum with the one constant c32; GENERAL blocks take S.pam_sum.  The other
    multipliers run _fmt_step, float32 being a format like another: their code here
    would cost the accumulators their registers (tests/test_cuda_ptx.py)."""
    if mode == CLEAN:
        for r in range(R):
            for c in range(R):
                acc[r, c] = f32_add(acc[r, c], as_f32(bv[c] + av[r]))
    elif mode == MASKED:
        for r in range(R):
            za = (av[r] & S.ABS32) < fc.minnorm32
            ca = _offset(av[r], c32)
            for c in range(R):
                p = as_f32(bv[c] + ca)
                if za or (bv[c] & S.ABS32) < fc.minnorm32:
                    p = np.float32(0)
                acc[r, c] = f32_add(acc[r, c], p)
    else:
        for r in range(R):
            for c in range(R):
                acc[r, c] = f32_add(acc[r, c], as_f32(S.pam_sum(av[r], bv[c], fc, c32)))


@register_jitable
def narrow_add(x, y, fca):
    """RNE_acc(x + y) for the pattern x of an acc value and y of a float32 value, for
    accumulators of at most 22 significant bits: the float32 sum, made round-to-odd
    with 2Sum's exact error (the pattern moves to the odd neighbour on the error's
    side), rounded once into acc (STICKY in emu/_kernels_acc.py, which proves it)."""
    xf = as_f32(x)
    yf = as_f32(y)
    s = f32_add(xf, yf)
    v = f32_bits(s)
    bb = f32_add(s, -xf)
    err = f32_add(f32_add(xf, -f32_add(s, -bb)), f32_add(yf, -bb))
    if err > 0 or err < 0:                      # inexact (a NaN error: s is ±inf)
        if (f32_bits(err) ^ v) & S.SIGN32:
            v -= 1                              # toward zero; then odd
        v |= 1
    return S.quantize(v, fca, S.RNE, True, False, 0, 0)


@register_jitable
def _fmt_step(acc, av, bv, mode, fc, fca, mkind, c32, table, mk):
    """acc[r, c] <- RNE_acc(acc[r, c] + a_r ·̂ b_c) in the accumulator format, for one k
    (``exact``: the fused step)."""
    for r in range(R):
        for c in range(R):
            if mode == CLEAN:                   # normal operands and products
                p = (av[r] + bv[c] - S.ONE32 + c32) & S.M32
            elif mkind == SM.EXACT:
                acc[r, c] = S.fp_fma(acc[r, c], av[r], bv[c], fca)
                continue
            else:
                p = SM.product_of(av[r], bv[c], fc, mkind, c32, table, mk)
            if fca.man_bits <= 21:
                acc[r, c] = narrow_add(acc[r, c], p, fca)
            else:
                acc[r, c] = S.fp_add(acc[r, c], p, fca)


@register_jitable
def _f32_store(v):
    """The pattern stored in C for a float32 accumulator (NaN canonical)."""
    if v != v:
        return np.int64(S.QNAN32)
    return f32_bits(v)


@register_jitable
def _fmt_store(v):
    """A narrow accumulator already holds a pattern (fp_add's NaNs are canonical)."""
    return v


matmul_f32acc = _make_matmul(True)
matmul_fmtacc = _make_matmul(False)
matmul_grad_f32acc = _make_matmul_grad(True)
matmul_grad_fmtacc = _make_matmul_grad(False)


# --- signatures: every kernel as emu/cuda_backend.py launches it ----------------------

GATHER_SOURCES = ("float32", "float16", "float64", "int8", "int16", "int32", "int64",
                  "uint8", "uint16", "uint32", "uint64")
# --- the defined-order sum (emu/reduce.py, emu/_kernels_reduce.py) ------------------------

@cuda.jit
def fold_sum(x, out, outer, n, inner):
    """out[o, i] = the left fold over j = 0..n-1 of x[o, j, i] (flat C-order uint32
    patterns of float32), from x[o, 0, i]; +0 for n = 0, NaN canonical: the CPU's
    fold (emu/_kernels_reduce.py), one thread per result."""
    total = np.int64(outer) * np.int64(inner)
    for t in range(cuda.grid(1), total, cuda.gridsize(1)):
        t = np.int64(t)
        o = t // inner
        i = t - o * inner
        base = o * np.int64(n) * inner + i
        if n == 0:
            out[t] = 0
        else:
            acc = as_f32(x[base])
            for j in range(1, n):
                acc = f32_add(acc, as_f32(x[base + np.int64(j) * inner]))
            out[t] = S.QNAN32 if acc != acc else f32_bits(acc)


BITS_SOURCES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def signatures():
    """``(name, kernel, argument types)`` for every kernel and every argument type
    emu/cuda_backend.py passes it: what tests/test_cuda_ptx.py compiles for each GPU
    architecture (and tests/test_cuda_sim.py checks that launches stay within)."""
    from numba import types, typeof

    from .formats import float32

    def vec(dt):
        return types.Array(getattr(types, dt), 1, "C")

    u32 = vec("uint32")
    i64 = types.int64
    fc = typeof(float32.consts)
    stats = types.Array(types.int32, 2, "C")
    terms = types.UniTuple(i64, 3 * NT)
    dims = types.UniTuple(i64, MAXDIM)
    sigs = [("quantize", quantize, (u32, u32, fc, i64, types.boolean, types.boolean, i64)),
            ("to_bits", to_bits, (u32, u32, fc))]
    sigs += [(f"from_bits[{dt}]", from_bits, (vec(dt), u32, fc, stats.copy(ndim=1)))
             for dt in BITS_SOURCES]
    sigs += [(name, k, (u32, u32, fc)) for name, k in UNARY.items()]
    sigs += [(name, k, (u32, u32, u32, fc)) for name, k in BINARY.items()]
    sigs += [(f"gather[{dt}->float32]", gather, (vec(dt), vec("float32"), dims, dims))
             for dt in GATHER_SOURCES]
    sigs += [(f"gather[{dt}->int64]", gather, (vec(dt), vec("int64"), dims, dims))
             for dt in BITS_SOURCES]
    sigs.append(("operand_stats", operand_stats, (u32, terms, i64, i64, i64, i64, i64,
                                                  stats, fc)))
    mm = (u32, terms, i64, i64, u32, terms, i64, i64, u32, i64, i64, i64, i64, stats, stats,
          fc, fc, i64, i64, vec("int64"), i64)
    sigs += [("matmul_f32acc", matmul_f32acc, mm), ("matmul_fmtacc", matmul_fmtacc, mm)]
    sigs += [(f"grad_{name}", k, (u32, u32, u32, fc)) for name, k in GRAD_UNARY.items()]
    sigs += [(f"grad_{name}", k, (u32, u32, u32, u32, u32, fc))
             for name, k in GRAD_BINARY.items()]
    sigs += [("e8m0", e8m0, (u32, u32, types.boolean)),
             ("e8m0_from_bits", e8m0_from_bits, (vec("int64"), u32, stats.copy(ndim=1))),
             ("mx_quantize", mx_quantize, (u32, u32, vec("uint8"), i64, i64, i64, i64, i64, fc,
                                           i64, types.boolean, types.boolean, fc)),
             ("mx_dequantize", mx_dequantize, (u32, vec("int64"), u32, i64, i64, i64, i64, fc))]
    mulp = (fc, i64, i64, vec("int64"), i64)
    mg = (u32, u32, u32, vec("int64"), vec("int64"), u32, i64, i64, i64, fc, *mulp,
          types.boolean, types.boolean)
    sigs += [("matmul_grad_f32acc", matmul_grad_f32acc, mg),
             ("matmul_grad_fmtacc", matmul_grad_fmtacc, mg)]
    sigs.append(("fold_sum", fold_sum, (u32, u32, i64, i64, i64)))
    sigs += [("mul", mul, (u32, u32, u32, *mulp)),
             ("mul_grad", mul_grad, (u32, u32, u32, u32, u32, *mulp))]
    return sigs

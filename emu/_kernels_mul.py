"""CPU kernels of the multipliers: ``emu.mul`` and the exact ``emu.grad.mul`` (every
multiplier's scalar definitions, emu/_scalar_mul.py, on each element, operands rounded
into the format first; a parallel and a serial twin), and when the float32 product is the ``exact`` multiplier's step."""
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from . import _scalar as S
from . import _scalar_mul as SM
from ._kernels import as_f32, twins
from ._numba_cache import drop_stale

drop_stale(__file__)


def _mul(x, y, out, fc, mp):
    if mp.kind == SM.SUM and mp.k == 0 and S.is_float32(fc):
        c = mp.c32      # one constant, float32 operands as they are: the 32-bit twin
        for i in prange(x.size):
            out[i] = S.pam_sum32(x[i], y[i], fc, c)
        return
    for i in prange(x.size):
        out[i] = SM.product(S.operand(x[i], fc), S.operand(y[i], fc), fc, mp)


MUL = twins("mul", _mul)


def _mul_grad(x, y, d, outa, outb, fc, mp):
    for i in prange(x.size):
        a, b, g = S.operand(x[i], fc), S.operand(y[i], fc), S.operand(d[i], fc)
        outa[i] = SM.product_da(a, b, g, fc, mp)
        outb[i] = SM.product_db(a, b, g, fc, mp)


#: the exact derivatives of every multiplier (emu.grad.mul)
MUL_GRAD = twins("mul_grad", _mul_grad)


def exact_ok(a, b, fmt) -> bool:
    """Whether every product of finite operands of the int32 patterns ``a``, ``b`` (values
    of fmt) is exact in float32, so that the float32 product and add are the ``exact``
    multiplier's fused step (K.matmul_blocked's FMUL): M <= 11 (2 (M + 1) significant
    bits), every product below 2^128 and every non-zero one at least 2^(2M + 2 - 149)
    (its last bit, above |a b| 2^(-2M-2), is then at least float32's 2^-149)."""
    if fmt.man_bits > 11:
        return False
    lo = 2.0 ** (2 * fmt.man_bits + 2 - 149)
    q = fmt.smallest_subnormal
    if fmt.max ** 2 < 2.0 ** 128 and q * q >= lo:
        return True                             # every pair of the format
    amn, amx = _abs_range(a.reshape(-1))
    bmn, bmx = _abs_range(b.reshape(-1))
    return amx * bmx < 2.0 ** 128 and (amn == np.inf or bmn == np.inf or amn * bmn >= lo)


@njit(cache=True)
def _abs_range(x):
    """(smallest non-zero, largest) finite magnitude of the patterns x (inf if none, 0)."""
    mn, mx = np.inf, 0.0
    for v in x:
        u = np.int32(v) & np.int32(S.ABS32)
        if 0 < u < np.int32(S.INF32):
            f = np.float64(as_f32(u))
            mn = min(mn, f)
            mx = max(mx, f)
    return mn, mx


@njit(parallel=True, cache=True)
def _encode(x, fc):
    """The format encodings of the patterns ``x`` (values of the format)."""
    out = np.empty(x.shape, np.int32)
    flat, o = x.reshape(-1), out.reshape(-1)
    for i in prange(flat.size):
        o[i] = S.f32_to_bits(flat[i], fc)
    return out


@njit(parallel=True, cache=True)
def _table_f32acc(ea, eb, ia, ib, values, w, c):
    """c[t] = ea[ia[t]] x eb[ib[t]] by the table ``values`` (float32, row e_a of 2^w),
    each column's sum in float32 in increasing k from +0 (numpy ``+``: fp_add into
    float32), NaNs canonical."""
    nout, m, n = c.shape
    k = ea.shape[2]
    for t in prange(nout * m):
        bo, i = t // m, t % m
        arow = ea[ia[bo], i]
        bmat = eb[ib[bo]]
        acc = np.zeros(n, np.float32)
        for kk in range(k):
            row = values[arow[kk] << w:(arow[kk] + 1) << w]
            ebk = bmat[kk]
            for j in range(n):
                acc[j] += row[ebk[j]]
        for j in range(n):
            c[bo, i, j] = acc[j] if acc[j] == acc[j] else np.float32(np.nan)


#: the panel kernel's columns (two AVX-512 vectors) and k of one expanded block
#: (TKC x 2^w x TP float32: 256 KiB at w = 8, in L2)
TP, TKC = 32, 8
#: rows from which the panel kernel's expansion (2^w lookups per k and column) costs
#: less than the lookups it saves (tests/test_table_multipliers.py runs both kernels)
TABLE_PANEL_ROWS = 128


@intrinsic
def _fold_panel_row(typingctx, acc, acc_off, pk, stride, ea, ea_off, kn):
    """acc[acc_off:acc_off + TP] += pk[kk · stride + ea[ea_off + kk] · TP:][:TP] for kk =
    0 .. kn - 1 in increasing order, one float32 add per column and kk, the sums in
    vector registers (1-D C arrays; numba's loop reloads them: it cannot tell acc from
    pk)."""
    sig = types.void(acc, acc_off, pk, stride, ea, ea_off, kn)
    nv = TP // 16

    def codegen(context, builder, signature, args):
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        vf = ir.VectorType(f32, 16)
        ta = signature.args

        def ptr(i, off, ty):
            data = context.make_array(ta[i])(context, builder, args[i]).data
            off = context.cast(builder, args[off], ta[off], types.int64)
            return builder.bitcast(builder.gep(data, [off]), ty.as_pointer())

        def i64_of(i):
            return context.cast(builder, args[i], ta[i], types.int64)

        accp = ptr(0, 1, f32)
        eap = ptr(4, 5, i32)
        pkp = builder.bitcast(context.make_array(ta[2])(context, builder, args[2]).data,
                              f32.as_pointer())
        stride, kn = i64_of(3), i64_of(6)
        vptr = [builder.bitcast(builder.gep(accp, [ir.Constant(i64, 16 * v)]), vf.as_pointer())
                for v in range(nv)]
        init = [builder.load(p, align=4) for p in vptr]
        pre = builder.basic_block
        loop = builder.append_basic_block("fold.loop")
        after = builder.append_basic_block("fold.after")
        builder.cbranch(builder.icmp_signed(">", kn, ir.Constant(i64, 0)), loop, after)
        builder.position_at_end(loop)
        kk = builder.phi(i64)
        kk.add_incoming(ir.Constant(i64, 0), pre)
        sums = [builder.phi(vf) for _ in range(nv)]
        for s_, x in zip(sums, init):
            s_.add_incoming(x, pre)
        e = builder.sext(builder.load(builder.gep(eap, [kk])), i64)
        row = builder.gep(pkp, [builder.add(builder.mul(kk, stride),
                                            builder.mul(e, ir.Constant(i64, TP)))])
        new = [builder.fadd(s_, builder.load(builder.bitcast(
            builder.gep(row, [ir.Constant(i64, 16 * v)]), vf.as_pointer()), align=4))
            for v, s_ in enumerate(sums)]
        kk1 = builder.add(kk, ir.Constant(i64, 1))
        end = builder.basic_block
        kk.add_incoming(kk1, end)
        for s_, x in zip(sums, new):
            s_.add_incoming(x, end)
        builder.cbranch(builder.icmp_signed("<", kk1, kn), loop, after)
        builder.position_at_end(after)
        outs = [builder.phi(vf) for _ in range(nv)]
        for out, x, y in zip(outs, init, new):
            out.add_incoming(x, pre)
            out.add_incoming(y, end)
        for p, out in zip(vptr, outs):
            builder.store(out, p, align=4)
        return context.get_dummy_value()

    return sig, codegen


@njit(parallel=True, cache=True)
def _present_codes(ea, w):
    """Per A batch and k, the encodings that column k of A holds, in increasing order:
    (codes (nA, K, 2^w) uint8 (w <= 8; at most half of ea's bytes where the panel kernel
    runs), count (nA, K))."""
    na, m, k = ea.shape
    ne = 1 << w
    codes = np.empty((na, k, ne), np.uint8)
    count = np.zeros((na, k), np.int32)
    for t in prange(na * k):
        b, kk = t // k, t % k
        seen = np.zeros(ne, np.bool_)
        for i in range(m):
            seen[ea[b, i, kk]] = True
        for e in range(ne):
            if seen[e]:
                codes[b, kk, count[b, kk]] = e
                count[b, kk] += 1
    return codes, count


@njit(parallel=True, cache=True)
def _table_panels_f32acc(ea, eb, ia, ib, values, w, c, codes, count):
    """_table_f32acc's result by 32-column panels: per block of TKC k, the panel's
    products for every encoding e_a that A's column k holds (``codes``, ``count``:
    _present_codes), P[k, e_a, j] = values[e_a, e_b[k, j]] (lookups once per panel, not
    per row), then each row adds the P rows its encodings name: two contiguous vector
    loads and adds per k.  Each sum folds k in increasing order from +0 as
    _table_f32acc's."""
    nout, m, n = c.shape
    k = ea.shape[2]
    ne = 1 << w
    npan = (n + TP - 1) // TP
    for t in prange(nout * npan):
        bo, p = t // npan, t % npan
        j0 = p * TP
        nj = min(TP, n - j0)
        eaf = ea[ia[bo]].reshape(-1)
        bmat = eb[ib[bo]]
        acc = np.zeros((m, TP), np.float32)
        accf = acc.reshape(-1)
        pk = np.zeros((TKC, ne, TP), np.float32)    # columns past nj stay +0
        pkf = pk.reshape(-1)
        for k0 in range(0, k, TKC):
            kn = min(TKC, k - k0)
            for kk in range(kn):
                ebk = bmat[k0 + kk, j0:j0 + nj]
                for u in range(count[ia[bo], k0 + kk]):
                    e = np.int64(codes[ia[bo], k0 + kk, u])
                    row = values[e << w:(e + 1) << w]
                    pr = pk[kk, e]
                    for j in range(nj):
                        pr[j] = row[ebk[j]]
            for i in range(m):
                _fold_panel_row(accf, i * TP, pkf, ne * TP, eaf, i * k + k0, kn)
        for i in range(m):
            for j in range(nj):
                v = acc[i, j]
                c[bo, i, j0 + j] = v if v == v else np.float32(np.nan)


def table_matmul_f32acc(a3, b3, ia, ib, c, fc, mp):
    """emu.matmul of a table multiplier with a float32 accumulator: operands encoded
    once, each product a lookup in the table's row of a's encoding (the fold of SM.mac,
    tests/test_table_multipliers.py); from TABLE_PANEL_ROWS rows by panels."""
    values = mp.table.astype(np.uint32).view(np.float32)
    w = int(mp.k)
    ea, eb = _encode(a3, fc), _encode(b3, fc)
    if a3.shape[1] >= TABLE_PANEL_ROWS:
        _table_panels_f32acc(ea, eb, ia, ib, values, w, c, *_present_codes(ea, w))
    else:
        _table_f32acc(ea, eb, ia, ib, values, w, c)

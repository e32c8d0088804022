"""emu.grad (both derivative kinds of Table 1) == the oracle emu.reference_grad, bit for bit.

Exhaustive over operand pairs of the 8-bit formats (with a gradient drawn per pair),
every bfloat16 value for the unary derivatives, random float32 and corner cases,
and the PAM-matmul gradient folds (fast paths included) against the elementwise
definition folded in order.
"""
import numpy as np
import pytest

import emu
import emu.grad as G
import emu.reference_grad as RG
from conftest import FP8, all_values, assert_bits_equal, corner_values

UNARY = [op.name for op in emu.registry.ops(1, differentiable=True)]
KINDS = ["exact", "approx"]


def oracle_binary(op, fmt, kind, a, b, d):
    f = emu.OPS[op].oracle_grad
    res = [f(float(x), float(y), float(g), fmt, kind) for x, y, g in zip(a, b, d)]
    return np.array([r[0] for r in res], np.float32), np.array([r[1] for r in res], np.float32)


def oracle_unary(op, fmt, kind, x, d):
    f = emu.OPS[op].oracle_grad
    return np.array([f(float(v), float(g), fmt, kind) for v, g in zip(x, d)], np.float32)


@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("op", ["pam_mul", "pa_div"])
def test_exact_binary_exhaustive_8bit(fmt, op, rng):
    v = all_values(fmt)
    a, b = (x.ravel() for x in np.meshgrid(v, v, indexing="ij"))
    d = v[rng.integers(0, v.size, a.size)]        # every pair, a gradient drawn per pair
    da, db = getattr(G, op)(a, b, d, fmt, "exact")
    wa, wb = RG.exact_vec(op, a, b, d, fmt=fmt)
    assert_bits_equal(da, wa, a, b, d, what=f"d{op}/da exact {fmt}")
    assert_bits_equal(db, wb, a, b, d, what=f"d{op}/db exact {fmt}")


@pytest.mark.parametrize("fmt,kind", [(f, "exact") for f in FP8 + ["e2m1", "e3m2fn", "e5m3"]]
                         + [(f, "approx") for f in ["float8_e5m2", "float8_e4m3fn", "e2m1"]])
def test_unary_exhaustive_small_formats(fmt, kind):
    v = all_values(fmt)
    x, d = (t.ravel() for t in np.meshgrid(v, v[::41], indexing="ij"))
    for op in UNARY:
        assert_bits_equal(getattr(G, op)(x, d, fmt, kind), oracle_unary(op, fmt, kind, x, d),
                          x, d, what=f"{op}' {kind} {fmt}")


@pytest.mark.parametrize("op", ["pa_exp2", "pa_log2", "pa_sqrt"])
def test_exact_unary_every_bfloat16(op, rng):
    x = all_values("bfloat16")
    d = x[rng.integers(0, x.size, x.size)]
    assert_bits_equal(getattr(G, op)(x, d, "bf16", "exact"), RG.exact_vec(op, x, d, fmt="bf16"),
                      x, d, what=f"{op}' exact bf16")


def samples(fmt, rng, n):
    """Corner values of fmt and n random values of it (every exponent)."""
    f = emu.format(fmt)
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    with np.errstate(over="ignore"):
        x = emu.quantize(bits.view(np.float32), f)
        y = emu.quantize(rng.standard_normal(n).astype(np.float32), f)
    return np.concatenate([corner_values(f), x, y])


@pytest.mark.parametrize("fmt", ["float32", "bf16", "float16", "e4m3fn", "e8m4"])
@pytest.mark.parametrize("kind", KINDS)
def test_random_and_corners(fmt, kind, rng):
    """Both kinds against the Fraction oracle; the vectorised oracle against it too."""
    x = samples(fmt, rng, 400)
    y = rng.permutation(x)
    d = rng.permutation(x)
    for op in ("pam_mul", "pa_div"):
        da, db = getattr(G, op)(x, y, d, fmt, kind)
        wa, wb = oracle_binary(op, fmt, kind, x, y, d)
        assert_bits_equal(da, wa, x, y, d, what=f"d{op}/da {kind} {fmt}")
        assert_bits_equal(db, wb, x, y, d, what=f"d{op}/db {kind} {fmt}")
        if kind == "exact":
            va, vb = RG.exact_vec(op, x, y, d, fmt=fmt)
            assert_bits_equal(va, wa, x, y, d, what=f"vectorised oracle d{op}/da {fmt}")
            assert_bits_equal(vb, wb, x, y, d, what=f"vectorised oracle d{op}/db {fmt}")
    for op in UNARY:
        want = oracle_unary(op, fmt, kind, x, d)
        assert_bits_equal(getattr(G, op)(x, d, fmt, kind), want, x, d, what=f"{op}' {kind} {fmt}")
        if kind == "exact" and op in ("pa_exp2", "pa_log2", "pa_sqrt"):
            assert_bits_equal(RG.exact_vec(op, x, d, fmt=fmt), want, x, d,
                              what=f"vectorised oracle {op}' {fmt}")


def test_inputs_are_rounded_like_the_forward_ops(rng):
    """Unrounded float32 operands are rounded to fmt (RNE) first, δ_Y included."""
    x = rng.standard_normal(500).astype(np.float32)
    y = rng.standard_normal(500).astype(np.float32)
    d = rng.standard_normal(500).astype(np.float32)
    q = lambda v: emu.quantize(v, "e8m3")             # noqa: E731
    for kind in KINDS:
        for got, want in zip(G.pa_div(x, y, d, "e8m3", kind), G.pa_div(q(x), q(y), q(d), "e8m3",
                                                                       kind)):
            assert_bits_equal(got, want)
        assert_bits_equal(G.pa_exp(x, d, "e8m3", kind), G.pa_exp(q(x), q(d), "e8m3", kind))


def test_table1_values():
    """Table 1 by hand: the slopes are the powers of two the paper writes down."""
    one = np.float32(1)
    # A ·̂ B, M_A + M_B >= 1 carries: δ_A = 2^(E_B + 1)
    assert G.pam_mul(1.5, 1.5, one)[0] == 2.0 and G.pam_mul(1.25, 3.0, one) == (2.0, 1.0)
    assert G.pam_mul(0.0, -3.0, one) == (-2.0, 0.0)      # ∂/∂A at 0 is the piece's slope
    # A ÷̂ B: δ_A = 2^(-E_B - 1{M_A < M_B}),  δ_B = -2^(E_A - 2 E_B - 1{M_A < M_B})
    assert G.pa_div(3.0, 1.25, one) == (1.0, -2.0) and G.pa_div(1.0, 1.5, one) == (0.5, -0.5)
    assert G.pa_exp2(-0.75, one) == 0.5 and G.pa_exp2(3.5, one) == 8.0
    assert G.pa_log2(3.0, one) == 0.5 and G.pa_log2(0.0, one) == np.inf
    assert G.pa_sqrt(4.0, one) == 0.25 and G.pa_sqrt(1.0, one) == 0.5
    assert G.pa_exp(float("-inf"), one) == 0.0              # masked attention logits
    assert G.pam_mul(1.5, 1.5, one, kind="approx")[0] == 1.5
    assert G.ln2("bf16") == np.float32(0.69140625) and G.ln2("float32") == np.float32(np.log(2))


def test_bad_kind_and_shapes():
    with pytest.raises(ValueError, match="kind='mimic'; expected one of"):
        G.pam_mul(1.0, 2.0, 1.0, kind="mimic")
    with pytest.raises(ValueError, match="could not be broadcast"):
        G.pa_exp2(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match=r"dY.shape=\(2, 2\) must be the shape"):
        G.pam_matmul(np.ones((2, 3)), np.ones((3, 4)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="fmt='bf17' is not a format"):
        G.pam_matmul(np.ones((2, 3)), np.ones((3, 4)), np.ones((2, 4)), fmt="bf17")


# --- PAM matmul gradients ------------------------------------------------------------

def matmul_case(rng, m, k, n, fmt, specials):
    A = emu.quantize(rng.standard_normal((m, k)).astype(np.float32) * 4, fmt)
    B = emu.quantize(rng.standard_normal((k, n)).astype(np.float32), fmt)
    dY = rng.standard_normal((m, n)).astype(np.float32)
    if specials:
        c = corner_values(fmt)
        for X in (A, B, dY):
            idx = rng.integers(0, X.size, max(1, X.size // 6))
            X.flat[idx] = c[rng.integers(0, c.size, idx.size)]
    return A, B, dY


@pytest.mark.parametrize("fmt,acc", [("float32", "float32"), ("bf16", "float32"),
                                     ("e4m3fn", "float32"), ("e5m2", "bf16"),
                                     ("bf16", "e4m3fn")])
@pytest.mark.parametrize("kind", KINDS)
def test_matmul_grad_matches_fraction_fold(fmt, acc, kind, rng):
    for specials in (False, True):
        A, B, dY = matmul_case(rng, 5, 6, 7, fmt, specials)
        da, db = G.pam_matmul(A, B, dY, fmt, acc, kind)
        wa, wb = RG.pam_matmul(A.tolist(), B.tolist(), dY.tolist(), fmt, acc, kind)
        assert_bits_equal(da, np.array(wa, np.float32), what=f"dA {kind} {fmt}/{acc}")
        assert_bits_equal(db, np.array(wb, np.float32), what=f"dB {kind} {fmt}/{acc}")


def fold(terms, axis):
    """Sequential float32 fold from +0.0 along ``axis`` (numpy + is IEEE binary32)."""
    terms = np.moveaxis(terms, axis, 0)
    acc = np.zeros(terms.shape[1:], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for t in terms:
            acc = acc + t
    return acc


def elementwise_fold(A, B, dY, fmt, kind):
    """δA and δB as the folds of the elementwise derivatives (already checked above)."""
    a = A[:, :, None]
    b = B[None, :, :]
    d = dY[:, None, :]
    ta, tb = G.pam_mul(a, b, d, fmt, kind)
    return fold(ta, 2), fold(tb, 0)


@pytest.mark.parametrize("fmt", ["float32", "bf16", "e5m2", "e4m3fn"])
@pytest.mark.parametrize("case", ["clean", "zeros", "ranges", "overflow", "specials"])
def test_exact_matmul_fast_paths(fmt, case, rng):
    """The vectorised fast paths (clean, masked, skip, and in fp8 flush and overflow of
    finite terms) agree with the elementwise fold."""
    m, k, n = 37, 45, 70
    A, B, dY = matmul_case(rng, m, k, n, fmt, case == "specials")
    dY = emu.quantize(dY, fmt)
    if case == "zeros":
        B[rng.random(B.shape) < 0.3] = 0.0
        B[:, 3] = 0.0
        dY[rng.random(dY.shape) < 0.2] = -0.0
        A[rng.random(A.shape) < 0.2] = 0.0
    if case == "ranges":      # products that overflow or flush next to clean ones
        f = emu.format(fmt)
        B[::3] *= np.float32(f.max / 8)
        dY[::4] *= np.float32(f.smallest_normal * 4)
        A = emu.quantize(A, fmt)
        B = emu.quantize(B, fmt)
        dY = emu.quantize(dY, fmt)
    if case == "overflow":    # finite terms above fmt's max in some blocks, flushes in others
        f = emu.format(fmt)
        with np.errstate(over="ignore"):        # float32/bf16: some become inf
            B[::3] = emu.quantize(B[::3] * np.float32(f.max / 4), fmt)
            A[:, ::3] = emu.quantize(A[:, ::3] * np.float32(f.max / 4), fmt)
        dY[::2] = emu.quantize(dY[::2] * np.float32(8), fmt)
    da, db = G.pam_matmul(A, B, dY, fmt, kind="exact")
    wa, wb = elementwise_fold(A, B, dY, fmt, "exact")
    assert_bits_equal(da, wa, what=f"dA {case}")
    assert_bits_equal(db, wb, what=f"dB {case}")


def test_exact_matmul_blocked_edges(rng):
    """The register-blocked exact fold (float32 accumulator) across its task and pass
    edges (rows > 128, k > 256, columns > 1024), with a NaN in one row of A, zeros in
    B, and a row of B near float32's top exponent where 2^(E_b + 1) is not finite
    (those terms take the scalar definition): dA against the per-k fold of the
    elementwise derivative."""
    M, K, N = 133, 1030, 260
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    dY = rng.standard_normal((M, N)).astype(np.float32)
    A[70, 900] = np.nan
    B[rng.random(B.shape) < 0.01] = 0.0
    # one k group of B's transpose near the top binade, tiny gradients: every term is in
    # range, but 2^(E_b + carry) reaches 2^128 where A's mantissa carries
    B[:, 200:208] = (rng.uniform(1, 2, (K, 8)) * rng.choice([-1, 1], (K, 8)) * 2.0 ** 127
                     ).astype(np.float32)
    dY[:, 200:208] = (rng.uniform(1, 2, (M, 8)) * 2.0 ** -110).astype(np.float32)
    da, _ = G.pam_matmul(A, B, dY, "float32", kind="exact", need=(True, False))
    want = np.zeros((M, K), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(N):
            ta, _ = G.pam_mul(A, B[:, j], dY[:, j:j + 1], "float32", "exact")
            want = want + ta
    assert np.isfinite(want[:, :10]).all() and np.isnan(want[70]).any()
    assert_bits_equal(da, want, what="dA")


def test_approx_matmul_is_pam_matmul_of_transposes(rng):
    A, B, dY = matmul_case(rng, 33, 20, 17, "bf16", True)
    da, db = G.pam_matmul(A, B, dY, "bf16", kind="approx")
    assert_bits_equal(da, emu.pam_matmul(dY, B.T, "bf16"))
    assert_bits_equal(db, emu.pam_matmul(A.T, dY, "bf16"))
    assert_bits_equal(db, emu.pam_matmul(dY.T, A, "bf16").T)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sa,sb", [((2, 3, 4, 5), (5, 6)), ((3, 4, 5), (2, 1, 5, 6)),
                                   ((4,), (2, 4, 3)), ((2, 3, 4), (4,)), ((4,), (4,)),
                                   ((1, 3, 4), (2, 1, 4, 3))])
def test_matmul_grad_broadcasting_folds_reduced_batches(kind, sa, sb, rng):
    """A broadcast operand's gradient is one fold over (its broadcast batch indices in
    C order, then the contracted index): compare with explicit 2-D folds."""
    A = emu.quantize(rng.standard_normal(sa).astype(np.float32), "bf16")
    B = emu.quantize(rng.standard_normal(sb).astype(np.float32), "bf16")
    Y = np.matmul(A, B)
    dY = rng.standard_normal(Y.shape).astype(np.float32)
    da, db = G.pam_matmul(A, B, dY, "bf16", kind=kind)
    assert da.shape == A.shape and db.shape == B.shape
    # reference: promote to full batch, list the reduction indices explicitly
    a2 = A[None] if A.ndim == 1 else A
    b2 = B[:, None] if B.ndim == 1 else B
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    af = np.broadcast_to(a2, batch + a2.shape[-2:])
    bf = np.broadcast_to(b2, batch + b2.shape[-2:])
    g = dY.reshape(batch + (a2.shape[-2], b2.shape[-1]))
    ta, tb = G.pam_mul(af[..., :, :, None], bf[..., None, :, :], g[..., :, None, :], "bf16",
                       kind)                       # (batch, M, K, N)

    def reduce(t, own_batch, axis):
        ob = (1,) * (len(batch) - len(own_batch)) + own_batch
        red = [d for d in range(len(batch)) if ob[d] == 1 and batch[d] != 1]
        keep = [d for d in range(len(batch)) if d not in red]
        nd = len(batch)
        t = np.moveaxis(t, nd + axis, -1)          # contracted index last
        t = t.transpose(*keep, nd, nd + 1, *red, nd + 2)
        t = t.reshape(t.shape[:len(keep) + 2] + (-1,))
        return fold(t, -1)
    wa = reduce(ta, a2.shape[:-2], 2).reshape(A.shape)
    wb = reduce(tb, b2.shape[:-2], 0).reshape(B.shape)
    assert_bits_equal(da, wa, what=f"dA {sa} {sb}")
    assert_bits_equal(db, wb, what=f"dB {sa} {sb}")


def test_e8_formats_need_no_second_rounding(rng):
    """For E = 8 formats PAM (and its exact derivative) on values of the format is the
    same in float32: the bridge rounds operands once and calls the float32 kernels."""
    A, B, dY = matmul_case(rng, 40, 30, 20, "e8m3", True)
    dY = emu.quantize(dY, "e8m3")
    assert_bits_equal(emu.pam_matmul(A, B, "float32"), emu.pam_matmul(A, B, "e8m3"))
    for kind in KINDS:
        for x, y in zip(G.pam_matmul(A, B, dY, "float32", kind=kind),
                        G.pam_matmul(A, B, dY, "e8m3", kind=kind)):
            assert_bits_equal(x, y, what=kind)


def test_empty_and_need(rng):
    da, db = G.pam_matmul(np.ones((0, 3)), np.ones((3, 4)), np.ones((0, 4)), kind="exact")
    assert da.shape == (0, 3) and db.shape == (3, 4) and not db.any()
    da, db = G.pam_matmul(np.ones((2, 0)), np.ones((0, 4)), np.ones((2, 4)), kind="exact")
    assert da.shape == (2, 0) and db.shape == (0, 4)
    da, db = G.pam_matmul(np.ones((2, 3)), np.ones((3, 4)), np.ones((2, 4)), need=(False, True))
    assert da is None and db.shape == (3, 4)

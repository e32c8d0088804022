"""pam_matmul: the sequential-k fold of the spec, np.matmul's shape rules, bad input."""
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import emu
import emu.reference as R
from conftest import assert_bits_equal


def with_specials(x, rng, fmt, frac=0.08):
    """Sprinkle zeros, subnormals, infinities, NaNs, huge and tiny values into x."""
    f = emu.format(fmt)
    x = x.copy()
    flat = x.reshape(-1)
    pool = [0.0, -0.0, f.smallest_subnormal, -f.smallest_normal, f.max, -f.max / 3,
            f.smallest_normal * 1.5, np.nan, f.max ** 0.5 * 1.7, f.smallest_normal ** 0.5]
    if f.has_inf:
        pool += [np.inf, -np.inf]
    idx = rng.random(flat.size) < frac
    flat[idx] = rng.choice(np.float32(pool), idx.sum())
    return x


def fraction_fold(A, B, fmt, acc):
    A3 = A.reshape(-1, *A.shape[-2:])
    return np.array([R.pam_matmul(a.tolist(), B.tolist(), fmt, acc) for a in A3],
                    np.float32).reshape(A.shape[:-1] + (B.shape[-1],))


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("acc", ["float32", "bfloat16", "float16", "float8_e4m3fn"])
def test_matches_fraction_fold_with_specials(fmt, acc, rng):
    A = with_specials(rng.standard_normal((2, 6, 21)).astype(np.float32), rng, fmt)
    B = with_specials(rng.standard_normal((21, 5)).astype(np.float32), rng, fmt)
    A[1, 2] = 0.0                                   # a zero row: skipped products
    assert_bits_equal(emu.pam_matmul(A, B, fmt, acc), fraction_fold(A, B, fmt, acc),
                      what=f"pam_matmul {fmt}/{acc}")


def vector_fold(A, B, fmt):
    """Independent float32-accumulation fold: exact products from the vectorised oracle,
    numpy float32 additions in increasing k."""
    dt = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[fmt]   # operand rounding
    Aq = A.astype(dt).astype(np.float32)
    Bq = B.astype(dt).astype(np.float32)
    C = np.zeros((A.shape[0], B.shape[1]), np.float32)
    with np.errstate(all="ignore"):
        for k in range(A.shape[1]):
            C = C + R.pam_mul_vec(Aq[:, k, None], Bq[None, k, :], fmt)
    return C


TILED_CASES = ["dense", "relu_a", "relu_b", "mixed"]


def tiled_operands(case, rng):
    """Sizes that cross every tile edge (M past one 128-row task and not a multiple of
    the micro-kernel's 4 or 8 rows, N past one 1024-column block and not a multiple of
    the panel width, K past two 256-k passes and not a multiple of the 8-k statistics
    group), with data for each kernel path: clean, masked (zeros in A, in B, in both),
    skipped (all-zero blocks) and general (NaN/inf/overflow/flush in some blocks)."""
    A = rng.standard_normal((131, 523)).astype(np.float32)
    B = rng.standard_normal((523, 1030)).astype(np.float32)
    if case == "relu_a":
        A = np.maximum(A, 0)
    if case == "relu_b":
        B = np.maximum(B, 0)
    if case == "mixed":
        A[5, 17] = np.inf
        A[7, 40:48] = 1e30                  # overflow with large B entries in some blocks
        A[9, 3] = 1e-30                     # flush against small B entries
        B[11, 1029] = np.nan
        B[100, 3] = 3e9
        B[150, 600] = 1e-20
        A[20] = np.maximum(A[20], 0)
        B[60] = np.maximum(B[60], 0)
        A[:8, 256:320] = 0                  # whole zero blocks of A and of B: skipped
        B[400:416] = 0
    return A, B


@pytest.mark.parametrize("fmt", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", TILED_CASES)
def test_tiled_fast_paths_match_the_fold(fmt, case, rng):
    A, B = tiled_operands(case, rng)
    assert_bits_equal(emu.pam_matmul(A, B, fmt), vector_fold(A, B, fmt), what=f"{fmt} {case}")


_OTHER_WIDTH = """
import sys, numpy as np, emu
from emu import _kernels as K
assert (K.W, K.QR, K.PW) == ({w}, {qr}, {pw}), (K.W, K.QR, K.PW)
for i in range({n}):
    A, B = np.load(f"{{sys.argv[1]}}/a{{i}}.npy"), np.load(f"{{sys.argv[1]}}/b{{i}}.npy")
    np.save(f"{{sys.argv[1]}}/c{{i}}.npy", emu.pam_matmul(A, B))
"""


def test_other_vector_width_gives_the_same_bits(tmp_path, rng):
    """The micro-kernel configuration this host does not pick (8 lanes x 4 rows or
    16 lanes x 8 rows) gives the default's bits on every kernel path, run in a
    subprocess with PAMSIM_VECTOR_LANES and its own Numba cache."""
    from emu import _kernels as K
    w = 8 if K.W == 16 else 16
    for i, case in enumerate(TILED_CASES):
        A, B = tiled_operands(case, rng)
        np.save(tmp_path / f"a{i}.npy", A)
        np.save(tmp_path / f"b{i}.npy", B)
    # 8 lanes: the cache `make test`'s 8-lane rerun uses (Makefile), so its kernels compile once
    cache = Path(sys.prefix) / "numba-cache-8-lanes" if w == 8 else tmp_path / "nb"
    env = dict(os.environ, PAMSIM_VECTOR_LANES=str(w), NUMBA_CACHE_DIR=str(cache))
    script = _OTHER_WIDTH.format(w=w, qr=4 if w == 8 else 8, pw=2 * w, n=len(TILED_CASES))
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, check=True)
    for i, case in enumerate(TILED_CASES):
        A, B = np.load(tmp_path / f"a{i}.npy"), np.load(tmp_path / f"b{i}.npy")
        assert_bits_equal(np.load(tmp_path / f"c{i}.npy"), emu.pam_matmul(A, B),
                          what=f"{w} lanes, {case}")


def test_bad_vector_width_is_a_clear_error():
    env = dict(os.environ, PAMSIM_VECTOR_LANES="12")
    r = subprocess.run([sys.executable, "-c", "import emu"], env=env, capture_output=True,
                       text=True)
    assert r.returncode != 0 and "PAMSIM_VECTOR_LANES must be 8 or 16, got '12'" in r.stderr


def test_long_accumulation_order(rng):
    """K = 4096 with cancelling terms: any reordering of k would change the bits."""
    A = (rng.standard_normal((3, 4096)) * 2.0 ** rng.integers(-20, 20, (3, 4096))).astype(np.float32)
    B = rng.standard_normal((4096, 9)).astype(np.float32)
    assert_bits_equal(emu.pam_matmul(A, B), vector_fold(A, B, "float32"), what="K=4096")
    reordered = emu.pam_matmul(A[:, ::-1], B[::-1])
    assert not np.array_equal(reordered, emu.pam_matmul(A, B))


SHAPES = [((4, 5), (5, 3)), ((5,), (5, 3)), ((4, 5), (5,)), ((5,), (5,)),
          ((2, 4, 5), (5, 3)), ((4, 5), (3, 5, 2)), ((3, 1, 4, 5), (2, 5, 6)),
          ((1, 4, 5), (7, 5, 6)), ((2, 3, 4, 5), (5,)), ((5,), (2, 5, 3))]


@pytest.mark.parametrize("sa,sb", SHAPES)
def test_shapes_follow_np_matmul(sa, sb, rng):
    A = rng.standard_normal(sa).astype(np.float32)
    B = rng.standard_normal(sb).astype(np.float32)
    C = emu.pam_matmul(A, B, "bf16")
    assert C.shape == np.matmul(A, B).shape and C.dtype == np.float32
    # every batch element equals the 2-D product of its (broadcast) operands
    A2 = A[None, :] if A.ndim == 1 else A
    B2 = B[:, None] if B.ndim == 1 else B
    batch = np.broadcast_shapes(A2.shape[:-2], B2.shape[:-2])
    Ab = np.broadcast_to(A2, batch + A2.shape[-2:])
    Bb = np.broadcast_to(B2, batch + B2.shape[-2:])
    want = np.stack([emu.pam_matmul(a, b, "bf16") for a, b in
                     zip(Ab.reshape(-1, *A2.shape[-2:]), Bb.reshape(-1, *B2.shape[-2:]))])
    assert np.array_equal(C.reshape(-1), want.reshape(-1))


@pytest.mark.parametrize("acc", ["float32", "bf16", "fp16"])
@pytest.mark.parametrize("mul", ["pam", "lmul", "exact"])
def test_broadcast_views_are_read_once(acc, mul, rng):
    """Stride-0 dimensions (batch, rows of A, columns of B, and k in both) give the bits
    of the materialised operands without being copied out."""
    a = rng.standard_normal((3, 1, 5, 40)).astype(np.float32)
    b = rng.standard_normal((1, 4, 40, 6)).astype(np.float32)
    row = rng.standard_normal((1, 1, 40)).astype(np.float32)
    col = rng.standard_normal((40, 1)).astype(np.float64)           # converted once
    x = np.float32([[1.7], [-0.3], [3e-3], [0.0], [-np.inf]])
    y = np.float32([[0.9, -2.5, 1e-30]])
    for A, B in ((np.broadcast_to(a, (3, 4, 5, 40)), np.broadcast_to(b, (3, 4, 40, 6))),
                 (np.broadcast_to(row, (2, 7, 40)), np.broadcast_to(col, (40, 9))),
                 (np.broadcast_to(x, (5, 3000)), np.broadcast_to(y, (3000, 3)))):
        assert_bits_equal(emu.matmul(A, B, "bf16", acc, mul=mul),
                          emu.matmul(A.copy(), B.copy(), "bf16", acc, mul=mul))


def test_huge_broadcast_k_stops_when_the_sum_does():
    """The issue's (8, 10^10) views: 8 x 8 results without copying 298 GiB; the sum of
    equal products stops changing (float32: 1.0 added stays at 2^24, bfloat16 at 2^8).
    Copied out, the operands' patterns would not fit (a MemoryError naming the op)."""
    x = np.broadcast_to(np.float32(1.5), (8, 10 ** 10))
    y = np.broadcast_to(np.float32(0.75), (10 ** 10, 8))       # PAM(1.5, 0.75) = 1.0
    assert (emu.matmul(x, y, "bf16", "bf16") == 256).all()
    assert emu.pam_matmul(x[:1], y[:, :1], "bf16")[0, 0] == 2.0 ** 24


def test_empty_and_zero_k():
    assert np.array_equal(emu.pam_matmul(np.ones((3, 0)), np.ones((0, 4))), np.zeros((3, 4)))
    assert emu.pam_matmul(np.ones((0, 5)), np.ones((5, 4))).shape == (0, 4)
    assert emu.pam_matmul(np.ones((2, 0, 5)), np.ones((5, 4))).shape == (2, 0, 4)
    assert emu.pam_matmul(np.ones((0, 3, 5)), np.ones((5, 4))).shape == (0, 3, 4)
    z = emu.pam_matmul(np.ones((3, 0)), np.ones((0, 4)))
    assert not np.signbit(z).any()


def test_non_contiguous_and_dtypes(rng):
    A = rng.standard_normal((40, 30)).astype(np.float32)
    B = rng.standard_normal((40, 50)).astype(np.float32)
    want = emu.pam_matmul(np.ascontiguousarray(A.T), B, "bf16")
    assert np.array_equal(emu.pam_matmul(A.T, B, "bf16"), want)
    assert np.array_equal(emu.pam_matmul(A.T.astype(np.float16), B[:, ::2], "e4m3fn"),
                          emu.pam_matmul(np.ascontiguousarray(A.T.astype(np.float16)),
                                         np.ascontiguousarray(B[:, ::2]), "e4m3fn"))


def test_nan_is_canonical():
    A = np.float32([[np.inf, 1.0], [np.nan, 0.0]])
    B = np.float32([[-np.inf, 0.0], [np.inf, 0.0]])     # -inf + inf, inf * 0, NaN * x
    C = emu.pam_matmul(A, B)
    assert np.isnan(C).all()
    assert np.all(C.view(np.uint32) == 0x7FC00000)


def test_narrow_fn_accumulator_overflows_to_nan():
    A = np.full((1, 4), 16.0, np.float32)
    B = np.full((4, 1), 16.0, np.float32)
    assert emu.pam_matmul(A[:, :1], B[:1], "e4m3fn", "e4m3fn")[0, 0] == 256.0
    assert np.isnan(emu.pam_matmul(A, B, "e4m3fn", "e4m3fn")[0, 0])     # 512 > 448


@pytest.mark.parametrize("A,B,match", [
    (np.ones((3, 4)), np.ones((5, 2)), r"contracted dimensions differ: A.shape=\(3, 4\) has K=4"),
    (np.ones(()), np.ones((2, 2)), "at least one dimension"),
    (np.ones((2, 3, 4)), np.ones((5, 4, 2)), "batch dimensions do not broadcast"),
])
def test_bad_shapes(A, B, match):
    with pytest.raises(ValueError, match=match):
        emu.pam_matmul(A, B)


def test_bad_formats_and_dtypes():
    with pytest.raises(ValueError, match="acc='float64'"):
        emu.pam_matmul(np.ones((2, 2)), np.ones((2, 2)), acc="float64")
    with pytest.raises(ValueError, match="fmt='int8'"):
        emu.pam_matmul(np.ones((2, 2)), np.ones((2, 2)), fmt="int8")
    with pytest.raises(TypeError, match="A must have a real floating dtype"):
        emu.pam_matmul(np.array([["a"]]), np.ones((1, 1)))

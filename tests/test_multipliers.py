"""Multipliers as data (emu/multipliers.py, docs/semantics.md "Multipliers"): names,
kernel == oracle bit for bit (exhaustive for 8-bit formats, random pairs and every
special value for the wider ones), L-Mul == its published float32 formula, ``mul="pam"``
== emu.pam_mul, the shipped corrected-PAM tables optimal, and the error statistics."""
import math
from fractions import Fraction

import numpy as np
import pytest

import emu
import emu.multipliers as EM
import emu.reference as R
import emu.reference_mul as RM
from conftest import all_values, assert_bits_equal, corner_values

EIGHT_BIT = ["float8_e4m3fn", "float8_e5m2", "e3m2", "float8_e4m3fnuz", "float4_e2m1fn"]
WIDE = ["bfloat16", "float16", "float32"]
#: exhaustive against the oracle in CI: lmul, exact and float on every 8-bit format, each
#: other member on one; the other (member, format) pairs are marked slow (7 to 15 s each:
#: the oracle is Fractions)
CI_EXHAUSTIVE = {"lmul", "exact", "float"}
MEMBERS = ["pam", "lmul", "lmul+3", "pam-2", "lmul-5", "exact", "float", "cpam1-unbiased",
           "cpam1-minimax", "cpam2-unbiased", "cpam2-minimax", "cpam1:3,-2,1,0"]
CI_ONE_FORMAT = {"pam-2": "float8_e4m3fn", "lmul+3": "float8_e4m3fnuz",
                 "cpam2-unbiased": "float8_e5m2", "cpam1:3,-2,1,0": "e3m2",
                 "lmul-5": "float8_e5m2", "cpam1-minimax": "float8_e4m3fnuz",
                 "cpam1-unbiased": "float4_e2m1fn", "cpam2-minimax": "float8_e4m3fn"}


def applies(mul, fmt) -> bool:
    m = emu.multiplier(mul)
    man = emu.format(fmt).man_bits
    return m.kind != "cpam" or (m.k <= man and (isinstance(m.table, tuple)
                                                 or man <= EM.CPAM_MAX_MAN_BITS))


def oracle(mul, fmt, a, b):
    m = emu.multiplier(mul)
    return np.array([RM.mul(float(x), float(y), fmt, m) for x, y in zip(a, b)], np.float32)


def exhaustive_cases():
    for mul in MEMBERS:
        for fmt in EIGHT_BIT:
            if not applies(mul, fmt) or mul == "pam":      # pam: == emu.pam_mul, below
                continue
            ci = mul in CI_EXHAUSTIVE or CI_ONE_FORMAT.get(mul) == fmt
            yield pytest.param(mul, fmt, marks=() if ci else pytest.mark.slow)


@pytest.mark.parametrize("mul,fmt", list(exhaustive_cases()))
def test_exhaustive_8bit_kernel_equals_oracle(mul, fmt):
    v = all_values(fmt)
    a, b = (x.ravel() for x in np.meshgrid(v, v, indexing="ij"))
    assert_bits_equal(emu.mul(a, b, fmt, mul), oracle(mul, fmt, a, b), a, b,
                      what=f"{mul} {fmt}")


@pytest.mark.parametrize("fmt", EIGHT_BIT + WIDE)
def test_pam_is_pam_mul(fmt, rng):
    """mul="pam" is emu.pam_mul: every pair of an 8-bit format, random pairs else."""
    if emu.format(fmt).width <= 8:
        v = all_values(fmt)
        a, b = (x.ravel() for x in np.meshgrid(v, v, indexing="ij"))
    else:
        a, b = rng.standard_normal((2, 100_000)).astype(np.float32) * 3
    assert_bits_equal(emu.mul(a, b, fmt), emu.pam_mul(a, b, fmt), a, b, what=fmt)
    assert_bits_equal(emu.mul(a, b, fmt, "pam"), emu.pam_mul(a, b, fmt), a, b, what=fmt)


def wide_operands(fmt, rng, n=1500):
    """Random values of every magnitude, and every pair of the format's corner values."""
    fmt = emu.format(fmt)
    x = emu.quantize(np.exp2(rng.uniform(-20, 20, (2, n))) * rng.choice([-1, 1], (2, n)), fmt)
    c = corner_values(fmt)
    ca, cb = (v.ravel() for v in np.meshgrid(c, c, indexing="ij"))
    return np.concatenate([x[0], ca]).astype(np.float32), np.concatenate([x[1], cb]).astype(np.float32)


WIDE_MEMBERS = ["lmul", "pam+5", "lmul-3", "exact", "float", "cpam2-unbiased", "cpam3-minimax",
                "cpam1:-7,40,3,1"]


@pytest.mark.parametrize("mul,fmt", [(m, f) for m in WIDE_MEMBERS for f in WIDE
                                     if applies(m, f)])   # no shipped cpam table for float32
def test_wide_formats_random_and_special(mul, fmt, rng):
    a, b = wide_operands(fmt, rng)
    assert_bits_equal(emu.mul(a, b, fmt, mul), oracle(mul, fmt, a, b), a, b,
                      what=f"{mul} {fmt}")


def test_lmul_is_the_published_float32_formula(rng):
    """(|a|bits + |b|bits - 0x3F780000) with the sign XORed, on normal operands whose
    product is normal (Luo & Sun's kernel; Kosson & Jaggi's with offset 0x80000)."""
    a, b = (np.exp2(rng.uniform(-60, 60, (2, 200_000))) * rng.choice([-1, 1], (2, 200_000))
            ).astype(np.float32)
    ua, ub = (x.view(np.uint32).astype(np.int64) for x in (a, b))
    mag = (ua & 0x7FFFFFFF) + (ub & 0x7FFFFFFF) - 0x3F780000
    want = (mag | ((ua ^ ub) & 0x80000000)).astype(np.uint32).view(np.float32)
    assert_bits_equal(emu.mul(a, b, "float32", "lmul"), want, a, b, what="L-Mul formula")


def test_lmul_levels():
    """l(M) = M for M <= 3, 3 for M = 4, 4 for M > 4: 1.5 x 1.5 = 2 (PAM) + 2 * 2^-l."""
    for fmt, level in [("e2m1", 1), ("e4m3fn", 3), ("e3m4", 3), ("bf16", 4), ("float32", 4)]:
        assert emu.mul(1.5, 1.5, fmt, "lmul") == 2 + 2 * 2.0 ** -level, fmt
        assert RM.lmul_constant(emu.format(fmt).man_bits) == Fraction(1, 2 ** level)


def test_offsets_carry_into_the_exponent_and_overflow():
    # 1.75 x 1 + 2 ULPs of e4m3fn (M = 3): the mantissa field carries into the exponent
    assert emu.mul(1.75, 1.0, "e4m3fn", "pam+2") == 2.0
    assert emu.mul(1.0, 1.0, "e4m3fn", "pam-1") == 0.9375          # a borrow
    assert emu.mul(448.0, 1.0, "e4m3fn", "lmul") == 448.0          # fn: saturates at max
    assert emu.mul(57344.0, 1.0, "e5m2", "lmul") == math.inf        # ieee: overflows to inf
    assert emu.mul(-2.0 ** -14, 1.0, "float16", "pam-1") == 0.0     # flushed, sign kept
    assert math.copysign(1, emu.mul(-2.0 ** -14, 1.0, "float16", "pam-1")) == -1
    assert math.copysign(1, emu.mul(-2.0 ** -7, 1.0, "e4m3fnuz", "pam-1")) == 1   # no -0


# --- names ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", [*emu.MULTIPLIERS, "pam+3", "pam-2", "lmul+12", "lmul-1",
                                  "cpam1:0,1,-1,0", "cpam2:" + ",".join(map(str, range(16)))])
def test_names_round_trip(name):
    m = emu.multiplier(name)
    assert str(m) == name and emu.multiplier(m) is m and emu.multiplier(str(m)) == m
    assert isinstance(hash(m), int)


def test_registry_members():
    assert {"pam", "lmul", "exact", "float", "cpam1-unbiased", "cpam2-minimax",
            "cpam3-unbiased"} <= set(emu.MULTIPLIERS)
    assert emu.multiplier("lmul") == emu.Multiplier("lmul")
    assert emu.multiplier("pam+3") == emu.Multiplier("pam", offset=3)


@pytest.mark.parametrize("name", ["", "PAM", "pamm", "pam+", "pam+0", "pam+03", "pam+1.5",
                                  "lmul+99999999", "exact+1", "float-2", "cpam0-unbiased",
                                  "cpam5-minimax", "cpam2-best", "cpam1:1,2,3", "cpam01-unbiased",
                                  "cpam1:01,0,0,0", "cpam1:", 3, None])
def test_bad_names_raise_naming_the_argument(name):
    with pytest.raises(ValueError, match=r"mul="):
        emu.multiplier(name)
    with pytest.raises(ValueError, match=r"mul="):
        emu.mul(1.0, 2.0, "bf16", name)


@pytest.mark.parametrize("kw,arg", [(dict(kind="fast"), "kind="), (dict(kind="pam", offset=1.5),
                                    "offset="), (dict(kind="exact", offset=1), "offset="),
                                    (dict(kind="cpam", k=2, table=(1, 2)), "table="),
                                    (dict(kind="cpam", k=True, table="minimax"), "k="),
                                    (dict(kind="lmul", k=1), "k=")])
def test_bad_fields_raise_naming_the_field(kw, arg):
    with pytest.raises(ValueError, match=arg):
        emu.Multiplier(**kw)


def test_cpam_needs_a_table():
    with pytest.raises(ValueError, match="mantissa widths"):
        emu.mul(1.0, 1.0, "float32", "cpam2-unbiased")
    with pytest.raises(ValueError, match="fmt=float4_e2m1fn"):
        emu.mul(1.0, 1.0, "float4_e2m1fn", "cpam2-minimax")
    assert emu.mul(1.5, 1.5, "float32", "cpam1:0,0,0,3") == 2 + 3 * 2.0 ** -22


# --- the shipped corrected-PAM tables --------------------------------------------------

def test_shipped_tables_are_the_search_results():
    for goal in EM.CPAM_GOALS:
        for man in range(1, EM.CPAM_MAX_MAN_BITS + 1):
            for k in range(1, min(man, EM.CPAM_MAX_K) + 1):
                assert EM.cpam_table(man, k, goal) == EM.search_cpam_table(man, k, goal), \
                    (goal, man, k)


def _exact_errors(man, c):
    """{(i, j): relative error} of every mantissa pair at correction c, from the oracle's
    paexp2/palog2 (Fractions)."""
    n = 2 ** man
    out = {}
    for i in range(n):
        for j in range(n):
            a, b = 1 + Fraction(i, n), 1 + Fraction(j, n)
            v = R.paexp2_exact(R.palog2_exact(a) + R.palog2_exact(b) + Fraction(c, n))
            out[i, j] = v / (a * b) - 1
    return out


@pytest.mark.parametrize("man", [1, 2, 3, 4])
def test_shipped_tables_are_optimal_over_every_correction(man):
    """Brute force over every integer c in [-2^M, 2^M], per cell, in exact arithmetic:
    the table's entry has the smallest |cell mean| (unbiased) or max |error| (minimax);
    ties go to the smaller |c|."""
    n = 2 ** man
    errs = {c: _exact_errors(man, c) for c in range(-n, n + 1)}
    for k in range(1, min(man, EM.CPAM_MAX_K) + 1):
        w = n >> k
        for goal in EM.CPAM_GOALS:
            table = EM.cpam_table(man, k, goal)
            for ci in range(2 ** k):
                for cj in range(2 ** k):
                    cell = [(i, j) for i in range(ci * w, (ci + 1) * w)
                            for j in range(cj * w, (cj + 1) * w)]

                    def objective(c):
                        e = [errs[c][p] for p in cell]
                        return abs(sum(e)) if goal == "unbiased" else max(map(abs, e))
                    best = min(range(-n, n + 1), key=lambda c: (objective(c), abs(c), c))
                    assert table[ci * 2 ** k + cj] == best, (goal, man, k, ci, cj)


# --- error statistics ----------------------------------------------------------------

def test_error_stats_pam_and_exact():
    s = EM.error_stats("pam", "bf16")
    assert s.exhaustive and s.pairs == 2 ** 14
    assert s.min == pytest.approx(-1 / 9, abs=1e-15) and s.max == 0 and s.mean < 0
    for fmt in ("e4m3fn", "bf16"):
        ex = EM.error_stats("exact", fmt)
        assert ex.max_abs <= 2.0 ** -(emu.format(fmt).man_bits + 1) and abs(ex.mean) < 1e-2
    f32 = EM.error_stats("lmul", "float32", samples=10_000)
    assert not f32.exhaustive and f32.pairs == 10_000


@pytest.mark.parametrize("fmt", ["e4m3fn", "bf16", "float16"])
def test_corrected_pam_beats_pam(fmt):
    pam, unb, mm = (EM.error_stats(m, fmt) for m in ("pam", "cpam2-unbiased", "cpam2-minimax"))
    assert abs(unb.mean) < abs(pam.mean) and mm.max_abs < pam.max_abs

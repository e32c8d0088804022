"""Formats: catalog values, name parsing, validation."""
import ml_dtypes
import numpy as np
import pytest

import emu
from conftest import POLICIES, all_values, assert_bits_equal
from emu.formats import Format


@pytest.mark.parametrize("name,ref", [
    ("float32", np.finfo(np.float32)),
    ("float16", np.finfo(np.float16)),
    ("bfloat16", ml_dtypes.finfo(ml_dtypes.bfloat16)),
    ("float8_e5m2", ml_dtypes.finfo(ml_dtypes.float8_e5m2)),
    *[(n, ml_dtypes.finfo(getattr(ml_dtypes, n))) for n in (
        "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3", "float8_e4m3fnuz",
        "float8_e4m3b11fnuz", "float8_e3m4", "float8_e8m0fnu", "float6_e3m2fn",
        "float6_e2m3fn", "float4_e2m1fn")],
])
def test_catalog_matches_finfo(name, ref):
    f = emu.format(name)
    assert f.name == name
    assert f.width == ref.bits
    assert f.man_bits == ref.nmant
    assert f.emin == ref.minexp and f.emax == ref.maxexp - 1
    assert f.max == float(ref.max)
    assert f.smallest_normal == float(ref.smallest_normal)
    assert f.smallest_subnormal == float(ref.smallest_subnormal)
    assert f.eps == float(ref.eps)


def test_e4m3fn_facts():
    f = emu.float8_e4m3fn
    assert (f.exp_bits, f.man_bits, f.has_inf, f.bias) == (4, 3, False, 7)
    assert f.max == 448.0 and f.max_encoding == 0x7E and f.nan_encoding == 0x7F
    assert f.inf_encoding is None


@pytest.mark.parametrize("name,has_inf,nan_codes,neg_zero,saturates,bias", [
    ("float8_e5m2", True, 6, True, False, 15),
    ("float8_e4m3", True, 14, True, False, 7),
    ("float8_e4m3fn", False, 2, True, False, 7),
    ("float8_e4m3fnuz", False, 1, False, False, 8),
    ("float8_e4m3b11fnuz", False, 1, False, False, 11),
    ("float8_e5m2fnuz", False, 1, False, False, 16),
    ("float6_e3m2fn", False, 0, True, True, 3),
    ("float4_e2m1fn", False, 0, True, True, 1),
    ("float8_e8m0fnu", False, 1, False, False, 127),
])
def test_policy(name, has_inf, nan_codes, neg_zero, saturates, bias):
    """The encoding policy, counted against ml_dtypes' decoding of every code."""
    f = emu.format(name)
    assert (f.has_inf, f.nan_codes, f.has_neg_zero, f.saturates, f.bias) == \
        (has_inf, nan_codes, neg_zero, saturates, bias)
    vals = np.arange(1 << f.width, dtype=np.uint8).view(getattr(ml_dtypes, name)) \
        .astype(np.float32)
    assert int(np.isnan(vals).sum()) == nan_codes
    assert bool(np.isinf(vals).any()) == has_inf
    assert bool((np.signbit(vals) & (vals == 0)).any()) == neg_zero


@pytest.mark.parametrize("spec,expect", [
    ("bf16", Format(8, 7)), ("BFloat16", Format(8, 7)), ("e8m7", Format(8, 7)),
    ("fp32", Format(8, 23)), ("e8m23", Format(8, 23)), ("half", Format(5, 10)),
    ("e5m2", Format(5, 2)), ("fp8_e5m2", Format(5, 2)), ("e4m3fn", Format(4, 3, False)),
    ("float8_e4m3fn", Format(4, 3, False)), ("e4m3", Format(4, 3)), ("e8m4", Format(8, 4)),
    ("e2m1", Format(2, 1)), ("e3m2fn", Format(3, 2, False)),
    ("e4m3fnuz", Format(4, 3, False, "fnuz", 8)), ("e4m3b11fnuz", Format(4, 3, False, "fnuz", 11)),
    ("float8_e4m3b11fnuz", Format(4, 3, False, "fnuz", 11)),
    ("e2m1sat", Format(2, 1, False, "none")),
    ("float6_e2m3fn", Format(2, 3, False, "none")), ("float6_e2m3sat", Format(2, 3, False, "none")),
    ("e5m2b14", Format(5, 2, bias=14)), ("e8m0fnu", Format(8, 0, False, "fn", signed=False)),
    ("float8_e3m4", Format(3, 4)), ("e3m3b2sat", Format(3, 3, False, "none", 2)),
    ("p3109_p3", Format(5, 2, True, "fnuz", 16)), ("e7m0uz", Format(7, 0, True, "fnuz", 64)),
    ("p3109_p7", Format(1, 6, True, "fnuz", 1)), ("p3109_k8p1se", Format(7, 0, True, "fnuz")),
    ("p3109_k8p3sf", Format(5, 2, False, "fnuz")), ("p3109_k6p2s", Format(4, 1, True, "fnuz")),
    ("e7m0fn", Format(7, 0, False, "fn")), ("e3m0sat", Format(3, 0, False, "none")),
])
def test_parse(spec, expect):
    assert emu.format(spec) == expect
    assert emu.format(expect) is expect
    assert emu.format(expect.name) == expect


def test_names_are_canonical():
    assert emu.format("e8m7").name == "bfloat16"
    assert emu.format("e4m3").name == "float8_e4m3"       # ml_dtypes' name for it
    assert emu.format("e8m4").name == "e8m4"
    assert str(emu.format("e3m2fn")) == "e3m2fn"          # fn: the NaN at all ones
    assert str(emu.format("e3m2sat")) == "float6_e3m2fn"  # ml_dtypes' fn6: no NaN at all
    assert emu.format("e4m3b9fnuz").name == "e4m3b9fnuz"
    assert emu.format("e5m2b14").name == "e5m2b14"
    for name in [*emu.FORMATS, *emu.P3109_FORMATS]:
        assert emu.format(name).name == name
    assert emu.format("p3109_k8p4sf").name == "float8_e4m3fnuz"   # P3109's finite domain
    assert emu.format("p3109_k6p3se").name == "e3m2uz"


def test_p3109_facts():
    """The encodings of IEEE P3109 binary8 (interim report): 0x80 NaN, ±inf at 0x7F/0xFF,
    max at 0x7E, no -0; P1 is the powers of two 2^-63 ... 2^62."""
    for p, f in enumerate(emu.P3109_FORMATS.values(), start=1):
        assert (f.width, f.man_bits, f.bias, f.nan_codes) == (8, p - 1, 2 ** (7 - p), 1)
        assert (f.inf_encoding, f.max_encoding, f.nan_encoding) == (0x7F, 0x7E, 0x80)
        codes = np.array([0x00, 0x7E, 0x7F, 0x80, 0xFF], np.uint16)
        v = emu.from_bits(codes, f)
        assert v[0] == 0 and v[1] == f.max and v[2] == np.inf and np.isnan(v[3])
        assert v[4] == -np.inf and not f.has_neg_zero
        assert emu.to_bits(np.array([np.inf, -np.inf, -0.0, np.nan], np.float32), f).tolist() \
            == [0x7F, 0xFF, 0x00, 0x80]
    p1 = emu.format("p3109_p1")
    assert (p1.max, p1.smallest_subnormal) == (2.0 ** 62, 2.0 ** -63)
    # M = 0: the tie 1.5 * 2^e goes to the even code (1.0 is code 64), not always up
    x = np.array([1.5, 3.0, 6.0, 12.0], np.float32)
    assert emu.quantize(x, p1).tolist() == [1.0, 4.0, 4.0, 16.0]
    with pytest.raises(ValueError, match="acc=p3109_p1 has no mantissa bit"):
        emu.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), "p3109_p4",
                   "p3109_p1")


def _gfloat_p3109():
    gf = pytest.importorskip("gfloat")
    from gfloat.formats import format_info_p3109
    from gfloat.types import Domain
    return gf, [(format_info_p3109(k, p, domain=d), f"p3109_k{k}p{p}s{'ef'[i]}")
                for k in (4, 6, 8) for p in range(1, k)
                for i, d in enumerate((Domain.Extended, Domain.Finite))]


def test_p3109_equals_gfloat():
    """Every signed P3109 format of K = 4, 6, 8 in both domains: from_bits of every code,
    to_bits of every value, quantize (RNE and toward zero, with and without saturation) of
    every value, midpoint, quarter point and out-of-range value equal gfloat's, bit for bit
    (quantize of ±inf with saturation excepted: docs/semantics.md §9)."""
    gf, formats = _gfloat_p3109()
    modes = (("nearest_even", gf.RoundMode.TiesToEven), ("toward_zero", gf.RoundMode.TowardZero))
    for fi, name in formats:
        f = emu.format(name)
        codes = np.arange(2 ** fi.k, dtype=np.uint16)
        ours = emu.from_bits(codes, f)
        ref = np.array([gf.decode_float(fi, int(c)).fval for c in codes], np.float32)
        assert_bits_equal(ours, ref, codes, what=f"from_bits {name}")
        vals = ours[~np.isnan(ours)]
        assert (emu.to_bits(vals, f) == codes[~np.isnan(ours)]).all(), name
        fin = np.unique(np.abs(ref[np.isfinite(ref)])).astype(np.float64)
        lo, hi = fin[:-1], fin[1:]
        q = np.concatenate([fin, (lo + hi) / 2, (3 * lo + hi) / 4, (lo + 3 * hi) / 4,
                            fin[-1] * np.array([1.25, 1.5, 2, 1e3]), fin[1] * np.array([.5, .25]),
                            [np.inf]])
        q = np.concatenate([q, -q]).astype(np.float32)
        for mode, rm in modes:
            for sat in (False, True):
                got = emu.quantize(q, f, rounding=mode, overflow="saturate" if sat else None)
                want = np.array([v if sat and np.isinf(v) and fi.domain.name == "Extended"
                                 else gf.round_float(fi, float(v), rm, sat) for v in q],
                                np.float32)
                assert_bits_equal(got, want, q, what=f"quantize {name} {mode} sat={sat}")


@pytest.mark.parametrize("bad", ["bf17", "e9m2", "e1m2", "e5m0", "e5m24", "e8m3fn", "", "float",
                                 3, None, 1.5, "float6_e4m3", "e4m3fnu", "e4m3b200", "e8m3b100sat",
                                 "p3109_p8", "p3109_p0", "p3109_k8p8s", "p3109_k8p3u",
                                 "p3109_k10p3s", "e1m0uz", "e0m3fn", "e4m3uzfn"])
def test_parse_rejects(bad):
    with pytest.raises(ValueError, match="fmt=.*expected"):
        emu.format(bad)


@pytest.mark.parametrize("kw", [dict(exp_bits=1, man_bits=2), dict(exp_bits=9, man_bits=2),
                                dict(exp_bits=5, man_bits=0), dict(exp_bits=5, man_bits=24),
                                dict(exp_bits=8, man_bits=3, has_inf=False),
                                dict(exp_bits=5, man_bits=2, has_inf=1),
                                dict(exp_bits=5, man_bits=2, has_inf=True, nan="fn"),
                                dict(exp_bits=5, man_bits=2, has_inf=False, nan="ieee"),
                                dict(exp_bits=5, man_bits=2, has_inf=False, nan="few"),
                                dict(exp_bits=5, man_bits=2, bias=200), dict(exp_bits=5, man_bits=2, bias=-120),
                                dict(exp_bits=5, man_bits=2, bias=1.0),
                                dict(exp_bits=8, man_bits=2, signed=False),
                                dict(exp_bits=5, man_bits=2, has_inf=True, nan="none"),
                                dict(exp_bits=1, man_bits=0, has_inf=True, nan="fnuz"),
                                dict(exp_bits=1, man_bits=3),       # IEEE needs E >= 2
                                dict(exp_bits=5, man_bits=True)])
def test_format_validation(kw):
    with pytest.raises(ValueError):
        Format(**kw)


def test_formats_are_frozen_and_hashable():
    f = emu.bfloat16
    with pytest.raises(AttributeError):
        f.man_bits = 3
    assert {emu.format("e8m7"): 1}[f] == 1


@pytest.mark.parametrize("e", range(2, 9))
@pytest.mark.parametrize("m", [1, 2, 3, 7, 10, 22, 23])
def test_every_value_is_a_float32(e, m):
    """Extreme values of every eXmY are exact float32 values (emu's representation)."""
    f = Format(e, m)
    for v in (f.max, f.smallest_normal, f.smallest_subnormal):
        assert float(np.float32(v)) == v


@pytest.mark.parametrize("fmt", POLICIES)
def test_exact_derivatives_under_policies(fmt, rng):
    """The exact derivatives (emu.grad, emu/_scalar_grad.py) == the oracle
    (emu/reference_grad.py) on every operand pair (pam_mul, pa_div) and every operand
    with a spread of gradients (unary ops) of fn/fnuz/none formats, and every result
    is a value of the format (docs/semantics.md §9 rule 7: no NaN without NaN codes,
    no -0 without -0)."""
    import emu.grad as G
    import emu.reference_grad as RG

    f = emu.format(fmt)
    v = all_values(fmt)

    def in_format(r, what):
        q = emu.quantize(r, f)
        assert_bits_equal(q, r, what=f"{what}: a value of {fmt}")
        if f.nan == "none":
            assert not np.isnan(r).any(), what
        if not f.has_neg_zero:
            assert not (np.signbit(r) & (r == 0)).any(), what

    a, b = (x.ravel() for x in np.meshgrid(v, v, indexing="ij"))
    d = v[rng.integers(0, v.size, a.size)]
    for op in ["pam_mul", "pa_div"]:
        da, db = getattr(G, op)(a, b, d, fmt, "exact")
        wa, wb = RG.exact_vec(op, a, b, d, fmt=fmt)
        assert_bits_equal(da, wa, a, b, d, what=f"d{op}/da {fmt}")
        assert_bits_equal(db, wb, a, b, d, what=f"d{op}/db {fmt}")
        in_format(da, f"d{op}/da")
        in_format(db, f"d{op}/db")
    x, g = (t.ravel() for t in np.meshgrid(v, v[:: max(1, v.size // 24)], indexing="ij"))
    for op in [o.name for o in emu.registry.ops(1, differentiable=True)]:
        oracle = emu.OPS[op].oracle_grad
        want = np.array([oracle(float(p), float(q), fmt, "exact") for p, q in zip(x, g)],
                        np.float32)
        got = getattr(G, op)(x, g, fmt, "exact")
        assert_bits_equal(got, want, x, g, what=f"{op}' {fmt}")
        in_format(got, f"{op}'")

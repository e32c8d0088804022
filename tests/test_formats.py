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
    for name in emu.FORMATS:
        assert emu.format(name).name == name


@pytest.mark.parametrize("bad", ["bf17", "e9m2", "e1m2", "e5m0", "e5m24", "e8m3fn", "", "float",
                                 3, None, 1.5, "float6_e4m3", "e4m3fnu", "e4m3b200", "e8m3b100sat"])
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
                                dict(exp_bits=8, man_bits=2, signed=False)])
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

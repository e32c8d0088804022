"""Formats: catalog values, name parsing, validation."""
import ml_dtypes
import numpy as np
import pytest

import emu
from emu.formats import Format


@pytest.mark.parametrize("name,ref", [
    ("float32", np.finfo(np.float32)),
    ("float16", np.finfo(np.float16)),
    ("bfloat16", ml_dtypes.finfo(ml_dtypes.bfloat16)),
    ("float8_e5m2", ml_dtypes.finfo(ml_dtypes.float8_e5m2)),
    ("float8_e4m3fn", ml_dtypes.finfo(ml_dtypes.float8_e4m3fn)),
])
def test_catalog_matches_finfo(name, ref):
    f = emu.format(name)
    assert f.name == name
    assert f.width == ref.bits
    assert f.man_bits == ref.nmant
    assert f.max == float(ref.max)
    assert f.smallest_normal == float(ref.smallest_normal)
    assert f.smallest_subnormal == float(ref.smallest_subnormal)
    assert f.eps == float(ref.eps)


def test_e4m3fn_facts():
    f = emu.float8_e4m3fn
    assert (f.exp_bits, f.man_bits, f.has_inf, f.bias) == (4, 3, False, 7)
    assert f.max == 448.0 and f.max_encoding == 0x7E and f.nan_encoding == 0x7F
    assert f.inf_encoding is None


@pytest.mark.parametrize("spec,expect", [
    ("bf16", Format(8, 7)), ("BFloat16", Format(8, 7)), ("e8m7", Format(8, 7)),
    ("fp32", Format(8, 23)), ("e8m23", Format(8, 23)), ("half", Format(5, 10)),
    ("e5m2", Format(5, 2)), ("fp8_e5m2", Format(5, 2)), ("e4m3fn", Format(4, 3, False)),
    ("float8_e4m3fn", Format(4, 3, False)), ("e4m3", Format(4, 3)), ("e8m4", Format(8, 4)),
    ("e2m1", Format(2, 1)), ("e3m2fn", Format(3, 2, False)),
])
def test_parse(spec, expect):
    assert emu.format(spec) == expect
    assert emu.format(expect) is expect
    assert emu.format(expect.name) == expect


def test_names_are_canonical():
    assert emu.format("e8m7").name == "bfloat16"
    assert emu.format("e4m3").name == "e4m3"
    assert emu.format("e8m4").name == "e8m4"
    assert str(emu.format("e3m2fn")) == "e3m2fn"


@pytest.mark.parametrize("bad", ["bf17", "e9m2", "e1m2", "e5m0", "e5m24", "e8m3fn", "", "float",
                                 3, None, 1.5])
def test_parse_rejects(bad):
    with pytest.raises(ValueError, match="fmt=.*expected"):
        emu.format(bad)


@pytest.mark.parametrize("kw", [dict(exp_bits=1, man_bits=2), dict(exp_bits=9, man_bits=2),
                                dict(exp_bits=5, man_bits=0), dict(exp_bits=5, man_bits=24),
                                dict(exp_bits=8, man_bits=3, has_inf=False),
                                dict(exp_bits=5, man_bits=2, has_inf=1)])
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

"""Scaling recipes (emu/recipes.py, docs/semantics.md §10b): names as data, quantization
bit for bit against torchao 0.18 (CPU), delayed scaling's state, and recipe_matmul
against an independent oracle in exact rationals (``oracle_matmul`` below)."""
import ast
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import emu
from emu import recipes as RC
from emu import reference as R
from emu import reference_mul as RM
from conftest import spy

torch = pytest.importorskip("torch")


def u32(x):
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def same_bits(a, b):
    """Bit equality of float32 arrays, every NaN counting as one value."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape
    na, nb = np.isnan(a), np.isnan(b)
    return bool((na == nb).all() and (u32(np.where(na, 0, a)) == u32(np.where(nb, 0, b))).all())


def rows(rng, m, n, spread=12):
    """Normal rows, each scaled by its own power of two (so scales differ)."""
    return (rng.standard_normal((m, n)) * np.exp2(rng.integers(-spread, spread, (m, 1)))
            ).astype(np.float32)


# --- names as data --------------------------------------------------------------------

NAMES = ["nvfp4", "nvfp4/single", "nvfp4/32", "fp8_current", "fp8_current/e4m3",
         "fp8_current/e5m2/rowwise/pow2/m2", "fp8_delayed", "fp8_delayed/h16/most_recent",
         "fp8_delayed/e4m3/pow2", "fp8_block", "fp8_block/64/pow2", "mxfp8_e4m3",
         "mxfp4_e2m1/16", "mxint8", "mxfp6_e2m3"]


@pytest.mark.parametrize("name", NAMES)
def test_canonical_names_round_trip(name):
    r = emu.recipe(name)
    assert r.name == name and str(r) == name and emu.recipe(r.name) == r
    assert hash(r) == hash(emu.recipe(name))


def test_aliases_and_parameter_order():
    assert emu.recipe("mxfp8").name == "mxfp8_e4m3"
    assert emu.recipe("MXFP4/16").name == "mxfp4_e2m1/16"
    assert emu.recipe("fp8_rowwise").name == "fp8_current/e4m3/rowwise/pow2"
    assert emu.recipe("fp8_tensorwise") == emu.RECIPES["fp8_current"]
    assert emu.recipe("fp8_delayed/most_recent/h8").name == "fp8_delayed/h8/most_recent"
    assert emu.recipe("fp8_current/hybrid") == emu.recipe("fp8_current")   # the default
    assert set(emu.RECIPES) == {"nvfp4", "fp8_current", "fp8_delayed", "fp8_block",
                                *emu.MX_TYPES}
    for name, r in emu.RECIPES.items():
        assert r.name == name and r.family == name


def test_the_families_hold_their_data():
    e4, e5 = emu.float8_e4m3fn, emu.float8_e5m2
    nv = emu.RECIPES["nvfp4"]
    assert (nv.elem, nv.block, nv.scale, nv.rule, nv.tensor_scale) == (
        (emu.float4_e2m1fn,) * 3, ((1, 16),) * 3, e4, "decode", True)
    cur = emu.RECIPES["fp8_current"]
    assert (cur.elem, cur.block, cur.scale, cur.history) == ((e4, e4, e5), ((0, 0),) * 3,
                                                             emu.float32, 0)
    assert emu.recipe("fp8_current/rowwise").block_of("grad") == (1, 0)
    dl = emu.RECIPES["fp8_delayed"]
    assert (dl.history, dl.reduce, dl.element("grad")) == (1024, "max", e5)
    blk = emu.RECIPES["fp8_block"]
    assert [blk.block_of(r) for r in ("act", "weight", "grad")] == [(1, 128), (128, 128),
                                                                      (1, 128)]
    assert emu.recipe("fp8_block/64").block_of("weight") == (64, 64)
    mx = emu.recipe("mxfp6_e3m2/16")
    assert (mx.elem[0], mx.block[0], mx.scale, mx.pow2_scales) == (
        emu.float6_e3m2fn, (1, 16), emu.float8_e8m0fnu, True)
    assert emu.recipe("fp8_block/pow2").pow2_scales and not blk.pow2_scales


BAD_SPECS = [
    ("nvfp4/0", "block 0 is outside"), ("nvfp4/-3", "block -3 is outside"),
    ("mxfp8/2000000", "block 2000000 is outside"), ("fp8_delayed/h0", "history length 0"),
    ("fp8_delayed/h-1", "history length -1"), ("fp8_current/m99", "margin 99"),
    ("fp8_current/h16", "/h16 does not apply to fp8_current"),
    ("fp8_delayed/rowwise", "/rowwise does not apply"), ("nvfp4/e4m3", "/e4m3 does not"),
    ("fp8_current/e4m3/e5m2", "two element parameters"), ("fp8_block/16/32", "two block"),
    ("fp8_current/fast", "unknown parameter /fast"), ("fp8_magic", "unknown recipe family"),
    ("mxfp9", "unknown recipe family"), ("", "unknown recipe family"),
]


@pytest.mark.parametrize("spec, match", BAD_SPECS)
def test_malformed_names_name_the_field(spec, match):
    with pytest.raises(ValueError, match=match):
        emu.recipe(spec)


def test_malformed_fields_name_the_field():
    base = {f: getattr(emu.RECIPES["fp8_current"], f) for f in
            ("family", "elem", "block", "scale", "rule")}
    bad = [(dict(scale=emu.float16), "scale='float16'"), (dict(scale="e4m3"), "scale="),
           (dict(block=((0, 5),) * 3), "rows 0"), (dict(block=((1, -1),) * 3), "block="),
           (dict(rule="magic"), "rule="), (dict(elem=(emu.float32,) * 2), "elem="),
           (dict(family="fp9"), "family="), (dict(margin=-1), "margin="),
           (dict(history=True), "history="), (dict(reduce="mean"), "reduce="),
           (dict(scale=emu.float8_e4m3fn), "rule 'encode' makes float32"),
           (dict(block=((1, 7),) * 3), "no recipe a name describes")]
    for change, match in bad:
        with pytest.raises(ValueError, match=match):
            RC.Recipe(**{**base, **change})
    with pytest.raises(ValueError, match="history=0"):
        RC.Recipe(**{**base, "family": "fp8_delayed"})
    with pytest.raises(TypeError, match="recipe=3"):
        emu.recipe(3)


def test_bad_quantize_inputs_raise_before_work():
    x = np.ones((4, 32), np.float32)
    with pytest.raises(ValueError, match="role='bias'"):
        emu.recipe_quantize(x, "nvfp4", "bias")
    with pytest.raises(ValueError, match=r"blocks of 16 along axis 1 do not divide"):
        emu.recipe_quantize(np.ones((2, 20), np.float32), "nvfp4")
    with pytest.raises(ValueError, match=r"blocks of 128 along axis 1 do not divide"):
        emu.recipe_quantize(np.ones((256, 100), np.float32), "fp8_block", "weight", axis=0)
    with pytest.raises(ValueError, match="quantized axis among the last two"):
        emu.recipe_quantize(np.ones((128, 4, 128), np.float32), "fp8_block", "weight", axis=0)
    with pytest.raises(ValueError, match="axis=2"):
        emu.recipe_quantize(x, "fp8_current", axis=2)
    with pytest.raises(ValueError, match="at least one dimension"):
        emu.recipe_quantize(np.float32(1), "fp8_current")
    with pytest.raises(TypeError, match="dtype"):
        emu.recipe_quantize(np.array(["a"]), "fp8_current")
    with pytest.raises(ValueError, match="keeps no amax history"):
        emu.recipe_quantize(x, "fp8_current", history=RC.RecipeState.initial("fp8_delayed"))
    with pytest.raises(ValueError, match=r"shape \(1024,\)"):
        emu.recipe_quantize(x, "fp8_delayed", history=RC.RecipeState(np.zeros(3, np.float32),
                                                                     np.float32(1)))
    with pytest.raises(ValueError, match="finite positive scale"):
        emu.recipe_quantize(x, "fp8_delayed/h2", history=RC.RecipeState(
            np.zeros(2, np.float32), np.float32(0)))
    with pytest.raises(TypeError, match="Quantized"):
        emu.recipe_dequantize(x)


def test_bad_matmul_inputs_raise_before_work():
    a, b = np.ones((2, 32), np.float32), np.ones((32, 16), np.float32)
    for kw, match in [(dict(mul="float"), "mul='float'"), (dict(acc="e8m0fnu"), "acc="),
                      (dict(mul="bogus"), "mul='bogus'"),
                      (dict(mul="cpam1-unbiased"), "cpam1-unbiased"),
                      (dict(roles=("act",)), "roles="), (dict(roles=("act", "bias")), "role=")]:
        with pytest.raises(ValueError, match=match):
            emu.recipe_matmul(a, b, "nvfp4", **kw)
    with pytest.raises(ValueError, match="one element format"):
        emu.recipe_matmul(a, b, "fp8_current", mul="lmul", roles=("act", "grad"))
    with pytest.raises(ValueError, match="mul='lmul' with mxint8"):
        emu.recipe_matmul(a, b, "mxint8", mul="lmul")
    with pytest.raises(ValueError, match="contracted dimensions differ"):
        emu.recipe_matmul(a, b[:16], "nvfp4")
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        emu.recipe_matmul(a[0], b, "nvfp4")
    qa = emu.recipe_quantize(a, "nvfp4", "weight")
    with pytest.raises(ValueError, match="as weight along axis 1"):
        emu.recipe_matmul(qa, b, "nvfp4")


# --- quantization against torchao 0.18 --------------------------------------------------

@pytest.fixture(scope="module")
def ao():
    pytest.importorskip("torchao")
    import torchao.float8.float8_utils as F8
    import torchao.prototype.mx_formats.kernels as K
    from torchao.float8.config import ScalingGranularity
    from torchao.prototype.mx_formats.mx_tensor import MXTensor
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
    return dict(F8=F8, K=K, G=ScalingGranularity, MX=MXTensor, NV=NVFP4Tensor,
                pts=per_tensor_amax_to_scale)


def e4m3_values():
    """Every positive finite float8_e4m3fn value, by code."""
    return emu.from_bits(np.arange(1, 127), "float8_e4m3fn")


def nvfp4_cases(rng):
    """Random blocks, and blocks whose amax / 6 is every E4M3 value and every midpoint
    between neighbours (the scale's ties), zeros, all-equal, tiny and huge blocks."""
    v = e4m3_values().astype(np.float64)
    amax = np.concatenate([v, (v[:-1] + v[1:]) / 2, [2 ** -10, 2 ** -20, 1e-40, 3e38 / 6]]) * 6
    corner = np.ones((amax.size, 16)) * rng.uniform(-1, 1, (amax.size, 16))
    corner[:, 0] = 1
    corner = corner * amax[:, None]
    special = np.zeros((4, 16))
    special[1] = 2.5                       # all equal
    special[2, ::2] = -448 * 6             # amax at the top of the two-level range
    special[3] = np.linspace(-1, 1, 16) * 2.0 ** -126
    return [rows(rng, 8, 64), corner.astype(np.float32), special.astype(np.float32)]


@pytest.mark.parametrize("two_level", [False, True])
def test_nvfp4_quantize_equals_torchao(ao, two_level):
    rng = np.random.default_rng(1)
    for x in nvfp4_cases(rng):
        t = torch.from_numpy(x)
        pts = ao["pts"](t.abs().max()) if two_level else None
        ref = ao["NV"].to_nvfp4(t, per_tensor_scale=pts)
        q = emu.recipe_quantize(x, "nvfp4" if two_level else "nvfp4/single")
        codes = ao["K"].unpack_uint4(ref.qdata.view(torch.uint8)).reshape(x.shape).numpy()
        assert (emu.to_bits(q.elements, "float4_e2m1fn") == codes).all()
        assert (emu.to_bits(q.scales, "float8_e4m3fn") == ref.scale.view(torch.uint8)
                .numpy()).all()
        assert (q.tensor_scale is None) == (not two_level)
        if two_level:
            assert u32(q.tensor_scale) == u32(pts.numpy())
        assert same_bits(emu.recipe_dequantize(q), ref.dequantize(torch.float32).numpy())


MX_DTYPES = {"mxfp8_e4m3": "float8_e4m3fn", "mxfp8_e5m2": "float8_e5m2",
             "mxfp6_e3m2": "fp6_e3m2", "mxfp6_e2m3": "fp6_e2m3", "mxfp4_e2m1": "float4_e2m1fn_x2"}


def mx_codes(ao, ref, name, shape):
    """The element codes of a torchao MXTensor."""
    data = ref.qdata
    if name.startswith("mxfp8"):
        return data.view(torch.uint8).numpy().reshape(shape)
    if name.startswith("mxfp4"):
        return ao["K"].unpack_uint4(data.view(torch.uint8)).numpy().reshape(shape)
    return data.numpy().reshape(shape)


@pytest.mark.parametrize("name", list(MX_DTYPES))
def test_mx_quantize_equals_torchao(ao, name):
    rng = np.random.default_rng(2)
    x = rows(rng, 6, 64, spread=20)
    x[0, :32] = 0                                   # zero block: code 0 in both
    x[1, :32] = 3.0                                 # all equal
    x[2, :32] = np.linspace(-1, 1, 32) * 2.0 ** 8   # amax a power of two
    x[3, :32] = 3.4e38                              # huge: the top code
    x[4, :32] *= 2.0 ** -90                         # small, still above 2^(emax - 126)
    dt = MX_DTYPES[name]
    ref = ao["MX"].to_mx(torch.from_numpy(x), getattr(torch, dt, dt), 32)
    q = emu.recipe_quantize(x, name)
    elem = emu.recipe(name).element()
    assert (emu.to_bits(q.scales, "float8_e8m0fnu") == ref.scale.view(torch.uint8).numpy()).all()
    assert (emu.to_bits(q.elements, elem) == mx_codes(ao, ref, name, x.shape)).all()
    assert same_bits(emu.recipe_dequantize(q), ref.dequantize(torch.float32).numpy())
    e, codes = emu.mx_quantize(x, name)             # the recipe is emu.mx
    assert same_bits(e, q.elements) and (emu.to_bits(q.scales, "e8m0fnu") == codes).all()


def test_mx_differs_from_torchao_where_documented(ao):
    tiny = np.full((1, 32), 2.0 ** -120, np.float32)   # scale code 0
    ref = ao["MX"].to_mx(torch.from_numpy(tiny), torch.float8_e4m3fn, 32)
    q = emu.recipe_quantize(tiny, "mxfp8")
    assert ref.scale.view(torch.uint8).item() == 0 == emu.to_bits(q.scales, "e8m0fnu").item()
    assert ref.qdata.float()[0, 0].item() == 64 and q.elements[0, 0] == 128
    assert ref.dequantize(torch.float32)[0, 0].item() == 2.0 ** -121
    assert emu.recipe_dequantize(q)[0, 0] == 2.0 ** -120
    inf = np.ones((1, 32), np.float32)
    inf[0, 3] = np.inf
    ref = ao["MX"].to_mx(torch.from_numpy(inf), torch.float8_e4m3fn, 32)
    q = emu.recipe_quantize(inf, "mxfp8")
    assert ref.scale.view(torch.uint8).item() == 247 and ref.qdata.float()[0, 3] == 448
    assert emu.to_bits(q.scales, "e8m0fnu").item() == 255 and not q.elements.any()


def test_nvfp4_differs_from_torchao_where_documented(ao):
    x = np.ones((1, 16), np.float32)
    x[0, 3] = np.inf
    ref = ao["NV"].to_nvfp4(torch.from_numpy(x))
    assert ref.scale.float().item() == 448 and ref.dequantize(torch.float32)[0, 3] == 2688
    q = emu.recipe_quantize(x, "nvfp4/single")
    assert np.isnan(q.scales).all() and not q.elements.any()
    assert np.isnan(emu.recipe_dequantize(q)).all()
    z = torch.zeros((1, 16))
    ref = ao["NV"].to_nvfp4(z, per_tensor_scale=ao["pts"](z.abs().max()))
    assert torch.isnan(ref.dequantize(torch.float32)).all()
    q = emu.recipe_quantize(z.numpy(), "nvfp4")
    assert q.tensor_scale == 1 and q.scales.item() == 2.0 ** -6
    assert u32(emu.recipe_dequantize(q)).max() == 0          # +0 everywhere


def fp8_cases(rng):
    x = rows(rng, 6, 40, spread=30)
    special = np.zeros((6, 40), np.float32)
    special[1] = 7.0
    special[2, 0] = 1e-39                           # amax below torchao's EPS
    special[3] = np.linspace(-3e38, 3e38, 40)
    special[4, :3] = [448.0, -57344.0, 0.5]
    special[5, 5] = np.nan
    withinf = x.copy()
    withinf[2, 7] = -np.inf
    return [x, special, withinf]


@pytest.mark.parametrize("dt", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_tensorwise_and_rowwise_equal_torchao(ao, dt):
    F8, G = ao["F8"], ao["G"]
    el = "e4m3" if dt == "float8_e4m3fn" else "e5m2"
    rng = np.random.default_rng(3)
    for x in fp8_cases(rng):
        t = torch.from_numpy(x)
        for rowwise in (False, True):
            for pow2 in (False, True):
                gran = G.AXISWISE if rowwise else G.TENSORWISE
                s = F8.tensor_to_scale(t, getattr(torch, dt), scaling_granularity=gran,
                                       axiswise_dim=-1 if rowwise else None,
                                       round_scales_to_power_of_2=pow2)
                ref = F8.to_fp8_saturated(t.to(torch.float32) * s, getattr(torch, dt))
                name = f"fp8_current/{el}" + "/rowwise" * rowwise + "/pow2" * pow2
                q = emu.recipe_quantize(x, name)
                assert same_bits(q.elements, ref.float().numpy()), name
                assert same_bits(q.scales, s.reciprocal().numpy().reshape(q.scales.shape))


def test_fp8_differs_from_torchao_where_documented(ao):
    F8 = ao["F8"]
    x = np.array([[np.nextafter(np.float32(1.75), np.float32(2)), 1.0]], np.float32)
    s = F8.tensor_to_scale(torch.from_numpy(x), torch.float8_e4m3fn,
                           round_scales_to_power_of_2=True)
    assert s.item() == 256                      # float32 log2(255.99998) rounds to 8
    q = emu.recipe_quantize(x, "fp8_current/e4m3/pow2")
    assert q.scales.item() == 2.0 ** -7 and q.elements[0, 0] == 224
    x = np.array([[11.0, 1.0]], np.float32)     # dequantize: torchao divides
    s = F8.tensor_to_scale(torch.from_numpy(x), torch.float8_e4m3fn)
    ref = F8.to_fp8_saturated(torch.from_numpy(x) * s, torch.float8_e4m3fn)
    assert (ref.float() / s)[0, 0].item() == 11.0
    q = emu.recipe_quantize(x, "fp8_current/e4m3")
    assert q.elements[0, 0] == 448 and emu.recipe_dequantize(q)[0, 0] == np.float32(11.000001)


@pytest.fixture(scope="module")
def ao_blockwise():
    """torchao's reference block-scaling functions (blockwise_fp8_training/kernels.py),
    taken from its source: the module imports triton, which a CPU install lacks."""
    torchao = pytest.importorskip("torchao")
    src = Path(torchao.__file__).parent / "prototype/blockwise_fp8_training/kernels.py"
    tree = ast.parse(src.read_text())
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in
            ("torch_blockwise_scale_act_quant_lhs", "torch_blockwise_scale_weight_quant")]
    assert len(keep) == 2
    ns = {"torch": torch, "EPS": 1e-12, "e4m3_dtype": torch.float8_e4m3fn}
    exec(compile(ast.Module(keep, []), str(src), "exec"), ns)
    return ns


def test_fp8_block_equals_torchao_blockwise(ao_blockwise):
    rng = np.random.default_rng(4)
    x = rows(rng, 256, 256, spread=10)
    x[:128, :128] *= 2.0 ** -20
    x[5, :128] = 0
    ref_e, ref_s = ao_blockwise["torch_blockwise_scale_act_quant_lhs"](torch.from_numpy(x))
    q = emu.recipe_quantize(x, "fp8_block", "act")
    assert same_bits(q.elements, ref_e.float().numpy()) and q.scales.shape == (256, 2)
    assert same_bits(q.scales, ref_s.numpy())
    ref_e, ref_s = ao_blockwise["torch_blockwise_scale_weight_quant"](torch.from_numpy(x))
    q = emu.recipe_quantize(x, "fp8_block", "weight", axis=-2)
    assert same_bits(q.elements, ref_e.float().numpy()) and q.scales.shape == (2, 2)
    assert same_bits(q.scales, ref_s.numpy())
    tile = np.kron(q.scales, np.ones((128, 128), np.float32))
    assert same_bits(emu.recipe_dequantize(q), q.elements * tile)


# --- delayed scaling ------------------------------------------------------------------------

def test_delayed_scaling_follows_its_history():
    r = emu.recipe("fp8_delayed/e4m3/h3")
    xs = [np.array([[2.0, -1.0]], np.float32), np.array([[0.5, 7.0]], np.float32),
          np.zeros((1, 2), np.float32), np.array([[1.0, 0.25]], np.float32)]
    q = emu.recipe_quantize(xs[0], r)
    assert q.scales.item() == 1 and same_bits(q.elements, xs[0])        # σ = 1 at the start
    assert list(q.history.amax) == [2, 0, 0] and q.history.scale == np.float32(448 / 2)
    q = emu.recipe_quantize(xs[1], r, history=q.history)
    assert q.elements.tolist() == [[112.0, 448.0]]                        # 7 · 224 saturates
    assert list(q.history.amax) == [7, 2, 0] and q.history.scale == np.float32(448 / 7)
    q = emu.recipe_quantize(xs[2], r, history=q.history)                   # max of the history
    assert list(q.history.amax) == [0, 7, 2] and q.history.scale == np.float32(64)
    q = emu.recipe_quantize(xs[3], r, history=q.history)
    assert list(q.history.amax) == [1, 0, 7] and q.history.scale == np.float32(64)
    mr = emu.recipe("fp8_delayed/e4m3/h3/most_recent/m1")
    q = emu.recipe_quantize(xs[2], mr, history=RC.RecipeState(
        np.array([3, 1, 1], np.float32), np.float32(5)))
    assert q.scales.item() == np.float32(1) / np.float32(5)
    assert q.history.scale == 5                     # amax 0: the scale stays
    q = emu.recipe_quantize(xs[1], mr, history=q.history)
    assert q.history.scale == np.float32(np.float32(448 / 7) / 2)      # margin 1
    assert emu.recipe_quantize(xs[0], "fp8_delayed").history.amax.shape == (1024,)


# --- the matmul against an independent oracle ----------------------------------------------

def extents(r, role, shape, axis):
    """The block extent along each of the 2 axes (an independent reading of §10b)."""
    rows_, cols = r.block_of(role)
    other = 1 - axis
    ext = [0, 0]
    ext[axis] = cols or shape[axis]
    ext[other] = shape[other] if rows_ == 0 else rows_
    return ext


def oracle_matmul(qa, qb, r, acc, mul):
    """§10b's matmul in Fractions: per K-block the fold of the element products
    (``emu.reference_mul``'s rules), the block scale, the fold over blocks, the
    per-tensor epilogue; nested loops over scalars."""
    m, acc, f32 = emu.multiplier(mul), emu.format(acc), emu.float32
    ea, eb = qa.elements.tolist(), qb.elements.tolist()
    (M, K), N = qa.elements.shape, qb.elements.shape[1]
    xa, xb = extents(r, qa.role, (M, K), 1), extents(r, qb.role, (K, N), 0)
    assert xa[1] == xb[0]
    g = xa[1]
    elem = r.element(qa.role)
    pow2 = r.rule == "ocp" or r.pow2

    def product(p, a, b):
        if m.kind == "exact":
            return RM.fma(p, a, b, acc)
        return R._add_exact(p, R.pam_sum(a, b, f32, RM._constant(m, elem)), acc)

    def scaled(p, sa, sb):
        if not pow2:
            return RM.mul(p, RM.mul(sa, sb, f32, m), f32, m)
        if math.isnan(p) or math.isnan(sa) or math.isnan(sb) or math.isinf(p):
            return p * sa * sb
        v = Fraction(p) * Fraction(sa) * Fraction(sb)
        return 0.0 if v == 0 else R._round_signed(v < 0, abs(v), f32)

    out = np.zeros((M, N), np.float32)
    for i in range(M):
        for j in range(N):
            c = 0.0
            for kb in range(math.ceil(K / g)):
                p = 0.0
                for k in range(kb * g, min(K, kb * g + g)):
                    p = product(p, ea[i][k], eb[k][j])
                sa = float(qa.scales[i // xa[0], kb])
                sb = float(qb.scales[kb, j // xb[1]])
                c = R._add_exact(c, scaled(p, sa, sb), acc)
            if r.tensor_scale:
                c = RM.mul(c, RM.mul(float(qa.tensor_scale), float(qb.tensor_scale), f32, m),
                           f32, m)
            out[i, j] = c
    return out


@pytest.fixture(scope="module")
def operands():
    rng = np.random.default_rng(5)
    a = rows(rng, 3, 48, spread=6)
    a[1, :16] *= 2.0 ** 9                   # blocks of one row far apart
    b = (rng.standard_normal((48, 16)) * np.exp2(rng.integers(-6, 6, (1, 16)))
         ).astype(np.float32)
    b[16:32] *= 0.01
    return a, b


@pytest.mark.parametrize("name", ["nvfp4", "fp8_block/16", "fp8_current/rowwise/e4m3",
                                  "mxfp4_e2m1/16"])
@pytest.mark.parametrize("acc", ["float32", "bfloat16"])
@pytest.mark.parametrize("mul", ["pam", "exact", "lmul"])
def test_recipe_matmul_equals_the_oracle(operands, name, acc, mul):
    a, b = operands
    r = emu.recipe(name)
    qa, qb = emu.recipe_quantize(a, r, "act"), emu.recipe_quantize(b, r, "weight", axis=-2)
    got = emu.recipe_matmul(a, b, r, acc, mul=mul)
    assert same_bits(got, oracle_matmul(qa, qb, r, acc, mul))
    assert same_bits(emu.recipe_matmul(qa, qb, r, acc, mul=mul), got)   # pre-quantized


@pytest.mark.parametrize("name", ["fp8_block/8", "nvfp4"])
def test_recipe_matmul_pads_shapes_its_blocks_do_not_divide(name):
    """K = 21 and N = 13 against blocks of 8 (16) and 8 x 8 weight tiles: the zero-padded
    operands' product, cut back, and the oracle on them, bit for bit."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6, 21)).astype(np.float32)
    b = rng.standard_normal((21, 13)).astype(np.float32)
    r = emu.recipe(name)
    g = r.block_of("act")[1]
    kp, n_pad = -21 % g, -13 % r.block_of("weight")[0] if r.block_of("weight")[0] > 1 else 0
    ap, bp = np.pad(a, ((0, 0), (0, kp))), np.pad(b, ((0, kp), (0, n_pad)))
    got = emu.recipe_matmul(a, b, r, "bfloat16", mul="lmul")
    assert got.shape == (6, 13)
    qa, qb = emu.recipe_quantize(ap, r, "act"), emu.recipe_quantize(bp, r, "weight", axis=-2)
    assert same_bits(got, oracle_matmul(qa, qb, r, "bfloat16", "lmul")[:, :13])


def test_recipe_matmul_with_batches_roles_and_specials(operands):
    a, b = operands
    A = np.stack([a, 2 * a, -a])
    got = emu.recipe_matmul(A, b, "nvfp4/single", "bfloat16", mul="lmul")
    assert same_bits(got, np.stack([emu.recipe_matmul(x, b, "nvfp4/single", "bfloat16",
                                                      mul="lmul") for x in A]))
    # dgrad-like roles: e5m2 grad x e4m3 weight, pam only needs no element format
    g = emu.recipe_matmul(a, b, "fp8_current", roles=("grad", "weight"))
    qa = emu.recipe_quantize(a, "fp8_current", "grad")
    qb = emu.recipe_quantize(b, "fp8_current", "weight", axis=-2)
    assert same_bits(g, oracle_matmul(qa, qb, emu.recipe("fp8_current"), "float32", "pam"))
    assert same_bits(g, emu.recipe_matmul(qa, qb, "fp8_current", roles=("grad", "weight")))
    for acc in ("float32", "bfloat16"):     # exact: the fast fused step of e4m3 x e5m2
        g = emu.recipe_matmul(qa, qb, "fp8_current", acc, mul="exact", roles=("grad", "weight"))
        assert same_bits(g, oracle_matmul(qa, qb, emu.recipe("fp8_current"), acc, "exact"))
    an = a.copy()
    an[0, 3] = np.nan
    c = emu.recipe_matmul(an, b, "mxfp8")
    assert np.isnan(c[0]).all() and not np.isnan(c[1:]).any()
    assert (u32(c[0]) == 0x7FC00000).all()          # emu's canonical NaN


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4_e2m1", "mxint8"])
@pytest.mark.parametrize("acc", ["float32", "bfloat16"])
def test_mx_recipe_matmul_is_mx_matmul_within_one_block(operands, name, acc):
    a, b = operands[0][:, :32], operands[1][:32]
    for mul in (["pam", "exact"] if name != "mxint8" else ["pam"]):
        got = emu.recipe_matmul(a, b, name, acc, mul=mul)          # K = 32: one block
        assert same_bits(got, emu.mx_matmul(a, b, name, 32, acc, mul=mul))
    # two blocks: block sums rounded into bf16 before the scales (docs §10b)
    two = emu.recipe_matmul(a, b, name + "/16", "bfloat16")
    assert not same_bits(two, emu.mx_matmul(a, b, name, 16, "bfloat16"))


@pytest.mark.parametrize("acc", ["float32", "bfloat16"])
def test_mx_shorter_last_block(operands, acc):
    a, b = operands[0][:, :40], operands[1][:40]          # blocks of 32 and 8
    r = emu.recipe("mxfp8")
    qa, qb = emu.recipe_quantize(a, r), emu.recipe_quantize(b, r, "weight", axis=-2)
    assert qa.scales.shape == (3, 2) and qb.scales.shape == (2, 16)
    assert same_bits(emu.recipe_dequantize(qa), emu.mx_dequantize(
        qa.elements, emu.to_bits(qa.scales, "e8m0fnu").astype(np.uint8)))
    for mul in ("pam", "lmul"):
        assert same_bits(emu.recipe_matmul(a, b, r, acc, mul=mul),
                         oracle_matmul(qa, qb, r, acc, mul))


# --- the one-pass kernel against §10b's steps on emu's own ops ---------------------------

def blockwise(qa, qb, r, mul, roles=("act", "weight")):
    """§10b with emu's tested ops, float32 accumulator: each K-block's partial product an
    emu.matmul, its scale emu.mul(P, emu.mul(s_a, s_b)) (pow2: the exact product rounded
    once), the blocks folded by numpy's float32 add, the tensor scales last."""
    m, mf = RC._multipliers(r, mul, r.element(roles[0]), r.element(roles[1]))
    ea, eb = qa.elements, qb.elements
    g = r.block_of(roles[0])[1] or ea.shape[-1]
    sa = RC._expand(qa.scales, ea.shape[:-1] + (ea.shape[-1] // g,),
                    (1,) * (qa.scales.ndim - 2) + (RC._reps(qa)[-2], 1))
    sb = RC._expand(qb.scales, (eb.shape[-2] // g,) + eb.shape[-1:],
                    (1,) * (qb.scales.ndim - 1) + (RC._reps(qb)[-1],))
    c = np.zeros(np.broadcast_shapes(ea.shape[:-1] + (1,), eb.shape[-1:]), np.float32)
    for k in range(ea.shape[-1] // g):
        p = emu.matmul(ea[..., k * g:(k + 1) * g], eb[k * g:(k + 1) * g], "float32", mul=m,
                       mul_fmt=mf)
        s_a, s_b = sa[..., k:k + 1], sb[k:k + 1]
        if r.pow2_scales:
            t = (p.astype(np.float64) * s_a * s_b).astype(np.float32)
        else:
            t = emu.mul(p, emu.mul(s_a, s_b, "float32", m), "float32", m)
        with np.errstate(invalid="ignore", over="ignore"):
            c = c + t
    if r.tensor_scale:
        c = emu.mul(c, emu.mul(qa.tensor_scale, qb.tensor_scale, "float32", m), "float32", m)
    return np.where(np.isnan(c), np.float32(np.nan), c)


@pytest.mark.parametrize("name,mul", [("nvfp4", "pam"), ("nvfp4", "lmul"), ("mxfp8", "pam"),
                                      ("fp8_block/16", "pam+3"), ("fp8_current", "pam"),
                                      ("mxfp4", "exact"), ("fp8_block/16", "exact"),
                                      ("mxfp8/4", "lmul"), ("nvfp4/64", "pam"),
                                      ("mxfp8/64", "lmul")])
def test_one_pass_recipe_matmul_is_the_blockwise_definition(name, mul, monkeypatch):
    """emu/_kernels_recipes.py's one pass, taken where it should be (pattern sums in
    K-blocks of 32 or more, a multiple of 8: on the register-blocked micro-kernel, tasks
    of 64 rows and 256 columns; the others: BLOCKED_F32, tasks of 32 x 256 and row
    groups of 4), across its task edges (M = 70, padded to rows of 8; N = 1104, a
    partial panel; a batch of 2 against one B), with zero elements and rows, a zero
    block, block sums whose fold order shows, scales far apart (scaled terms that
    overflow or turn subnormal in float32): emu's own per-block ops' bits."""
    rng = np.random.default_rng(7)
    r = emu.recipe(name)
    a = rng.standard_normal((2, 70, 128)).astype(np.float32)
    b = rng.standard_normal((128, 1104)).astype(np.float32)
    a[0, 2] = 0
    a[1, :, 64:80] = 0
    # far-apart scales; NVFP4's tensor scale would flush every other block to zero
    t = 0.05 if r.tensor_scale else 1
    a[:, 3] *= np.float32(2.0 ** (100 * t))
    b[:, 7] *= np.float32(2.0 ** (40 * t))
    b[:, 9] *= np.float32(2.0 ** (-120 * t))
    a[1, 5] *= np.float32(2.0 ** (-100 * t))
    a[:, 1, ::3] *= np.float32(2.0 ** -9)     # block sums that need more than 24 bits
    qa = emu.recipe_quantize(a, r, "act")
    qb = emu.recipe_quantize(b, r, "weight", axis=-2)
    taken = spy(monkeypatch, RC, "_blocked")
    got = emu.recipe_matmul(qa, qb, r, mul=mul)
    # tensorwise (one K-block): emu.matmul, then _scale_fold's float32 pass
    assert taken and (taken[0] is None) == (name == "fp8_current")
    assert same_bits(got, blockwise(qa, qb, r, mul))


@pytest.mark.parametrize("name,mul", [("mxfp8", "pam"), ("mxfp8/64", "lmul"), ("mxfp4", "pam"),
                                      ("mxfp8/8", "pam-2"), ("mxfp8", "exact")])
def test_prescaled_recipe_matmul_is_the_blockwise_definition(name, mul, monkeypatch):
    """Power-of-two scales applied to the elements first (recipes._prescaled), where its
    preconditions hold, then the K-blocks' sums added in the micro-kernel's registers
    (runs of blocks in one mode: CLEAN, zeros in A, in B, in both; blocks whose groups
    differ, the tile path; SKIP) or BLOCKED_F32's (blocks of 8), across 2 passes of K
    (384 = 1.5 x 256), a partial panel, rows padded to 8 and a batch against one B:
    emu's own per-block ops' bits.  ``exact`` never prescales."""
    rng = np.random.default_rng(11)
    r = emu.recipe(name)
    a = rng.standard_normal((2, 70, 384)).astype(np.float32)
    b = rng.standard_normal((384, 1104)).astype(np.float32)
    a[0, :, 40:41] = 0                      # one group of k with zeros in A: MASK_A
    b[40:41, :600] = 0                      # ... in B: MASK_B, and one with both
    b[64:128:4, :] = 0                      # every group of 2 (1) K-blocks: MASK_B runs
    a[1, 8:16, 128:192] = 0                 # zero rows of a row block: SKIP blocks
    a[0, 16:24, 200:204] = 0                # zeros in half of a K-block's groups
    a[:, 30] *= np.float32(2.0 ** 20)       # scales far apart, still in range
    b[:, 50] *= np.float32(2.0 ** -30)
    a[1, 33, ::5] *= np.float32(2.0 ** -9)  # block sums that need more than 24 bits
    qa = emu.recipe_quantize(a, r, "act")
    qb = emu.recipe_quantize(b, r, "weight", axis=-2)
    pre = spy(monkeypatch, RC, "_prescaled")
    got = emu.recipe_matmul(qa, qb, r, mul=mul)
    assert [p is not None for p in pre] == ([] if mul == "exact" else [True])
    assert same_bits(got, blockwise(qa, qb, r, mul))


def test_prescaled_needs_normal_scaled_elements():
    """A scale that makes a non-zero element subnormal, or products leave float32's
    normal range after scaling, keeps the scales apart (the same bits, another path)."""
    r = emu.recipe("mxfp8")
    rng = np.random.default_rng(12)
    a = rng.standard_normal((16, 64)).astype(np.float32)
    b = rng.standard_normal((64, 32)).astype(np.float32)
    for scale_a, scale_b in ((2.0 ** -120, 1.0), (2.0 ** 60, 2.0 ** 60), (1.0, 1.0)):
        qa = emu.recipe_quantize(a * np.float32(scale_a), r, "act")
        qb = emu.recipe_quantize(b * np.float32(scale_b), r, "weight", axis=-2)
        m, mf = RC._multipliers(r, "pam", r.element("act"), r.element("weight"))
        sa = RC._expand(qa.scales, (16, 2), (RC._reps(qa)[-2], 1))
        sb = RC._expand(qb.scales, (2, 32), (1, RC._reps(qb)[-1]))
        pre = RC._prescaled(qa.elements, qb.elements, sa, sb, 32, int(m.params(mf).c32))
        assert (pre is not None) == (scale_a == 1.0), (scale_a, scale_b)
        assert same_bits(emu.recipe_matmul(qa, qb, r), blockwise(qa, qb, r, "pam"))
    # a NaN or inf scale of an all-zero block: its block sum times the scale is NaN (with
    # B all zero too, no product range check sees it)
    for bad in (np.nan, np.inf):
        sa_bad = sa.copy()
        sa_bad[3, 1] = bad
        ea = qa.elements.copy()
        ea[3, 32:] = 0
        for eb in (qb.elements, np.zeros_like(qb.elements)):
            assert RC._prescaled(ea, eb, sa_bad, sb, 32, int(m.params(mf).c32)) is None

"""The composites of torch_bridge/composites.py: each description's fused kernels equal
its graph of autograd Functions bit for bit (forward, and backward of both derivative
kinds), over every value of the 8-bit formats and every encoding of the 16-bit ones
(elementwise composites), and over the special values of each format in rows (softmax,
norms, cross-entropy); the generated backward adds gradient contributions in autograd's
order (checked against a consumer of the input outside the composite)."""
import numpy as np
import pytest
import torch

import emu
import torch_bridge as tb
from conftest import assert_bits_equal
from emu import sizes
from torch_bridge import _compose
from torch_bridge import _nodes as N
from torch_bridge.config import check_numerics
from torch_bridge import composites as D
from torch_bridge import elementwise as PE
from torch_bridge import functional as PF
from torch_bridge import losses as PL
from torch_bridge import norms as PN

KINDS = ["approx", "exact"]
ROUNDINGS = ["nearest_even", "toward_zero"]


def _every_value(fmt) -> torch.Tensor:
    """Every encoding of a format of at most 16 bits, as float32; float32: its special
    values and a sweep of exponents."""
    fmt = emu.format(fmt)
    if fmt.bits <= 16:
        codes = np.arange(1 << fmt.bits, dtype=np.uint32)
        return torch.from_numpy(np.asarray(emu.from_bits(codes, fmt), np.float32))
    return _specials(fmt)


def _specials(fmt) -> torch.Tensor:
    """A format's special values: ±0, the smallest and largest subnormal, the smallest
    normal, 1 and its neighbours, the largest finite value, ±inf and NaN where the
    format has them, the composites' clamps and thresholds; and one value per binade."""
    fmt = emu.format(fmt)
    one = 1.0
    ulp = 2.0 ** -fmt.man_bits
    tiny = float(np.uint32(fmt.consts.minnorm32).view(np.float32))
    big = float(np.uint32(fmt.consts.max32).view(np.float32))
    vals = [0.0, tiny * ulp, tiny * (1 - ulp), tiny, one, one + ulp * 2, one - ulp, big,
            float("inf"), float("nan"), 88.0, 88.7, 16.0, 20.0, 5.0, 0.5, 2.0 ** 10,
            *(1.375 * 2.0 ** e for e in range(-30, 31, 3))]
    vals = vals + [-v for v in vals]
    return emu_round(torch.tensor(vals, dtype=torch.float32), fmt)


def emu_round(x, fmt):
    return torch.from_numpy(np.asarray(emu.quantize(x.numpy(), fmt), np.float32))


def _rows(values: torch.Tensor, n: int) -> torch.Tensor:
    """The values in rows of ``n`` (the last row filled up by starting over)."""
    rows = -(-values.numel() // n)
    return values[torch.arange(rows * n) % values.numel()].reshape(rows, n)


def _pass(fn, x, seed=0):
    """Output and input gradient of ``fn(x)``, the output gradient random (and a
    residual consumer of x beside the composite, so slots add to a gradient already
    there)."""
    x = x.clone().requires_grad_()
    y = fn(x)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)) * 2
    (y * g).sum().add((x * 0.25).sum()).backward()
    return y.detach(), x.grad


NE = check_numerics("float32", "approx", "nearest_even")


def _same_both_ways(fn, x, what):
    assert _compose.fusable(NE, x)
    with _compose.use(True):
        fused = _pass(fn, x)
    with _compose.use(False):
        graph = _pass(fn, x)
    for i, (a, b) in enumerate(zip(fused, graph)):
        assert_bits_equal(a.numpy(), b.numpy(), what=f"{what}[{i}]")


ELEMENTWISE = {
    "sigmoid": lambda x, kw: PE.pa_sigmoid(x, **kw),
    "tanh": lambda x, kw: PE.pa_tanh(x, **kw),
    "silu": lambda x, kw: PE.pa_silu(x, **kw),
    "gelu tanh": lambda x, kw: PE.pa_gelu(x, "tanh", **kw),
    "gelu erf": lambda x, kw: PE.pa_gelu(x, **kw),
    "softplus": lambda x, kw: PE.pa_softplus(x, **kw),
    "softplus beta": lambda x, kw: PE.pa_softplus(x, 2.0, 5.0, **kw),
    "rsqrt": lambda x, kw: PE.pa_rsqrt(x, **kw),
    # the losses' elementwise parts, the target a permutation of the values (it takes a
    # gradient too)
    "huber": lambda x, kw: PL.pa_huber_loss(x, x.flip(-1), "none", 0.7, **kw),
    "smooth_l1": lambda x, kw: PL.pa_smooth_l1_loss(x, x.flip(-1), "none", 0.3, **kw),
    "bce": lambda x, kw: PL.pa_binary_cross_entropy(x, x.flip(-1), None, "none", **kw),
    "bce with logits": lambda x, kw: PL.pa_binary_cross_entropy_with_logits(
        x, x.flip(-1), None, "none", **kw),
    "kl_div": lambda x, kw: PL.pa_kl_div(x, x.flip(-1), "none", **kw),
}


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2", "e3m2", "float4_e2m1fn",
                                 "bf16", "float16", "float32"])
def test_elementwise_composites_on_every_value(fmt, kind, rounding, monkeypatch):
    """Every value of the format (every special value of float32) through each
    elementwise composite, fused and as its graph."""
    monkeypatch.setattr(sizes, "FUSED_MAX", 1 << 17)     # the 16-bit formats in one call
    monkeypatch.setattr(sizes, "FUSED_MAX_GELU", 1 << 17)
    x = _rows(_every_value(fmt), 256)
    kw = dict(fmt=fmt, backward=kind, rounding=rounding)
    for name, fn in ELEMENTWISE.items():
        _same_both_ways(lambda a: fn(a, kw), x, f"{name} {fmt}")


ROWS = {
    "softmax": lambda x, kw: PF.pa_softmax(x, -1, **kw),
    "softmax scaled": lambda x, kw: PF.along(D.softmax, x, -1, check_numerics(**{
        "backward": "approx", "rounding": "nearest_even", **kw}), scale=0.3),
    "mean": lambda x, kw: PE.pa_mean(x, -1, True, **kw),
    "mean of all": lambda x, kw: PE.pa_mean(x, **kw).reshape(1),
    "batch_norm": lambda x, kw: PN.pa_batch_norm(x.t(), training=True, **kw).t(),
    "log_softmax": lambda x, kw: PL.pa_log_softmax(x, -1, **kw),
    "layer_norm": lambda x, kw: PF.pa_layer_norm(x, x.shape[-1], **kw),
    "rms_norm": lambda x, kw: PE.pa_rms_norm(x, x.shape[-1], None, 1e-6, **kw),
    "cross_entropy": lambda x, kw: PF.pa_cross_entropy(
        x, torch.arange(x.shape[0]) % x.shape[1], reduction="none", label_smoothing=0.1,
        **kw),
}


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "e3m2", "bf16", "float32"])
def test_row_composites_on_special_values(fmt, kind, rounding):
    """Rows of the format's special values (every value of an 8-bit format), each row
    once as it is and once with its finite values only (so the statistics are finite)."""
    v = _every_value(fmt) if emu.format(fmt).bits <= 8 else _specials(fmt)
    g = torch.Generator().manual_seed(1)
    v = v[torch.randperm(v.numel(), generator=g)]
    x = torch.cat([_rows(v, 8), _rows(v[torch.isfinite(v)], 8)])
    kw = dict(fmt=fmt, backward=kind, rounding=rounding)
    for name, fn in ROWS.items():
        _same_both_ways(lambda a: fn(a, kw), x, f"{name} {fmt}")


def test_every_composite_runs_fused():
    """Each composite of composites.py (its ``__all__``) traces into kernels that compile
    and run from its public function: a composite described there needs nothing else."""
    from torch_bridge.recurrent import _pa_cell
    x = torch.randn(3, 8)
    nm = tb.config.check_numerics("bf16", "approx", "nearest_even")
    for fn in list(ELEMENTWISE.values()) + list(ROWS.values()):
        fn(x, dict(fmt="bf16"))
    _pa_cell("gru", nm, torch.randn(3, 6), torch.randn(3, 6), torch.randn(3, 2))
    _pa_cell("lstm", nm, torch.randn(3, 8), torch.randn(3, 8), torch.randn(3, 2))
    planned = {key[0].__name__ for key in _compose._PLANS}
    assert set(D.__all__) <= planned, set(D.__all__) - planned


def test_generated_backward_follows_autograd_order():
    """A value with several consumers inside the composite (layer norm's x - μ, tanh's
    x + x) gets their contributions in autograd's order: the generated source adds them
    in decreasing creation order, and the input's contributions are separate slots."""
    p = _compose.plan(D.layer_norm, (("x", "e"),), ("n", "eps"), weight=None, bias=None)
    assert [(i, k) for i, _, k in p.slots] == [(0, 0), (0, 0)]
    assert p.slots[0][1] > p.slots[1][1]        # x - μ (created later) first, then Σx
    b = p.backward((True,))
    assert b.kernels[True, N.APPROX].py_func.__code__.co_filename.endswith(".py")
    assert "add(" in b.source                  # x - μ's gradient: three contributions
    t = _compose.plan(D.tanh, (("x", "e"),))
    assert len(t.slots) == 2                                       # x + x: two operands

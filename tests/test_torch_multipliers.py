"""torch_bridge with a multiplier other than PAM (issue 23): ``PAMConfig(mul=...)`` and
``pam_matmul(..., mul=...)`` give emu.matmul's bits forward and emu.grad.matmul's
derivatives backward, on every path (per call, one-call linear, batched); the
elementwise products, the composites and the optimizers follow the multiplier."""
import numpy as np
import pytest
import torch

import emu
import emu.grad
import torch_bridge as tb
from conftest import assert_bits_equal
from torch_bridge import elementwise as PE
from torch_bridge import functional as PF
from torch_bridge import losses as PL

MULS = ["lmul", "pam+2", "exact", "float", "cpam2-unbiased", "cpam1:0,1,-1,0"]


def _np(t):
    return t.detach().numpy()


@pytest.mark.parametrize("mul", MULS)
@pytest.mark.parametrize("shape_a,shape_b", [((5, 7), (7, 3)), ((2, 40, 70), (70, 60)),
                                             ((3, 1, 6, 9), (2, 9, 4))])
def test_pam_matmul_forward_and_backward_are_emus(mul, shape_a, shape_b, rng):
    a = torch.tensor(rng.standard_normal(shape_a), dtype=torch.float32, requires_grad=True)
    b = torch.tensor(rng.standard_normal(shape_b), dtype=torch.float32, requires_grad=True)
    c = PF.pam_matmul(a, b, "bf16", mul=mul)
    assert_bits_equal(_np(c), emu.matmul(_np(a), _np(b), "bf16", mul=mul), what="forward")
    g = torch.tensor(rng.standard_normal(tuple(c.shape)), dtype=torch.float32)
    c.backward(g)
    da, db = emu.grad.matmul(_np(a), _np(b), emu.quantize(g.numpy(), "bf16"), "bf16", mul=mul)
    assert_bits_equal(a.grad.numpy(), da, what="dA")
    assert_bits_equal(b.grad.numpy(), db, what="dB")


@pytest.mark.parametrize("mul", ["pam", *MULS])
def test_grad_matmul_is_the_approximate_rule(mul, rng):
    """emu.grad.matmul's approximate derivative: δA = matmul(δY, Bᵀ), δBᵀ = matmul(δYᵀ, A),
    δY the first operand of each product (cpam1:0,1,-1,0 does not commute), also where
    the 2-D code would transpose the smaller operand."""
    for m, k, n in [(3, 50, 4), (60, 5, 2)]:
        A = rng.standard_normal((m, k)).astype(np.float32)
        B = rng.standard_normal((k, n)).astype(np.float32)
        G = rng.standard_normal((m, n)).astype(np.float32)
        da, db = emu.grad.matmul(A, B, G, "e4m3fn", mul=mul)
        assert_bits_equal(da, emu.matmul(G, B.T, "e4m3fn", mul=mul), what=f"dA {m}x{k}x{n}")
        assert_bits_equal(db, emu.matmul(G.T, A, "e4m3fn", mul=mul).T, what=f"dB {m}x{k}x{n}")
        # batched A over a 2-D B (a weight): one fold over (batch, i)
        A3 = rng.standard_normal((2, m, k)).astype(np.float32)
        G3 = rng.standard_normal((2, m, n)).astype(np.float32)
        _, db3 = emu.grad.matmul(A3, B, G3, "e4m3fn", mul=mul)
        want = emu.matmul(G3.reshape(-1, n).T, A3.reshape(-1, k), "e4m3fn", mul=mul).T
        assert_bits_equal(db3, want, what=f"batched dB {m}x{k}x{n}")


@pytest.mark.parametrize("mul", MULS)
def test_model_under_pam_mode_follows_the_multiplier(mul, rng):
    """A small MLP under pam_mode with PAMConfig(mul=...): its linear layers (the
    one-call kernels for a constant pattern sum, the per-call path otherwise) give
    emu.matmul's forward bits and the approximate backward's weight gradients."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 8, bias=False)
    x = torch.tensor(rng.standard_normal((6, 24)), dtype=torch.float32)
    cfg = tb.PAMConfig("bf16", ops=("matmul",), mul=mul)
    with tb.pam_mode(cfg):
        y = lin(x)
        y.sum().backward()
    xw = (_np(x), _np(lin.weight).T)
    assert_bits_equal(_np(y), emu.matmul(*xw, "bf16", mul=mul), what="forward")
    _, dw = emu.grad.matmul(*xw, np.ones((6, 8), np.float32), "bf16", mul=mul)
    assert_bits_equal(lin.weight.grad.numpy(), dw.T, what="dW")


def test_the_multiplier_changes_the_result_and_pam_is_the_default(rng):
    a = torch.tensor(rng.standard_normal((4, 9)), dtype=torch.float32)
    b = torch.tensor(rng.standard_normal((9, 3)), dtype=torch.float32)
    assert torch.equal(PF.pam_matmul(a, b, "bf16"), PF.pam_matmul(a, b, "bf16", mul="pam"))
    assert not torch.equal(PF.pam_matmul(a, b, "bf16"), PF.pam_matmul(a, b, "bf16", mul="lmul"))
    assert tb.PAMConfig().mul == emu.MULTIPLIERS["pam"]
    assert tb.PAMConfig("bf16", ops=("matmul",), mul="lmul").describe() == \
        "bfloat16 matmul approx mul=lmul"


@pytest.mark.parametrize("kw,match", [
    (dict(mul="cpam2-unbiased"), "pa_fmt=float32: cpam2-unbiased: tables are shipped for mantissa widths"),
    (dict(mul="float", ops=("matmul",), fmt="mxfp8_e4m3"), "fmt=mxfp8_e4m3: mul=.float. with"),
    (dict(mul="cpam4-unbiased", ops=("matmul",), fmt="e4m3fn"), "indexes 4 mantissa bits"),
    (dict(mul="lmull", ops=("matmul",)), "mul='lmull' is not a multiplier"),
])
def test_config_rejects_what_the_multiplier_does_not_support(kw, match):
    with pytest.raises(ValueError, match=match):
        tb.PAMConfig(**kw)


def test_config_accepts_every_group_and_the_exact_derivative():
    cfg = tb.PAMConfig("bf16", mul="lmul", backward="exact")
    assert cfg.describe() == "bfloat16 all-ops exact mul=lmul"
    tb.PAMConfig("bf16", mul="cpam2-unbiased", pa_fmt="bf16")
    tb.PAMConfig("bf16", mul="cpam2-unbiased", ops=("matmul",))     # pa_fmt unused


@pytest.mark.parametrize("kind", ["approx", "exact"])
@pytest.mark.parametrize("mul", ["lmul", "exact", "cpam1:0,1,-1,0"])
def test_elementwise_product_is_emu_mul(mul, kind, rng):
    """PF.pam_mul with mul=: emu.mul forward, emu.grad.mul backward (a broadcast
    operand's gradient folded over the broadcast rows)."""
    a = torch.tensor(rng.standard_normal((5, 6)), dtype=torch.float32, requires_grad=True)
    b = torch.tensor(rng.standard_normal((5, 6)), dtype=torch.float32, requires_grad=True)
    y = PF.pam_mul(a, b, "bf16", mul=mul, backward=kind)
    assert_bits_equal(_np(y), emu.mul(_np(a), _np(b), "bf16", mul))
    g = torch.tensor(rng.standard_normal((5, 6)), dtype=torch.float32)
    y.backward(g)
    da, db = emu.grad.mul(_np(a), _np(b), emu.quantize(g.numpy(), "bf16"), "bf16", kind, mul)
    assert_bits_equal(a.grad.numpy(), da, what="dA")
    assert_bits_equal(b.grad.numpy(), db, what="dB")
    # a number operand takes the same products (not PAM's constant kernels)
    z = PF.pam_mul(a.detach(), 0.3, "bf16", mul=mul)
    assert_bits_equal(_np(z), emu.mul(_np(a), np.float32(0.3), "bf16", mul))


COMPOSITES = {
    "softmax": lambda x, kw: PF.pa_softmax(x, -1, **kw),
    "layer_norm": lambda x, kw: PF.pa_layer_norm(x, (x.shape[-1],), **kw),
    "rms_norm": lambda x, kw: PE.pa_rms_norm(x, (x.shape[-1],), **kw),
    "cross_entropy": lambda x, kw: PF.pa_cross_entropy(x, torch.tensor([1, 0, 3]), reduction="none", **kw),
    "mse": lambda x, kw: PL.pa_mse_loss(x, torch.ones_like(x), **kw),
    "gelu": lambda x, kw: PE.pa_gelu(x, "tanh", **kw),
    "vector_norm": lambda x, kw: PE.pa_vector_norm(x, -1, **kw),
}


@pytest.mark.parametrize("name", COMPOSITES)
def test_composites_follow_the_multiplier(name, rng):
    """Each composite's products take the multiplier: a corrected PAM with a zero table
    (the other multipliers' path, PAM's products) gives PAM's bits forward and backward,
    L-Mul changes the result, and its backward runs to finite gradients."""
    x = torch.tensor(rng.standard_normal((3, 8)), dtype=torch.float32)
    f = COMPOSITES[name]
    kw = dict(fmt="bf16", backward="exact")
    xp, xz = x.clone().requires_grad_(), x.clone().requires_grad_()
    pam = f(xp, kw)
    zero = f(xz, dict(kw, mul="cpam1:0,0,0,0"))
    assert torch.equal(zero, pam)
    pam.sum().backward()
    zero.sum().backward()
    assert torch.equal(xz.grad, xp.grad)
    pam = pam.detach()
    xl = x.clone().requires_grad_()
    lm = f(xl, dict(kw, mul="lmul"))
    assert not torch.equal(lm, pam)
    lm.sum().backward()
    assert torch.isfinite(xl.grad).all() and xl.grad.abs().sum() > 0


@pytest.mark.parametrize("mul", ["lmul", "exact"])
def test_optimizer_update_takes_the_multiplier(mul, rng):
    """PASGD's ``p -= lr ⊙ g`` with the multiplier, bit for bit; PAAdamW leaves its
    fused PAM kernel for the sequence of emu calls and differs from PAM."""
    cfg = tb.PAMConfig("bf16", mul=mul, pa_fmt="bf16")
    p = torch.nn.Parameter(torch.tensor(rng.standard_normal(50), dtype=torch.float32))
    p.grad = torch.tensor(rng.standard_normal(50), dtype=torch.float32)
    before = p.detach().clone()
    tb.PASGD([p], lr=0.01, config=cfg).step()
    step = emu.mul(p.grad.numpy(), np.float32(0.01), "bf16", mul)
    assert_bits_equal(p.detach().numpy(), before.numpy() - step)
    results = {}
    for m in ("pam", mul):
        q = torch.nn.Parameter(before.clone())
        q.grad = p.grad.clone()
        tb.PAAdamW([q], lr=0.01, config=cfg.replace(mul=m)).step()
        results[m] = q.detach()
    assert not torch.equal(results["pam"], results[mul])


def test_training_step_under_pam_mode_with_every_group(rng):
    """An MLP step under pam_mode with every group on and L-Mul: loss and gradients are
    finite, and differ from PAM's."""
    losses = {}
    for mul in ("pam", "lmul"):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16),
                                  torch.nn.GELU(), torch.nn.Linear(16, 3))
        x = torch.tensor(rng.standard_normal((10, 8)), dtype=torch.float32)
        cfg = tb.PAMConfig("bf16", mul=mul, pa_fmt="bf16")
        with tb.pam_mode(cfg):
            loss = torch.nn.functional.cross_entropy(net(x), torch.arange(10) % 3)
            loss.backward()
        assert torch.isfinite(net[0].weight.grad).all()
        losses[mul] = float(loss.detach())
    assert losses["pam"] != losses["lmul"]


def test_audit_counts_another_multiplier_as_emulated(rng):
    """The audit under L-Mul: the model's products all run emulated, as under PAM."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                              torch.nn.Linear(16, 3))
    x = torch.tensor(rng.standard_normal((4, 8)), dtype=torch.float32)
    y = torch.arange(4) % 3
    cfg = tb.PAMConfig("bf16", mul="lmul")
    rep = tb.audit(net, (x,), cfg, loss_fn=lambda z: torch.nn.functional.cross_entropy(z, y))
    native = tb.audit(net, (x,), None, loss_fn=lambda z: torch.nn.functional.cross_entropy(z, y))
    assert rep.escaped == 0 and native.escaped > 0


@pytest.mark.parametrize("mul", ["lmul", "exact"])
def test_mx_matmul_follows_the_multiplier(mul, rng):
    """PAMConfig(fmt=MX, mul=...): emu.mx_matmul forward; backward emu.grad.matmul of the
    MX values by the element format's rule."""
    a = torch.tensor(rng.standard_normal((4, 64)), dtype=torch.float32, requires_grad=True)
    b = torch.tensor(rng.standard_normal((64, 3)), dtype=torch.float32, requires_grad=True)
    c = PF.pam_matmul(a, b, "mxfp8_e4m3", mul=mul)
    assert_bits_equal(_np(c), emu.mx_matmul(_np(a), _np(b), "mxfp8_e4m3", mul=mul))
    c.backward(torch.ones_like(c))
    mx = emu.mx.mx_format("mxfp8_e4m3")
    ra, rb = mx.round(_np(a), -1), mx.round(_np(b), -2)
    da, db = emu.grad.matmul(ra, rb, mx.round(np.ones((4, 3), np.float32), -1), "float32",
                             mul=mul, mul_fmt="float8_e4m3fn")
    assert_bits_equal(a.grad.numpy(), da, what="dA")
    assert_bits_equal(b.grad.numpy(), db, what="dB")


def test_rnn_tanh_takes_the_multiplier():
    """nn.RNN's tanh (the elementwise group alone, matmuls native) follows PAMConfig.mul:
    it dropped the multiplier, so every mul gave PAM's bits."""
    torch.manual_seed(0)
    m, x = torch.nn.RNN(4, 6), torch.randn(5, 2, 4)
    outs = {}
    for mul in ("pam", "lmul", "cpam1:0,0,0,0"):
        with tb.pam_mode(tb.PAMConfig("bf16", ops={"elementwise"}, mul=mul)):
            outs[mul] = m(x)[0]
    assert torch.equal(outs["cpam1:0,0,0,0"], outs["pam"])       # PAM's products, another path
    assert not torch.equal(outs["lmul"], outs["pam"])

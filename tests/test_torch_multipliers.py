"""torch_bridge with a multiplier other than PAM (issue 23): ``PAMConfig(mul=...)`` and
``pam_matmul(..., mul=...)`` give emu.matmul's bits forward and emu.grad.matmul's
approximate derivative backward, on every path (per call, one-call linear, batched)."""
import numpy as np
import pytest
import torch

import emu
import emu.grad
import torch_bridge as tb
from conftest import assert_bits_equal
from torch_bridge import functional as PF

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
    (dict(mul="lmul"), "matmul group only"),
    (dict(mul="lmul", ops=("matmul",), backward="exact"), "exact matmul derivative"),
    (dict(mul="lmul", ops=("matmul",), fmt="mxfp8_e4m3"), "MX formats"),
    (dict(mul="cpam4-unbiased", ops=("matmul",), fmt="e4m3fn"), "indexes 4 mantissa bits"),
    (dict(mul="lmull", ops=("matmul",)), "mul='lmull' is not a multiplier"),
])
def test_config_rejects_what_the_multiplier_does_not_support(kw, match):
    with pytest.raises(ValueError, match=match):
        tb.PAMConfig(**kw)

"""torch_bridge with a scaling recipe as ``fmt`` (issue 26): a linear layer's three GEMMs are
emu.recipe_matmul with their roles, bit for bit; delayed scaling's states live in module
buffers and resume exactly from a state_dict; bad configs fail before any work."""
import numpy as np
import pytest
import torch

import emu
import torch_bridge as tb
from conftest import assert_bits_equal


def _layer(fmt, mul="pam", n_in=48, n_out=20, seed=0):
    torch.manual_seed(seed)
    cfg = tb.PAMConfig(fmt=fmt, ops={"matmul"}, mul=mul)
    return tb.PAMLinear(n_in, n_out, bias=False, config=cfg)


@pytest.mark.parametrize("fmt,mul", [("nvfp4", "pam"), ("nvfp4", "lmul"), ("fp8_block/16", "pam"),
                                     ("fp8_current", "exact"), ("fp8_rowwise", "lmul"),
                                     ("mxfp4_e2m1/16", "pam")])
def test_linear_is_the_recipe_gemms(fmt, mul):
    """Forward A·Wᵀ (act, weight), dgrad dC·W (grad, weight), wgrad Aᵀ·dC (act, grad): each
    emu.recipe_matmul, shapes its blocks do not divide included (5 tokens, 20 outputs)."""
    r = emu.recipe(fmt)
    lin = _layer(r, mul)
    rng = np.random.default_rng(1)
    x = torch.tensor(rng.standard_normal((5, 48)).astype(np.float32), requires_grad=True)
    dc = rng.standard_normal((5, 20)).astype(np.float32)
    y = lin(x)
    y.backward(torch.from_numpy(dc))
    w = lin.weight.detach().numpy()
    xn = x.detach().numpy()
    assert_bits_equal(y.detach().numpy(), emu.recipe_matmul(xn, w.T, r, mul=mul), what="forward")
    assert_bits_equal(x.grad.numpy(), emu.recipe_matmul(dc, w, r, mul=mul,
                                                        roles=("grad", "weight")), what="dgrad")
    assert_bits_equal(lin.weight.grad.numpy().T, emu.recipe_matmul(
        xn.T, dc, r, mul=mul, roles=("act", "grad")), what="wgrad")


def test_products_of_activations_and_convolutions():
    """A product of two activations (attention) runs in float32 operands with the same
    multiplier; a convolution's weight (the left operand) takes the weight role."""
    cfg = tb.PAMConfig(fmt="fp8_block/8", ops={"matmul"})
    rng = np.random.default_rng(2)
    q, k = (torch.tensor(rng.standard_normal((2, 6, 16)).astype(np.float32)) for _ in "qk")
    with tb.pam_mode(cfg):
        s = torch.matmul(q, k.transpose(-1, -2))
    assert_bits_equal(s.numpy(), emu.matmul(q.numpy(), k.transpose(-1, -2).numpy(), "float32"),
                      what="activations")
    torch.manual_seed(0)
    conv = tb.PAMConv2d(2, 8, 2, bias=False, config=cfg)
    x = torch.tensor(rng.standard_normal((1, 2, 5, 5)).astype(np.float32))
    y = conv(x)
    cols = torch.nn.functional.unfold(x, 2).numpy()[0]                # (C·kh·kw, L)
    want = emu.recipe_matmul(cols.T, conv.weight.detach().reshape(8, -1).numpy().T,
                             cfg.fmt).T.reshape(1, 8, 4, 4)
    assert_bits_equal(y.detach().numpy(), want, what="conv")


def test_delayed_scaling_states_are_buffers_and_resume_exactly():
    """fp8_delayed/h3: the act history holds the last three amaxes, most recent first; a
    state_dict taken after two steps resumes the third step bit for bit."""
    rng = np.random.default_rng(3)
    xs = [torch.tensor(rng.standard_normal((4, 48)).astype(np.float32) * 2.0 ** i)
          for i in range(3)]
    lin = _layer("fp8_delayed/h3")
    assert set(lin.state_dict()) == {"weight", "recipe_amax", "recipe_scale"}
    for x in xs[:2]:
        lin(x).sum().backward()
    saved = {k: v.clone() for k, v in lin.state_dict().items()}
    amax = [np.float32(np.abs(x.numpy()).max()) for x in xs[:2]]
    assert lin.recipe_amax[0].tolist() == [amax[1], amax[0], 0.0]
    assert lin.recipe_amax[2, 0] > 0 and lin.recipe_scale[0] != 1     # grads, scales moved
    y3 = lin(xs[2])
    again = _layer("fp8_delayed/h3", seed=1)          # other initial weights
    again.load_state_dict(saved)
    assert_bits_equal(again(xs[2]).detach().numpy(), y3.detach().numpy(), what="resumed")
    assert torch.equal(again.recipe_amax, lin.recipe_amax)


@pytest.mark.parametrize("kw,msg", [
    (dict(fmt="fp8_block/0"), "fmt='fp8_block/0'"),
    (dict(fmt="nvfp5"), "a scaling recipe \\(nvfp4, fp8_current"),
    (dict(fmt="fp8_delayed/h0"), "history"),
    (dict(fmt="nvfp4", rounding="stochastic"), "round to nearest even only"),
    (dict(fmt="fp8_current", backward="exact"), "backward\\['matmul'\\]='exact'"),
    (dict(fmt="fp8_current", mul="lmul"), "fmt=fp8_current, dgrad GEMM: mul='lmul'"),
    (dict(fmt="nvfp4", mul="float"), "mul='float'")])
def test_bad_configs(kw, msg):
    with pytest.raises(ValueError, match=msg):
        tb.PAMConfig(**kw)


def test_cli_takes_recipes(capsys):
    from sim.cli import main
    with pytest.raises(SystemExit) as exc:
        main(["train", "--fmt", "nvfp4/0"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2
    assert err.startswith("pamsim train: error: argument --fmt:") and "\n" not in err
    from sim.commands.sweep import rows_arg
    assert rows_arg("nvfp4,fp8_block/32,mxfp4,p3109_p4") == ["nvfp4", "fp8_block/32",
                                                             "mxfp4_e2m1", "p3109_p4"]

"""Training-step op counting (known counts for Linear, Conv2d, attention), saved bytes,
the per-scenario energy, the reference models and bad input."""
import pytest
import torch
from torch import nn

import emu
from costs import analytic as A
from costs.step import count_step, model_step, scenarios, step_energy


def _sgd_step(module, x):
    opt = torch.optim.SGD(module.parameters(), lr=0.1, foreach=False)
    return count_step(module, lambda: module(x).sum(), opt)


def test_linear_known_counts():
    B, IN, OUT = 5, 20, 7
    lin = nn.Linear(IN, OUT)
    x = torch.randn(B, IN, requires_grad=True)
    c = _sgd_step(lin, x)
    # y = x W^T + b; backward: dx = dy W and dW = dy^T x
    assert c.macs == {"forward": B * IN * OUT, "backward": 2 * B * IN * OUT, "optimizer": 0}
    assert c.macs_by_op == {"aten.addmm": B * IN * OUT, "aten.mm": 2 * B * IN * OUT}
    # forward: the bias adds of addmm + the B*OUT - 1 additions of .sum()
    assert c.ops["forward"] == {"add": B * OUT + B * OUT - 1}
    # backward: the bias gradient sums dy over the batch
    assert c.ops["backward"] == {"add": B * OUT - OUT}
    # SGD: p += (-lr) * g, one multiply and one add per parameter
    P = IN * OUT + OUT
    assert c.ops["optimizer"] == {"mul": P, "add": P}
    assert c.params == P
    # saved for backward: the input x (the weight is a parameter, not an activation)
    assert c.saved_bytes == B * IN * 4 and c.saved_float_bytes == B * IN * 4
    assert c.unclassified == {}


def test_conv2d_known_counts():
    B, Cin, Cout, k, H = 2, 3, 4, 3, 8
    conv = nn.Conv2d(Cin, Cout, k)
    x = torch.randn(B, Cin, H, H, requires_grad=True)
    c = _sgd_step(conv, x)
    Ho = H - k + 1
    macs = B * Cout * Ho * Ho * Cin * k * k
    assert c.macs == {"forward": macs, "backward": 2 * macs, "optimizer": 0}
    n_out = B * Cout * Ho * Ho
    assert c.ops["forward"] == {"add": n_out + n_out - 1}        # bias, then .sum()
    assert c.ops["backward"] == {"add": n_out - Cout}            # bias gradient
    assert c.saved_bytes == B * Cin * H * H * 4


def test_first_layer_has_no_input_gradient():
    lin = nn.Linear(6, 3, bias=False)
    c = _sgd_step(lin, torch.randn(4, 6))
    assert c.macs == {"forward": 72, "backward": 72, "optimizer": 0}


def test_attention_matmuls_are_visible():
    """sdpa runs with the MATH backend: Q K^T and P V are counted, softmax decomposed."""
    B, L, E, h = 2, 5, 8, 2
    mha = nn.MultiheadAttention(E, h, batch_first=True)
    x = torch.randn(B, L, E)
    c = count_step(mha, lambda: mha(x, x, x, need_weights=False)[0].sum(),
                   torch.optim.SGD(mha.parameters(), lr=0.1, foreach=False))
    proj = 3 * B * L * E * E + B * L * E * E
    scores = B * h * L * L * (E // h)
    assert c.macs["forward"] == proj + 2 * scores
    assert c.ops["forward"]["special"] == B * h * L * L        # one exp per score
    assert c.ops["forward"]["div"] >= B * h * L * L             # softmax normalisation
    assert c.unclassified == {}


def test_adamw_update_counts():
    lin = nn.Linear(3, 2)
    c = count_step(lin, lambda: lin(torch.randn(4, 3)).sum())      # default AdamW
    P = 8
    # decay p*=(1-lr*wd); m.lerp_(g); v*=b2; v+=(1-b2)*g*g; (sqrt(v)/bc).add_(eps);
    # p.addcdiv_(m, denom, -step); plus each parameter tensor's step counter += 1
    assert c.ops["optimizer"] == {"mul": 6 * P, "add": 5 * P + 2, "div": 2 * P, "special": P}


def test_step_energy_formula():
    lin = nn.Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    c = _sgd_step(lin, x)
    native, mixed, pam, pa = (step_energy(c, s) for s in scenarios("bf16", "float32"))
    f32 = emu.float32
    macs = c.total_macs
    assert native.multiply_pj == pytest.approx(
        macs * A.fp_mul(f32).energy_pj + c.total_ops("mul") * A.fp_mul(f32).energy_pj)
    assert native.accumulate_pj == pytest.approx(
        (macs + c.total_ops("add")) * A.fp_add(f32).energy_pj)
    assert native.memory_pj == pytest.approx(2 * c.saved_bytes * 1300 / 8)
    assert mixed.memory_pj == pytest.approx(native.memory_pj / 2)     # bf16 activations
    assert pam.multiply_pj == pytest.approx(
        macs * A.pam_mul("bf16").energy_pj + c.total_ops("mul") * A.fp_mul(f32).energy_pj)
    assert pa.multiply_pj == pytest.approx(
        macs * A.pam_mul("bf16").energy_pj + c.total_ops("mul") * A.pam_mul(f32).energy_pj)
    assert native.total_pj > mixed.total_pj > pam.total_pj > pa.total_pj
    assert pam.accumulate_pj == mixed.accumulate_pj
    sram = step_energy(c, scenarios()[0], memory="sram_1mb")
    assert sram.memory_pj == pytest.approx(native.memory_pj * 100 / 1300)
    adders = step_energy(c, scenarios()[2], rule="adders")
    assert adders.multiply_pj < pam.multiply_pj


def test_reference_model_step_counts():
    model, loss_fn = model_step("vit", batch_size=2)
    c = count_step(model, loss_fn)
    assert c.unclassified == {}
    assert c.macs["backward"] == pytest.approx(2 * c.macs["forward"], rel=0.02)
    assert c.macs["optimizer"] == 0 and c.macs["forward"] > 1e6
    assert c.total_ops("special") > 0 and c.ops["optimizer"]["special"] == c.params
    assert c.saved_bytes > 4 * 2 * 17 * 64        # at least one (batch, tokens, dim) map


def test_minilm_step():
    model, loss_fn = model_step("minilm", batch_size=1, seq_len=16)
    c = count_step(model, loss_fn)
    assert c.unclassified == {}
    assert c.params == sum(p.numel() for p in model.parameters())
    # AdamW updates only parameters that got a gradient (not the unused BERT pooler)
    updated = sum(p.numel() for p in model.parameters() if p.grad is not None)
    assert 0 < updated < c.params
    assert c.macs["forward"] > 0 and c.ops["optimizer"]["mul"] == 6 * updated


@pytest.mark.parametrize("call,exc,msg", [
    (lambda: model_step("resnet"), ValueError, "model='resnet'"),
    (lambda: model_step("vit", batch_size=0), ValueError, "batch_size must be a positive int"),
    (lambda: count_step("vit", lambda: 0), TypeError, "model must be a torch.nn.Module"),
    (lambda: count_step(nn.Linear(2, 2), lambda: nn.Linear(2, 2)(torch.ones(3, 2))),
     ValueError, "loss_fn must return a scalar"),
    (lambda: scenarios("bf17"), ValueError, "fmt='bf17'"),
    (lambda: scenarios("bf16", "f33"), ValueError, "acc='f33'"),
])
def test_bad_input(call, exc, msg):
    with pytest.raises(exc, match=msg):
        call()

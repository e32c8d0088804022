"""What the memory-saving activations keep for backward, measured with
saved_tensors_hooks on real blocks (exact byte counts), and convert_activations."""
import numpy as np
import pytest
import torch
from torch import nn

from sim.memory_study import (VARIANTS, minilm_case, mlp_block, saved_bytes, saved_memory,
                              transformer_block)
from torch_bridge.memory import (FewBitActivation, InvertedActivation, PAActivation,
                                 convert_activations, packed_nbytes)

TOKENS, D, HIDDEN = 64, 32, 128
N = TOKENS * HIDDEN                      # elements entering the (one) GELU


def x_maker():
    return torch.randn(TOKENS // 16, 16, D)


def expected_delta(label: str) -> int:
    """Saved bytes minus native when the GELU output is the next Linear's input: the
    fp32 input copy (4N) goes, the packed index or branch mask comes."""
    if label == "native":
        return 0
    bits = {"InvAct": 1, "PA 16": 4}.get(label) or int(label.split()[-1])
    return packed_nbytes(N, bits) - 4 * N


def test_mlp_block_savings_are_exact():
    torch.manual_seed(0)
    res = saved_memory(mlp_block(D, HIDDEN), x_maker)
    base = res["native"].nbytes
    assert set(res) == set(VARIANTS)
    for label, s in res.items():
        assert s.nbytes - base == expected_delta(label), label
    # native: the block input, the GELU input and the GELU output (the Linear's input)
    assert base == 4 * TOKENS * D + 2 * 4 * N
    assert res["InvAct"].nbytes < res["few-bit 2"].nbytes < res["native"].nbytes


def test_inverted_saves_only_when_the_next_layer_saves_its_input():
    """Transformer block: GELU -> Dropout -> Linear.  With dropout the Linear saves the
    dropped tensor, so InvAct's saved output is extra: it costs the mask *more* than
    native.  Without dropout, the output is shared and InvAct saves 4N - N/8 bytes."""
    torch.manual_seed(0)
    with_dropout = saved_memory(transformer_block(D, 2, HIDDEN, 0.1), x_maker)
    assert with_dropout["InvAct"].nbytes - with_dropout["native"].nbytes == packed_nbytes(N, 1)
    assert with_dropout["few-bit 1"].nbytes - with_dropout["native"].nbytes == \
        expected_delta("few-bit 1")
    torch.manual_seed(0)
    plain = saved_memory(transformer_block(D, 2, HIDDEN, 0.0), x_maker)
    for label, s in plain.items():
        assert s.nbytes - plain["native"].nbytes == expected_delta(label), label


def test_hook_counts_shared_storages_once():
    a = torch.randn(1000, requires_grad=True)
    model = nn.Identity()
    s = saved_bytes(model, lambda: (a * a).sum())      # mul saves a twice
    assert s.tensors == 2 and s.storages == 1 and s.nbytes == 4000
    lin = nn.Linear(10, 10)
    s = saved_bytes(lin, lambda: lin(torch.randn(3, 10)).sum())
    assert s.nbytes == 3 * 10 * 4                       # the weight is not counted


def test_minilm_gelus_are_replaced_and_the_savings_measured():
    bert, make = minilm_case(batch=2, seq=16)
    n_gelu = sum(type(m).__name__ == "GELUActivation" for m in bert.modules())
    assert n_gelu == bert.config.num_hidden_layers == 6
    n = 2 * 16 * bert.config.intermediate_size
    res = saved_memory(bert, make, {k: VARIANTS[k] for k in ("native", "few-bit 2", "InvAct")})
    base = res["native"].nbytes
    # BertIntermediate's GELU feeds BertOutput.dense directly: InvAct's output is shared.
    # few-bit also converts the pooler's Tanh (2 x 384 elements; not invertible)
    pooler = packed_nbytes(2 * 384, 2) - 4 * 2 * 384
    assert res["few-bit 2"].nbytes - base == n_gelu * (packed_nbytes(n, 2) - 4 * n) + pooler
    assert res["InvAct"].nbytes - base == n_gelu * (packed_nbytes(n, 1) - 4 * n)


def test_convert_activations():
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Sequential(nn.LeakyReLU(0.2),
                                                                    nn.Tanh()), nn.SiLU())
    model.eval()
    assert convert_activations(model) is model and isinstance(model[1], nn.GELU)
    convert_activations(model, fewbit=2)
    assert isinstance(model[1], FewBitActivation) and model[1].bits == 2
    assert model[2][0].act.kwargs["negative_slope"] == 0.2
    assert model[2][1].act.name == "tanh" and not model[1].training
    m2 = nn.Sequential(nn.GELU(), nn.Tanh(), nn.SiLU())
    convert_activations(m2, fewbit=3, inverted=True, pa=8)
    assert isinstance(m2[0], PAActivation) and isinstance(m2[2], PAActivation)
    assert isinstance(m2[1], FewBitActivation)           # no PA/inverted tanh: few-bit
    m3 = convert_activations(nn.Sequential(nn.Mish(), nn.GELU(approximate="tanh")),
                             inverted=True)
    assert isinstance(m3[0], InvertedActivation) and m3[1].act.name == "gelu_tanh"
    assert isinstance(convert_activations(nn.GELU(), fewbit=1), FewBitActivation)
    x = torch.randn(3, 4, requires_grad=True)
    y = model(x)
    y.sum().backward()
    assert x.grad is not None and np.isfinite(x.grad.numpy()).all()


@pytest.mark.parametrize("kwargs,err,msg", [
    ({"fewbit": 9}, ValueError, r"fewbit=9 must be an integer in 1\.\.8"),
    ({"fewbit": 0}, ValueError, r"fewbit=0 must be an integer"),
    ({"inverted": 1}, TypeError, r"inverted must be True or False"),
    ({"pa": 1}, ValueError, r"pa=1 must be None or a number of pieces >= 2"),
    ({"fewbit": 2, "weight": "laplace"}, ValueError, r"weight='laplace'; expected one of"),
])
def test_convert_bad_arguments(kwargs, err, msg):
    with pytest.raises(err, match=msg):
        convert_activations(nn.GELU(), **kwargs)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        convert_activations(lambda x: x, fewbit=2)

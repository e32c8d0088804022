"""pam_mode on what users' models do at the edges (issue 25): keyword arguments,
in-place ops followed by backward, finfo.min attention masks."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_bridge as tb

ALL = tb.PAMConfig("bf16")
MATMUL = tb.PAMConfig("bf16", ops=("matmul",))
EW = tb.PAMConfig("bf16", ops=("matmul", "elementwise"))


def _t(*shape, seed=0):
    torch.manual_seed(seed)
    return torch.randn(*shape)


B, M1, M2 = _t(3, 5), _t(3, 4, seed=1), _t(4, 5, seed=2)
BB, B1, B2 = _t(2, 3, 5), _t(2, 3, 4, seed=1), _t(2, 4, 5, seed=2)
X, W, BIAS = _t(3, 4), _t(5, 4, seed=1), _t(5, seed=2)

# (positional call, the same call with keyword arguments)
KEYWORDS = {
    "addmm": (lambda: torch.addmm(B, M1, M2),
              lambda: torch.addmm(B, mat1=M1, mat2=M2)),
    "addmm_alpha_beta": (lambda: torch.addmm(B, M1, M2, beta=0.5, alpha=2.0),
                         lambda: torch.addmm(input=B, mat1=M1, mat2=M2, alpha=2.0, beta=0.5)),
    "Tensor.addmm": (lambda: B.addmm(M1, M2), lambda: B.addmm(mat1=M1, mat2=M2)),
    "baddbmm": (lambda: torch.baddbmm(BB, B1, B2, beta=2.0),
                lambda: torch.baddbmm(BB, batch1=B1, batch2=B2, beta=2.0)),
    "matmul": (lambda: torch.matmul(M1, M2), lambda: torch.matmul(input=M1, other=M2)),
    "Tensor.matmul": (lambda: M1.matmul(M2), lambda: M1.matmul(other=M2)),
    "mm": (lambda: torch.mm(M1, M2), lambda: torch.mm(M1, mat2=M2)),
    "bmm": (lambda: torch.bmm(B1, B2), lambda: torch.bmm(input=B1, mat2=B2)),
    "linear": (lambda: F.linear(X, W, BIAS), lambda: F.linear(input=X, weight=W, bias=BIAS)),
    "mul": (lambda: torch.mul(X, 3.0), lambda: torch.mul(input=X, other=3.0)),
    "div": (lambda: torch.div(X, M1), lambda: torch.div(input=X, other=M1)),
    "Tensor.mul": (lambda: X.mul(M1), lambda: X.mul(other=M1)),
    "softmax": (lambda: torch.softmax(X, 1), lambda: torch.softmax(input=X, dim=1)),
    "F.softmax": (lambda: F.softmax(X, 0), lambda: F.softmax(input=X, dim=0)),
    "pow": (lambda: torch.pow(X, 2), lambda: torch.pow(input=X, exponent=2)),
    "sdpa": (lambda: F.scaled_dot_product_attention(B1, B1, B1),
             lambda: F.scaled_dot_product_attention(query=B1, key=B1, value=B1)),
}


@pytest.mark.parametrize("name", KEYWORDS)
def test_keyword_arguments_give_the_positional_bits(name):
    positional, keyword = KEYWORDS[name]
    with tb.pam_mode(ALL):
        want = positional()
        got = keyword()
    assert torch.equal(got, want)
    assert not torch.equal(want, positional())      # it was PA, not native


def _pa_leaf(*shape):
    return _t(*shape, seed=3).requires_grad_()


# in-place ops on a PA result, each with its out-of-place twin
INPLACE = {
    "imul": (lambda h: h.__imul__(0.5), lambda h: h * 0.5),
    "itruediv": (lambda h: h.__itruediv__(3.0), lambda h: h / 3.0),
    "mul_tensor": (lambda h: h.mul_(h.detach() + 1), lambda h: h * (h.detach() + 1)),
    "sigmoid_": (lambda h: h.sigmoid_(), torch.sigmoid),
    "tanh_": (lambda h: h.tanh_(), torch.tanh),
    "exp_": (lambda h: h.exp_(), torch.exp),
    "silu_inplace": (lambda h: F.silu(h, inplace=True), F.silu),
    "normalise": (lambda h: h.__itruediv__(h.sum(-1, keepdim=True)),
                  lambda h: h / h.sum(-1, keepdim=True)),
}


@pytest.mark.parametrize("name", INPLACE)
def test_inplace_ops_then_backward(name):
    """Autograd's semantics as natively (no 'modified by an inplace operation'); the
    bits of the out-of-place form."""
    inplace, plain = INPLACE[name]
    lin = nn.Linear(4, 6)
    x = _pa_leaf(3, 4)

    def run(op):
        lin.zero_grad()
        x.grad = None
        with tb.pam_mode(EW):
            h = lin(x)
            if name == "normalise":
                h = h.exp()
            y = op(h)
            y.sum().backward()
        return [y.detach(), x.grad, lin.weight.grad]
    assert all(torch.equal(a, b) for a, b in zip(run(inplace), run(plain)))


def test_inplace_into_a_tensor_that_takes_no_gradient():
    """``h *= w`` with only ``w`` requiring grad: w's gradient reads h as it was before
    the write, as natively."""
    def run(inplace):
        w = _pa_leaf(3, 4)
        with tb.pam_mode(EW):
            h = _t(3, 4)
            if inplace:
                h *= w
            else:
                h = h * w
            h.sum().backward()
        return w.grad
    assert torch.equal(run(True), run(False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_finfo_min_mask_rows(dtype, op):
    """transformers' eager-attention mask: finfo.min at masked positions.  Masked
    positions give torch's 0 (log: a huge negative, finite), the others the PA softmax
    of the unmasked ones; a fully masked row is uniform, as torch's."""
    lo = torch.finfo(dtype).min
    x = _t(4, 6).to(dtype)
    masked = x.clone()
    masked[0, :2] = lo
    masked[1, :] = lo
    masked[2, :] = x[2] + lo                 # score + mask, as eager attention adds them
    fn = getattr(F, op)
    with tb.pam_mode(ALL):
        y = fn(masked, -1)
        unmasked = fn(x[0, 2:], -1)
    assert not y.isnan().any()
    if op == "softmax":
        assert torch.equal(y[0, :2], torch.zeros(2, dtype=dtype))
        assert torch.equal(y[0, 2:], unmasked)
        assert torch.equal(y[1], torch.full((6,), y[1, 0].item(), dtype=dtype))
        assert abs(y[1, 0].item() - 1 / 6) < 0.03       # 1 ÷̂ 6
        assert torch.equal(y[3], F.softmax(x[3], -1)) is False    # PA, not native
    else:
        assert torch.equal(y[0, 2:], unmasked)
        assert (y[0, :2] < -1e30).all() and y[1].isfinite().all()


def test_all_minus_inf_rows_stay_nan():
    x = _t(2, 5)
    x[1] = float("-inf")
    with tb.pam_mode(ALL):
        y = F.softmax(x, -1)
    assert y[1].isnan().all() and not y[0].isnan().any()


def test_finfo_min_mask_backward_has_no_nan():
    x = _t(3, 6)
    x[0, :3] = torch.finfo(torch.float32).min
    x[1] = torch.finfo(torch.float32).min
    x.requires_grad_()
    with tb.pam_mode(ALL):
        F.softmax(x, -1).mul(torch.arange(6.0)).sum().backward()
    assert not x.grad.isnan().any()


def test_cross_entropy_with_finfo_min_logits():
    z = _t(3, 5)
    z[0, 3:] = torch.finfo(torch.float32).min
    z[1] = torch.finfo(torch.float32).min
    with tb.pam_mode(ALL):
        loss = F.cross_entropy(z, torch.tensor([0, 1, 2]), reduction="none")
    assert loss.isfinite().all()


def test_sdpa_finfo_min_mask_on_a_fully_masked_row():
    """A float mask of finfo.min on every key of a row: torch's attention averages the
    values there (uniform weights), PA too, and no NaN forward or backward."""
    q, k, v = (_t(1, 2, 4, 8, seed=s).requires_grad_() for s in range(3))
    mask = torch.zeros(4, 4)
    mask[1] = torch.finfo(torch.float32).min
    mask[2, :2] = torch.finfo(torch.float32).min
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with tb.pam_mode(ALL):
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y.sum().backward()
    assert not y.isnan().any() and not q.grad.isnan().any()
    assert (y[..., 1, :] - ref[..., 1, :]).abs().max() < 0.05


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4/16", "e8m4"])
def test_train_fmt_takes_what_pamconfig_takes(fmt):
    from sim.cli import build_parser
    from sim.commands.train import config_from_args
    args = build_parser().parse_args(["train", "--fmt", fmt])
    assert config_from_args(args).fmt == tb.PAMConfig(fmt).fmt


def test_expanded_operands_are_not_copied_out():
    """Issue 25: matmuls of expand()ed operands give the bits of contiguous ones (batch,
    rows, columns, and k), and an 8 x 8 result of two (8, 10^10) views runs without
    asking for 298 GiB (the sum of equal products stops changing: 2^8 in bfloat16)."""
    torch.manual_seed(0)
    a = torch.randn(3, 1, 5, 40).expand(3, 4, 5, 40)
    b = torch.randn(40, 1).expand(40, 6)
    x = torch.randn(5, 1).expand(5, 300)
    with tb.pam_mode(tb.PAMConfig("bf16", acc="bf16")):
        for p, q in ((a, b), (x, b[:1].expand(300, 6))):
            assert torch.equal((p @ q).view(torch.int32),
                               (p.contiguous() @ q.contiguous()).view(torch.int32))
        big = torch.full((8, 1), 1.5).expand(8, 10 ** 10) @ \
            torch.full((1, 8), 0.75).expand(10 ** 10, 8)
    assert big.shape == (8, 8) and (big == 256).all()

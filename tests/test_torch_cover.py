"""pam_mode and convert() on real model set-ups: checkpointing, masked attention rows,
left-padded generation, CPU autocast, transformers' Conv1D."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import torch_bridge as tb

CFG = tb.PAMConfig("bf16")


def _grads(model, run):
    model.zero_grad()
    torch.manual_seed(5)
    loss = run()
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters()]


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("backward_inside", [False, True])
def test_checkpointing_gives_the_same_bits(reentrant, backward_inside):
    """Autograd runs backward without the forward's function modes: the recomputation
    must re-enter them, whether .backward() runs inside the with block or after it."""
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.2), nn.LayerNorm(8), nn.Linear(8, 8))
    x = torch.randn(4, 8, requires_grad=True)      # the reentrant variant needs one

    def run(ck):
        def go():
            with tb.pam_mode(CFG):
                y = checkpoint(block, x, use_reentrant=reentrant) if ck else block(x)
                loss = F.cross_entropy(y, torch.arange(4))
                if backward_inside:
                    loss.backward()
            return loss
        block.zero_grad()
        x.grad = None
        torch.manual_seed(5)
        loss = go()
        if not backward_inside:
            loss.backward()
        return [loss.detach(), x.grad] + [p.grad.clone() for p in block.parameters()]
    assert _same(run(True), run(False))


def _hf(name):
    pytest.importorskip("transformers")
    from sim.tiny_models import build
    return build(name)


@pytest.mark.parametrize("reentrant", [False, True])
def test_hf_gradient_checkpointing_gives_the_same_bits(reentrant):
    model, inputs = _hf("llama")
    model.train()

    def run():
        with tb.pam_mode(CFG):
            return model(**inputs).loss
    plain = _grads(model, run)
    model.activation_checkpointing_enable({"use_reentrant": reentrant})   # transformers 5
    assert _same(_grads(model, run), plain)


def test_fully_masked_attention_rows_give_torchs_zeros():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[1] = False
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with tb.pam_mode(CFG):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        fmask = torch.zeros(4, 4).masked_fill(~mask, float("-inf"))
        fout = F.scaled_dot_product_attention(q, k, v, attn_mask=fmask)
    assert torch.equal(out[:, :, 1], ref[:, :, 1]) and not out[:, :, 1].any()
    assert torch.equal(out, fout)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2"])
def test_left_padded_generation(name):
    model, inputs = _hf(name)
    ids = inputs["input_ids"].clone()
    att = torch.ones_like(ids)
    ids[0, :3], att[0, :3] = 0, 0
    with torch.no_grad(), tb.pam_mode(CFG):
        logits = model(input_ids=ids, attention_mask=att).logits
        out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=3,
                             do_sample=False, pad_token_id=0)
    assert torch.isfinite(logits[:, 3:]).all() and torch.isfinite(logits[1]).all()
    assert out.shape == (2, ids.shape[1] + 3) and torch.equal(out[:, :ids.shape[1]], ids)


def test_autocast_keeps_torchs_dtypes():
    torch.manual_seed(0)
    lin, x = nn.Linear(8, 8), torch.randn(4, 8)
    img, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    t = torch.arange(4)

    def calls():
        return [lin(x), x @ x.T, torch.addmm(x[:, :4], x, x.T), F.conv2d(img, w),
                F.scaled_dot_product_attention(x[None], x[None], x[None]), torch.softmax(x, -1),
                F.layer_norm(x, (8,)), F.cross_entropy(x, t)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        native = [y.dtype for y in calls()]
        with tb.pam_mode(CFG):
            got = calls()
    assert [y.dtype for y in got] == native and native[0] == torch.bfloat16
    bf = [t.bfloat16() for t in (x, lin.weight, lin.bias)]
    assert torch.equal(got[0], tb.pam_linear(*bf, "bf16"))        # operands cast first


def test_convert_swaps_transformers_conv1d():
    """GPT-2's linear layers are transformers' Conv1D: convert() turns them into PAM
    linear layers equal bit for bit to the addmm pam_mode routes."""
    model, inputs = _hf("gpt2")
    cfg = tb.PAMConfig("bf16", ops={"matmul"})
    with tb.pam_mode(cfg):
        ref = model(**inputs).logits
    conv = tb.convert(copy.deepcopy(model), cfg)
    layer = conv.transformer.h[0].mlp.c_fc
    assert type(layer).__name__ == "PAMConv1D" and "config=bfloat16 matmul" in repr(layer)
    assert layer.weight is not model.transformer.h[0].mlp.c_fc.weight       # deepcopy'd
    with tb.pam_mode(cfg):
        assert torch.equal(conv(**inputs).logits, ref)
    rep = tb.audit(conv, inputs, None)
    assert not {r.op for r in rep.rows} & {"mm", "addmm"} and rep.share < 0.1
    tb.convert(conv, None)
    assert type(conv.transformer.h[0].mlp.c_fc).__name__ == "Conv1D"
    assert torch.equal(conv(**inputs).logits, model(**inputs).logits)


#: tiny models the op groups cover completely (docs/torch_bridge.md, "Audit table")
COVERED = ["gpt2", "llama", "qwen2", "bert", "vit", "t5", "whisper", "clip", "encoder", "mha",
           "cnn", "gru", "lstm", "einsum", "extras"]
TORCH_ONLY = {"encoder", "mha", "cnn", "gru", "lstm", "einsum", "extras"}


@pytest.mark.parametrize("name", COVERED)
def test_covered_models_fully_emulated(name):
    """0 escaped multiplies in a forward+backward pass; the output differs from native
    and every gradient is finite."""
    model, inputs = _model(name)
    assert tb.audit(model, inputs, CFG).escaped == 0

    def out():
        y = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
        y = y.loss if hasattr(y, "loss") and y.loss is not None else \
            (y[0] if isinstance(y, tuple) else getattr(y, "last_hidden_state", y))
        return y
    ref = out()
    with tb.pam_mode(CFG):
        y = out()
    assert not torch.equal(y, ref)
    model.zero_grad()
    y.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def _torch_model(name):
    from sim.tiny_models import build
    return build(name)


#: the tiny models that generate text (transformers' generate with greedy decoding)
GENERATIVE = ["gpt2", "llama", "qwen2", "mistral", "t5", "whisper"]


def _model(name):
    return _torch_model(name) if name in TORCH_ONLY else _hf(name)


def _loss(model, inputs):
    """The model's own loss, else the sum of its first output (as the audit's pass)."""
    y = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    if getattr(y, "loss", None) is not None:
        return y.loss
    y = y[0] if isinstance(y, tuple) else getattr(y, "last_hidden_state", y)
    return y.float().sum()


def _generate(model, inputs, steps=2):
    kw = {k: v for k, v in inputs.items() if k in ("input_ids", "input_features")}
    return model.generate(**kw, max_new_tokens=steps, do_sample=False, pad_token_id=0)


@pytest.mark.parametrize("name", GENERATIVE)
def test_generation(name):
    """Greedy generation under pam_mode (KV cache on) adds the asked-for tokens, and
    they are real token ids."""
    model, inputs = _hf(name)
    with torch.no_grad():
        native = _generate(model, inputs, 3)
        with tb.pam_mode(CFG):
            out = _generate(model, inputs, 3)
    assert out.shape == native.shape
    assert ((out >= 0) & (out < model.config.vocab_size)).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", COVERED)
def test_half_precision_models(name, dtype):
    """Every covered model cast to bfloat16 / float16 runs forward and backward under
    pam_mode with finite results, gradients in the model's dtype; the generative ones
    also generate."""
    model, inputs = _model(name)
    model.to(dtype)
    if isinstance(inputs, dict):
        inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    else:
        inputs = tuple(v.to(dtype) if v.is_floating_point() else v for v in inputs)
    with tb.pam_mode(CFG):
        loss = _loss(model, inputs)
        loss.backward()
        if name in GENERATIVE:
            out = _generate(model, inputs)
            assert out.shape[0] == 2 and ((out >= 0) & (out < model.config.vocab_size)).all()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == dtype and torch.isfinite(g).all() for g in grads)

"""PAMConfig, convert(), pam_mode and the PA optimizers on whole models."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import emu
import torch_bridge as tb
import torch_bridge.functional as PF
from conftest import assert_bits_equal
from workloads.models import build_model, example_inputs


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def npy(t):
    return t.detach().float().numpy()


# --- PAMConfig ---------------------------------------------------------------------

def test_config_defaults_and_normalisation():
    c = tb.PAMConfig()
    assert c.fmt == emu.bfloat16 and c.ops == frozenset(tb.OP_GROUPS)
    assert c.rounding == "nearest_even"
    assert all(c.kind(op) == "approx" for op in tb.OP_GROUPS)
    c = tb.PAMConfig("e8m4", backward={"loss": "exact"}, ops="matmul", rounding="sr")
    assert c.kind("loss") == "exact" and c.kind("matmul") == "approx"
    assert c.ops == {"matmul"} and c.rounding == "stochastic" and c.enabled("matmul")
    assert not c.enabled("softmax") and not tb.PAMConfig(None).enabled("matmul")
    assert c.replace(fmt="bf16").kind("loss") == "exact"
    assert tb.PAMConfig(backward="approx") == tb.PAMConfig(backward={})
    assert "e8m4 matmul approx" == tb.PAMConfig("e8m4", ops={"matmul"}).describe()


@pytest.mark.parametrize("kw,msg", [({"fmt": "bf17"}, "fmt='bf17' is not a format"),
                                    ({"ops": {"matmul", "gelu"}}, r"unknown op group\(s\) \['gelu'\]"),
                                    ({"backward": "mimic"}, "backward\\['matmul'\\]='mimic'"),
                                    ({"backward": {"attn": "exact"}}, "unknown op group"),
                                    ({"backward": 3}, "expected 'approx', 'exact' or a mapping"),
                                    ({"rounding": "up"}, "rounding='up'; expected one of"),
                                    ({"acc": "int8"}, "acc='int8' is not a format"),
                                    ({"ops": 5}, "expected a set of names")])
def test_bad_configs(kw, msg):
    with pytest.raises(ValueError, match=msg):
        tb.PAMConfig(**kw)


def test_functional_dispatch_is_native_when_off(rng):
    x = torch.randn(4, 8)
    w = torch.randn(3, 8)
    for cfg in (None, tb.PAMConfig(None), tb.PAMConfig(ops={"softmax"})):
        assert torch.equal(PF.linear(x, w, None, cfg), F.linear(x, w))
        assert torch.equal(PF.layer_norm(x, (8,), config=cfg), F.layer_norm(x, (8,)))
    with pytest.raises(TypeError, match="config must be a torch_bridge.PAMConfig"):
        PF.linear(x, w, None, "bf16")


# --- convert -------------------------------------------------------------------------

def test_convert_swaps_layers_and_keeps_weights():
    m = build_model("vit", dim=32, depth=1, heads=2)
    params = {n: p for n, p in m.named_parameters()}
    x, _ = example_inputs(m, 3)
    cfg = tb.PAMConfig("bf16", ops={"matmul", "layernorm", "softmax"})
    assert tb.convert(m, cfg) is m
    kinds = {type(mod) for mod in m.modules()}
    assert {tb.PAMConv2d, tb.PAMLinear, tb.PALayerNorm, tb.PAMultiheadAttention} <= kinds
    assert not kinds & {nn.Linear, nn.Conv2d, nn.LayerNorm, nn.MultiheadAttention}
    assert all(p is params[n] for n, p in m.named_parameters())
    y = m(x)
    y.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())
    tb.convert(m, None)                                    # back to plain torch
    assert not any(isinstance(mod, tb.modules.PAModule) for mod in m.modules())
    ref = m(x)
    assert not torch.equal(y, ref) and F.cosine_similarity(y.flatten(), ref.flatten(), 0) > 0.9


def test_convert_respects_ops_and_skip():
    m = build_model("mlp")
    tb.convert(m, tb.PAMConfig("bf16", ops={"layernorm"}))
    assert type(m.head) is nn.Linear                       # matmul off: untouched
    tb.convert(m, tb.PAMConfig("bf16", ops={"matmul"}), skip="head")
    assert type(m.head) is nn.Linear and type(m.layers[0]) is tb.PAMLinear
    with pytest.raises(ValueError, match="no submodule named"):
        tb.convert(m, tb.PAMConfig(), skip="nosuch")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        tb.convert("model", tb.PAMConfig())
    lin = tb.convert(nn.Linear(3, 2), tb.PAMConfig())       # a bare layer: use the result
    assert type(lin) is tb.PAMLinear


def test_modules_equal_functional_calls(rng):
    cfg = tb.PAMConfig("e8m4", ops={"matmul", "softmax", "layernorm", "loss"})
    x = torch.randn(2, 5, 8)
    lin = tb.PAMLinear(8, 4, config=cfg)
    assert torch.equal(lin(x), tb.pam_linear(x, lin.weight, lin.bias, "e8m4"))
    ln = tb.PALayerNorm(8, config=cfg)
    assert torch.equal(ln(x), tb.pa_layer_norm(x, (8,), ln.weight, ln.bias))
    sm = tb.PASoftmax(-1, config=cfg)
    assert torch.equal(sm(x), tb.pa_softmax(x, -1))
    ce = tb.PACrossEntropyLoss(label_smoothing=0.1, config=cfg)
    t = torch.randint(4, (2,))
    z = torch.randn(2, 4)
    assert torch.equal(ce(z, t), tb.pa_cross_entropy(z, t, label_smoothing=0.1))
    conv = tb.PAMConv2d(2, 3, 3, stride=2, config=cfg)
    img = torch.randn(1, 2, 7, 7)
    assert torch.equal(conv(img), tb.pam_conv2d(img, conv.weight, conv.bias, 2, 0, 1, 1, "e8m4"))
    assert "config=e8m4" in repr(conv)


# --- pam_mode --------------------------------------------------------------------------

def test_pam_mode_routes_the_listed_functions(rng):
    cfg = tb.PAMConfig("bf16")
    a, b = torch.randn(3, 4, 5), torch.randn(5, 6)
    w = torch.randn(6, 5)
    z = torch.randn(4, 7)
    t = torch.randint(7, (4,))
    img, k = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
    with tb.pam_mode(cfg):
        got = [a @ b, torch.matmul(a, b), a.matmul(b), torch.bmm(a, b.expand(3, 5, 6)),
               torch.mm(a[0], b), torch.addmm(z[:, :6], z[:, :5], b), F.linear(a, w),
               F.conv2d(img, k, padding=1), F.softmax(z, -1), z.softmax(-1),
               F.layer_norm(z, (7,)), F.cross_entropy(z, t, label_smoothing=0.1),
               torch.ones(2, 2, dtype=torch.long) @ torch.ones(2, 2, dtype=torch.long)]
    want = [tb.pam_matmul(a, b, "bf16")] * 3 + [
        tb.pam_matmul(a, b.expand(3, 5, 6), "bf16"), tb.pam_matmul(a[0], b, "bf16"),
        z[:, :6] + tb.pam_matmul(z[:, :5], b, "bf16"), tb.pam_linear(a, w, None, "bf16"),
        tb.pam_conv2d(img, k, None, 1, 1, 1, 1, "bf16"), tb.pa_softmax(z), tb.pa_softmax(z),
        tb.pa_layer_norm(z, (7,)), tb.pa_cross_entropy(z, t, label_smoothing=0.1),
        torch.full((2, 2), 2, dtype=torch.long)]
    for g, e in zip(got, want):
        assert torch.equal(g, e)
    native = tb.PAMConfig("bf16", ops={"softmax"})
    with tb.pam_mode(native):
        m, ln = a @ b, F.layer_norm(z, (7,))
    assert torch.equal(m, a @ b) and torch.equal(ln, F.layer_norm(z, (7,)))   # off: native
    with tb.pam_mode(None):
        assert torch.equal(F.softmax(z, -1), torch.softmax(z, -1))


def test_pam_mode_attention_matches_explicit_composition(rng):
    cfg = tb.PAMConfig("e8m4", ops={"matmul", "softmax"})
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    mask = torch.rand(5, 5) > 0.3
    mask[:, 0] = True
    with tb.pam_mode(cfg):
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    s = tb.pam_mul(tb.pam_matmul(q, k.transpose(-2, -1), "e8m4"), 8 ** -0.5)
    p = tb.pa_softmax(s.masked_fill(~mask, float("-inf")))
    assert torch.equal(got, tb.pam_matmul(p, v, "e8m4"))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert F.cosine_similarity(causal.flatten(), ref.flatten(), 0) > 0.97


@pytest.mark.parametrize("kind", ["approx", "exact"])
@pytest.mark.parametrize("case", ["plain", "causal", "bool mask, a dead row", "float mask",
                                  "scale 2", "scale 0.3"])
def test_attention_logit_scale_in_the_softmax_node(case, kind, monkeypatch):
    """PA attention takes the logit scale's PAM into the softmax's fused node where no
    float mask comes between them and 0 < scale <= 1: output and gradients are those of
    the explicit composition (PAM by the scale, the masks, the PA softmax)."""
    cfg = tb.PAMConfig("bf16", backward=kind)
    q, k, v = (torch.randn(2, 3, 6, 8, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    mask = torch.rand(6, 6, generator=torch.Generator().manual_seed(5)) > 0.4
    mask[2] = False
    args = {"causal": dict(is_causal=True), "bool mask, a dead row": dict(attn_mask=mask),
            "float mask": dict(attn_mask=torch.where(mask, 0.0, torch.finfo(torch.float32).min)),
            "scale 2": dict(scale=2.0), "scale 0.3": dict(scale=0.3)}.get(case, {})
    kw = dict(fmt="float32", backward=kind)

    def explicit(q, k, v):
        s = tb.pam_mul(PF.matmul(q, k.transpose(-2, -1), cfg), args.get("scale", 8 ** -0.5),
                       **kw)
        if "is_causal" in args:
            s = s.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
        m = args.get("attn_mask")
        if m is not None:
            s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m
        dead = (s == float("-inf")).all(-1, keepdim=True)
        p = tb.pa_softmax(s.masked_fill(dead, 0.0), **kw).masked_fill(dead, 0.0)
        return PF.matmul(p, v, cfg)

    folded = []
    along = PF.along
    monkeypatch.setattr(PF, "along", lambda *a, **k: folded.append(k) or along(*a, **k))
    runs = []
    for fn in (lambda q, k, v: PF.scaled_dot_product_attention(q, k, v, config=cfg, **args),
               explicit):
        qkv = [t.clone().requires_grad_() for t in (q, k, v)]
        y = fn(*qkv)
        (y * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
        runs.append([y.detach()] + [t.grad for t in qkv])
    assert ("scale" in folded[0]) == (case not in ("float mask", "scale 2"))
    for a, b in zip(*runs):
        assert_bits_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_attention_under_mode_and_drop_in(need_weights):
    mha = nn.MultiheadAttention(16, 4, batch_first=True, bias=True)
    x = torch.randn(3, 6, 16, requires_grad=True)
    mask = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)
    cfg = tb.PAMConfig("bf16", ops={"matmul", "softmax"})
    calls = []
    orig = tb.mode._HANDLERS[F.linear]
    tb.mode._HANDLERS[F.linear] = lambda *a, **k: (calls.append(1), orig(*a, **k))[1]
    try:
        with tb.pam_mode(cfg):
            y = mha(x, x, x, attn_mask=mask, need_weights=need_weights)[0]
    finally:
        tb.mode._HANDLERS[F.linear] = orig
    assert len(calls) == 2                                  # in-projection and out-projection
    drop = tb.PAMultiheadAttention.from_module(mha, cfg)
    assert torch.equal(drop(x, x, x, attn_mask=mask, need_weights=need_weights)[0], y)
    ref = mha(x, x, x, attn_mask=mask, need_weights=need_weights)[0]
    assert F.cosine_similarity(y.flatten(), ref.flatten(), 0) > 0.97
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_hugging_face_bert_runs_under_pam_mode():
    """An unmodified third-party model: every nn.Linear / attention / LayerNorm of a
    randomly initialised BERT goes through PA, and autograd works through it."""
    transformers = pytest.importorskip("transformers")
    conf = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=16)
    model = transformers.BertModel(conf).eval()
    ids = torch.randint(50, (2, 10))
    ref = model(ids).last_hidden_state
    seen = set()

    class Spy(tb.mode._PAMMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in tb.mode._HANDLERS:
                seen.add(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs)
    with Spy(tb.PAMConfig("bf16", ops={"matmul", "softmax", "layernorm"})):
        out = model(ids).last_hidden_state
    assert {"linear", "layer_norm"} <= seen and seen & {"scaled_dot_product_attention",
                                                        "matmul", "softmax"}
    assert not torch.equal(out, ref)
    assert F.cosine_similarity(out.flatten(1), ref.flatten(1)).min() > 0.9


# --- optimizers ------------------------------------------------------------------------

def _params(rng, n=2):
    return [nn.Parameter(torch.from_numpy(rng.standard_normal((5, 3)).astype(np.float32)))
            for _ in range(n)]


def _grads(params, rng):
    for p in params:
        p.grad = torch.from_numpy(rng.standard_normal(p.shape).astype(np.float32))


def test_optimizers_without_config_are_torchs(rng):
    for pa_cls, torch_cls, kw in ((tb.PAAdamW, torch.optim.AdamW, {"weight_decay": 0.1}),
                                  (tb.PASGD, torch.optim.SGD, {"momentum": 0.9,
                                                               "nesterov": True})):
        p1 = _params(np.random.default_rng(1))
        p2 = [nn.Parameter(p.detach().clone()) for p in p1]
        o1 = pa_cls(p1, lr=0.01, config=tb.PAMConfig(ops={"matmul"}), **kw)
        o2 = torch_cls(p2, lr=0.01, foreach=False, **kw)
        for step in range(3):
            g = np.random.default_rng(step)
            _grads(p1, g)
            _grads(p2, np.random.default_rng(step))
            o1.step()
            o2.step()
        assert all(torch.equal(a, b) for a, b in zip(p1, p2))


def test_paadamw_update_is_emus(rng):
    """Two steps of the PA AdamW update against the same update written with emu."""
    cfg = tb.PAMConfig("bf16", ops={"optimizer"}, pa_fmt="e8m10")
    params = _params(rng, 1)
    P = params[0].detach().numpy().copy()
    M = np.zeros_like(P)
    V = np.zeros_like(P)
    opt = tb.PAAdamW(params, lr=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.05,
                     config=cfg)
    f = cfg.pa_fmt
    q = lambda x: emu.quantize(np.asarray(x, np.float32), f)          # noqa: E731
    mul = lambda a, b: emu.pam_mul(q(a), q(b), f)                     # noqa: E731
    div = lambda a, b: emu.pa_div(q(a), q(b), f)                      # noqa: E731
    for t in (1, 2):
        G = rng.standard_normal(P.shape).astype(np.float32)
        params[0].grad = torch.from_numpy(G.copy())
        opt.step()
        P = P - mul(P, 0.01 * 0.05)
        M = M + mul(G - M, 1 - 0.9)
        V = V + mul(mul(G, G) - V, 1 - 0.99)
        denom = div(emu.pa_sqrt(q(V), f), np.sqrt(1 - 0.99 ** t)) + np.float32(1e-6)
        P = P - mul(div(M, denom), 0.01 / (1 - 0.9 ** t))
        assert_bits_equal(npy(params[0]), P, what=f"step {t}")
    assert_bits_equal(npy(opt.state[params[0]]["exp_avg"]), M)
    sd = opt.state_dict()                                  # state dicts are torch's
    torch.optim.AdamW(params).load_state_dict(sd)


@pytest.mark.parametrize("pa_fmt,rounding,wd,maximize", [
    ("float32", "nearest_even", 0.05, False), ("bf16", "stochastic", 0.05, False),
    ("bf16", "nearest_even", 0.05, True),
    ("e8m10", "toward_zero", 0.0, True), ("float16", "nearest_even", 0.1, False),
    ("float8_e4m3fn", "stochastic", 0.0, False)])
def test_fused_adamw_is_the_sequence(rng, monkeypatch, pa_fmt, rounding, wd, maximize):
    """emu's fused PA AdamW kernel (emu/optim.py) against PAAdamW's sequence of emu calls
    (the path CUDA tensors take): the same bits in p and both moments over three steps,
    and the same draws from torch's RNG; operands include zeros, subnormals, infinities,
    NaNs and values beyond the format's range."""
    from torch_bridge import optim as tb_optim
    special = np.array([0.0, -0.0, 1e-40, -3e-39, np.inf, -np.inf, np.nan, 7e4, -1e38, 1e-8],
                       np.float32)
    cfg = tb.PAMConfig("bf16", ops={"optimizer"}, pa_fmt=pa_fmt, rounding=rounding)
    grads = []
    for step in range(3):
        gs = [rng.standard_normal((24, 10)).astype(np.float32),
              rng.standard_normal(7).astype(np.float32)]
        gs[0].reshape(-1)[:special.size] = special[::-1] if step else special
        grads.append(gs)
    init = [rng.standard_normal((24, 10)).astype(np.float32) * 3,
            rng.standard_normal(7).astype(np.float32)]
    init[0].reshape(-1)[-special.size:] = special
    runs = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(tb_optim, "_fusable", lambda p, state: False)
        torch.manual_seed(1)
        params = [nn.Parameter(torch.from_numpy(x.copy())) for x in init]
        opt = tb.PAAdamW(params, lr=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=wd,
                         maximize=maximize, config=cfg)
        for gs in grads:
            for p, g in zip(params, gs):
                p.grad = torch.from_numpy(g.copy())
            opt.step()
        runs.append([npy(t) for p in params
                     for t in (p, opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"])]
                    + [torch.rand(1).numpy()])
    for what, a, b in zip(["p", "m", "v"] * 2 + ["next draw"], *runs):
        assert_bits_equal(a, b, what=what)


def test_pasgd_momentum_update_is_emus(rng):
    cfg = tb.PAMConfig(ops={"optimizer"})
    params = _params(rng, 1)
    P = params[0].detach().numpy().copy()
    opt = tb.PASGD(params, lr=0.1, momentum=0.9, weight_decay=0.01, config=cfg)
    buf = None
    for _ in range(3):
        G = rng.standard_normal(P.shape).astype(np.float32)
        params[0].grad = torch.from_numpy(G.copy())
        opt.step()
        d = G + emu.pam_mul(P, np.float32(0.01))
        buf = d if buf is None else emu.pam_mul(buf, np.float32(0.9)) + d
        P = P - emu.pam_mul(buf, np.float32(0.1))
        assert_bits_equal(npy(params[0]), P)


def test_pa_optimizers_train(rng):
    """A least-squares problem: both PA optimizers drive the loss down."""
    X = torch.from_numpy(rng.standard_normal((64, 8)).astype(np.float32))
    Y = X @ torch.from_numpy(rng.standard_normal((8, 1)).astype(np.float32))
    cfg = tb.PAMConfig(ops={"optimizer"})
    for make in (lambda p: tb.PAAdamW(p, lr=0.05, config=cfg),
                 lambda p: tb.PASGD(p, lr=0.02, momentum=0.9, config=cfg)):
        w = nn.Parameter(torch.zeros(8, 1))
        opt = make([w])
        losses = []
        for _ in range(60):
            loss = ((X @ w - Y) ** 2).mean()
            losses.append(loss.item())
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert losses[-1] < 0.05 * losses[0]
    with pytest.raises(ValueError, match="amsgrad=True is not supported"):
        tb.PAAdamW([w], amsgrad=True, config=cfg)
    with pytest.raises(ValueError, match="optimizer='lamb'"):
        tb.make_optimizer("lamb", [w])


def test_convert_swaps_memory_saving_activations():
    """convert(model, fewbit=/inverted=/pa=) applies torch_bridge.memory's rule next to
    the PAM swaps, honours skip, and leaves PAM layers alone without a config."""
    from torch_bridge.memory import FewBitActivation, InvertedActivation, PAActivation
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Sequential(nn.Linear(8, 8), nn.SiLU()),
                      nn.Linear(8, 2))
    tb.convert(m, tb.PAMConfig("bf16", ops={"matmul"}))
    assert tb.convert(m, fewbit=3) is m
    assert isinstance(m[0], tb.PAMLinear) and isinstance(m[2][0], tb.PAMLinear)
    assert isinstance(m[1], FewBitActivation) and m[1].bits == 3
    assert isinstance(m[2][1], FewBitActivation)
    x = torch.randn(5, 4, requires_grad=True)
    m(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()

    m = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Sequential(nn.Linear(8, 8), nn.SiLU()))
    tb.convert(m, tb.PAMConfig("bf16"), skip="2", inverted=True)
    assert isinstance(m[0], tb.PAMLinear) and isinstance(m[1], InvertedActivation)
    assert type(m[2][0]) is nn.Linear and type(m[2][1]) is nn.SiLU
    assert isinstance(tb.convert(nn.GELU(), pa=8), PAActivation)
    with pytest.raises(ValueError, match="fewbit"):
        tb.convert(m, fewbit=9)

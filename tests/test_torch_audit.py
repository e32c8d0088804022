"""torch_bridge.audit and ``pamsim audit``: native multiplies found, emulated ones not."""
import json
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_bridge as tb
from sim.cli import main
from torch_bridge.audit import MULTIPLY_FREE

ALL = tb.PAMConfig("bf16")
NO_ELEMENTWISE = tb.PAMConfig("bf16", ops=set(tb.OP_GROUPS) - {"elementwise"})


class Net(nn.Module):
    """An MLP whose forward has one native product and one GELU of its own."""

    def __init__(self, gelu):
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3)
        self.gelu = gelu

    def forward(self, x):
        h = torch.relu(self.a(x))
        if self.gelu:
            h = F.gelu(h) * 0.5             # the native line
        return self.b(h)


def _line(marker):
    src = open(__file__).read().splitlines()
    return next(i + 1 for i, s in enumerate(src) if marker in s and "_line(" not in s)


def test_fully_emulated_mlp_reports_nothing():
    torch.manual_seed(0)
    m, x, y = Net(False), torch.randn(4, 6), torch.randint(3, (4,))
    rep = tb.audit(m, (x,), ALL, loss_fn=lambda z: F.cross_entropy(z, y))
    assert rep.escaped == 0 and rep.rows == [] and rep.share == 0.0
    # natively, every multiply is counted: mm/addmm forward and backward, the loss
    native = tb.audit(m, (x,), None, loss_fn=lambda z: F.cross_entropy(z, y))
    assert native.share == pytest.approx(1.0)
    ops = {(r.op, r.phase) for r in native.rows}
    assert {("addmm", "forward"), ("mm", "backward"), ("_log_softmax", "forward")} <= ops
    assert rep.native_work == native.native_work > 6 * 8 * 4
    assert all(p.grad is None for p in m.parameters())       # gradients left as they were


def test_native_ops_are_named_counted_and_located():
    torch.manual_seed(0)
    m, x = Net(True), torch.randn(4, 6)
    rep = tb.audit(m, (x,), NO_ELEMENTWISE)
    line = f"tests/test_torch_audit.py:{_line('# the native line')} (forward)"
    got = {(r.op, r.phase): r for r in rep.rows}
    assert set(got) == {("gelu", "forward"), ("mul", "forward"), ("gelu_backward", "backward"),
                        ("mul", "backward")}
    assert {r.source for r in rep.rows} == {line}           # backward: the forward's line
    assert got["mul", "forward"].count == 1 and got["mul", "forward"].work == 4 * 8
    assert rep.escaped == 4 and 0 < rep.share < 0.5
    assert rep.share == pytest.approx(sum(r.share for r in rep.rows))
    assert "| gelu | forward | 1 |" in rep.table()
    matmul_only = tb.audit(m, (x,), tb.PAMConfig("bf16", ops={"matmul"}))
    assert not {r.op for r in matmul_only.rows} & {"mm", "addmm"}   # emulated: not counted
    assert tb.audit(m, (x,), NO_ELEMENTWISE, backward=False).escaped == 2
    assert tb.audit(m, (x,), ALL).escaped == 0            # the elementwise group covers them


def test_scaled_additions_and_unknown_ops_count():
    torch.manual_seed(0)

    class Odd(nn.Module):
        def forward(self, x):
            return torch.add(x, x, alpha=3) + torch.cumprod(x, 0)
    rep = tb.audit(Odd(), torch.randn(3, 2, requires_grad=True), ALL)
    assert {"add", "cumprod"} <= {r.op for r in rep.rows}
    assert "cumprod" not in MULTIPLY_FREE and "add" in MULTIPLY_FREE


def test_bad_arguments():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        tb.audit(lambda x: x, torch.ones(1), ALL)
    with pytest.raises(TypeError, match="config must be a torch_bridge.PAMConfig"):
        tb.audit(nn.Linear(2, 2), torch.ones(2), "bf16")
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        tb.audit(nn.Linear(2, 2), torch.ones(2), ALL, loss_fn=3)


def test_tiny_models_build_and_audit_natively():
    """Every tiny model of the zoo runs forward+backward; natively all its work is native."""
    pytest.importorskip("transformers")
    from sim.tiny_models import TINY, build
    for name in TINY:
        model, inputs = build(name)
        rep = tb.audit(model, inputs, None)
        assert rep.native_work > 0 and rep.share == pytest.approx(1.0), name


def test_native_rarer_ops_are_caught():
    """The ops the 'extras' model exercises are multiply-bearing to the audit: run
    natively they are all reported, with index_add counted only with alpha != 1."""
    from sim.tiny_models import build
    model, inputs = build("extras")
    ops = {r.op for r in tb.audit(model, inputs, None).rows}
    assert {"convolution", "convolution_backward", "avg_pool2d", "avg_pool3d",
            "_adaptive_avg_pool2d", "addbmm", "addmv", "binary_cross_entropy",
            "binary_cross_entropy_with_logits", "xlogy", "huber_loss", "smooth_l1_loss",
            "linalg_vector_norm"} <= ops
    x = torch.zeros(3, requires_grad=True)
    rows = tb.audit(nn.Identity(), (x,), None, loss_fn=lambda y: (
        y.index_add(0, torch.tensor([0]), torch.ones(1)) +
        y.index_add(0, torch.tensor([1]), torch.ones(1), alpha=2)).sum()).rows
    assert [(r.op, r.count) for r in rows] == [("index_add", 1)]


def test_cli_audit(tmp_path, capsys):
    js = tmp_path / "a.json"
    assert main(["audit", "encoder", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "## encoder" in out and "1/1 model(s) fully emulated" in out
    assert json.loads(js.read_text())["encoder"]["escaped"] == 0
    assert main(["audit", "mha", "--summary"]) == 0
    out = capsys.readouterr().out
    assert "| mha (_MHA) | 175,104 | 0 | – |" in out and "1/1 model(s) fully emulated" in out
    assert main(["audit", "nosuch"]) == 2
    assert "pamsim audit: error: unknown model(s) ['nosuch']" in capsys.readouterr().out


def test_bench_tiny_models_quick():
    from sim import bench
    rows = bench.run(quick=True, only=["tiny-models"])
    assert [r.name.split(":")[0] for r in rows] == ["encoder", "gru"]
    assert all(r.seconds > 0 and r.baseline_seconds > 0 and r.target == 4.0 for r in rows)


def test_complex_products_and_scatter_products_count():
    """A complex multiply (the view_as_complex rotary embedding) and scatter_reduce's
    'prod' and 'mean' run natively: the audit names them; 'amax' multiplies nothing."""
    class Rotary(nn.Module):
        def forward(self, x):
            z = torch.view_as_complex(x.reshape(3, 2, 2))
            r = torch.view_as_real(z * torch.polar(torch.ones(2), torch.arange(2.0)))
            idx = torch.tensor([0, 1, 0])
            s = x[:, 0].new_ones(2)
            return (r.sum() + s.scatter_reduce(0, idx, x[:, 1], "prod").sum()
                    + s.scatter_reduce(0, idx, x[:, 1], "mean").sum()
                    + s.scatter_reduce(0, idx, x[:, 1], "amax").sum())
    rep = tb.audit(Rotary(), torch.randn(3, 4, requires_grad=True), ALL, backward=False)
    counts = {op: sum(r.count for r in rep.rows if r.op == op) for op in ("mul", "scatter_reduce")}
    assert counts == {"mul": 1, "scatter_reduce": 2}, rep.rows


# --- the classification of aten ops (torch_bridge/classification.py) ---------------------

def _aten_ops_with_tensors():
    """Every aten op (overload packet, in-place folded) the installed torch can dispatch
    whose schema holds a tensor: a schema states no dtype, so each may see floating
    tensors.  (13 ops, such as ``promote_types``, take no tensor at all.)"""
    from torch_bridge.classification import packet
    found = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qualified.partition("::")
        if ns != "aten":
            continue
        pk = getattr(torch.ops.aten, rest.partition(".")[0])
        schemas = [getattr(pk, ov)._schema for ov in pk.overloads()]
        if any("Tensor" in str(a.type) for s in schemas for a in (*s.arguments, *s.returns)):
            found.add(packet(pk.__name__))
    return found


def test_every_aten_op_is_classified():
    from torch_bridge import classification as C
    ops = _aten_ops_with_tensors()
    assert len(ops) > 1000
    missing = sorted(op for op in ops if C.classify(op) is None)
    assert not missing, (f"aten ops of torch {torch.__version__} that "
                         f"torch_bridge/classification.py does not classify: {missing}")
    classes = {C.classify(op)[0] for op in ops}
    assert classes == {C.FREE, C.EMULATED, C.BY_DESIGN, C.BEARING}
    # the explicit tables never contradict each other or the derived emulated set
    tables = [set(C.MULTIPLY_FREE), set(C.MULTIPLY_BEARING), set(C.NATIVE_BY_DESIGN),
              set(C.emulated())]
    for i, a in enumerate(tables):
        for b in tables[i + 1:]:
            assert not a & b, a & b
    assert set(C.CONDITIONAL) <= set(C.MULTIPLY_FREE) | {"_foreach_add", "_foreach_sub"}
    assert set(C.COMPLEX_BEARING) <= set(C.MULTIPLY_FREE)
    assert all(C.classify(op)[0] != C.FREE for op in C.INTEGER_BY_DESIGN)


def test_emulated_ops_come_from_mode_tables():
    """The emulated class is derived from pam_mode's handler table: every torch function
    there is either an aten op's or written in Python without one of its own."""
    import types

    from torch_bridge import classification as C
    from torch_bridge.mode import _HANDLERS
    emulated = C.emulated()
    assert {"mul", "div", "matmul", "addmm", "linear", "conv2d", "gelu", "softmax",
            "layer_norm", "cross_entropy_loss", "scaled_dot_product_attention", "gru",
            "linalg_vector_norm", "pow", "tanh"} <= set(emulated)
    assert all(hasattr(torch.ops.aten, op) for op in emulated)
    assert "Tensor.__rmul__" in emulated["mul"] and "torch.mul" in emulated["mul"]
    loose = [f for f in _HANDLERS if C._aten_name(f) is None]
    assert loose == [F.interpolate, F.multi_head_attention_forward]
    assert all(isinstance(f, types.FunctionType) for f in loose)
    assert C.classify("mul_") == C.classify("mul")
    assert C.classify("_foreach_mul_")[0] == C.BEARING
    assert C.classify("_foreach_add")[0] == C.FREE
    assert C.classify("special_round")[0] == C.FREE
    assert C.classify("permute_copy")[0] == C.FREE
    assert C.classify("gelu_backward")[0] == C.BEARING
    assert C.classify("linalg_solve")[0] == C.BEARING
    assert C.classify("linalg_matmul")[0] == C.EMULATED           # torch.linalg.matmul
    assert C.classify("no_such_op") is None


@torch.library.custom_op("pamsim_audit_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


_twice.register_fake(lambda x: torch.empty_like(x))


def test_unclassified_ops_count_as_escaped(monkeypatch):
    """An op no table names (a custom op here; a new aten op of a newer torch) counts as
    escaped, never as free — even one that would be free if it were classified."""
    from torch_bridge import classification as C
    x = torch.randn(3, 4)
    rep = tb.audit(nn.Identity(), (x,), ALL, loss_fn=lambda y: _twice(y).sum(),
                   backward=False)
    assert [(r.op, r.count) for r in rep.rows] == [("pamsim_audit_test::twice", 1)]
    assert rep.escaped == 1 and "(unclassified)" in rep.table()

    class Cum(nn.Module):
        def forward(self, x):
            return x.cumsum(0)
    assert tb.audit(Cum(), (x,), ALL, backward=False).rows == []
    known = C.classify
    monkeypatch.setattr(sys.modules["torch_bridge.audit"], "classify",
                        lambda op: None if op == "cumsum" else known(op))
    rep = tb.audit(Cum(), (x,), ALL, backward=False)
    assert [(r.op, r.count, r.design) for r in rep.rows] == [("cumsum", 1, "")]
    assert rep.escaped == 1


def test_integer_results_count():
    """A product with an integer result runs natively like a floating one: integer
    arithmetic of INTEGER_BY_DESIGN (T5's bucket ids) is listed by design, an integer
    matmul escapes; a bool product (a logical and of masks) is no multiply."""
    class Ints(nn.Module):
        def forward(self, x):
            buckets = (x > 0).long() * 16                     # integer arithmetic
            counts = torch.mm(buckets, buckets.t())           # an integer matmul
            mask = (x > 0) * (x < 1)                          # bool: logical and
            return x * (buckets.sum() + counts.sum() + mask.sum()).float()
    x = torch.randn(3, 4, requires_grad=True)
    rep = tb.audit(Ints(), (x,), ALL, backward=False)
    got = {(r.op, bool(r.design)): r for r in rep.rows}
    assert set(got) == {("mul (integer)", True), ("mm (integer)", False)}, rep.rows
    assert got["mm (integer)", False].work == 3 * 3 * 4 and got["mul (integer)", True].work == 12
    assert rep.escaped == 1
    table = rep.table()
    assert "| mul (integer) (by design) | forward | 1 |" in table
    assert "| mm (integer) | forward | 1 |" in table


@pytest.mark.filterwarnings("ignore:index_reduce")
def test_conditional_and_backward_ops_count():
    """Dropout's backward multiplies (grad · mask · scale); index_reduce's 'prod' and an
    embedding's scale_grad_by_freq multiply, 'amax' and the plain embedding do not; an
    in-place _foreach op (it returns nothing: its written arguments are its results) is
    classified under its out-of-place name."""
    x = torch.randn(4, 3, requires_grad=True)
    rows = tb.audit(nn.Identity(), (x,), ALL,
                    loss_fn=lambda y: torch.native_dropout(y, 0.5, True)[0].sum()).rows
    assert {(r.op, r.phase) for r in rows} == {("native_dropout", "forward"),
                                               ("native_dropout_backward", "backward")}
    idx = torch.tensor([0, 1, 0, 1])

    def reduce(kind):
        return lambda y: y.new_ones(2, 3).index_reduce(0, idx, y, kind).sum()
    assert [r.op for r in tb.audit(nn.Identity(), (x,), ALL, loss_fn=reduce("prod")).rows
            if r.phase == "forward"] == ["index_reduce"]
    assert not [r for r in tb.audit(nn.Identity(), (x,), ALL, loss_fn=reduce("amax")).rows
                if r.phase == "forward"]
    for freq, expected in ((False, set()), (True, {"embedding_dense_backward"})):
        emb = nn.Embedding(5, 3, scale_grad_by_freq=freq)
        rep = tb.audit(emb, (torch.tensor([1, 1, 2]),), ALL)
        assert {r.op for r in rep.rows} == expected

    class Foreach(nn.Module):
        def forward(self, x):
            ys = [x.clone(), x.clone()]
            torch._foreach_add_(ys, ys)
            torch._foreach_mul_(ys, 3.0)
            return ys[0] + ys[1]
    rows = tb.audit(Foreach(), (x,), ALL, backward=False).rows
    assert [r.op for r in rows] == ["_foreach_mul"]


def test_other_spellings_are_routed():
    """torch.linalg.matmul, torch.special.softmax / log_softmax / expit / exp2 ran natively
    under the mode; now they give the bits of torch.matmul, softmax, sigmoid, exp2."""
    class Spellings(nn.Module):
        def forward(self, x):
            return [torch.linalg.matmul(x, x.t()), torch.special.softmax(x, -1),
                    torch.special.log_softmax(x, dim=-1), torch.special.expit(x),
                    torch.special.exp2(x), torch.linalg.matmul(input=x, other=x.t())]
    torch.manual_seed(0)
    x = torch.randn(4, 6, requires_grad=True)
    rep = tb.audit(Spellings(), (x,), ALL, loss_fn=lambda ys: sum(y.sum() for y in ys))
    assert rep.escaped == 0 and rep.rows == [], rep.table()
    with tb.pam_mode(ALL):
        got = Spellings()(x)
        want = [torch.matmul(x, x.t()), torch.softmax(x, -1), torch.log_softmax(x, -1),
                torch.sigmoid(x), torch.exp2(x), x @ x.t()]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert not torch.equal(got[1], torch.softmax(x, -1))          # PA, not native


def test_window_tables_and_interpolation():
    """Window functions (no tensor input: constants of the length) are native by design,
    with the reason; F.interpolate's linear modes are routed (they escaped), nearest is
    multiply-free (it was counted), antialias stays native and is counted."""
    from torch_bridge import classification as C

    class Resample(nn.Module):
        def __init__(self, mode, **kw):
            super().__init__()
            self.mode, self.kw = mode, kw

        def forward(self, x):
            if self.mode == "window":
                w = (torch.hann_window(8) + torch.hamming_window(8) + torch.blackman_window(8)
                     + torch.kaiser_window(8) + torch.bartlett_window(8))
                return x * 1.0 + w.sum()
            dims = {"linear": 3, "bilinear": 4, "bicubic": 4, "trilinear": 5,
                    "nearest": 4, "nearest-exact": 4}[self.mode]
            v = x[:, :4 ** (dims - 2)].reshape(1, 2, *([4] * (dims - 2)))
            return F.interpolate(v, mode=self.mode, **self.kw)
    x = torch.randn(2, 64, requires_grad=True)
    rows = tb.audit(Resample("window"), (x,), ALL).rows
    assert {r.op for r in rows} == {"hann_window", "hamming_window", "blackman_window",
                                    "kaiser_window", "bartlett_window"}
    assert all(r.design.startswith("window tables") for r in rows)
    for mode in ("linear", "bilinear", "bicubic", "trilinear"):
        for kw in ({"scale_factor": 2}, {"size": 7, "align_corners": True}):
            m = Resample(mode, **kw)
            assert tb.audit(m, (x,), ALL).rows == [], (mode, kw)
            with tb.pam_mode(ALL):
                y = m(x)
            assert not torch.equal(y, m(x))                        # PA, not native
            # PAM errs by <= 1/9 per product; bicubic's weights sum to <= 1.6 in |.|
            assert (y - m(x)).abs().max() < 0.2 * x.abs().max()
    for mode in ("nearest", "nearest-exact"):
        assert tb.audit(Resample(mode, scale_factor=2), (x,), ALL).rows == [], mode
    rows = tb.audit(Resample("bilinear", scale_factor=0.5, antialias=True), (x,), ALL).rows
    assert {r.op for r in rows} == {"_upsample_bilinear2d_aa",
                                    "_upsample_bilinear2d_aa_backward"}
    assert C.classify("upsample_nearest2d_backward")[0] == C.FREE
    assert C.classify("upsample_bicubic2d")[0] == C.EMULATED
    assert C.classify("grid_sampler_2d")[0] == C.BEARING           # data-dependent weights


def test_interpolation_is_torchs_with_exact_products():
    """pam_interpolate with exact float32 products is torch's F.interpolate up to the
    order of its sums: the weight tables are torch's."""
    from torch_bridge.contract import INTERPOLATION, pam_interpolate
    torch.manual_seed(0)
    for mode, nd in INTERPOLATION.items():
        x = torch.randn(2, 3, *([5] * nd))
        for kw in ({"scale_factor": 2}, {"size": 7}, {"scale_factor": 1.7}, {"size": 3},
                   {"scale_factor": 2.5, "recompute_scale_factor": True}):
            for ac in (False, True):
                ref = F.interpolate(x, mode=mode, align_corners=ac, **kw)
                y = pam_interpolate(x, mode=mode, align_corners=ac, mul="exact", **kw)
                assert y.shape == ref.shape and (y - ref).abs().max() < 1e-5, (mode, kw, ac)


def test_complex_sign_and_abs_count():
    """sgn(z) = z/|z| and |z| of a complex z divide and take square roots: counted; of a
    real tensor, a sign and a selection: free."""
    class Sign(nn.Module):
        def __init__(self, complex_):
            super().__init__()
            self.complex = complex_

        def forward(self, x):
            v = torch.view_as_complex(x.reshape(-1, 2)) if self.complex else x
            return torch.sgn(v).abs().sum() + x.sum()
    x = torch.randn(3, 4)
    assert tb.audit(Sign(False), (x,), ALL, backward=False).rows == []
    rep = tb.audit(Sign(True), (x,), ALL, backward=False)
    assert sorted(r.op for r in rep.rows) == ["abs", "sgn"] and rep.escaped == 2

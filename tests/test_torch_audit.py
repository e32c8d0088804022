"""torch_bridge.audit and ``pamsim audit``: native multiplies found, emulated ones not."""
import json

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
    assert all(r.seconds > 0 and r.baseline_seconds > 0 and r.target == 5.0 for r in rows)


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

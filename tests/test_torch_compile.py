"""torch.compile on models under pam_mode and on converted models: the PA ops run
eagerly (graph breaks), so the compiled model gives the eager PA bits — forward and
backward, under any sequence of configs on the same compiled model (Dynamo does not
guard a config it would have traced into: before the PA entry points were
``torch.compiler.disable``d, the second config reused the first one's trace)."""
import copy

import pytest
import torch
from torch import nn

import torch_bridge as tb

#: AOTAutograd without a C++ compiler: Dynamo's graph capture and the autograd split of
#: the native parts; inductor gives the same PA bits (docs/torch_bridge.md)
BACKEND = "aot_eager"
CONFIGS = [tb.PAMConfig("bf16"), tb.PAMConfig("e8m3", ops={"matmul"}),
           tb.PAMConfig("bf16", backward="exact")]


class _Conv(nn.Module):
    """A tiny conv net: convolutions, batch norm (training), pooling, tanh, a linear head."""

    def __init__(self):
        super().__init__()
        self.c1, self.bn = nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.c2, self.fc = nn.Conv2d(4, 4, 3), nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        h = nn.functional.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
        return self.fc(torch.tanh(self.c2(h)).flatten(1))


def _models():
    torch.manual_seed(0)
    return [("mlp", nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)),
             torch.randn(5, 8)),
            ("conv", _Conv(), torch.randn(2, 1, 12, 12))]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def _step(model, call, x, config):
    """Output and parameter gradients of one forward+backward pass under ``config``,
    the model's state (batch-norm statistics) and gradients restored afterwards."""
    state = copy.deepcopy(model.state_dict())
    for p in model.parameters():
        p.grad = None
    with tb.pam_mode(config):
        y = call(x)
        y.square().sum().backward()
    out = [y.detach()] + [p.grad.clone() for p in model.parameters()]
    model.load_state_dict(state)
    for p in model.parameters():
        p.grad = None
    return out


def _equal(a, b):
    return len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("name, model, x", _models(), ids=["mlp", "conv"])
def test_compiled_model_under_pam_mode_gives_the_eager_bits(name, model, x):
    compiled = torch.compile(model, backend=BACKEND)
    for config in [*CONFIGS, None, CONFIGS[0]]:        # one compiled model, configs in turn
        eager = _step(model, model, x, config)
        assert _equal(_step(model, compiled, x, config), eager), (name, config)
    assert not _equal(_step(model, model, x, CONFIGS[0]), _step(model, model, x, None))


@pytest.mark.parametrize("name, model, x", _models(), ids=["mlp", "conv"])
def test_compiled_converted_model_gives_the_eager_bits(name, model, x):
    for config in CONFIGS:                  # a fresh converted copy per config, same code
        converted = tb.convert(copy.deepcopy(model), config)
        compiled = torch.compile(converted, backend=BACKEND)
        for mode in (None, config):
            assert _equal(_step(converted, compiled, x, mode),
                          _step(converted, converted, x, mode)), (name, config, mode)


def test_pam_mode_inside_the_compiled_function():
    _, model, x = _models()[0]

    def forward(x, config):
        with tb.pam_mode(config):
            return model(x)
    compiled = torch.compile(forward, backend=BACKEND)
    with torch.no_grad():
        for config in CONFIGS:
            assert torch.equal(compiled(x, config), forward(x, config))


def test_fullgraph_names_the_graph_break():
    """fullgraph=True cannot hold a PA op: Dynamo says which function it may not trace."""
    _, model, x = _models()[0]
    compiled = torch.compile(model, backend=BACKEND, fullgraph=True)
    with pytest.raises(Exception, match="torch.compiler.disable"), torch.no_grad(), \
            tb.pam_mode(CONFIGS[0]):
        compiled(x)

"""The shared reference models build, run forward/backward, and reject unknown names."""
import pytest
import torch

from workloads.models import build_model, example_inputs


@pytest.mark.parametrize("name,kw,out", [("mlp", {}, (3, 10)), ("cnn", {}, (3, 10)),
                                         ("cnn", {"image_size": 28}, (3, 10)),
                                         ("vit", {}, (3, 10)), ("charlm", {"seq_len": 16}, (3, 16, 73))])
def test_models_forward_backward(name, kw, out):
    torch.manual_seed(0)
    m = build_model(name, **kw)
    x, y = example_inputs(m, 3)
    logits = m(x)
    assert logits.shape == out
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_unknown_model():
    with pytest.raises(ValueError, match="model='resnet'; expected one of"):
        build_model("resnet")

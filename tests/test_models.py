"""The shared reference models build, run forward/backward, and reject unknown names."""
import pytest
import torch

from workloads.models import build_model, example_inputs


@pytest.mark.parametrize("name,kw,out", [("mlp", {}, (3, 10)), ("cnn", {}, (3, 10)),
                                         ("cnn", {"image_size": 28}, (3, 10)),
                                         ("vit", {}, (3, 10)),
                                         ("vit", {"image_size": 8, "patch": 4, "pool": "mean"},
                                          (3, 10)),
                                         ("charlm", {"seq_len": 16}, (3, 16, 73))])
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


def test_vit_pooling():
    """pool='mean' has no class token (one position per patch); pool='cls' keeps the
    original model, parameter for parameter; anything else is refused."""
    torch.manual_seed(0)
    cls = build_model("vit", image_size=8, patch=4, dim=8, depth=1)
    torch.manual_seed(0)
    mean = build_model("vit", image_size=8, patch=4, dim=8, depth=1, pool="mean")
    assert cls.pos.shape == (1, 5, 8) and cls.cls is not None and cls.n_patches == 4
    assert mean.pos.shape == (1, 4, 8) and mean.cls is None and mean.n_patches == 4
    x = torch.rand(2, 1, 8, 8)
    h = mean.norm(mean.blocks(mean.embed(x).flatten(2).transpose(1, 2) + mean.pos))
    assert torch.allclose(mean(x), mean.head(h.mean(1)))
    with pytest.raises(ValueError, match="pool='max'; expected 'cls' or 'mean'"):
        build_model("vit", pool="max")

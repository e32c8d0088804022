"""Small reference models for training simulations and cost estimates (plain PyTorch).

Every model here is native PyTorch; running it on emulated PA hardware is
torch_bridge's job (``torch_bridge.convert`` / ``pam_mode``).  ``build_model`` and
``example_inputs`` are the entry points the CLI, the trainers and the cost model share.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    """Flattened image -> hidden layers with ReLU -> logits."""

    def __init__(self, in_features=64, hidden=(128, 64), n_classes=10):
        super().__init__()
        dims = (in_features, *hidden)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(dims[-1], n_classes)

    def forward(self, x):
        x = x.flatten(1)
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


class CNN(nn.Module):
    """Two conv blocks and a linear head, for 1-channel images (8x8 digits or 28x28 MNIST)."""

    def __init__(self, image_size=8, channels=(16, 32), n_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels[0], 3, padding=1)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 3, padding=1)
        side = image_size // 4 if image_size >= 16 else image_size // 2
        self.pool_twice = image_size >= 16
        self.head = nn.Linear(channels[1] * side * side, n_classes)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        if self.pool_twice:
            x = F.max_pool2d(x, 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


#: attention heads of the transformers (ViT, CharLM): their width must be a multiple
HEADS = 4


class Block(nn.Module):
    """Pre-norm transformer block: multi-head self-attention and a GELU MLP."""

    def __init__(self, dim, heads, mlp_ratio=4, causal=False):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(),
                                 nn.Linear(mlp_ratio * dim, dim))
        self.causal = causal

    def forward(self, x):
        h = self.norm1(x)
        mask = None
        if self.causal:
            n = x.shape[1]
            mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """A small vision transformer: conv patch embedding, pre-norm blocks, and either a
    class token (``pool="cls"``, as the original ViT) or global average pooling of the
    patch tokens (``pool="mean"``, as Beyer et al. 2022, "Better plain ViT baselines";
    no class token).  The mean over the tokens is a sum and a division by their count,
    a power of two on the square grids pamsim trains (4 or 16 patches), which a PA
    division computes exactly."""

    def __init__(self, image_size=28, patch=7, dim=64, depth=4, heads=HEADS, n_classes=10,
                 pool="cls"):
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image_size={image_size} must be a multiple of patch={patch}")
        if pool not in ("cls", "mean"):
            raise ValueError(f"pool={pool!r}; expected 'cls' or 'mean'")
        self.embed = nn.Conv2d(1, dim, patch, stride=patch)
        n = (image_size // patch) ** 2
        self.pool = pool
        self.cls = nn.Parameter(torch.zeros(1, 1, dim)) if pool == "cls" else None
        self.pos = nn.Parameter(torch.randn(1, n + (pool == "cls"), dim) * 0.02)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_classes)

    @property
    def n_patches(self) -> int:
        return self.pos.shape[1] - (self.pool == "cls")

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2)
        if self.pool == "cls":
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1)
        x = self.norm(self.blocks(x + self.pos))
        return self.head(x[:, 0] if self.pool == "cls" else x.mean(1))


class CharLM(nn.Module):
    """A causal character-level transformer language model."""

    def __init__(self, vocab=73, seq_len=64, dim=128, depth=4, heads=HEADS):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, seq_len, dim) * 0.02)
        self.blocks = nn.Sequential(*(Block(dim, heads, causal=True) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.seq_len = seq_len

    def forward(self, idx):
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        return self.head(self.norm(self.blocks(x)))


MODELS = {"mlp": MLP, "cnn": CNN, "vit": ViT, "charlm": CharLM}


def build_model(name: str, **kwargs) -> nn.Module:
    """A model by name: 'mlp', 'cnn', 'vit' or 'charlm' (keyword arguments go to its class)."""
    if name not in MODELS:
        raise ValueError(f"model={name!r}; expected one of {sorted(MODELS)}")
    return MODELS[name](**kwargs)


def example_inputs(model: nn.Module, batch_size: int = 32):
    """A batch of (inputs, targets) with the shapes ``model`` expects (random data)."""
    g = torch.Generator().manual_seed(0)
    if isinstance(model, CharLM):
        vocab = model.tok.num_embeddings
        x = torch.randint(vocab, (batch_size, model.seq_len), generator=g)
        return x, torch.randint(vocab, (batch_size, model.seq_len), generator=g)
    if isinstance(model, MLP):
        x = torch.rand(batch_size, model.layers[0].in_features, generator=g)
    else:
        if isinstance(model, ViT):
            n = int(math.isqrt(model.n_patches)) * model.embed.kernel_size[0]
        else:
            n = 28 if model.pool_twice else 8
        x = torch.rand(batch_size, 1, n, n, generator=g)
    return x, torch.randint(10, (batch_size,), generator=g)

"""Tiny random-initialised models, built offline, for audits, tests and benchmarks.

The transformers ones are built from configs (no download; ``HF_HUB_OFFLINE=1`` is
set before transformers is imported), a few thousand parameters each, so a forward
and backward pass takes milliseconds natively.  ``build(name)`` returns
``(model, inputs)`` with ``inputs`` a dict of keyword arguments (or a tuple of
positional ones) for one training-style pass; transformers models get labels so
their own loss runs.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TINY", "build", "HF_MODELS", "TORCH_MODELS"]

_V, _D, _FF, _H, _L, _T, _B = 64, 32, 64, 4, 2, 8, 2     # vocab, width, ffn, heads, layers,
                                                          # tokens, batch


def _hf():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    transformers.logging.set_verbosity_error()
    return transformers


def _ids(gen):
    return torch.randint(3, _V, (_B, _T), generator=gen)


def _causal(cls_conf, cls_model, **extra):
    def make(gen):
        tf = _hf()
        conf = getattr(tf, cls_conf)(vocab_size=_V, hidden_size=_D, intermediate_size=_FF,
                                     num_hidden_layers=_L, num_attention_heads=_H,
                                     max_position_embeddings=64, pad_token_id=0,
                                     bos_token_id=1, eos_token_id=2, **extra)
        ids = _ids(gen)
        return getattr(tf, cls_model)(conf), {"input_ids": ids, "labels": ids}
    return make


def _gpt2(gen):
    tf = _hf()
    conf = tf.GPT2Config(vocab_size=_V, n_positions=64, n_embd=_D, n_layer=_L, n_head=_H,
                         n_inner=_FF, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    ids = _ids(gen)
    return tf.GPT2LMHeadModel(conf), {"input_ids": ids, "labels": ids}


def _bert(gen):
    tf = _hf()
    conf = tf.BertConfig(vocab_size=_V, hidden_size=_D, num_hidden_layers=_L,
                         num_attention_heads=_H, intermediate_size=_FF,
                         max_position_embeddings=32)
    ids = _ids(gen)
    return tf.BertForMaskedLM(conf), {"input_ids": ids, "labels": ids}


def _vit(gen):
    tf = _hf()
    conf = tf.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=_D,
                        num_hidden_layers=_L, num_attention_heads=_H, intermediate_size=_FF,
                        num_labels=5)
    return tf.ViTForImageClassification(conf), {
        "pixel_values": torch.randn(_B, 3, 16, 16, generator=gen),
        "labels": torch.randint(5, (_B,), generator=gen)}


def _t5(gen):
    tf = _hf()
    conf = tf.T5Config(vocab_size=_V, d_model=_D, d_kv=_D // _H, d_ff=_FF, num_layers=_L,
                       num_heads=_H, relative_attention_num_buckets=8,
                       relative_attention_max_distance=16, decoder_start_token_id=0,
                       pad_token_id=0, eos_token_id=1)
    return tf.T5ForConditionalGeneration(conf), {"input_ids": _ids(gen), "labels": _ids(gen)}


def _whisper(gen):
    tf = _hf()
    conf = tf.WhisperConfig(vocab_size=_V, num_mel_bins=8, encoder_layers=1, decoder_layers=1,
                            d_model=_D, encoder_attention_heads=_H, decoder_attention_heads=_H,
                            encoder_ffn_dim=_FF, decoder_ffn_dim=_FF, max_source_positions=8,
                            max_target_positions=16, pad_token_id=0, bos_token_id=1,
                            eos_token_id=2, decoder_start_token_id=1,
                            suppress_tokens=[], begin_suppress_tokens=[])
    return tf.WhisperForConditionalGeneration(conf), {
        "input_features": torch.randn(_B, 8, 16, generator=gen), "labels": _ids(gen)}


def _clip(gen):
    tf = _hf()
    conf = tf.CLIPTextConfig(vocab_size=_V, hidden_size=_D, intermediate_size=_FF,
                             num_hidden_layers=_L, num_attention_heads=_H,
                             max_position_embeddings=16, eos_token_id=2)
    return tf.CLIPTextModel(conf), {"input_ids": _ids(gen)}


class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(_D, _H, _FF, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, _L, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(_D)

    def forward(self, x):
        return self.norm(self.body(x, is_causal=False))


class _MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(_D, _H, batch_first=True)

    def forward(self, x):
        y, w = self.attn(x, x, x, need_weights=True)
        return y, w


class _CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(2), nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8),
                                  nn.ReLU(), nn.Flatten(), nn.Linear(8 * 2 * 2, 5))

    def forward(self, x):
        return self.body(x)


class _RNN(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(_D, _D, num_layers=1, batch_first=True)
        self.head = nn.Linear(_D, 5)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


class _Einsum(nn.Module):
    """Attention written with torch.einsum."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(_D, 3 * _D)

    def forward(self, x):
        q, k, v = self.qkv(x).unflatten(-1, (3, _H, _D // _H)).unbind(2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) * (_D // _H) ** -0.5
        return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


class _Extras(nn.Module):
    """The rarer multiply-bearing torch ops: 3-D and transposed convolutions, average
    pooling (fixed and adaptive), addbmm/addmv, cosine similarity and pairwise distance,
    and the BCE, BCE-with-logits, KL-div, Huber, smooth-L1 and L1 losses; returns the
    summed losses."""

    def __init__(self):
        super().__init__()
        self.conv3d = nn.Conv3d(2, 4, 3, padding=1)
        self.up3d = nn.ConvTranspose3d(4, 2, 2, stride=2)
        self.up2d = nn.ConvTranspose2d(8, 3, 3, stride=2, padding=1, output_padding=1)
        self.up1d = nn.ConvTranspose1d(3, 2, 3)
        self.pool1d, self.pool3d = nn.AvgPool1d(2), nn.AvgPool3d(2)
        self.adapt = nn.AdaptiveAvgPool2d(3)
        self.mix = nn.Parameter(torch.randn(2, 4, 4) * 0.5)
        self.vec = nn.Parameter(torch.randn(4))

    def forward(self, x, t):
        h = self.pool3d(self.up3d(torch.relu(self.conv3d(x))))            # (B, 2, 4, 4, 4)
        h = self.up2d(F.avg_pool2d(h.flatten(1, 2), 2, count_include_pad=False))
        z = self.adapt(h)                                                 # (B, 3, 3, 3)
        s = self.pool1d(self.up1d(z.flatten(2)))                          # (B, 2, 5)
        m = torch.addbmm(z[0, 0, :, :1], self.mix[:, :3, :3], self.mix[:, :3, :1])
        v = torch.addmv(s[:, 0, :4].sum(0), self.mix[0], self.vec)
        feat = torch.cat([s.flatten(1)[:, :4] + v, m.flatten()[None].expand(len(x), 3)], 1)
        p = torch.sigmoid(feat)
        return (F.binary_cross_entropy(p, t) + F.binary_cross_entropy_with_logits(feat, t)
                + F.kl_div(F.log_softmax(feat, 1), t.softmax(1), reduction="batchmean")
                + F.huber_loss(feat, t, delta=0.5) + F.smooth_l1_loss(feat, t)
                + F.l1_loss(feat, t)
                + (1 - F.cosine_similarity(feat, t)).mean()
                + F.pairwise_distance(feat, t).mean())


def _tokens(gen):
    return (torch.randn(_B, _T, _D, generator=gen),)


def _torch(factory, inputs):
    return lambda gen: (factory(), inputs(gen))


#: name -> builder(generator) -> (model, inputs)
HF_MODELS = {
    "gpt2": _gpt2,
    "llama": _causal("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=2),
    "qwen2": _causal("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2),
    "mistral": _causal("MistralConfig", "MistralForCausalLM", num_key_value_heads=2),
    "bert": _bert, "vit": _vit, "t5": _t5, "whisper": _whisper, "clip": _clip,
}
TORCH_MODELS = {
    "encoder": _torch(_Encoder, _tokens), "mha": _torch(_MHA, _tokens),
    "cnn": _torch(_CNN, lambda g: (torch.randn(_B, 3, 8, 8, generator=g),)),
    "gru": _torch(lambda: _RNN(nn.GRU), _tokens), "lstm": _torch(lambda: _RNN(nn.LSTM), _tokens),
    "einsum": _torch(_Einsum, _tokens),
    "extras": _torch(_Extras, lambda g: (torch.randn(_B, 2, 4, 4, 4, generator=g),
                                         torch.rand(_B, 7, generator=g))),
}
TINY = {**HF_MODELS, **TORCH_MODELS}


def build(name: str, seed: int = 0):
    """``(model, inputs)`` of the tiny model ``name`` (one of ``TINY``), weights and
    inputs drawn from ``seed``; transformers models in eval mode (no dropout)."""
    if name not in TINY:
        raise ValueError(f"model={name!r}; expected one of {sorted(TINY)}")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model, inputs = TINY[name](gen)
    if name in HF_MODELS:
        model.eval()
    return model, inputs

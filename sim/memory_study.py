"""Measurements of the memory-saving activations (torch_bridge.memory).

* :func:`derivative_errors`: L2 and L∞ error of the backward derivative, few-bit
  1-8 bits vs the inverted activation (Inverted Activations, Fig. 5), measured through
  the layers themselves on every float32 step of a dense grid of [−10, 10].
* :func:`saved_bytes` / :func:`saved_memory`: the bytes autograd actually keeps,
  recorded with ``torch.autograd.graph.saved_tensors_hooks`` and deduplicated by
  storage (a tensor saved by two layers — an activation's output and the next
  Linear's input — counts once), for an MLP block, transformer blocks and
  all-MiniLM-L6-v2 with their activations swapped by ``convert_activations``.
* :func:`train_mlp`: a small training study (digits or MNIST-subset MLP), native vs
  few-bit vs inverted vs PA, several seeds.

The commands ``pamsim memory-errors``, ``pamsim memory-saved`` and
``pamsim memory-study`` print these; docs/memory.md records their numbers.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from torch_bridge.memory import convert_activations, fewbit, inverted, inverter

#: the activation variants compared everywhere: label -> convert_activations kwargs
VARIANTS = {"native": {}, **{f"few-bit {b}": {"fewbit": b} for b in (1, 2, 3, 4)},
            "InvAct": {"inverted": True}, "PA 16": {"pa": 16}}


# --- derivative error (Fig. 5) --------------------------------------------------------

def _grid32(n: int) -> torch.Tensor:
    return torch.linspace(-10, 10, n, dtype=torch.float64).float()


def _backward_derivative(layer, x: torch.Tensor) -> torch.Tensor:
    xr = x.clone().requires_grad_(True)
    layer(xr).backward(torch.ones_like(xr))
    return xr.grad.double()


def derivative_errors(act: str = "gelu", n: int = 2_000_001, bits=range(1, 9)) -> dict:
    """{label: (L2, L∞)} of the backward derivative against f'(x) in float64.

    L2 = sqrt(∫_{−10}^{10} (g − f')² dx) (the square root of eq. 3, uniform weight),
    estimated on an ``n``-point float32 grid; L∞ the maximum there.  Few-bit rows use
    the uniform-weight tables; the InvAct rows store y in float32 / bfloat16.
    """
    x = _grid32(n)
    exact = inverter(act)._d(x.double().numpy())

    def norms(g):
        e = g.numpy() - exact
        return float(np.sqrt(np.mean(e * e) * 20.0)), float(np.abs(e).max())

    out = {f"few-bit {b}": norms(_backward_derivative(lambda t: fewbit(t, act, b), x))
           for b in bits}
    out["InvAct fp32"] = norms(_backward_derivative(lambda t: inverted(t, act), x))
    xb = x.bfloat16()
    e16 = _backward_derivative(lambda t: inverted(t, act), xb).numpy() \
        - inverter(act)._d(xb.double().numpy())
    out["InvAct bf16"] = (float(np.sqrt(np.mean(e16 * e16) * 20.0)), float(np.abs(e16).max()))
    return out


# --- saved-activation memory ------------------------------------------------------------

@dataclass(frozen=True)
class Saved:
    """What autograd kept for one forward pass."""
    nbytes: int          # distinct storages, parameters excluded
    tensors: int         # saved tensors (with repeats)
    storages: int        # distinct storages


def saved_bytes(model: nn.Module, run) -> Saved:
    """Bytes kept for backward while ``run()`` executes ``model``'s forward pass.

    Every tensor autograd saves passes the pack hook; the bytes are those of its
    distinct storages (a view and its base, or one tensor saved by two nodes, count
    once), excluding the model's parameters and buffers, which exist anyway.
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    params |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    seen: dict[int, int] = {}
    count = 0

    def pack(t):
        nonlocal count
        count += 1
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()               # saved storages stay alive (no address reuse) while it runs
    return Saved(sum(seen.values()), count, len(seen))


def mlp_block(d: int = 256, hidden: int = 1024) -> nn.Module:
    """Linear → GELU → Linear (the activation's output is the next Linear's input)."""
    return nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))


def transformer_block(d: int = 256, heads: int = 4, hidden: int = 1024,
                      dropout: float = 0.1) -> nn.Module:
    """nn.TransformerEncoderLayer with GELU (pre-norm).  With dropout > 0 the GELU
    output goes into a Dropout, which saves only a mask: the Linear after it saves the
    dropped tensor, so the inverted activation's saved output is *extra* memory."""
    return nn.TransformerEncoderLayer(d, heads, hidden, dropout, activation=nn.GELU(),
                                      batch_first=True, norm_first=True)


def _variant(model: nn.Module, kwargs: dict) -> nn.Module:
    return convert_activations(copy.deepcopy(model), **kwargs).train()


def saved_memory(model: nn.Module, make_input, variants=VARIANTS) -> dict:
    """{variant: Saved} for one model, its input built by ``make_input()``."""
    out = {}
    for label, kwargs in variants.items():
        m = _variant(model, kwargs)
        inputs = make_input()
        torch.manual_seed(0)                       # same dropout masks in every variant
        out[label] = saved_bytes(m, lambda: m(**inputs) if isinstance(inputs, dict)
                                 else m(inputs))
    return out


def minilm_case(batch: int = 8, seq: int = 128):
    """(the BERT encoder of all-MiniLM-L6-v2, input maker): KJV verses tokenised to
    ``seq`` tokens.  Its GELUs are transformers' GELUActivation (F.gelu)."""
    from workloads.data import kjv_text, load_minilm
    st = load_minilm()
    bert = st[0].auto_model
    verses = kjv_text().splitlines()[:batch * 4:4]
    tok = st.tokenizer(verses, padding="max_length", truncation=True, max_length=seq,
                       return_tensors="pt")
    return bert, lambda: {"input_ids": tok["input_ids"], "attention_mask": tok["attention_mask"]}


def memory_cases(quick: bool = False):
    """[(name, model, input maker, bytes of the native activations' inputs)]."""
    torch.manual_seed(0)
    tokens, d, hidden = (256, 128, 512) if quick else (2048, 256, 1024)
    x = lambda: torch.randn(tokens // 128, 128, d)          # noqa: E731
    cases = [("MLP block", mlp_block(d, hidden), x, tokens * hidden * 4),
             ("transformer block, dropout 0.1", transformer_block(d, 4, hidden, 0.1), x,
              tokens * hidden * 4),
             ("transformer block, dropout 0", transformer_block(d, 4, hidden, 0.0), x,
              tokens * hidden * 4)]
    if not quick:
        bert, inp = minilm_case()
        n = inp()["input_ids"].numel()
        layers = bert.config.num_hidden_layers
        cases.append(("all-MiniLM-L6-v2 (8 x 128 tokens)", bert, inp,
                      layers * n * bert.config.intermediate_size * 4))
    return cases


# --- training study ---------------------------------------------------------------------

DATASETS = ("digits", "mnist")


def mlp(inputs: int, hidden: int = 128) -> nn.Module:
    """The study's classifier: inputs → hidden → GELU → hidden → GELU → 10."""
    return nn.Sequential(nn.Linear(inputs, hidden), nn.GELU(), nn.Linear(hidden, hidden),
                         nn.GELU(), nn.Linear(hidden, 10))


def train_mlp(variant: dict, seed: int, epochs: int = 30, data: str = "digits",
              batch: int = 64, lr: float = 3e-3) -> dict:
    """Train :func:`mlp` on ``data`` (sklearn digits or the 5,000-image MNIST subset)
    with one activation variant; per-epoch train loss and the final test loss/accuracy.
    Same initialisation and batch order per seed.  Runs on one thread (torch and
    Numba): the tensors are tiny, and on the shared machine thread synchronisation made
    two threads ~40x slower than one."""
    from sim.bench import threads
    with threads(1):
        return _train_mlp(variant, seed, epochs, data, batch, lr)


def _train_mlp(variant, seed, epochs, data, batch, lr):
    from workloads import data as datasets
    if data not in DATASETS:
        raise ValueError(f"data={data!r}; expected one of {list(DATASETS)}")
    data = getattr(datasets, data)(seed=0)
    xtr, ytr = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    xte, yte = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
    torch.manual_seed(seed)
    model = convert_activations(mlp(xtr.shape[1]), **variant)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(epochs):
        order = torch.randperm(len(xtr), generator=gen)
        total = 0.0
        for i in range(0, len(xtr), batch):
            idx = order[i:i + batch]
            loss = nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        losses.append(total / len(xtr))
    with torch.no_grad():
        logits = model(xte)
        test_loss = float(nn.functional.cross_entropy(logits, yte))
        acc = float((logits.argmax(1) == yte).float().mean())
    return {"train_loss": losses, "test_loss": test_loss, "test_acc": acc}

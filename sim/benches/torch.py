"""torch_bridge: a transformer training step on emulated PA hardware vs native float32.

The target (issue 13 §6, "the transformer step stays <= 3x native"): one step
(forward + backward + optimizer) of a 4-layer, d=128, seq 64, batch 32 transformer
(workloads.models.CharLM) with PAM matmuls (approximate backward, bfloat16 operands)
within 3x of the native float32 step on this CPU — the paper's own GPU
implementation was 4.5x slower than native (Appendix E).  Also the
fully multiplication-free step (every op group PA, the paper's choice of derivatives,
PAAdamW) and the matmul step with exact derivatives, both <= 3x on one thread (issue
29).  Ratios against the native step measured in the same run, at one thread and at
all threads.

Per-call overhead: a training step of the default digits MLP (64-128-64-10, batch 64,
one thread) with every op group PA and PAAdamW against the native step, target 4x
(issue 29; 5x in issue 13): on tensors this small, handing tensors to emu, validation and dispatch
dominate, not the kernels.
"""
from __future__ import annotations

import copy

import torch

import torch_bridge as tb
from sim.bench import Row, best_of, case, threads
from workloads.models import build_model, example_inputs


def _step_fn(model, config, opt, batch, device="cpu"):
    x, y = (t.to(device) for t in example_inputs(model, batch))

    def step():
        logits = model(x)
        loss = tb.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                           label_smoothing=0.1, config=config)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def _setups(quick: bool):
    torch.manual_seed(0)
    shape = dict(seq_len=16, dim=64, depth=1, heads=4) if quick else \
        dict(seq_len=64, dim=128, depth=4, heads=4)
    batch = 8 if quick else 32
    native = build_model("charlm", **shape)
    paper = {"loss": "exact"}
    configs = {
        "PAM matmuls, bf16, approx bwd": tb.PAMConfig("bf16", ops={"matmul"}),
        "all ops PA (mult.-free), bf16": tb.PAMConfig("bf16", backward=paper),
        "PAM matmuls, bf16, exact bwd": tb.PAMConfig("bf16", ops={"matmul"}, backward="exact"),
    }
    base = _step_fn(native, None, torch.optim.AdamW(native.parameters(), lr=1e-3), batch)
    cands = {}
    for name, cfg in configs.items():
        m = tb.convert(copy.deepcopy(native), cfg)
        cands[name] = _step_fn(m, cfg, tb.PAAdamW(m.parameters(), lr=1e-3, config=cfg), batch)
    label = f"L{shape['depth']} d{shape['dim']} seq{shape['seq_len']} b{batch}"
    return label, base, cands


@case("torch")
def torch_cases(quick: bool) -> list[Row]:
    label, base, cands = _setups(quick)
    rows = []
    for nthreads in (1, None):
        with threads(nthreads) as used:
            for name, step in cands.items():
                tc, tb_ = best_of(step, base, 2 if quick else 3)
                # issue 13: the approximate step <= 3x; issue 29: the exact backward and the
                # multiplication-free step <= 3x on one thread
                target = 3.0 if name.startswith("PAM matmuls, bf16, approx") or used == 1 \
                    else None
                rows.append(Row(f"train step {label} {name}, {used} thr", tc,
                                f"native fp32 step, {used} thr", tb_, target))
    return rows


@case("torch")
def mlp_overhead(quick: bool) -> list[Row]:
    torch.manual_seed(0)
    native = build_model("mlp")
    cfg = tb.PAMConfig("bf16", backward={"loss": "exact"})
    base = _step_fn(native, None, torch.optim.AdamW(native.parameters(), lr=1e-3), 64)
    m = tb.convert(copy.deepcopy(native), cfg)
    cand = _step_fn(m, cfg, tb.PAAdamW(m.parameters(), lr=1e-3, config=cfg), 64)
    with threads(1) as used:
        tc, tb_ = best_of(cand, base, 3 if quick else 10)
    return [Row(f"train step digits MLP 64-128-64-10 b64, all ops PA + PAAdamW, {used} thr",
                tc, f"native fp32 step, {used} thr", tb_, 4.0)]

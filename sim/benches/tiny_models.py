"""The tiny models of sim.tiny_models: one forward+backward pass under pam_mode with
every op group on (bf16, approximate derivatives) against the same pass native, per
model (target: within 4x, issue 29; issue 15 asked 5x), at one thread (torch's and Numba's): tiny models
gain nothing from more and a shared machine makes multi-threaded timings erratic.
``--quick``: two torch-only models."""
from __future__ import annotations

import torch

import torch_bridge as tb
from sim.bench import Row, best_of, case, threads
from sim.tiny_models import TINY, build

_QUICK = ("encoder", "gru")


def _pass(model, inputs, config):
    def run():
        model.zero_grad(set_to_none=True)
        with tb.pam_mode(config):
            out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
            loss = getattr(out, "loss", None)
            if loss is None:
                first = out if isinstance(out, torch.Tensor) else out[0]
                loss = first.float().sum()
        loss.backward()
    return run


@case("tiny-models")
def tiny_model_cases(quick: bool) -> list[Row]:
    cfg = tb.PAMConfig("bf16")
    rows = []
    with threads(1):
        for name in _QUICK if quick else TINY:
            model, inputs = build(name)
            pa, native = _pass(model, inputs, cfg), _pass(model, inputs, None)
            t_pa, t_native = best_of(pa, native, 2 if quick else 5)
            rows.append(Row(f"{name}: fwd+bwd, all op groups PA, bf16, 1 thr", t_pa,
                            f"{name}: native fwd+bwd", t_native, 4.0))
    return rows

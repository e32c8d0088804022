"""torch_bridge.memory: forward + backward of the memory-saving activations vs torch's
native activation (GELU; SiLU for InvSiLU)."""
from __future__ import annotations

import torch

from sim.bench import Row, best_of, case, threads


def _fwd_bwd(layer, x, g):
    def run():
        xr = x.detach().requires_grad_(True)
        layer(xr).backward(g)
    return run


@case("memory")
def memory_cases(quick: bool) -> list[Row]:
    from torch_bridge.memory import FewBitGELU, InvGELU, InvSiLU, PAGELU
    n = (1 if quick else 16) << 20
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=gen) * 2
    g = torch.randn(n, generator=gen)
    rows = []
    with threads(None) as used:
        for name, layer, target, base_name, base in (
                ("FewBitGELU(bits=3)", FewBitGELU(3), 1.5, "GELU", torch.nn.GELU()),
                ("InvGELU", InvGELU(), 1.5, "GELU", torch.nn.GELU()),
                ("InvSiLU", InvSiLU(), None, "SiLU", torch.nn.SiLU()),
                ("PAGELU(pieces=16)", PAGELU(16), None, "GELU", torch.nn.GELU())):
            tc, tb = best_of(_fwd_bwd(layer, x, g), _fwd_bwd(base, x, g), 3 if quick else 5)
            rows.append(Row(f"{name} fwd+bwd, {n >> 20} M fp32, {used} threads", tc,
                            f"torch nn.{base_name} fwd+bwd", tb, target))
    return rows

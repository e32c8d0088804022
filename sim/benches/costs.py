"""costs: overhead of counting a training step (FlopCounterMode + decomposing dispatch
mode + saved-tensor hooks) against running the same step plainly."""
from __future__ import annotations

from sim.bench import Row, best_of, case


@case("costs")
def costs_cases(quick: bool) -> list[Row]:
    import torch

    from costs.step import count_step, model_step
    name, batch = ("mlp", 32) if quick else ("vit", 32)
    model, loss_fn = model_step(name, batch)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)

    def plain():
        opt.zero_grad(set_to_none=True)
        loss_fn().backward()
        opt.step()

    tc, tb = best_of(lambda: count_step(model, loss_fn, opt), plain, 2 if quick else 3)
    return [Row(f"count_step {name} batch {batch}", tc, f"plain step {name}", tb)]

"""Scaling recipes (issue 26 §6): quantizing a 4096 x 4096 tensor with any recipe within 3x
of a plain ``emu.quantize`` to its element format, and a recipe's PAM matmul within 1.5x of
the same matmul (``emu.matmul`` with the elements' rule) on operands quantized before."""
from __future__ import annotations

import numpy as np

import emu
from sim.bench import Row, best_of, case

#: (recipe, role) rows: every family, fp8_block's two block shapes
QUANTIZE = [("nvfp4", "act"), ("fp8_current", "act"), ("fp8_delayed", "act"),
            ("fp8_block", "act"), ("fp8_block", "weight"), ("mxfp8_e4m3", "act"),
            ("mxfp4_e2m1", "act")]
MATMUL = ["nvfp4", "fp8_current/e4m3", "fp8_block", "mxfp8_e4m3"]


@case("recipes")
def recipe_cases(quick: bool) -> list[Row]:
    rng = np.random.default_rng(0)
    n = 1024 if quick else 4096
    x = rng.standard_normal((n, n)).astype(np.float32)
    repeat = 3 if quick else 5
    rows = []
    for name, role in QUANTIZE:
        r = emu.recipe(name)
        elem = r.element(role)
        tc, tb = best_of(lambda: emu.recipe_quantize(x, r, role),
                         lambda: emu.quantize(x, elem), repeat)
        rows.append(Row(f"recipe_quantize {name} ({role}) {n}x{n}", tc,
                        f"emu.quantize {elem.name}", tb, 3.0))
    k = 256 if quick else 1024
    a = rng.standard_normal((k, k)).astype(np.float32)
    b = rng.standard_normal((k, k)).astype(np.float32)
    for name in MATMUL:
        r = emu.recipe(name)
        qa, qb = emu.recipe_quantize(a, r, "act"), emu.recipe_quantize(b, r, "weight", axis=-2)
        da, db = emu.recipe_dequantize(qa), emu.recipe_dequantize(qb)
        tc, tb = best_of(lambda: emu.recipe_matmul(qa, qb, r),
                         lambda: emu.matmul(da, db, "float32"), repeat)
        rows.append(Row(f"recipe_matmul {name} pam {k}^3 (quantized operands)", tc,
                        "emu.matmul pam of the dequantized operands", tb, 1.5))
    return rows

"""Bad input, table-driven (issue 12): every row is one bad value given through the public
API or the ``pamsim`` command line.

API rows raise ValueError or TypeError (MemoryError for results that cannot be
allocated) whose message names the argument.  CLI rows end in exit status 2 and one line
on stderr, ``pamsim <command>: error: ...`` naming the option, with no traceback and no
file or directory left behind.  Every row must fail in validation: the fixture
``no_work`` replaces what would start the work of each command (training, synthesis,
simulation, solving, plotting) with a function that fails the test.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import costs
import emu
import torch_bridge as tb
from sim import rtl_sim
from sim.cli import main
from sim.train import TrainSpec
from torch_bridge.memory import (FewBitGELU, InvGELU, convert_activations, fewbit, inverted,
                                 pa_activation)

NAN, INF = math.nan, math.inf
F32 = np.float32


def _params():
    return [torch.nn.Parameter(torch.ones(3))]


def _x():
    return torch.ones(3, requires_grad=True)


#: (id, call, exception type, text the message must contain: the argument's name)
API = [
    # emu: formats
    ("emu.format list", lambda: emu.format(["bf16"]), ValueError, "fmt=['bf16']"),
    ("emu.Format exp_bits", lambda: emu.Format(9, 3), ValueError, "exp_bits"),
    ("emu.Format man_bits", lambda: emu.Format(8, 0), ValueError, "man_bits"),
    ("emu.Format float exp", lambda: emu.Format(8.0, 3), ValueError, "exp_bits"),
    ("emu.Format has_inf", lambda: emu.Format(8, 3, has_inf=1), ValueError, "has_inf"),
    # emu: quantize / to_bits / from_bits
    ("quantize bad format", lambda: emu.quantize(1.0, "bf17"), ValueError, "fmt='bf17'"),
    ("quantize format None", lambda: emu.quantize(1.0, None), ValueError, "fmt=None"),
    ("quantize format int", lambda: emu.quantize(1.0, 16), ValueError, "fmt=16"),
    ("quantize str", lambda: emu.quantize("a", "bf16"), TypeError, "x must"),
    ("quantize masked", lambda: emu.quantize(np.ma.masked_array([1.0, 2.0], mask=[0, 1]),
                                             "bf16"), TypeError,
     "x is a numpy masked array; masked arrays are not accepted"),
    ("pam_mul masked", lambda: emu.pam_mul(np.ones(2, F32), np.ma.masked_array(
        np.ones(2, F32), mask=[1, 0]), "bf16"), TypeError, "is a numpy masked array"),
    ("pam_mul masked constant", lambda: emu.pam_mul(np.ma.masked, 1.0, "bf16"), TypeError,
     "a.filled(value) or a.data instead"),
    ("quantize complex", lambda: emu.quantize(1j, "bf16"), TypeError, "x must"),
    ("quantize object", lambda: emu.quantize([1, None], "bf16"), TypeError, "x must"),
    ("quantize int beyond int64", lambda: emu.quantize(2 ** 70, "bf16"), TypeError, "x must"),
    ("quantize rounding name", lambda: emu.quantize(1.0, "bf16", "up"), ValueError, "rounding="),
    ("quantize rounding list", lambda: emu.quantize(1.0, "bf16", ["x"]), ValueError,
     "rounding="),
    ("quantize overflow", lambda: emu.quantize(1.0, "bf16", overflow="clip"), ValueError,
     "overflow="),
    ("quantize subnormals", lambda: emu.quantize(1.0, "bf16", subnormals="no"), ValueError,
     "subnormals"),
    ("quantize seed without stochastic", lambda: emu.quantize(1.0, "bf16", seed=3), ValueError,
     "seed"),
    ("quantize seed negative", lambda: emu.quantize(1.0, "bf16", "stochastic", seed=-1),
     ValueError, "seed"),
    ("quantize seed 2**64", lambda: emu.quantize(1.0, "bf16", "stochastic", seed=2 ** 64),
     ValueError, "seed"),
    ("quantize seed float", lambda: emu.quantize(1.0, "bf16", "stochastic", seed=1.5),
     ValueError, "seed"),
    ("to_bits str", lambda: emu.to_bits("a", "bf16"), TypeError, "x must"),
    ("to_bits bad format", lambda: emu.to_bits(1.0, "e9m2"), ValueError, "fmt='e9m2'"),
    ("from_bits float", lambda: emu.from_bits(1.0, "bf16"), TypeError, "bits must"),
    ("from_bits bool", lambda: emu.from_bits(True, "bf16"), TypeError, "bits must"),
    ("from_bits negative", lambda: emu.from_bits(-1, "bf16"), ValueError, "bits must"),
    ("from_bits too wide", lambda: emu.from_bits(np.array([70000]), "bf16"), ValueError,
     "bits must"),
    ("from_bits python int beyond int64", lambda: emu.from_bits(2 ** 70, "bf16"), ValueError,
     "beyond int64"),
    ("from_bits list beyond int64", lambda: emu.from_bits([1, 2 ** 70], "bf16"), ValueError,
     "beyond int64"),
    ("from_bits huge broadcast view, bad value",
     lambda: emu.from_bits(np.broadcast_to(np.int64(70000), (10 ** 6, 10 ** 6)), "bf16"),
     ValueError, "bits must"),
    ("from_bits huge broadcast view, no memory",
     lambda: emu.from_bits(np.broadcast_to(np.int64(7), (10 ** 6, 10 ** 6)), "bf16"),
     MemoryError, "from_bits: cannot allocate the result, shape (1000000, 1000000)"),
    ("from_bits bad format", lambda: emu.from_bits(3, "bf17"), ValueError, "fmt='bf17'"),
    # emu: elementwise operations
    ("pam_mul shapes", lambda: emu.pam_mul(np.ones(3), np.ones(4)), ValueError, "a.shape=(3,)"),
    ("mul name", lambda: emu.mul(1.0, 2.0, "bf16", "lmul+x"), ValueError, "mul='lmul+x'"),
    ("mul cpam width", lambda: emu.mul(1.0, 2.0, "float32", "cpam2-unbiased"), ValueError,
     "mantissa widths"),
    ("mul cpam k", lambda: emu.mul(1.0, 2.0, "e2m1", "cpam2-minimax"), ValueError, "fmt=e2m1"),
    ("mul shapes", lambda: emu.mul(np.ones(3), np.ones(4)), ValueError, "a.shape=(3,)"),
    ("mul dtype", lambda: emu.mul(np.array(["x"]), 1.0), TypeError, "a must"),
    ("multiplier field", lambda: emu.Multiplier("pam", offset=1.5), ValueError, "offset=1.5"),
    ("error_stats samples", lambda: emu.multipliers.error_stats("pam", "float32", samples=0),
     ValueError, "samples=0"),
    ("pam_mul no memory",
     lambda: emu.pam_mul(np.ones((10 ** 6, 1), F32), np.ones((1, 10 ** 7), F32)), MemoryError,
     "pam_mul: cannot allocate the result, shape (1000000, 10000000)"),
    ("pa_div str", lambda: emu.pa_div("a", 1.0), TypeError, "a must"),
    ("pa_div str b", lambda: emu.pa_div(1.0, "b"), TypeError, "b must"),
    ("pa_exp2 None", lambda: emu.pa_exp2(None), TypeError, "x must"),
    ("pa_sqrt no memory", lambda: emu.pa_sqrt(np.broadcast_to(F32(2), (10 ** 7, 10 ** 6))),
     MemoryError, "pa_sqrt: cannot allocate the result, shape (10000000, 1000000)"),
    ("fp_mul subnormals", lambda: emu.fp_mul(1.0, 2.0, subnormals=2), ValueError, "subnormals"),
    ("fp_add bad format", lambda: emu.fp_add(1.0, 2.0, "e9m1"), ValueError, "fmt='e9m1'"),
    # emu: matmul
    ("pam_matmul scalars", lambda: emu.pam_matmul(1.0, 2.0), ValueError, "A.shape=()"),
    ("pam_matmul K", lambda: emu.pam_matmul(np.ones((2, 3)), np.ones((2, 3))), ValueError,
     "contracted"),
    ("pam_matmul batch", lambda: emu.pam_matmul(np.ones((2, 2, 3)), np.ones((3, 3, 2))),
     ValueError, "batch dimensions"),
    ("pam_matmul acc", lambda: emu.pam_matmul(np.ones((2, 2)), np.ones((2, 2)), acc="x"),
     ValueError, "acc='x'"),
    ("pam_matmul str", lambda: emu.pam_matmul("a", np.ones(2)), TypeError, "A must"),
    ("pam_matmul no memory",
     lambda: emu.pam_matmul(np.ones((10 ** 6, 1), F32), np.ones((1, 10 ** 6), F32)),
     MemoryError, "pam_matmul: cannot allocate the result, shape (1000000, 1000000)"),
    ("mx_quantize huge block", lambda: emu.mx_quantize(np.ones(4, F32), "mxfp8", block=2**63),
     ValueError, "block must be an int in [1, 1048576]"),
    ("mx_pam_matmul huge block",
     lambda: emu.mx_pam_matmul(np.ones((2, 4), F32), np.ones((4, 2), F32), "mxfp8",
                               block=2**21), ValueError, "got 2097152"),
    # torch_bridge: PAMConfig
    ("PAMConfig MX block huge", lambda: tb.PAMConfig(fmt="mxfp8_e4m3/9223372036854775808"),
     ValueError, "fmt='mxfp8_e4m3/9223372036854775808': block 9223372036854775808 is outside"),
    ("PAMConfig MX block 0", lambda: tb.PAMConfig(fmt="mxfp4/0"), ValueError,
     "fmt='mxfp4/0': block 0"),
    ("PAMConfig rounding list", lambda: tb.PAMConfig(rounding=["x"]), ValueError, "rounding="),
    ("PAMConfig rounding int", lambda: tb.PAMConfig(rounding=3), ValueError, "rounding=3"),
    ("PAMConfig fmt", lambda: tb.PAMConfig(fmt="bf17"), ValueError, "fmt='bf17'"),
    ("PAMConfig acc None", lambda: tb.PAMConfig(acc=None), ValueError, "acc=None"),
    ("PAMConfig pa_fmt", lambda: tb.PAMConfig(pa_fmt="x"), ValueError, "pa_fmt='x'"),
    ("PAMConfig ops name", lambda: tb.PAMConfig(ops=["gelu"]), ValueError, "ops"),
    ("PAMConfig ops int", lambda: tb.PAMConfig(ops=3), ValueError, "ops=3"),
    ("PAMConfig backward", lambda: tb.PAMConfig(backward="maybe"), ValueError, "backward"),
    ("PAMConfig backward group", lambda: tb.PAMConfig(backward={"gelu": "exact"}), ValueError,
     "backward"),
    ("PAMConfig backward list", lambda: tb.PAMConfig(backward=["exact"]), ValueError,
     "backward="),
    # torch_bridge: optimizers
    ("PAAdamW betas scalar", lambda: tb.PAAdamW(_params(), betas=0.9), TypeError, "betas"),
    ("PAAdamW betas triple", lambda: tb.PAAdamW(_params(), betas=(0.9, 0.9, 0.9)), TypeError,
     "betas"),
    ("PAAdamW betas str", lambda: tb.PAAdamW(_params(), betas=("a", "b")), TypeError,
     "betas[0]"),
    ("PAAdamW beta2 = 1", lambda: tb.PAAdamW(_params(), betas=(0.9, 1.0)), ValueError,
     "betas[1]"),
    ("PAAdamW beta1 nan", lambda: tb.PAAdamW(_params(), betas=(NAN, 0.9)), ValueError,
     "betas[0]"),
    ("PAAdamW lr str", lambda: tb.PAAdamW(_params(), lr="fast"), TypeError, "lr"),
    ("PAAdamW lr nan", lambda: tb.PAAdamW(_params(), lr=NAN), ValueError, "lr=nan"),
    ("PAAdamW lr inf", lambda: tb.PAAdamW(_params(), lr=INF), ValueError,
     "lr=inf; expected a finite number >= 0"),
    ("PAAdamW lr negative", lambda: tb.PAAdamW(_params(), lr=-1), ValueError, "lr=-1"),
    ("PAAdamW eps negative", lambda: tb.PAAdamW(_params(), eps=-1e-8), ValueError, "eps"),
    ("PAAdamW weight_decay inf", lambda: tb.PAAdamW(_params(), weight_decay=INF), ValueError,
     "weight_decay"),
    ("PAAdamW weight_decay str", lambda: tb.PAAdamW(_params(), weight_decay="x"), TypeError,
     "weight_decay"),
    ("PAAdamW amsgrad", lambda: tb.PAAdamW(_params(), amsgrad="yes"), TypeError, "amsgrad"),
    ("PAAdamW config", lambda: tb.PAAdamW(_params(), config="bf16"), TypeError, "config"),
    ("PASGD lr str", lambda: tb.PASGD(_params(), lr="x"), TypeError, "lr"),
    ("PASGD momentum nan", lambda: tb.PASGD(_params(), momentum=NAN), ValueError, "momentum"),
    ("PASGD dampening inf", lambda: tb.PASGD(_params(), dampening=INF), ValueError,
     "dampening"),
    ("PASGD nesterov", lambda: tb.PASGD(_params(), nesterov=1), TypeError, "nesterov"),
    ("make_optimizer name", lambda: tb.make_optimizer("adam", _params()), ValueError,
     "optimizer='adam'"),
    # torch_bridge: functional, convert, mode
    ("tb.pam_matmul numpy", lambda: tb.pam_matmul(np.ones((2, 2)), torch.ones(2, 2)), TypeError,
     "a must"),
    ("tb.pam_matmul int tensor", lambda: tb.pam_matmul(torch.ones(2, 2, dtype=torch.int64),
                                                    torch.ones(2, 2)), TypeError, "a must"),
    ("tb.pam_matmul meta", lambda: tb.pam_matmul(torch.ones(2, 2, device="meta"),
                                              torch.ones(2, 2, device="meta")), ValueError,
     "a is on meta"),
    ("tb.pam_matmul K", lambda: tb.pam_matmul(torch.ones(2, 3), torch.ones(2, 3)), ValueError,
     "contracted"),
    ("pa_cross_entropy label_smoothing",
     lambda: tb.pa_cross_entropy(torch.ones(2, 3), torch.tensor([0, 1]), label_smoothing=2.0),
     ValueError, "label_smoothing"),
    ("pa_layer_norm shape", lambda: tb.pa_layer_norm(torch.ones(2, 2), (3,)), ValueError,
     "normalized_shape"),
    ("convert model", lambda: tb.convert("x"), TypeError, "model"),
    ("convert config", lambda: tb.convert(torch.nn.Linear(2, 2), "bf16"), TypeError, "config"),
    ("convert skip", lambda: tb.convert(torch.nn.Linear(2, 2), None, skip=3), TypeError,
     "skip"),
    ("convert skip name", lambda: tb.convert(torch.nn.Linear(2, 2), None, skip=["x"]),
     ValueError, "skip"),
    ("PAMLinear config", lambda: tb.PAMLinear(2, 2, config="bf16"), TypeError, "config"),
    ("PASoftmax config", lambda: tb.PASoftmax(1, config=3), TypeError, "config"),
    ("pam_mode config", lambda: tb.pam_mode("bf16").__enter__(), TypeError, "config"),
    # torch_bridge.memory
    ("fewbit numpy", lambda: fewbit(np.ones(3)), TypeError, "input"),
    ("fewbit int tensor", lambda: fewbit(torch.ones(3, dtype=torch.int32)), TypeError, "input"),
    ("fewbit activation", lambda: fewbit(_x(), "gleu"), ValueError, "activation='gleu'"),
    ("fewbit bits 0", lambda: fewbit(_x(), "gelu", 0), ValueError, "bits=0"),
    ("fewbit bits 9", lambda: fewbit(_x(), "gelu", 9), ValueError, "bits=9"),
    ("fewbit bits float", lambda: fewbit(_x(), "gelu", 2.0), ValueError, "bits=2.0"),
    ("fewbit weight", lambda: fewbit(_x(), "gelu", 3, weight="x"), ValueError, "weight='x'"),
    ("fewbit slope nan", lambda: fewbit(_x(), "leaky_relu", 2, negative_slope=NAN), ValueError,
     "negative_slope"),
    ("fewbit slope list", lambda: fewbit(_x(), "leaky_relu", 2, negative_slope=[1]),
     ValueError, "negative_slope"),
    ("fewbit unknown parameter", lambda: fewbit(_x(), "gelu", 2, alpha=1.0), ValueError,
     "alpha"),
    ("fewbit softplus beta", lambda: fewbit(_x(), "softplus", 2, beta=0), ValueError, "beta"),
    ("inverted relu", lambda: inverted(_x(), "relu"), ValueError, "activation='relu'"),
    ("inverted int tensor", lambda: inverted(torch.ones(3, dtype=torch.int64)), TypeError,
     "input"),
    ("pa_activation pieces", lambda: pa_activation(_x(), "gelu", 1), ValueError, "pieces=1"),
    ("pa_activation relu", lambda: pa_activation(_x(), "relu"), ValueError,
     "activation='relu'"),
    ("FewBitGELU bits", lambda: FewBitGELU(bits=9), ValueError, "bits=9"),
    ("FewBitGELU approximate", lambda: FewBitGELU(approximate="fast"), ValueError,
     "approximate="),
    ("InvGELU approximate", lambda: InvGELU(approximate="x"), ValueError, "approximate="),
    ("convert_activations model", lambda: convert_activations("x"), TypeError, "model"),
    ("convert_activations fewbit", lambda: convert_activations(torch.nn.GELU(), fewbit=0),
     ValueError, "fewbit=0"),
    ("convert_activations inverted", lambda: convert_activations(torch.nn.GELU(),
                                                                  inverted="yes"),
     TypeError, "inverted"),
    ("convert_activations pa", lambda: convert_activations(torch.nn.GELU(), pa=1), ValueError,
     "pa=1"),
    # sim.rtl_matmul and the verify functions (checked before any simulator starts)
    ("rtl_matmul scalars", lambda: rtl_sim.rtl_matmul(1.0, 2.0), ValueError, "A.shape=()"),
    ("rtl_matmul K", lambda: rtl_sim.rtl_matmul(np.ones((2, 3)), np.ones((2, 3))), ValueError,
     "contracted"),
    ("rtl_matmul str", lambda: rtl_sim.rtl_matmul("a", np.ones(2)), TypeError, "A must"),
    ("rtl_matmul unit", lambda: rtl_sim.rtl_matmul(np.ones(2), np.ones(2), unit="dsp"),
     ValueError, "unit='dsp'"),
    ("rtl_matmul fmt", lambda: rtl_sim.rtl_matmul(np.ones(2), np.ones(2), "bf17"), ValueError,
     "fmt='bf17'"),
    ("rtl_matmul rows", lambda: rtl_sim.rtl_matmul(np.ones(2), np.ones(2), unit="array",
                                                   rows=0), ValueError, "rows=0"),
    ("rtl_matmul sim", lambda: rtl_sim.rtl_matmul(np.ones(2), np.ones(2), sim="modelsim"),
     ValueError, "sim='modelsim'"),
    ("verify_unit unit", lambda: rtl_sim.verify_unit("nosuch", "bf16", 10), ValueError,
     "unit='nosuch'"),
    ("verify_unit vectors -1", lambda: rtl_sim.verify_unit("mul", "bf16", -1), ValueError,
     "vectors=-1"),
    ("verify_unit vectors huge", lambda: rtl_sim.verify_unit("mul", "bf16", 10 ** 11),
     ValueError, "vectors="),
    ("verify_unit seed", lambda: rtl_sim.verify_unit("mul", "bf16", 10, seed=-1), ValueError,
     "seed=-1"),
    ("verify_matmul option", lambda: rtl_sim.verify_matmul("bf16", "float32", 10, bogus=1),
     TypeError, "bogus"),
    ("verify_matmul specials", lambda: rtl_sim.verify_matmul("bf16", "float32", 10,
                                                             specials=2), ValueError,
     "specials"),
    # sim.train.TrainSpec
    ("TrainSpec lr nan", lambda: TrainSpec(lr=NAN), ValueError, "lr"),
    ("TrainSpec lr inf", lambda: TrainSpec(lr=INF), ValueError,
     "lr must be a finite number in [0, inf), got inf"),
    ("TrainSpec weight_decay -inf", lambda: TrainSpec(weight_decay=-INF), ValueError,
     "weight_decay must be a finite number in [0, inf), got -inf"),
    ("TrainSpec label_smoothing", lambda: TrainSpec(label_smoothing=2), ValueError,
     "label_smoothing must be a finite number in [0, 1], got 2"),
    ("TrainSpec batch_size", lambda: TrainSpec(batch_size=0), ValueError,
     "batch_size must be an int in [1, "),
    ("TrainSpec weight_decay str", lambda: TrainSpec(weight_decay="x"), ValueError,
     "weight_decay"),
    ("TrainSpec max_steps", lambda: TrainSpec(max_steps=-1), ValueError,
     "max_steps must be an int in [0, inf), got -1"),
    ("TrainSpec train_subset", lambda: TrainSpec(train_subset=-5), ValueError, "train_subset"),
    ("TrainSpec seed", lambda: TrainSpec(seed=-1), ValueError, "seed"),
    ("TrainSpec epochs float", lambda: TrainSpec(epochs=1.5), ValueError, "epochs"),
    ("TrainSpec dim heads", lambda: TrainSpec(data="mnist", dim=6), ValueError, "dim=6"),
    ("TrainSpec dim mlp", lambda: TrainSpec(dim=8), ValueError, "dim=8"),
    ("TrainSpec model data", lambda: TrainSpec(model="charlm"), ValueError, "model='charlm'"),
    # costs
    ("costs int_add", lambda: costs.int_add(0), ValueError, "bits"),
    ("costs pam_mul rule", lambda: costs.pam_mul("bf16", rule="x"), ValueError, "rule='x'"),
    ("costs memory level", lambda: costs.memory_pj_per_byte("l9"), ValueError, "memory='l9'"),
    ("costs model_step batch", lambda: costs.model_step("vit", batch_size=0), ValueError,
     "batch_size"),
    ("costs count_step model", lambda: costs.count_step("x", None), TypeError, "model"),
    ("costs step_energy counts", lambda: costs.step_energy("x", None), TypeError, "counts"),
    ("costs fit result", lambda: costs.fit("x"), TypeError, "result"),
    ("costs synthesize design", lambda: costs.synthesize("x"), TypeError, "design"),
    ("costs unit_design unit", lambda: costs.unit_design("nosuch", "bf16"), ValueError,
     "unit='nosuch'"),
    ("costs synthesize_unit target", lambda: costs.synthesize_unit("mul", "bf16", "nosuch"),
     ValueError, "target='nosuch'"),
    ("costs sweep jobs", lambda: costs.sweep(jobs=0), ValueError, "jobs"),
    ("costs sweep unit", lambda: costs.sweep(units=["nosuch"], progress=False), ValueError,
     "unit='nosuch'"),
    ("costs sweep target", lambda: costs.sweep(targets=["nosuch"], progress=False), ValueError,
     "target='nosuch'"),
    ("costs float_mac stages", lambda: costs.float_mac("bf16", stages=0), ValueError,
     "stages=0"),
]


def _fail_work(*args, **kwargs):
    raise AssertionError("the work started: this bad input was not caught in validation")


#: what starts the work of each command or API call
WORK = [("sim.train.train", None), ("sim.train.cached_baseline", None),
        ("sim.train_distributed.run", None), ("sim.memory_study.train_mlp", None),
        ("sim.memory_study.derivative_errors", None), ("sim.memory_study.saved_memory", None),
        ("sim.error_report.error_report", None), ("sim.error_report.multiplier_report", None), ("sim.rtl_sim.run_cocotb", None),
        ("sim.rtl_sim.build", None), ("sim.rtl_sim.prebuild", None),
        ("workloads.data.load_minilm", None), ("costs.step.count_step", "cli"),
        ("costs.fpga.synthesize", "cli"), ("costs.units.sweep", "cli"),
        ("torch_bridge.memory.tables.generate_fewbit", None),
        ("torch_bridge.memory.pa.generate_pa", None)]


@pytest.fixture
def no_work(monkeypatch):
    for target, scope in WORK:
        monkeypatch.setattr(target, _fail_work)


@pytest.mark.parametrize("call,exc,names", [r[1:] for r in API], ids=[r[0] for r in API])
def test_api_rejects(call, exc, names, monkeypatch):
    for target, scope in WORK:
        if scope != "cli":      # the API rows call these themselves, with bad arguments
            monkeypatch.setattr(target, _fail_work)
    with pytest.raises(exc) as info:
        call()
    assert names in str(info.value)


#: (argv, text naming the option); {file} is an existing file, {dir} a directory,
#: /proc/... a directory nobody can create files in
CLI = [
    # train (and the options every training command shares)
    ("train --max-steps -1", "argument --max-steps: got '-1'"),
    ("train --train-subset -5", "argument --train-subset: got '-5'"),
    ("train --lr nan", "argument --lr: got 'nan'"),
    ("train --lr inf", "argument --lr: got 'inf'"),
    ("train --lr -1", "argument --lr: got '-1'"),
    ("train --lr fast", "argument --lr: got 'fast'"),
    ("train --label-smoothing 2", "argument --label-smoothing: got '2'"),
    ("train --label-smoothing -0.1", "argument --label-smoothing"),
    ("train --weight-decay nan", "argument --weight-decay"),
    ("train --dim -5", "argument --dim: got '-5'"),
    ("train --dim 100000", "argument --dim"),
    ("train --data mnist --dim 6", "dim=6"),
    ("train --dim 8", "dim=8"),
    ("train --depth -1", "argument --depth"),
    ("train --seed -1", "argument --seed: got '-1'"),
    ("train --seed 99999999999", "argument --seed"),
    ("train --epochs 0", "argument --epochs"),
    ("train --epochs 1.5", "argument --epochs"),
    ("train --batch-size 0", "argument --batch-size"),
    ("train --batch-size 1000000000", "argument --batch-size"),
    ("train --steps-per-epoch 0", "argument --steps-per-epoch"),
    ("train --threads -1", "argument --threads"),
    ("train --nproc 0", "argument --nproc"),
    ("train --nproc 65", "nproc must lie in [1, batch_size=64], got 65"),
    ("train --out {file}", "argument --out"),
    ("train --out {file}/sub", "argument --out"),
    ("train --out /proc/pamsim-out", "argument --out"),
    ("train --ops gelu", "argument --ops"),
    ("train --exact nosuch", "argument --exact"),
    ("train --fmt bf17", "argument --fmt"),
    ("train --fmt mxfp8_e4m3/9223372036854775808", "argument --fmt: --fmt="),
    ("train --fmt mxfp9", "argument --fmt"),
    ("train --pa-fmt e9m3", "argument --pa-fmt"),
    ("train --data digits --model charlm", "model='charlm'"),
    ("train --rounding up", "argument --rounding"),
    ("train --data nosuch", "argument --data"),
    ("train --backward maybe", "argument --backward"),
    ("train --optimizer adam", "argument --optimizer"),
    # ablate, sweep
    ("ablate --seeds 0", "argument --seeds"),
    ("ablate --seeds 1000", "argument --seeds"),
    ("ablate --out /proc/pamsim-out", "argument --out"),
    ("ablate --lr nan", "argument --lr"),
    ("sweep --mantissa 0,7", "argument --mantissa"),
    ("sweep --mantissa 24", "argument --mantissa"),
    ("sweep --mantissa a", "argument --mantissa"),
    ("sweep --exp-bits 9", "argument --exp-bits"),
    ("sweep --exp-bits 1", "argument --exp-bits"),
    ("sweep --seeds -1", "argument --seeds"),
    ("sweep --out {file}", "argument --out"),
    ("sweep --mx mxfp8_e4m3/9223372036854775808", "block 9223372036854775808 is outside"),
    ("study table3 --seeds 0", "argument --seeds"),
    ("study table3 --threads -1", "argument --threads"),
    ("study table3 --out {file}", "argument --out"),
    # bench, cost, error
    ("bench --only nosuch", "--only"),
    ("bench --json {dir}", "argument --json"),
    ("bench --device tpu", "argument --device"),
    ("cost --batch 0", "argument --batch"),
    ("cost --model vit --batch -3", "argument --batch"),
    ("cost --json {file}/x.json", "argument --json"),
    ("cost --png {dir}/x.png", "--png"),
    ("cost --model vit --png {dir}", "argument --png"),
    ("cost --fmt e1m2", "argument --fmt"),
    ("cost --acc nosuch", "argument --acc"),
    ("cost --rule nosuch", "argument --rule"),
    ("cost --memory l9", "argument --memory"),
    ("cost --model nosuch", "argument --model"),
    ("error --fmt bf17", "argument --fmt"),
    ("error --png {dir}", "argument --png"),
    ("error --json /proc/pamsim.json", "argument --json"),
    ("error --mul bogus", "argument --mul"),
    ("cost --mul pam,bogus", "argument --mul"),
    ("cost --mul ,", "argument --mul"),
    ("cost --model vit --mul lmul", "--mul"),
    ("train --mul exact,bogus", "argument --mul"),
    ("train --mul pam,pam", "argument --mul"),
    ("train --mul pam,cpam3-unbiased --fmt e5m2 --ops matmul", "cpam3-unbiased"),
    ("ablate --mul bogus", "argument --mul"),
    ("ablate --mul cpam3-unbiased --fmt e8m2", "cpam3-unbiased"),
    ("study multipliers --muls exact,bogus", "argument --muls"),
    ("study multipliers --formats bf17", "argument --formats"),
    ("study multipliers --groups matmul/nosuch", "argument --groups"),
    ("study multipliers --mul lmul", "--mul"),
    ("study table6 --mul cpam3-unbiased --mantissa 2", "cpam3-unbiased"),
    ("bench --mul bogus", "argument --mul"),
    ("bench --only emu --mul lmul", "--mul"),
    ("error --mul pam+01", "argument --mul"),
    ("error --fmt float32 --mul cpam2-minimax", "argument --mul"),
    ("error --mul pam lmul --png {dir}/x.png", "--png"),
    # fewbit-tables
    ("fewbit-tables --report --activations gleu", "--activations"),
    ("fewbit-tables --full", "--full"),
    ("fewbit-tables --report --check", "argument --check"),
    ("fewbit-tables --out {file}", "argument --out"),
    ("fewbit-tables --report --out {dir}/tables", "--out"),
    ("fewbit-tables --only nosuch", "argument --only"),
    # fpga
    ("fpga --stages 0", "argument --stages"),
    ("fpga --rows -1", "argument --rows"),
    ("fpga --cols x", "argument --cols"),
    ("fpga --jobs 0", "argument --jobs"),
    ("fpga --json {dir}", "argument --json"),
    ("fpga --target all --device 85k", "device='85k'"),
    ("fpga --unit nosuch", "argument --unit"),
    ("fpga --target nosuch", "argument --target"),
    ("fpga --fmt e9m1", "argument --fmt"),
    ("fpga --unit mul --stages 2", "stages"),
    # memory-errors, memory-study
    ("memory-errors --points 1", "argument --points"),
    ("memory-errors --points 1000000000000", "argument --points"),
    ("memory-errors --png {dir}", "argument --png"),
    ("memory-errors --activations relu", "argument --activations"),
    ("memory-study --seeds 0", "argument --seeds"),
    ("memory-study --epochs 0", "argument --epochs"),
    ("memory-study --png {dir}", "argument --png"),
    ("memory-study --png /proc/pamsim.png", "argument --png"),
    ("memory-study --data text", "argument --data"),
    # minilm
    ("minilm --fmts bf17", "argument --fmts"),
    ("minilm --fmts ,", "argument --fmts"),
    ("minilm --sentences 0", "argument --sentences"),
    ("minilm --sentences 1000", "argument --sentences"),
    ("minilm --ops gelu", "argument --ops"),
    ("minilm --out {file}", "argument --out"),
    # verify, verilog
    ("verify", "--unit is required"),
    ("verify --unit mul --vectors 0", "argument --vectors"),
    ("verify --unit mul --vectors 100000000000", "argument --vectors"),
    ("verify --unit mul --seed -1", "argument --seed"),
    ("verify --unit nosuch", "argument --unit"),
    ("verify --unit mul --sim modelsim", "argument --sim"),
    ("verify --prebuild --jobs 0", "argument --jobs"),
    ("verify --unit mul --fmt bf17", "argument --fmt"),
    ("verilog --unit mul --stages 3", "stages"),
    ("verilog --unit array --rows 40", "rows=40"),
    ("verilog --unit mac --stages 0", "argument --stages"),
    ("verilog --unit mul -o {dir}", "argument -o/--output"),
    ("verilog --unit mul -o {file}/x.v", "argument -o/--output"),
    ("verilog --unit mul --name 1bad", "name='1bad'"),
    ("verilog --unit mul --name é", "name='é'"),
    ("verilog", "--unit"),
]


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("line,names", CLI, ids=[r[0] for r in CLI])
def test_cli_rejects(line, names, tmp_path, monkeypatch, capsys, no_work):
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "dir").mkdir()
    monkeypatch.chdir(tmp_path)             # default outputs (out/...) would land here
    argv = line.format(file=tmp_path / "file", dir=tmp_path / "dir").split()
    before = _tree(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"pamsim {argv[0]}: error: "), err
    assert names in lines[0], err
    assert _tree(tmp_path) == before         # nothing written, no directory made


def test_tables_are_large():
    assert len(API) + len(CLI) >= 100


# --- values that are not errors but must not give a silently wrong result ----------------

@pytest.mark.parametrize("name", ["relu", "leaky_relu", "gelu", "silu", "sigmoid", "tanh",
                                  "elu", "selu", "softplus", "mish"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fewbit_nan_gets_native_gradient(name, dtype):
    """A NaN input gets native torch's gradient (NaN for the smooth activations), not the
    level of the interval its code happens to name; the other elements are unchanged."""
    from torch_bridge.memory import activation
    x = torch.tensor([NAN, 1.5, -0.5, NAN], dtype=dtype)
    g = torch.tensor([1.0, 2.0, 3.0, -1.0], dtype=dtype)
    xf = x.clone().requires_grad_()
    fewbit(xf, name, 2).backward(g)
    xn = x.clone().requires_grad_()
    activation(name).native(xn).backward(g)
    nans = torch.isnan(x)
    torch.testing.assert_close(xf.grad[nans], xn.grad[nans], equal_nan=True, rtol=0, atol=0)
    clean = x[1:3].clone().requires_grad_()
    fewbit(clean, name, 2).backward(g[1:3])
    assert torch.equal(xf.grad[1:3], clean.grad)


@pytest.mark.parametrize("name,pieces", [("gelu", 16), ("silu", 8)])
def test_pa_activation_propagates_nan(name, pieces):
    """The segment code of a NaN is 0 (the left tail, slope 0): the gradient must still
    be NaN, as PA f(NaN) is."""
    x = torch.tensor([NAN, 1.0], requires_grad=True)
    y = pa_activation(x, name, pieces)
    y.sum().backward()
    assert torch.isnan(y[0]) and torch.isnan(x.grad[0]) and torch.isfinite(x.grad[1])


@pytest.mark.parametrize("fn", [lambda x: fewbit(x, "gelu", 3), lambda x: fewbit(x, "relu", 1),
                                lambda x: inverted(x, "silu"),
                                lambda x: pa_activation(x, "gelu")],
                         ids=["fewbit gelu", "fewbit relu", "inverted silu", "PA gelu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_meta_tensors_give_shapes(fn, dtype):
    """Meta tensors (shape inference, no values) go through like native activations."""
    x = torch.empty(3, 5, device="meta", dtype=dtype, requires_grad=True)
    y = fn(x)
    assert y.device.type == "meta" and y.shape == (3, 5) and y.dtype == dtype
    y.sum().backward()
    assert x.grad.device.type == "meta" and x.grad.shape == (3, 5)


def test_from_bits_checks_each_distinct_element_once():
    """The range check reads a broadcast view's own elements, not its 1e12 repetitions;
    empty and broadcast inputs still decode."""
    view = np.broadcast_to(np.array([0x3F80, 0x4000], np.int64), (3, 2))
    assert emu.from_bits(view, "bf16").tolist() == [[1.0, 2.0]] * 3
    assert emu.from_bits(np.zeros((0, 3), np.int64), "bf16").shape == (0, 3)


# --- pamsim verify: a harness failure is an error, not a MISMATCH ------------------------

class _FakeRunner:
    """Stands in for cocotb's runner: one failed test, with or without a mismatch report."""

    def __init__(self, reports):
        self.reports = reports

    def test(self, *, results_xml, extra_env, **kwargs):
        import json
        from pathlib import Path
        Path(extra_env["PAMSIM_REPORT"]).write_text(
            "".join(json.dumps(r) + "\n" for r in self.reports))
        Path(results_xml).write_text('<testsuites><testsuite tests="1" failures="1"/>'
                                     '</testsuites>')
        raise SystemExit(1)


@pytest.mark.parametrize("reports,error", [
    ([], rtl_sim.RTLHarnessError),
    ([{"test": "mul", "vectors": 10, "mismatches": 0}], rtl_sim.RTLHarnessError),
    ([{"test": "mul", "vectors": 10, "mismatches": 3}], rtl_sim.RTLVerificationError)])
def test_run_cocotb_tells_mismatches_from_harness_failures(reports, error, tmp_path,
                                                           monkeypatch):
    import cocotb_tools.runner
    monkeypatch.setattr(rtl_sim, "build", lambda h, sim: tmp_path)
    monkeypatch.setattr(cocotb_tools.runner, "get_runner", lambda sim: _FakeRunner(reports))
    with pytest.raises(error, match="1 of 1 cocotb tests failed"):
        rtl_sim.run_cocotb(rtl_sim.Harness.comb("bf16"), "sim.tb.test_comb",
                           sim="verilator")


@pytest.mark.parametrize("error,code,text", [
    (rtl_sim.RTLHarnessError("bench crashed: MemoryError"), 3,
     "pamsim verify: error: the simulation harness failed"),
    (rtl_sim.RTLVerificationError("mul: 3 of 10 mismatches"), 1, "pamsim verify: MISMATCH")])
def test_verify_reports_harness_failures_as_errors(error, code, text, monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise error
    monkeypatch.setattr(rtl_sim, "default_simulator", lambda: "verilator")
    monkeypatch.setattr(rtl_sim, "verify_unit", fail)
    assert main(["verify", "--unit", "mul"]) == code
    assert capsys.readouterr().err.startswith(text)


@pytest.mark.parametrize("lo,hi,text,expected", [
    (0, INF, "inf", "expected a finite number >= 0"),
    (-INF, INF, "nan", "expected a finite number"),
    (0, 1, "2", "expected a number in [0, 1]"),
    (-INF, 1, "-inf", "expected a finite number <= 1"),
])
def test_float_in_states_the_accepted_range(lo, hi, text, expected):
    """sim.cli.float_in's message never offers an infinity it refuses."""
    import argparse

    from sim.cli import float_in
    with pytest.raises(argparse.ArgumentTypeError) as info:
        float_in(lo, hi)(text)
    assert str(info.value) == f"got {text!r}; {expected}"

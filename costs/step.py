"""Cost of one training step (forward + backward + optimizer) of any PyTorch model.

Counting uses PyTorch's own machinery, no per-layer formulas:

* MACs of matmul-family ops (mm, bmm, addmm, baddbmm, convolution and its backward) come
  from ``torch.utils.flop_counter.FlopCounterMode`` (its flop count / 2).
* Every other op is decomposed by a ``TorchDispatchMode`` with PyTorch's reference
  decompositions (``torch._decomp.decomposition_table``, then the op's own
  CompositeImplicit decomposition) down to primitive ops (``prims.mul``, ``prims.add``,
  ``prims.exp``, ...), and each primitive on floating-point tensors is counted once per
  output element (reductions: per input element folded).  Ops nobody classified are
  kept in ``unclassified`` rather than silently dropped.
* Attention runs with the MATH backend of ``scaled_dot_product_attention`` so its matmuls
  and softmax are visible (the fused CPU kernel is opaque to both counters).
* Bytes saved for backward: ``torch.autograd.graph.saved_tensors_hooks`` over the
  forward pass, each storage counted once, parameters excluded.

:func:`step_energy` prices the counts with :mod:`costs.analytic` for native float32,
mixed precision, PAM and fully piecewise-affine training (:func:`scenarios`).
"""
from __future__ import annotations

from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import emu

from . import analytic

__all__ = ["StepCounts", "count_step", "Scenario", "scenarios", "step_energy", "StepEnergy",
           "model_step", "step_models", "KINDS"]

#: Arithmetic classes of primitive ops.  "mul"/"div"/"add" are priced; "special"
#: (exp, log, sqrt, erf, tanh, ...) and "compare" (max, where, comparisons, abs, neg)
#: have no Table 4 entry and are counted but not priced.
KINDS = ("mul", "div", "add", "special", "compare")

_PRIM_KIND = {
    "mul": "mul", "div": "div", "reciprocal": "div", "true_divide": "div",
    "add": "add", "sub": "add", "rsub": "add",
    **{op: "special" for op in (
        "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "erf",
        "erfc", "erfinv", "erf_inv", "tanh", "sigmoid", "sin", "cos", "tan", "pow", "atan2",
        "atan", "asin", "acos", "sinh", "cosh", "cbrt", "lgamma", "digamma", "fmod",
        "remainder")},
    **{op: "compare" for op in (
        "where", "ge", "gt", "le", "lt", "eq", "ne", "maximum", "minimum", "fmax", "fmin",
        "abs", "neg", "sign", "signbit", "isfinite", "isnan", "bitwise_not", "bitwise_and",
        "bitwise_or", "bitwise_xor", "logical_not", "logical_and", "logical_or", "clamp",
        "clamp_min", "clamp_max", "floor", "ceil", "round", "trunc", "relu")},
}
# Reductions: the number of ops is the number of input elements folded away.
_REDUCTION_KIND = {"sum": "add", "prod": "mul", "amax": "compare", "amin": "compare",
                   "any": "compare", "all": "compare", "max": "compare", "min": "compare",
                   "argmax": "compare", "argmin": "compare", "xor_sum": "compare"}
# Data movement, allocation, dtype conversion, random numbers: not arithmetic.
_MOVEMENT = frozenset((
    "broadcast_in_dim", "transpose", "split_dim", "collapse_view", "collapse", "view_of",
    "view_of_dtype", "squeeze", "unsqueeze", "expand", "view", "reshape", "_unsafe_view",
    "permute", "t", "as_strided", "select", "slice", "slice_scatter", "select_scatter",
    "index", "index_select", "index_put", "gather", "scatter", "scatter_add", "cat",
    "stack", "rev", "flip", "copy", "copy_to", "copy_strided", "clone", "to", "_to_copy",
    "convert_element_type", "empty", "empty_strided", "empty_permuted", "empty_like",
    "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "fill", "zero",
    "iota", "arange", "scalar_tensor", "item", "_local_scalar_dense", "lift_fresh",
    "lift_fresh_copy", "detach", "alias", "resize", "device_put", "split",
    "split_with_sizes", "unbind", "contiguous", "constant_pad_nd", "set", "index_copy",
    "as_strided_scatter", "diagonal", "bernoulli", "uniform", "normal", "rand", "randn",
    "randint", "_record_function_enter_new", "_record_function_exit"))
# Ops whose reference decomposition evaluates both branches of a where() (torch._refs.lerp
# does, for accuracy): counted as the one branch hardware computes, a + w * (b - a).
_FIXED_MIX = {"lerp": {"add": 2, "mul": 1}}
# Matmul-family ops FlopCounterMode prices; never decomposed here.  What it ignores, the
# additive term of addmm/baddbmm and the bias of convolution (and its gradient), is
# counted here as additions.
_MATMUL = frozenset(("mm", "bmm", "addmm", "baddbmm", "convolution", "convolution_backward",
                     "_convolution"))


def _name(func) -> str:
    """The op's name without namespace, in-place ops as their functional form."""
    name = func.overloadpacket.__name__
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


@dataclass
class StepCounts:
    """Operation counts and saved activation bytes of one training step.

    ``macs``/``ops`` are per phase ("forward", "backward", "optimizer").
    """
    macs: dict[str, int]
    ops: dict[str, dict[str, int]]              # phase -> kind -> count
    macs_by_op: dict[str, int]
    prims: dict[str, int]                       # primitive name -> count, all phases
    unclassified: dict[str, int]                # op name -> elements, should stay empty
    saved_bytes: int                            # distinct storages saved for backward
    saved_bytes_by_dtype: dict[str, int]
    params: int
    integer_ops: int = 0                        # ops on integer/bool tensors only (index math)

    @property
    def total_macs(self) -> int:
        return sum(self.macs.values())

    def total_ops(self, kind: str) -> int:
        return sum(p.get(kind, 0) for p in self.ops.values())

    @property
    def saved_float_bytes(self) -> int:
        return sum(n for dt, n in self.saved_bytes_by_dtype.items()
                   if dt.startswith(("torch.float", "torch.bfloat", "torch.half")))


@lru_cache(maxsize=None)
def _op_counter_class():
    """The TorchDispatchMode that decomposes and counts (built lazily: torch is optional)."""
    import torch
    from torch._decomp import decomposition_table
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.phase = "forward"
            self.ops = {}
            self.prims = Counter()
            self.unclassified = Counter()
            self.integer_ops = 0

        def _count(self, kind, n):
            bucket = self.ops.setdefault(self.phase, Counter())
            bucket[kind] += n

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = _name(func)
            if name not in _MATMUL and name not in _MOVEMENT and name not in _FIXED_MIX:
                decomp = decomposition_table.get(func)
                with self:
                    r = decomp(*args, **kwargs) if decomp else func.decompose(*args, **kwargs)
                if r is not NotImplemented:
                    return r
            out = func(*args, **kwargs)
            self._classify(name, func, args, kwargs, out)
            return out

        def _classify(self, name, func, args, kwargs, out):
            if name in _MOVEMENT:
                return
            tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs))
                       if isinstance(a, torch.Tensor)]
            outs = [o for o in torch.utils._pytree.tree_leaves(out)
                    if isinstance(o, torch.Tensor)]
            if name in _MATMUL:
                self._matmul_adds(name, args, out)
                return
            floating = any(t.is_floating_point() for t in tensors + outs)
            n_out = sum(o.numel() for o in outs)
            if name in _REDUCTION_KIND:
                n = max(0, sum(t.numel() for t in tensors[:1]) - n_out)
                kind = _REDUCTION_KIND[name]
            elif name == "var":
                # prims.var: per input element a subtract, a square and two adds (the
                # mean and the sum of squares); one division per output
                n_in = tensors[0].numel()
                if floating:
                    self.prims[name] += 1
                    self._count("add", 2 * n_in + n_out)
                    self._count("mul", n_in)
                    self._count("div", 2 * n_out)
                return
            elif name in _FIXED_MIX:
                if floating:
                    self.prims[name] += 1
                    for kind, k in _FIXED_MIX[name].items():
                        self._count(kind, k * n_out)
                return
            elif name in _PRIM_KIND:
                n, kind = n_out, _PRIM_KIND[name]
            else:
                self.unclassified[str(func.overloadpacket)] += n_out
                return
            if not floating:
                self.integer_ops += n
                return
            self.prims[name] += 1
            self._count(kind, n)

        def _matmul_adds(self, name, args, out):
            if name in ("addmm", "baddbmm", "convolution", "_convolution"):
                if name.endswith("mm") or args[2] is not None:
                    self._count("add", out.numel())
            elif name == "convolution_backward" and out[2] is not None:
                self._count("add", args[0].numel() - out[2].numel())

    return Mode


def count_step(model, loss_fn: Callable[[], object], optimizer=None) -> StepCounts:
    """Count one training step of ``model``: ``loss_fn()`` (forward, returns the scalar
    loss), ``loss.backward()``, ``optimizer.step()``.

    ``optimizer`` defaults to ``torch.optim.AdamW(model.parameters(), foreach=False)``
    (elementwise updates, as a PA accelerator would run them).
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer is None:
        optimizer = torch.optim.AdamW(params, foreach=False)
    optimizer.zero_grad(set_to_none=True)
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, tuple[int, str]] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in param_storages and ptr not in saved:
            saved[ptr] = (t.untyped_storage().nbytes(), str(t.dtype))
        return t

    counter = _op_counter_class()()
    macs, macs_by_op = {}, Counter()
    with ExitStack() as stack:
        stack.enter_context(sdpa_kernel(SDPBackend.MATH))
        for phase in ("forward", "backward", "optimizer"):
            flops = FlopCounterMode(display=False)
            with flops, counter:
                counter.phase = phase
                if phase == "forward":
                    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                        loss = loss_fn()
                    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
                        raise ValueError("loss_fn must return a scalar tensor")
                elif phase == "backward":
                    loss.backward()
                else:
                    optimizer.step()
            macs[phase] = flops.get_total_flops() // 2
            for op, n in flops.get_flop_counts().get("Global", {}).items():
                macs_by_op[str(op)] += n // 2
    by_dtype = Counter()
    for nbytes, dt in saved.values():
        by_dtype[dt] += nbytes
    return StepCounts(
        macs=macs, ops={p: dict(c) for p, c in counter.ops.items()},
        macs_by_op=dict(macs_by_op), prims=dict(counter.prims),
        unclassified=dict(counter.unclassified), saved_bytes=sum(by_dtype.values()),
        saved_bytes_by_dtype=dict(by_dtype), params=sum(p.numel() for p in params),
        integer_ops=counter.integer_ops)


# -- pricing ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    """How a step is computed: matmul multiplier and formats, elementwise arithmetic,
    and the format activations are stored in for backward."""
    name: str
    matmul_mul: str                 # "float" or "pam"
    matmul_fmt: emu.Format
    acc: emu.Format
    elementwise: str                # "float" or "pa" (PAM / PA division)
    elementwise_fmt: emu.Format
    activation_fmt: emu.Format


def scenarios(fmt="bf16", acc="float32") -> list[Scenario]:
    """Native float32; mixed precision (``fmt`` multiply, ``acc`` accumulate); PAM in the
    matmuls; fully PA (also every elementwise multiply/division, Kosson & Jaggi §3.4).
    Elementwise arithmetic stays float32, as in the paper; activations are stored in the
    matmul format."""
    fmt = emu.format(fmt)
    acc = emu.format(acc, argname="acc")
    f32 = emu.float32
    return [Scenario("native float32", "float", f32, f32, "float", f32, f32),
            Scenario(f"{fmt.name} mixed", "float", fmt, acc, "float", f32, fmt),
            Scenario(f"PAM {fmt.name}", "pam", fmt, acc, "float", f32, fmt),
            Scenario(f"fully PA {fmt.name}", "pam", fmt, acc, "pa", f32, fmt)]


@dataclass
class StepEnergy:
    scenario: Scenario
    multiply_pj: float
    accumulate_pj: float
    memory_pj: float
    activation_bytes: float
    unpriced_ops: dict[str, int] = field(default_factory=dict)

    @property
    def total_pj(self) -> float:
        return self.multiply_pj + self.accumulate_pj + self.memory_pj


def step_energy(counts: StepCounts, scenario: Scenario, *, rule: str = "paper",
                memory: str = "dram") -> StepEnergy:
    """Energy of one step in ``scenario``:

    * multiply = MACs x multiplier(matmul fmt) + elementwise (mul + div) x multiplier in
      the elementwise format (a native division is priced as a multiply: Table 4 has no
      divider, so this is a lower bound; PA division is priced like PAM, eq. 9);
    * accumulate = MACs x adder(acc) + elementwise additions x adder(elementwise fmt);
    * memory = activations saved for backward, written once and read once, at
      ``memory_pj_per_byte(memory)``; float tensors stored in ``activation_fmt``.
    """
    if not isinstance(counts, StepCounts):
        raise TypeError(f"counts must be a costs.StepCounts (from count_step), got "
                        f"{type(counts).__name__}")
    if not isinstance(scenario, Scenario):
        raise TypeError(f"scenario must be a costs.step.Scenario (from scenarios), got "
                        f"{type(scenario).__name__}")
    s = scenario
    mm_mul = (analytic.fp_mul(s.matmul_fmt) if s.matmul_mul == "float"
              else analytic.pam_mul(s.matmul_fmt, rule))
    if s.elementwise == "float":
        ew_mul = ew_div = analytic.fp_mul(s.elementwise_fmt)
    else:
        ew_mul, ew_div = (analytic.pam_mul(s.elementwise_fmt, rule),
                          analytic.pa_div(s.elementwise_fmt, rule))
    macs = counts.total_macs
    multiply = (macs * mm_mul.energy_pj + counts.total_ops("mul") * ew_mul.energy_pj
                + counts.total_ops("div") * ew_div.energy_pj)
    accumulate = (macs * analytic.fp_add(s.acc).energy_pj
                  + counts.total_ops("add") * analytic.fp_add(s.elementwise_fmt).energy_pj)
    float_bytes = counts.saved_float_bytes
    act_bytes = (counts.saved_bytes - float_bytes) + float_bytes * s.activation_fmt.width / 32
    mem = 2 * act_bytes * analytic.memory_pj_per_byte(memory)
    unpriced = {k: counts.total_ops(k) for k in ("special", "compare")}
    return StepEnergy(s, multiply, accumulate, mem, act_bytes, unpriced)


# -- the reference models -------------------------------------------------------------------

def step_models() -> tuple[str, ...]:
    """The models :func:`model_step` knows: the trainable workloads
    (``workloads.models.MODELS``, imported on use: it needs torch) and the pretrained
    "minilm"."""
    from workloads.models import MODELS
    return (*MODELS, "minilm")


def model_step(name: str, batch_size: int = 32, seq_len: int = 64):
    """(model, loss_fn) of a training step of a reference model.

    "mlp", "cnn", "vit", "charlm": workloads.models with ``example_inputs`` and
    cross-entropy; "minilm": all-MiniLM-L6-v2 (workloads.data.load_minilm) on
    ``batch_size`` pairs of consecutive KJV verses (truncated to ``seq_len`` tokens)
    with the in-batch-negatives contrastive loss it was trained with (scale 20).
    """
    import torch
    from torch.nn import functional as F

    if name not in step_models():
        raise ValueError(f"model={name!r}; expected one of {list(step_models())}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    torch.manual_seed(0)
    if name == "minilm":
        from workloads.data import kjv_text, load_minilm
        model = load_minilm()
        model.max_seq_length = seq_len
        model.train()
        verses = kjv_text().splitlines()[: 2 * batch_size]

        def loss_fn():
            a = model(model.preprocess(verses[0::2]))["sentence_embedding"]
            b = model(model.preprocess(verses[1::2]))["sentence_embedding"]
            return F.cross_entropy(20 * a @ b.T, torch.arange(len(a)))
        return model, loss_fn

    from workloads.models import build_model, example_inputs
    model = build_model(name)
    model.train()
    x, y = example_inputs(model, batch_size)

    def loss_fn():
        logits = model(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    return model, loss_fn

"""Composites written once: a description runs as a torch graph or becomes a fused kernel.

A composite (an activation, a norm, softmax) is described once, in
torch_bridge/composites.py, as a Python function of an ``o`` that provides the PA
primitives and the float32 glue::

    def softmax(o, x, log2e, ymax):
        e, _ = exp_shifted(o, x, log2e, ymax)
        return o.div(e, o.sum(e))

Two interpreters run it:

* :class:`GraphOps` runs it on tensors: each primitive is torch_bridge's PA autograd
  Function or a torch op, so autograd differentiates the graph node by node (the
  reference semantics, and the path for CUDA tensors, stochastic rounding and large
  tensors);
* :func:`plan` traces it once (:class:`Trace`) into a list of nodes and generates
  the source of two Numba kernels that compute, row by row, the same nodes in the same
  order with emu's scalar definitions: the forward, and the backward that autograd
  would run on the graph.

The generated backward follows autograd's engine: on one device it runs the nodes in
decreasing creation order (the largest ready sequence number first; every consumer of
a value is created after it), and a value's gradient is the sum of its consumers'
contributions in that order, the first one stored as it is, the next ones added
(float32).  A composite *input* is passed to the fused Function once per contribution
("slot"), so that autograd adds them, in the same order, after whatever the input
received before from nodes created later.  Row values (sums, the softmax shift) used
by elementwise nodes are broadcast; their gradient contributions are reduced with
emu.fold_sum's order, each consumer's separately (as each graph Function's
``fold_to``).  Constants that depend on the format (rounded PA operands) or on the
call (eps, beta) come in a constants array; structural choices (a weight or not) are
flags, each a separate plan.

tests/test_composites.py and tests/test_fused.py prove kernels and graphs equal bit for bit.
"""
from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from numba.extending import register_jitable

import emu
from emu import lowlevel as L

from . import _nodes as N
from ._backend import cuda_backend_active
from ._lean import kernel_consts, round_lean
from ._sums import expand, fold_sum, fold_to
from ._tensors import host_view
from .config import Numerics

S = L.scalar

# --- the switch -------------------------------------------------------------------------

_ENABLED = True


def enabled() -> bool:
    """Whether the composites take their fused kernels where they can."""
    return _ENABLED


@contextmanager
def use(on: bool):
    """Run the composites fused (``True``, the default) or as their graphs (``False``)."""
    global _ENABLED
    old, _ENABLED = _ENABLED, bool(on)
    try:
        yield
    finally:
        _ENABLED = old


#: PAM as Numerics (None) and as PAMConfig hold it
_PAM = (None, emu.MULTIPLIERS["pam"])


def fusable(nm, *tensors) -> bool:
    """Whether the fast paths run under ``nm`` (a Numerics or a PAMConfig): enabled,
    deterministic rounding, float32 CPU tensors (None entries are absent optional
    operands)."""
    if not _ENABLED or nm.rounding == "stochastic" or cuda_backend_active():
        return False
    return all(t is None or (isinstance(t, torch.Tensor) and t.dtype == torch.float32
                             and t.device.type == "cpu") for t in tensors)


def composite(nm, x, *tensors, limit: int | None = None) -> bool:
    """Whether a composite of ``x`` (and further operands) runs fused: PAM products (the
    generated kernels' only multiplier), :func:`fusable`, and ``x`` has at least one and
    at most ``limit`` (default sizes.FUSED_MAX) elements (the fused kernels are serial,
    and outside float32 their chain of scalar definitions does not vectorise: beyond that
    the graph's kernels are faster)."""
    return (nm.mul in _PAM and fusable(nm, x, *tensors)
            and 0 < x.numel() <= (L.sizes.FUSED_MAX if limit is None else limit))


# --- the description's values ---------------------------------------------------------


class Param:
    """A number given per call (eps, beta, n): a symbol while tracing."""
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


class Node:
    """One traced operation: ``op`` of ``args`` (Nodes or constants), its value per
    element (``shape`` "e"), per row ("r") or, for inputs, per column ("c": a weight
    indexed by the element's position in its row)."""
    __slots__ = ("i", "op", "args", "shape", "grad", "name", "dtype")

    def __init__(self, i, op, args, shape, grad, name=None, dtype="f"):
        self.i, self.op, self.args, self.shape, self.grad = i, op, args, shape, grad
        self.name = name or f"v{i}"
        self.dtype = dtype      # inputs: "f" a float32, "b" a flag, "i" an index


class Const(NamedTuple):
    """A constant operand: ``rounded`` into the format (a PA operand) or as float32 (an
    addend, a clamp bound, a comparison); ``key`` a number or a Param's name."""
    key: object
    rounded: bool


_PA_BINARY = {"mul": "pam_mul", "div": "pa_div"}
_PA_UNARY = {"exp": "pa_exp", "exp2": "pa_exp2", "log": "pa_log", "log2": "pa_log2",
             "sqrt": "pa_sqrt"}


class Trace:
    """The description's ``o`` while tracing: records nodes."""

    def __init__(self):
        self.nodes: list[Node] = []

    def _node(self, op, args, shape=None, grad=True, name=None):
        if shape is None:
            shape = "e" if any(isinstance(a, Node) and a.shape in "ec" for a in args) else "r"
        n = Node(len(self.nodes), op, tuple(args), shape, grad, name)
        self.nodes.append(n)
        return n

    def input(self, name, shape, dtype="f", grad=True):
        n = self._node("input", (), shape, grad=grad and dtype == "f", name=f"in_{name}")
        n.dtype = dtype
        return n

    @staticmethod
    def _const(v, rounded):
        if isinstance(v, Node):
            return v
        if isinstance(v, Param):
            return Const(v.name, rounded)
        return Const(float(v), rounded)

    def _pa(self, op, *args):
        return self._node(op, [self._const(a, True) for a in args])

    def _f(self, op, *args):
        return self._node(op, [self._const(a, False) for a in args])

    def mul(self, a, b):
        return self._pa("mul", a, b)

    def div(self, a, b):
        return self._pa("div", a, b)

    def exp(self, a):
        return self._pa("exp", a)

    def exp2(self, a):
        return self._pa("exp2", a)

    def log(self, a):
        return self._pa("log", a)

    def log2(self, a):
        return self._pa("log2", a)

    def sqrt(self, a):
        return self._pa("sqrt", a)

    def add(self, a, b):
        return self._f("add", a, b)

    def sub(self, a, b):
        return self._f("sub", a, b)

    def neg(self, a):
        return self._f("neg", a)

    def clamp_max(self, a, c):
        return self._f("clamp_max", a, c)

    def clamp_min(self, a, c):
        return self._f("clamp_min", a, c)

    def floor(self, a):
        return self._f("floor", a)

    def lead(self, a):
        return self._f("lead", a)

    def detach(self, a):
        return self._f("detach", a)

    def lt(self, a, c):
        return self._f("lt", a, c)

    def gt(self, a, c):
        return self._f("gt", a, c)

    def where(self, cond, a, b):
        return self._node("where", (cond, self._const(a, False), self._const(b, False)))

    def sum(self, v):
        return self._node("sum", (v,), "r")

    def floor_max(self, v):
        return self._node("floor_max", (v,), "r", grad=False)

    def pick(self, v, index):
        return self._node("pick", (v, index), "r")


class GraphOps:
    """The description's ``o`` on tensors: torch_bridge's PA primitives on checked
    numerics ``nm`` (``prims``: functional's ``mul``, ``div``, ``exp``, ``exp2``, ``log``,
    ``log2``, ``sqrt``, each an autograd Function), float32 torch ops, and row
    statistics over ``dims`` in emu.fold_sum's order."""

    def __init__(self, prims, nm: Numerics, dims=-1):
        self.p, self.nm = prims, nm
        self.dims = (dims,) if isinstance(dims, int) else tuple(dims)

    def mul(self, a, b):
        return self.p.mul(a, b, self.nm)

    def div(self, a, b):
        return self.p.div(a, b, self.nm)

    def exp(self, a):
        return self.p.exp(a, self.nm)

    def exp2(self, a):
        return self.p.exp2(a, self.nm)

    def log(self, a):
        return self.p.log(a, self.nm)

    def log2(self, a):
        return self.p.log2(a, self.nm)

    def sqrt(self, a):
        return self.p.sqrt(a, self.nm)

    def _broadcast(self, a, b):
        """A row statistic that carries a gradient, broadcast by expand (its gradient
        in emu.fold_sum's order); numbers and detached shifts as torch broadcasts."""
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape != b.shape:
            if b.requires_grad and b.numel() < a.numel():
                b = expand(b, a.shape)
            elif a.requires_grad and a.numel() < b.numel():
                a = expand(a, b.shape)
        return a, b

    def add(self, a, b):
        a, b = self._broadcast(a, b)
        return a + b

    def sub(self, a, b):
        a, b = self._broadcast(a, b)
        return a - b

    @staticmethod
    def neg(a):
        return -a

    @staticmethod
    def clamp_max(a, c):
        return a.clamp(max=c)

    @staticmethod
    def clamp_min(a, c):
        return a.clamp(min=c)

    @staticmethod
    def floor(a):
        """floor(a), a constant of the function (no gradient), as the softmax shift."""
        return torch.floor(a).detach()

    @staticmethod
    def lead(a):
        """a's leading power of two, its mantissa bits cleared (sign kept; ±0 for zero and
        subnormals), a constant of the function (no gradient), as floor."""
        bits = a.float().view(torch.int32) & _LEAD_MASK
        return bits.view(torch.float32).to(a.dtype).detach()

    @staticmethod
    def detach(a):
        """a as a constant of the function (no gradient)."""
        return a.detach()

    @staticmethod
    def lt(a, c):
        return a < c

    @staticmethod
    def gt(a, c):
        return a > c

    @staticmethod
    def where(cond, a, b):
        return torch.where(cond, a, b)

    def sum(self, v):
        return fold_sum(v, self.dims)

    def floor_max(self, v):
        return torch.floor(v.amax(self.dims, keepdim=True)).detach()

    @staticmethod
    def pick(v, index):
        """``v`` at each row's ``index`` (kept as a size-1 last dimension)."""
        return v.gather(-1, index)


# --- code generation --------------------------------------------------------------------


def _pattern(v: float) -> int:
    return int(np.float32(v).view(np.uint32))


_COND = {"lt": "<", "gt": ">"}
_NO_GRAD = ("lt", "gt", "floor", "lead", "detach", "floor_max", "input")


class _Gen:
    """The kernels' source from a trace (module docstring).

    Arrays of elementwise values (inputs, outputs, their gradients, the slots) are
    (rows, n) arrays of any strides, so views such as a GRU's gate chunks are read and
    written in place; weights ("c") are indexed by j, row values by r.

    The forward runs the row's segments in creation order: loops over the row's
    elements (``for j in range(n)``) and row statements between them; an elementwise
    value read in a later segment goes through the scratch ``T``.  The backward
    reruns the forward (keeping in ``T`` the elementwise values the derivatives read),
    then the segments in reverse, each loop's nodes in reverse: gradients of this
    loop's values are locals, of earlier loops' values the scratch ``G``, of row
    values scalars (an elementwise consumer's contributions folded from the scratch
    ``R`` after its loop), and of inputs the slots ``DX``.  A composite of one loop
    computes forward and backward in that loop, without scratch.
    """

    def __init__(self, name, nodes, inputs, outputs):
        self.name, self.nodes, self.inputs, self.outputs = name, nodes, inputs, outputs
        self.consts: list[Const] = []
        self.users: dict[int, list] = {n.i: [] for n in nodes}
        for n in nodes:
            for k, a in enumerate(n.args):
                if isinstance(a, Node):
                    self.users[a.i].append((n, k))
        # segments: maximal runs (in creation order) of elementwise or of row nodes
        self.segs: list[tuple[str, list[Node]]] = []
        self.seg_of: dict[int, int] = {}
        for n in nodes:
            if n.op == "input":
                continue
            kind = "loop" if n.shape == "e" else "row"
            if not self.segs or self.segs[-1][0] != kind:
                self.segs.append((kind, []))
            self.segs[-1][1].append(n)
            self.seg_of[n.i] = len(self.segs) - 1
        self.tslot = {n.i: k for k, n in enumerate(
            m for m in nodes if m.shape == "e" and m.op not in ("input", "lt", "gt"))}
        self.single = len(self.segs) == 1 and self.segs[0][0] == "loop"
        every = self._reached(tuple(True for _ in outputs))
        self.slots = [(v, u, k) for v in inputs if v.grad
                      for u, k in self._contributions(v) if u.i in every]

    # -- operands and arrays --

    def const(self, c: Const) -> str:
        if not c.rounded and not isinstance(c.key, str):
            return f"np.int64({_pattern(c.key)})"
        if c not in self.consts:
            self.consts.append(c)
        return f"c[{self.consts.index(c)}]"

    def val(self, a) -> str:
        return self.const(a) if isinstance(a, Const) else a.name

    def rval(self, a) -> str:
        """A PA operand rounded into the format (round_to); constants come rounded."""
        return self.const(a) if isinstance(a, Const) else f"rnd({a.name}, fc, mode)"

    @staticmethod
    def at(array: str, j="j") -> str:
        """Element j of row r of a (rows, n) array."""
        return f"{array}[r, {j}]"

    def load(self, v: Node) -> str:
        if v.op != "input":
            return f"{v.name} = P(T[{self.tslot[v.i]}, base + j])"
        a = v.name.upper()
        return f"{v.name} = P({self.at(a) if v.shape == 'e' else a + '[j]'})"

    def row_top(self) -> list[str]:
        """Per row: the scratch's row start and the row inputs."""
        lines = ["base = r * n"]
        for v in self.inputs:
            if v.shape == "r":
                a = v.name.upper()
                lines.append(f"{v.name} = {a}[r]" if v.dtype != "f" else f"{v.name} = P({a}[r])")
        return lines

    def fwd_expr(self, n: Node) -> str:
        a = n.args
        if n.op in _PA_BINARY:
            return f"S.{_PA_BINARY[n.op]}({self.rval(a[0])}, {self.rval(a[1])}, fc)"
        if n.op in _PA_UNARY:       # the nodes' own (float32: branch-free twins)
            return f"{_PA_UNARY[n.op]}({self.rval(a[0])}, fc)"
        if n.op in ("add", "sub"):
            return f"{n.op}({self.val(a[0])}, {self.val(a[1])})"
        if n.op == "neg":
            return f"neg({self.val(a[0])})"
        if n.op in ("clamp_max", "clamp_min"):
            return f"{n.op}({self.val(a[0])}, F({self.val(a[1])}))"
        if n.op == "floor":
            return f"floor_({self.val(a[0])})"
        if n.op == "lead":
            return f"lead_({self.val(a[0])})"
        if n.op == "detach":
            return self.val(a[0])
        if n.op in _COND:
            return f"F({self.val(a[0])}) {_COND[n.op]} F({self.val(a[1])})"
        if n.op == "where":
            return f"{self.val(a[1])} if {a[0].name} else {self.val(a[2])}"
        v = a[0]
        row = (f"{v.name.upper()}[r]", "0") if v.op == "input" else \
            (f"T[{self.tslot[v.i]}]", "base")
        if n.op == "sum":
            return f"P(fold({row[0]}, {row[1]}, n, 1))"
        if n.op == "floor_max":
            return f"floor_max({row[0]}, {row[1]}, n)"
        if n.op == "pick":
            return f"P({row[0]}[{row[1]} + {a[1].name}])"
        raise AssertionError(n.op)

    # -- forward --

    def forward(self, keep: set | None = None) -> list[str]:
        """The row's forward; ``keep``: elementwise values the backward reads (into T)."""
        out = []
        for si, (kind, seg) in enumerate(self.segs):
            if kind == "row":
                out += [f"{n.name} = {self.fwd_expr(n)}" for n in seg]
                for n in seg:
                    if n in self.outputs and keep is None:
                        out.append(f"OUT{self.outputs.index(n)}[r] = F({n.name})")
                continue
            body, loaded = [], set()
            for n in seg:
                for a in n.args:
                    if isinstance(a, Node) and a.i not in loaded and a.shape != "r" \
                            and self.seg_of.get(a.i) != si:
                        loaded.add(a.i)
                        body.append(self.load(a))
                body.append(f"{n.name} = {self.fwd_expr(n)}")
                if n.i in self.tslot and ((keep is not None and n.i in keep) or any(
                        self.seg_of[u.i] != si for u, _ in self.users[n.i])):
                    body.append(f"T[{self.tslot[n.i]}, base + j] = F({n.name})")
                if n in self.outputs and keep is None:
                    body.append(f"{self.at('OUT' + str(self.outputs.index(n)))} = F({n.name})")
            out.append("for j in range(n):")
            out += ["    " + s for s in body]
        return out

    # -- backward --

    def _contributions(self, v: Node):
        """v's gradient contributions in autograd's order: decreasing consumer creation,
        a consumer's operands left to right."""
        return sorted(((u, k) for u, k in self.users[v.i]
                       if u.op not in _NO_GRAD and not (u.op == "where" and k == 0)
                       and not (u.op == "pick" and k == 1)),
                      key=lambda uk: (-uk[0].i, uk[1]))

    def _reached(self, present) -> set:
        """Nodes whose gradient autograd computes: on a path from an output that has a
        gradient (``present``, one flag per output)."""
        reached = {o.i for o, p in zip(self.outputs, present) if p}
        for n in reversed(self.nodes):
            if n.i in reached and n.op not in _NO_GRAD:
                for a in self._grad_args(n):
                    reached.add(a.i)
        return reached

    @staticmethod
    def _grad_args(n: Node):
        if n.op == "where":
            return [a for a in n.args[1:] if isinstance(a, Node)]
        if n.op == "pick":
            return [n.args[0]]
        return [a for a in n.args if isinstance(a, Node)]

    @staticmethod
    def _reading(n: Node):
        """The operands whose forward values n's derivative reads."""
        if n.op in _PA_BINARY or n.op in _PA_UNARY:
            return n.args
        return n.args[:1] if n.op in ("clamp_max", "clamp_min", "where") else ()

    def backward(self, present) -> list[str]:
        """The row's backward when the outputs flagged in ``present`` have gradients."""
        self.reached = self._reached(present)
        reads = set()
        for n in self.nodes:
            if n.i in self.reached and n.op not in _NO_GRAD:
                for a in self._reading(n):
                    if isinstance(a, Node):
                        reads |= {b.i for b in a.args if isinstance(b, Node)} \
                            if a.op in _COND else {a.i}
        lines: list[str] = []
        self.gslot: dict[int, int] = {}        # elementwise values with contributions in G
        self.rslots = 0
        self.local: set = set()                # gradients defined as locals
        if not self.single:
            lines += self.forward(keep=reads)
        for k, o in enumerate(self.outputs):   # the gradient from outside comes first
            if not present[k]:
                continue
            if o.shape == "r":
                lines.append(f"g{o.name} = P(GO{k}[r])")
                self.local.add(o.i)
            elif any(self.seg_of[u.i] != self.seg_of[o.i] for u, _ in self.users[o.i]):
                self._g_store(o, f"P({self.at(f'GO{k}')})", lines, loop=False)
        for si in reversed(range(len(self.segs))):
            kind, seg = self.segs[si]
            if kind == "row":
                for n in reversed(seg):
                    if n.i in self.reached and n.op not in _NO_GRAD:
                        self._node(n, lines, si, loop=False)
                continue
            body, post = [], []
            self._loaded: set = set()
            if self.single:
                self._loaded = {v.i for v in self.inputs} | {n.i for n in seg}
                body += [self.load(v) for v in self.inputs if v.shape != "r"]
                body += [f"{n.name} = {self.fwd_expr(n)}" for n in seg]
            for n in seg:                      # gradients from later segments, and outside
                if n.i in self.gslot:
                    body.append(f"g{n.name} = P(G[{self.gslot[n.i]}, base + j])")
                    self.local.add(n.i)
                elif n in self.outputs and present[self.outputs.index(n)]:
                    body.append(f"g{n.name} = P({self.at('GO' + str(self.outputs.index(n)))})")
                    self.local.add(n.i)
            for n in reversed(seg):
                if n.i in self.reached and n.op not in _NO_GRAD:
                    self._node(n, body, si, loop=True, post=post)
            lines.append("for j in range(n):")
            lines += ["    " + s for s in body]
            lines += post
        return lines

    def _need(self, a, body):
        """Make the forward value of node ``a`` available in the current loop body."""
        if not isinstance(a, Node) or a.shape == "r" or a.i in self._loaded:
            return
        self._loaded.add(a.i)
        if a.op in _COND:
            for b in a.args:
                self._need(b, body)
            body.append(f"{a.name} = {self.fwd_expr(a)}")
        else:
            body.append(self.load(a))

    def _node(self, n: Node, body, si, loop, post=None):
        """n's backward: its operands' contributions from its gradient ``g<n>``."""
        g = f"g{n.name}"
        a = n.args
        if loop:
            for x in self._reading(n):
                self._need(x, body)
        if n.op in _PA_BINARY:
            fn = "mul_g" if n.op == "mul" else "div_g"
            t = f"t{n.i}"
            body.append(f"{t}a, {t}b = {fn}({self.rval(a[0])}, {self.rval(a[1])}, {g}, "
                        "kind, ln2, fc, mode)")
            parts = [(a[0], 0, f"{t}a"), (a[1], 1, f"{t}b")]
        elif n.op in _PA_UNARY:
            parts = [(a[0], 0, f"{n.op}_g({self.rval(a[0])}, {g}, kind, ln2, fc, mode)")]
        elif n.op == "add":
            parts = [(a[0], 0, g), (a[1], 1, g)]
        elif n.op == "sub":
            parts = [(a[0], 0, g), (a[1], 1, f"neg({g})")]
        elif n.op == "neg":
            parts = [(a[0], 0, f"neg({g})")]
        elif n.op == "clamp_max":
            parts = [(a[0], 0, f"pass_if(F({a[0].name}) <= F({self.val(a[1])}), {g})")]
        elif n.op == "clamp_min":
            parts = [(a[0], 0, f"pass_if(F({a[0].name}) >= F({self.val(a[1])}), {g})")]
        elif n.op == "where":
            parts = [(a[1], 1, f"pass_if({a[0].name}, {g})"),
                     (a[2], 2, f"pass_if(not {a[0].name}, {g})")]
        elif n.op == "sum":
            parts = [(a[0], 0, g)]
        elif n.op == "pick":      # gather's backward: scatter_add into zeros
            parts = [(a[0], 0, f"add(np.int64(0), {g}) if j == {a[1].name} else np.int64(0)")]
        else:
            raise AssertionError(n.op)
        for v, k, expr in parts:
            if isinstance(v, Node) and v.i in self.reached:
                self._contrib(v, n, k, expr, body, si, loop, post)

    def _contrib(self, v, u, k, expr, body, si, loop, post):
        """Consumer ``u``'s (operand ``k``) contribution ``expr`` to v's gradient."""
        if v.op == "input":
            if (v, u, k) not in self.slots:     # an input without a gradient
                return
            dx = self.at(f"DX{self.slots.index((v, u, k))}")
            if loop:
                body.append(f"{dx} = F({expr})")
            else:                               # a row value's: broadcast
                body += ["for j in range(n):", f"    {dx} = F({expr})"]
        elif v.shape == "r":
            if loop:                            # folded after the loop, in order
                r = self.rslots
                self.rslots += 1
                body.append(f"R[{r}, base + j] = F({expr})")
                self._r_acc(v, f"P(fold(R[{r}], base, n, 1))", post)
            else:
                self._r_acc(v, expr, body)
        elif loop and self.seg_of[v.i] == si:
            name = f"g{v.name}"
            body.append(f"{name} = add({name}, {expr})" if v.i in self.local else
                        f"{name} = {expr}")
            self.local.add(v.i)
        else:
            self._g_store(v, expr, body, loop)

    def _r_acc(self, v, expr, lines):
        name = f"g{v.name}"
        lines.append(f"{name} = add({name}, {expr})" if v.i in self.local else
                     f"{name} = {expr}")
        self.local.add(v.i)

    def _g_store(self, v, expr, lines, loop):
        """A contribution to an earlier loop's value: accumulated in G."""
        first = v.i not in self.gslot
        if first:
            self.gslot[v.i] = len(self.gslot)
        s = f"G[{self.gslot[v.i]}, base + j]"
        stmt = f"{s} = F({expr})" if first else f"{s} = F(add(P({s}), {expr}))"
        if loop:
            lines.append(stmt)
        else:
            lines += ["for j in range(n):", "    " + stmt]

    # -- the kernels --

    def forward_source(self) -> str:
        ins = [v.name.upper() for v in self.inputs]
        outs = [f"OUT{k}" for k in range(len(self.outputs))]
        return "\n".join([
            f"def {self.name}_forward({', '.join(ins + outs)}, T, rows, n, c, fc, mode):",
            "    for r in range(rows):",
            *("        " + s for s in self.row_top() + self.forward()), ""])

    def backward_source(self, present) -> str:
        ins = [v.name.upper() for v in self.inputs]
        body = self.backward(present)
        gos = [f"GO{k}" for k in range(len(self.outputs)) if present[k]]
        dxs = [f"DX{s}" for s in range(len(self.slots))]
        tag = "".join("1" if p else "0" for p in present)
        return "\n".join([
            f"def {self.name}_backward_{tag}({', '.join(ins + gos + dxs)}, "
            "T, G, R, rows, n, c, kind, ln2, fc, mode):",
            "    for r in range(rows):",
            *("        " + s for s in self.row_top() + body), ""])


# --- plans: a description traced, its kernels compiled ------------------------------------

@register_jitable
def F(p):
    """A float32 pattern (held in int64) as float32."""
    return L.as_f32(np.int32(p & 0xFFFFFFFF))


@register_jitable
def P(v):
    """A float32 as its pattern, in int64."""
    return np.int64(L.as_i32(v)) & 0xFFFFFFFF


@register_jitable
def _fadd(a, b):
    return a + b


@register_jitable
def _fsub(a, b):
    return a - b


@register_jitable
def floor_(a):
    """torch.floor of a float32 pattern (NaN and infinities kept)."""
    return P(np.float32(np.floor(F(a))))


#: sign and exponent bits of a float32 (as a signed int32 for torch)
_LEAD_MASK = -(1 << 23)


@register_jitable
def lead_(a):
    """The leading power of two of a float32 pattern: its mantissa bits cleared."""
    return a & 0xFF800000


@register_jitable
def floor_max(t, base, n):
    """floor(max) of a row (NaN if it holds a NaN, -inf if every value is -inf): the
    softmax shift, torch.floor(amax)."""
    mx = np.float32(-np.inf)
    nan = False
    for j in range(n):
        v = t[base + j]
        if v != v:
            nan = True
        elif v > mx:
            mx = v
    return P(np.float32(np.nan) if nan else np.float32(np.floor(mx)))


#: the nodes' helpers for float32 (every rounding compiled out) and for other formats: the
#: derivative kind an argument (None), and for float32 also APPROX compiled in
_KINDS = {True: (None, N.APPROX), False: (None,)}
_HELPERS = {(f32, kind): N.define(F, P, _fadd, _fsub, f32, kind)
            for f32 in (True, False) for kind in _KINDS[f32]}


def _source_file(tag: str, src: str) -> str:
    """The generated source as a file (Numba caches kernels per source file, and
    tracebacks show its lines): torch_bridge/__pycache__/composites/<tag>.py."""
    path = Path(__file__).parent / "__pycache__" / "composites" / f"{tag}.py"
    try:
        if not path.exists() or path.read_text() != src:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(src)
            tmp.replace(path)
    except OSError:          # a read-only install: Numba's user-wide cache still works
        pass
    return str(path)


#: what the generated kernels inline (emu's scalar definitions, the nodes): part of their
#: cache key, since their own source does not change when those do
_DEPENDS = L.dependency_digest(__file__)


def _compile(tag: str, src: str, fn: str, backward: bool = False) -> dict:
    """``fn`` of the generated ``src``, compiled for float32 and for other formats, by
    ``(f32, kind)``: a backward's for each kind of _KINDS[f32], a forward's for None
    (its nodes are every kind's)."""
    digest = hashlib.sha256((src + _DEPENDS).encode()).hexdigest()[:16]
    code = compile(src, _source_file(f"{tag}_{digest}", src), "exec")
    out = {}
    for f32 in (True, False):
        for kind in _KINDS[f32] if backward else (None,):
            ns = dict(_HELPERS[f32, kind], S=S, np=np, F=F, P=P, fold=L.fold,
                      floor_max=floor_max, floor_=floor_, lead_=lead_,
                      __name__=__name__)   # Numba rebuilds a cached kernel's environment by name
            exec(code, ns)
            out[f32, kind] = L.njit_variant(
                f"composite {fn} f32={f32} kind={kind} {digest}")(ns[fn])
    return out


class Backward(NamedTuple):
    """A plan's backward for one set of outputs with gradients."""
    kernels: dict           # by (float32-ness, derivative kind)
    scratch: tuple          # rows of the T, G, R scratch per element
    live: tuple             # per slot: whether its consumer gets a gradient
    source: str             # the generated source


class Plan:
    """A traced composite: its inputs ((name, shape, dtype, grad)), outputs' shapes,
    gradient slots [(input index, consumer node, operand)], constants layout, the
    forward and backward kernels by (float32-ness, kind) (_compile), the backward ones by
    which outputs have a gradient (generated and compiled on first use)."""

    def __init__(self, tag, gen, inputs):
        self.name, self._gen, self.inputs = tag, gen, inputs
        self.outputs = tuple(o.shape for o in gen.outputs)
        index = {v.i: k for k, v in enumerate(gen.inputs)}
        self.slots = tuple((index[v.i], u.i, k) for v, u, k in gen.slots)
        # per input: its slots, and how many times Fused takes it (once per slot, at
        # least once: autograd then adds the slots' gradients in the graph's order)
        self.mine = tuple(tuple(s for s, (j, _, _) in enumerate(self.slots) if j == i)
                          for i in range(len(inputs)))
        self.takes = tuple(max(1, len(m)) for m in self.mine)
        self.first = tuple(sum(self.takes[:i]) for i in range(len(inputs)))
        self.forward_source = gen.forward_source()
        self.consts = tuple(gen.consts)
        self.scratch_fwd = len(gen.tslot)
        self.forward = _compile(tag, self.forward_source, f"{tag}_forward")
        self._backward: dict = {}

    def backward(self, present: tuple) -> Backward:
        """The backward kernels for these outputs' gradients (``present``: a flag per
        output)."""
        b = self._backward.get(present)
        if b is None:
            src = self._gen.backward_source(present)
            tag = "".join("1" if p else "0" for p in present)
            if self._gen.consts != list(self.consts):
                raise AssertionError("the backward needs constants the forward does not")
            b = self._backward[present] = Backward(
                _compile(self.name, src, f"{self.name}_backward_{tag}", backward=True),
                (len(self._gen.tslot), len(self._gen.gslot), self._gen.rslots),
                tuple(u in self._gen.reached for _, u, _ in self.slots), src)
        return b


_PLANS: dict = {}


def plan(desc, inputs: tuple, params: tuple = (), **flags) -> Plan:
    """``desc`` (a composites.py function) traced with ``inputs`` ((name, shape[, dtype[,
    grad]]): shape "e" per element, "c" per column (a weight of the row's length), "r"
    per row; dtype "f" float32, "b" a flag, "i" an index), the numbers ``params``
    (names) given per call, and structural ``flags`` (the description's other keyword
    arguments); traced and compiled once per process."""
    key = (desc, inputs, params, tuple(sorted(flags.items())))
    p = _PLANS.get(key)
    if p is not None:
        return p
    tr = Trace()
    args = [tr.input(*spec) for spec in inputs]
    out = desc(tr, **{spec[0]: a for spec, a in zip(inputs, args)},
               **{name: Param(name) for name in params}, **flags)
    outputs = list(out) if isinstance(out, tuple) else [out]
    tag = "_".join([desc.__name__] + [f"no_{k}" if v is None else f"{k}{int(v)}"
                                      for k, v in sorted(flags.items())])
    p = _PLANS[key] = Plan(tag, _Gen(tag, tr.nodes, args, outputs), inputs)
    return p


# --- running a plan ---------------------------------------------------------------------

_CONSTS: dict = {}


def consts(p: Plan, fmt, rounding, params: dict) -> np.ndarray:
    """The plan's constants array for this call, as patterns: PA operands rounded into
    ``fmt`` (as round_to rounds a constant operand), the others as float32."""
    key = (p, fmt, rounding, tuple(sorted(params.items())) if params else ())
    c = _CONSTS.get(key)
    if c is None:
        vals = [params[k.key] if isinstance(k.key, str) else k.key for k in p.consts]
        t = torch.tensor(vals, dtype=torch.float32)
        r = host_view(round_lean(t, fmt, rounding))
        keep = np.array([not k.rounded for k in p.consts], bool)
        c = np.where(keep, host_view(t), r).astype(np.float32).view(np.uint32).astype(np.int64)
        if len(_CONSTS) > 4096:
            _CONSTS.clear()
        _CONSTS[key] = c
    return c


def forward(p: Plan, kc, c, ins, outs, n: int) -> None:
    """The plan's forward on arrays: ``ins`` in the order of its inputs (elementwise
    ones (rows, n) of any strides, weights (n,), row values (rows,)), into ``outs``."""
    rows = ins[0].shape[0]
    scratch = np.empty((p.scratch_fwd, rows * n), np.float32)
    p.forward[kc.f32, None](*ins, *outs, scratch, rows, n, c, kc.fc, kc.mode)


def backward(p: Plan, kc, c, kind, ins, gouts, dxs, n: int) -> tuple:
    """The plan's backward on arrays: ``gouts`` the outputs' gradients (None where an
    output got none), into ``dxs`` (one (rows, n) array per slot); a slot whose consumer
    got no gradient is +0, as a chunk without one in the graph.  Returns which slots
    got one."""
    rows = ins[0].shape[0]
    b = p.backward(tuple(g is not None for g in gouts))
    t, g, r = (np.empty((k, rows * n), np.float32) for k in b.scratch)
    kernel = b.kernels[kc.f32, kind if kc.f32 and kind == N.APPROX else None]
    kernel(*ins, *(g_ for g_ in gouts if g_ is not None), *dxs, t, g, r, rows, n, c, kind,
           kc.ln2, kc.fc, kc.mode)
    for d, ok in zip(dxs, b.live):
        if not ok:
            d[...] = 0.0
    return b.live


def _rows(t: torch.Tensor, n: int) -> np.ndarray:
    """An elementwise operand as a C-contiguous (rows, n) float32 array (a view where it
    can be): a strided or broadcast operand (the gradient of a sum) is copied, because
    a kernel whose loops read it in place does not vectorise."""
    return np.ascontiguousarray(host_view(t)).reshape(-1, n)


def _arrays(p: Plan, ins, n):
    return [_rows(t, n) if spec[1] == "e" else host_view(t.detach().reshape(-1))
            for t, spec in zip(ins, p.inputs)]


class Fused(torch.autograd.Function):
    """A plan's kernels as one autograd node.  Each input comes once per gradient slot
    (at least once), so autograd adds the slots' gradients in the graph's order."""

    @staticmethod
    def forward(ctx, p, c, kc, kind, n, *tensors):
        ins = [tensors[k] for k in p.first]
        rows = ins[0].numel() // n
        arrays = [np.empty((rows, n) if sh == "e" else rows, np.float32) for sh in p.outputs]
        forward(p, kc, c, _arrays(p, ins, n), arrays, n)
        outs = [torch.from_numpy(a).view(ins[0].shape) if sh == "e" else torch.from_numpy(a)
                for a, sh in zip(arrays, p.outputs)]
        ctx.save_for_backward(*ins)
        ctx.plan, ctx.c, ctx.kc, ctx.kind, ctx.n = p, c, kc, kind, n
        ctx.set_materialize_grads(False)       # an unused output: no gradient, as the graph
        return outs[0] if len(outs) == 1 else tuple(outs)

    @staticmethod
    def backward(ctx, *gs):
        p, n = ctx.plan, ctx.n
        ins = ctx.saved_tensors
        rows = ins[0].numel() // n
        dx = [np.empty((rows, n), np.float32) for _ in p.slots]
        go = [None if g is None else _rows(g.float(), n) if sh == "e" else
              host_view(g.float().reshape(-1)) for g, sh in zip(gs, p.outputs)]
        live = backward(p, ctx.kc, ctx.c, ctx.kind, _arrays(p, ins, n), go, dx, n)
        grads = []
        for i, inp in enumerate(ins):
            mine = p.mine[i]
            for s in mine:          # a slot whose consumer got no gradient: none, as the graph
                d = torch.from_numpy(dx[s])
                grads.append(None if not live[s] else d.view(inp.shape)
                             if p.inputs[i][1] == "e" else fold_to(d.view(ins[0].shape),
                                                                    inp.shape))
            if not mine:
                grads.append(None)
        return (None,) * 5 + tuple(grads)


def run(p: Plan, tensors, row: int, nm: Numerics, params: dict):
    """The composite of ``tensors`` (CPU; float32 but for flags and indices; the first
    elementwise, rows of ``row`` trailing elements; weights of ``row`` elements; row
    inputs of one value per row) by the plan's fused kernels, with the numbers
    ``params``."""
    c = consts(p, nm.fmt, nm.rounding, params)
    kc = kernel_consts(nm.fmt, nm.rounding)
    kind = N.EXACT if nm.backward == "exact" else N.APPROX
    args = [t for t, k in zip(tensors, p.takes) for _ in range(k)]
    return Fused.apply(p, c, kc, kind, row, *args)

"""audit(): which multiplications of a model still run natively under a PAMConfig.

One forward and one backward pass run under :func:`torch_bridge.pam_mode` while a
TorchDispatchMode watches every aten op.  An op is *multiply-bearing* unless
:mod:`torch_bridge.classification` classifies it as multiply-free (data movement,
additions, comparisons, max/min, selections, sampling): an op nobody has classified
(a new torch release, a custom op) counts as multiply-bearing, so a new or unexpected
op is reported rather than missed.  Results of every numeric dtype count: floating,
complex (a complex product is real multiplies) and integer; a bool result (a logical
and/or of masks) is no product.  Integer arithmetic of :data:`INTEGER_BY_DESIGN` and
the ops of :data:`NATIVE_BY_DESIGN` are listed with their reason, not counted as
escaped.

Emulated ops versus native ones: the PA kernels (torch_bridge's private modules,
``torch_bridge._*``, whose autograd Functions hand operands to :mod:`emu` and back)
issue only data movement in aten, but to make the rule independent of what they issue,
an aten op counts as emulated whenever a frame of one of those modules is on the
Python stack — in the forward pass and in their backward, which autograd calls from
Python.  Everything else is audited like user code, the composites of
:mod:`torch_bridge.functional` included: a native multiply they issued would be
reported.

Work is counted FLOP-style in multiplies: multiply-adds for the matmul and
convolution family (torch.utils.flop_counter's formulas, halved), otherwise the
largest floating or complex tensor the op reads or writes (one multiply per element;
for an op on integers only, the largest integer tensor).  The share
of a row is its work over the multiply work of the same pass run natively (no config;
for a converted model, on a copy converted back).
The source line of a forward op is the innermost stack frame outside torch and
torch_bridge (the model's own code); a backward op is attributed to the forward line
that created its autograd node (recorded by anomaly mode, NaN checks off).
"""
from __future__ import annotations

import copy
import os
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from .classification import (BY_DESIGN, COMPLEX_BEARING, CONDITIONAL, FREE, INTEGER_BY_DESIGN,
                             MULTIPLY_FREE, NATIVE_BY_DESIGN, classify, packet)
from .config import PAMConfig

__all__ = ["audit", "AuditReport", "AuditRow", "MULTIPLY_FREE", "NATIVE_BY_DESIGN",
           "INTEGER_BY_DESIGN"]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_BRIDGE_DIR = os.path.dirname(__file__) + os.sep
_STDLIB = (os.path.dirname(os.__file__) + os.sep,)
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


@dataclass(frozen=True)
class AuditRow:
    """One native multiply-bearing aten op at one source line, in one pass."""
    op: str                     # the aten op; "mul (integer)": a result of an integer dtype
    phase: str                  # "forward" or "backward"
    source: str                 # "file:line (function)", shortened to the model's package
    count: int
    work: int                   # multiplies (multiply-adds for matmul-like ops)
    share: float                # work / the native run's multiply work
    design: str = ""            # why it is native by design; "" if it escaped


@dataclass
class AuditReport:
    """The native multiply-bearing ops of one forward+backward pass under ``config``."""
    config: str
    rows: list[AuditRow]
    native_work: int            # multiplies of the same pass run natively
    escaped_work: int = field(init=False)

    def __post_init__(self):
        self.escaped_work = sum(r.work for r in self.rows)

    @property
    def escaped(self) -> int:
        """Native multiply-bearing op calls, those native by design excepted (0: fully
        emulated)."""
        return sum(r.count for r in self.rows if not r.design)

    @property
    def share(self) -> float:
        """Fraction of the native run's multiply work that stayed native (by design
        included)."""
        return self.escaped_work / self.native_work if self.native_work else 0.0

    def to_dict(self) -> dict:
        return {"config": self.config, "native_work": self.native_work,
                "escaped": self.escaped, "escaped_work": self.escaped_work,
                "share": self.share, "rows": [r.__dict__ for r in self.rows]}

    def table(self) -> str:
        """A Markdown table of the rows, largest share first, and a summary line."""
        design = sum(r.count for r in self.rows) - self.escaped
        head = (f"{self.escaped} native multiply-bearing op call(s)"
                + (f" (+{design} native by design)" if design else "")
                + f", {100 * self.share:.2f} % of {self.native_work:,} multiplies "
                f"({self.config})")
        if not self.rows:
            return head
        lines = [head, "", "| op | phase | count | share | source |", "|---|---|---|---|---|"]
        for r in self.rows:
            op = (f"{r.op} (by design)" if r.design else r.op if classify(
                r.op.split(" ")[0]) is not None else f"{r.op} (unclassified)")
            lines.append(f"| {op} | {r.phase} | {r.count} | {100 * r.share:.2f} % | "
                         f"{r.source} |")
        return "\n".join(lines)

    __str__ = table


def _packet(func) -> str:
    """The op's classified name: the aten packet (in-place ``_`` stripped), or
    ``namespace::name`` for an op of another namespace (never classified)."""
    name = packet(func._overloadpacket.__name__)
    return name if func.namespace == "aten" else f"{func.namespace}::{name}"


def _tensors(tree):
    """The floating and complex tensors of ``tree`` (a complex product is four real
    multiplies: the view_as_complex rotary embedding)."""
    for leaf in torch.utils._pytree.tree_leaves(tree):
        if isinstance(leaf, torch.Tensor) and (leaf.is_floating_point() or leaf.is_complex()):
            yield leaf


def _integers(tree):
    """The integer tensors of ``tree`` (bool ones excepted: logical values)."""
    for leaf in torch.utils._pytree.tree_leaves(tree):
        if isinstance(leaf, torch.Tensor) and not (leaf.is_floating_point() or leaf.is_complex()) \
                and leaf.dtype != torch.bool:
            yield leaf


def _results(func, args, kwargs, out):
    """What the op wrote: its outputs, or for an in-place op that returns nothing
    (``_foreach_mul_``) the arguments its schema marks as written."""
    if any(isinstance(leaf, torch.Tensor) for leaf in torch.utils._pytree.tree_leaves(out)):
        return out
    written = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            written.append(kwargs.get(a.name) if a.kwarg_only or i >= len(args) else args[i])
    return written


def _work(func, args, kwargs, out) -> int:
    formula = flop_registry.get(func._overloadpacket)
    if formula is not None:
        return int(formula(*args, **kwargs, out_val=out)) // 2
    tree = (args, kwargs, out)
    return max((t.numel() for t in _tensors(tree)),
               default=max((t.numel() for t in _integers(tree)), default=0))


def _multiplies(name, args, kwargs) -> bool:
    """False for an op that multiplies nothing with these arguments; True for every
    other, unclassified ones included."""
    if name in CONDITIONAL:             # add(alpha=2), scatter_reduce(..., "prod"), ...
        arg, pos, default, free = CONDITIONAL[name]
        return kwargs.get(arg, args[pos] if len(args) > pos else default) not in free
    if name in COMPLEX_BEARING:         # sgn(z) = z/|z|
        return any(leaf.is_complex() for leaf in _tensors((args, kwargs)))
    cls = classify(name)
    return cls is None or cls[0] != FREE


def _design(name, out) -> str:
    """Why a native multiply-bearing op is native by design, or "" (escaped)."""
    cls = classify(name)
    if cls is not None and cls[0] == BY_DESIGN:
        return cls[1]
    if name in INTEGER_BY_DESIGN and not any(True for _ in _tensors(out)):
        return INTEGER_BY_DESIGN[name]
    return ""


def _user(file: str) -> bool:
    return not (file.startswith(_TORCH_DIR) or file.startswith(_BRIDGE_DIR)
                or file.startswith(_STDLIB) or file.startswith("<"))


def _short(file: str, line, func) -> str:
    parts = file.split(os.sep)
    for anchor in ("site-packages", "transformers"):
        if anchor in parts:
            parts = parts[parts.index(anchor) + 1:]
            break
    else:
        parts = parts[-2:]
    return f"{'/'.join(parts)}:{line} ({func})"


class _Counter(TorchDispatchMode):
    """Counts native multiply-bearing aten ops by (op, phase, source)."""

    def __init__(self, backward_frame):
        super().__init__()
        self.calls = defaultdict(lambda: [0, 0])
        self.total = 0
        self._backward_frame = backward_frame    # the audit's own .backward() frame

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = _packet(func)
        results = _results(func, args, kwargs, out)
        if not _multiplies(name, args, kwargs) or not any(
                True for _ in (*_tensors(results), *_integers(results))):
            return out
        source = self._source()
        if source is None:                      # inside a PA kernel: emulated
            return out
        work = _work(func, args, kwargs, out)
        node = torch._C._current_autograd_node()
        integer = not any(True for _ in _tensors(results))
        row = self.calls[(f"{name} (integer)" if integer else name,
                          "forward" if node is None else "backward", source,
                          _design(name, results))]
        row[0] += 1
        row[1] += work
        self.total += work
        return out

    def _source(self) -> str | None:
        """The user frame that issued the op, or None inside a PA kernel."""
        found = None
        frame = sys._getframe(2)
        while frame is not None:
            mod = frame.f_globals.get("__name__", "")
            if mod.startswith("torch_bridge._") or mod == "emu" or mod.startswith("emu."):
                return None
            if frame.f_code is self._backward_frame:
                break                           # run by autograd: the node knows the line
            if found is None and _user(frame.f_code.co_filename):
                found = _short(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
            frame = frame.f_back
        if found is not None:
            return found
        node = torch._C._current_autograd_node()
        stack = node.metadata.get("traceback_", []) if node is not None else []
        for entry in reversed(stack):
            m = _FRAME.search(entry)
            if m and _user(m["file"]):
                return _short(m["file"], m["line"], m["func"])
        return "<autograd>" if node is None else f"<{node.name()}>"


def _call(model, inputs):
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def _scalar(out) -> torch.Tensor | None:
    """The model's own loss if it returned one, else the sum of its floating outputs."""
    loss = getattr(out, "loss", None) if not isinstance(out, torch.Tensor) else None
    if isinstance(loss, torch.Tensor):
        return loss
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    ts = [t for t in _tensors(out) if t.requires_grad]
    return sum(t.sum() for t in ts) if ts else None


def _backward(loss):
    loss.backward()


def _pass(model, inputs, config, loss_fn, backward):
    from .mode import pam_mode
    counter = _Counter(_backward.__code__)
    grads = {p: p.grad for p in model.parameters()}
    state = torch.get_rng_state()
    try:
        with pam_mode(config), torch.autograd.set_detect_anomaly(True, check_nan=False), \
                counter:
            out = _call(model, inputs)
            loss = loss_fn(out) if loss_fn is not None else _scalar(out)
            if backward and loss is not None and loss.requires_grad:
                _backward(loss)
    finally:
        torch.set_rng_state(state)
        for p, g in grads.items():
            p.grad = g
    return counter


def audit(model: torch.nn.Module, inputs, config: PAMConfig | None, *, loss_fn=None,
          backward: bool = True) -> AuditReport:
    """Run ``model`` once forward (and backward) under ``pam_mode(config)`` and report
    every multiply-bearing aten op that ran natively: name, phase, count, share of the
    multiply work and source line.  ``report.escaped == 0`` proves the pass fully
    emulated (see this module's docstring for what counts).

    ``inputs``: a tensor, a tuple of positional arguments or a dict of keyword
    arguments.  The backward pass starts from ``loss_fn(output)`` if given, else the
    model's ``.loss`` if it returned one, else the sum of its floating outputs that
    require grad.  Parameter gradients and torch's RNG state are restored afterwards.
    A model converted with :func:`torch_bridge.convert` is audited as it is; its native
    multiply work is counted on a deep copy converted back to plain torch.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if config is not None and not isinstance(config, PAMConfig):
        raise TypeError(f"config must be a torch_bridge.PAMConfig or None, got "
                        f"{type(config).__name__}")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    from .convert import convert
    from .modules import PAModule
    converted = any(isinstance(m, PAModule) for m in model.modules())
    plain = convert(copy.deepcopy(model), None) if converted else model
    native = _pass(plain, inputs, None, loss_fn, backward)
    pa = native if config is None and not converted else \
        _pass(model, inputs, config, loss_fn, backward)
    rows = [AuditRow(op, phase, source, count, work,
                     work / native.total if native.total else 0.0, design)
            for (op, phase, source, design), (count, work) in pa.calls.items()]
    rows.sort(key=lambda r: (-r.work, r.op, r.phase, r.source))
    return AuditReport("native" if config is None else config.describe(), rows, native.total)

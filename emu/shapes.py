"""The plans the front ends make and every backend executes: shape rules shared by
every backend (broadcasting of elementwise operands, ``np.matmul``'s rules for PAM
matmul, docs/semantics.md §5), each checked in one place with errors that name the
operands."""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

__all__ = ["broadcast", "Elementwise", "elementwise", "MatmulShapes", "matmul_shapes", "matmul_grad_shapes",
           "contract_layout", "batch_index", "broadcast_base"]


def broadcast(*named) -> tuple:
    """Broadcast shape of ``(name, shape)`` pairs; ValueError naming every shape."""
    try:
        return tuple(np.broadcast_shapes(*(tuple(s) for _, s in named)))
    except ValueError:
        shapes = ", ".join(f"{n}.shape={tuple(s)}" for n, s in named)
        raise ValueError(f"operands could not be broadcast together: {shapes}") from None


class Elementwise(NamedTuple):
    """The plan of one elementwise call: kernel name ``op``, the result's broadcast
    ``shape``, the format's kernel constants ``fc``, and ``scalar``: every operand is
    0-d (the host then returns a numpy scalar)."""
    op: str
    shape: tuple
    fc: object
    scalar: bool


def elementwise(op: str, fc, **operands) -> Elementwise:
    """The plan of ``op`` on the operands (arrays of a backend, by name)."""
    shapes = [tuple(v.shape) for v in operands.values()]
    shape = shapes[0]
    if any(s != shape for s in shapes):
        shape = broadcast(*zip(operands, shapes))
    return Elementwise(op, shape, fc, shape == ())


class MatmulShapes(NamedTuple):
    """The plan of ``matmul(A, B)`` with np.matmul's rules: a 1-D A is a row
    (``squeeze_a``), a 1-D B a column (``squeeze_b``); ``batch`` is the broadcast batch
    shape, and A is (..., m, k), B (..., k, n)."""
    squeeze_a: bool
    squeeze_b: bool
    batch: tuple
    mkn: tuple

    @property
    def out(self) -> tuple:
        """The result's shape (1-D operands' dimensions dropped)."""
        m, _, n = self.mkn
        return self.batch + (m,) * (not self.squeeze_a) + (n,) * (not self.squeeze_b)

    @property
    def full(self) -> tuple:
        """The result's shape with both matrix dimensions kept: batch + (m, n)."""
        m, _, n = self.mkn
        return self.batch + (m, n)


def matmul_shapes(ashape, bshape, who: str = "pam_matmul") -> MatmulShapes:
    """Check the operand shapes of a matmul; ValueError (prefixed ``who``) for shapes
    np.matmul rejects: a 0-D operand, contracted dimensions that differ, batch
    dimensions that do not broadcast."""
    ashape, bshape = tuple(ashape), tuple(bshape)
    if not ashape or not bshape:
        raise ValueError(f"{who} operands must have at least one dimension, got "
                         f"A.shape={ashape}, B.shape={bshape}")
    a2 = (1,) + ashape if len(ashape) == 1 else ashape
    b2 = bshape + (1,) if len(bshape) == 1 else bshape
    (m, k), (k2, n) = a2[-2:], b2[-2:]
    if k != k2:
        raise ValueError(f"{who}: contracted dimensions differ: A.shape={ashape} has K={k}, "
                         f"B.shape={bshape} has K={k2}")
    try:
        batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError:
        raise ValueError(f"{who}: batch dimensions do not broadcast: A.shape={ashape}, "
                         f"B.shape={bshape}") from None
    return MatmulShapes(len(ashape) == 1, len(bshape) == 1, batch, (m, k, n))


def matmul_grad_shapes(ashape, bshape, gshape):
    """(A as >= 2-D, B as >= 2-D, broadcast batch, full dY shape) of a PAM matmul
    gradient; ValueError for shapes np.matmul would reject or a dY of another shape."""
    plan = matmul_shapes(ashape, bshape)
    if tuple(gshape) != plan.out:
        raise ValueError(f"dY.shape={tuple(gshape)} must be the shape of pam_matmul(A, B), "
                         f"{plan.out}")
    m, k, n = plan.mkn
    return tuple(ashape)[:-2] + (m, k), tuple(bshape)[:-2] + (k, n), plan.batch, plan.full


def contract_layout(gshape, xshape):
    """The layout of emu.grad's ``_contract``: ``(gperm, gshape, wperm, wshape, xshape)`` with
    ``g.transpose(gperm).reshape(gshape)``, ``broadcast_to(w, batch + (R, C))
    .transpose(wperm).reshape(wshape)`` and ``x.reshape(xshape)`` (perms None when no
    batch dimension is reduced).  The reduced batch dimensions move next to r and
    merge into it, in C order before r."""
    batch = tuple(gshape[:-2])
    P, R = gshape[-2:]
    C = xshape[-1]
    xb = (1,) * (len(batch) - (len(xshape) - 2)) + tuple(xshape[:-2])
    red = [d for d in range(len(batch)) if xb[d] == 1 and batch[d] != 1]
    kept = [d for d in range(len(batch)) if d not in red]
    if not red:
        return None, None, None, None, None
    nd = len(batch)
    kshape = tuple(batch[d] for d in kept)
    folded = R * int(np.prod([batch[d] for d in red]))     # explicit: sizes may be 0
    return ((*kept, nd, *red, nd + 1), kshape + (P, folded), (*kept, *red, nd, nd + 1),
            kshape + (folded, C), tuple(xb[d] for d in kept) + (P, C))


def broadcast_base(shape, strides):
    """The index that keeps one element along each broadcast dimension of a view (stride
    0, size > 1; numpy's byte strides or torch's element strides alike), None where it
    has none: the view's own values, read once instead of copied out."""
    one = tuple(slice(0, 1) if st == 0 and d > 1 else slice(None)
                for d, st in zip(shape, strides))
    return one if any(s != slice(None) for s in one) else None


def batch_index(batch_shape, shape) -> np.ndarray:
    """Index of each element of the broadcast batch ``shape`` into an operand's own
    (flattened, C-order) batches of shape ``batch_shape`` (cached: callers must not
    write to it)."""
    return _batch_index(tuple(int(d) for d in batch_shape), tuple(int(d) for d in shape))


@functools.lru_cache(maxsize=1024)
def _batch_index(batch_shape, shape) -> np.ndarray:
    n = math.prod(batch_shape)
    own = np.arange(n, dtype=np.int64).reshape(batch_shape)
    return np.ascontiguousarray(np.broadcast_to(own, shape)).reshape(-1)

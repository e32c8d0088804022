"""More PAM matmul products: einsum and 1-D convolution, with a defined contraction order.

Both reduce to :func:`torch_bridge.functional.pam_matmul` (emu's fold: strictly
increasing k in ``acc``), so their backward passes are the PAM matmul's, approximate
or exact (Table 1).
"""
from __future__ import annotations

import math

from torch.nn.modules.utils import _single

from .functional import pam_conv2d, pam_matmul

__all__ = ["pam_einsum", "pam_conv1d"]


def _parse(equation: str, n: int):
    """(input subscripts, output subscripts), or None for what is left to torch
    (ellipsis, a letter repeated inside one operand: diagonals)."""
    eq = equation.replace(" ", "")
    if "." in eq:
        return None
    ins, _, out = eq.partition("->")
    subs = ins.split(",")
    if len(subs) != n:
        raise ValueError(f"einsum: equation {equation!r} has {len(subs)} operand(s), "
                         f"got {n} tensor(s)")
    if "->" not in eq:      # implicit output: the letters seen once, alphabetically
        out = "".join(sorted(c for c in set(ins) if c.isalpha() and ins.count(c) == 1))
    if any(len(set(s)) != len(s) for s in (*subs, out)):
        return None
    return subs, out


def _pair(a, sa, b, sb, out, mm):
    """``einsum(f'{sa},{sb}->{out}', a, b)`` as one batched PAM matmul: batch letters
    (in both and the output), a's free letters (M), the contracted letters (K, in the
    order they appear in ``sa``), b's free letters (N)."""
    def sum_away(t, s, other):             # letters nowhere else: summed before the product
        gone = [i for i, c in enumerate(s) if c not in other and c not in out]
        if not gone:
            return t, s
        return t.sum(gone), "".join(c for i, c in enumerate(s) if i not in gone)
    a, sa = sum_away(a, sa, sb)
    b, sb = sum_away(b, sb, sa)
    batch = [c for c in sa if c in sb and c in out]
    contr = [c for c in sa if c in sb and c not in out]
    af = [c for c in sa if c not in sb]
    bf = [c for c in sb if c not in sa]
    size = {**dict(zip(sa, a.shape)), **dict(zip(sb, b.shape))}
    nb = [size[c] for c in batch]
    A = a.permute([sa.index(c) for c in batch + af + contr]).reshape(
        *nb, math.prod(size[c] for c in af), math.prod(size[c] for c in contr))
    B = b.permute([sb.index(c) for c in batch + contr + bf]).reshape(
        *nb, math.prod(size[c] for c in contr), math.prod(size[c] for c in bf))
    C = mm(A, B).reshape([*nb, *[size[c] for c in af], *[size[c] for c in bf]])
    have = batch + af + bf
    return C.permute([have.index(c) for c in out]) if have != list(out) else C


def pam_einsum(equation, *operands, fmt="float32", acc="float32", backward="approx",
               rounding="nearest_even"):
    """torch.einsum with PAM products: operands are combined left to right, each pair
    as one batched PAM matmul whose contraction runs over the contracted letters in
    the order they appear in the left operand's subscripts (row-major); letters of one
    operand that appear nowhere later are summed (float32) first.  Returns None for
    equations left to torch (ellipsis, repeated letters: no products or diagonals), and
    a single operand is torch's (a permutation or a sum, no multiply)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    parsed = _parse(equation, len(operands))
    if parsed is None or len(operands) < 2:
        return None
    subs, out = parsed

    def mm(x, y):
        return pam_matmul(x, y, fmt, acc=acc, backward=backward, rounding=rounding)
    t, s = operands[0], subs[0]
    for i in range(1, len(operands)):
        later = set(out).union(*subs[i + 1:])
        keep = "".join(dict.fromkeys(c for c in s + subs[i] if c in later))
        t, s = _pair(t, s, operands[i], subs[i], keep, mm), keep
    return t if s == out else t.permute([s.index(c) for c in out])


def pam_conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
               fmt="float32", *, acc="float32", backward="approx", rounding="nearest_even"):
    """1-D convolution as :func:`pam_conv2d` on a height-1 image: each output folds
    over the kernel's (channel, position) entries in that order.  F.conv1d's arguments."""
    unbatched = x.dim() == 2
    if unbatched:
        x = x.unsqueeze(0)
    pad = padding if isinstance(padding, str) else (0, _single(padding)[0])
    y = pam_conv2d(x.unsqueeze(-2), weight.unsqueeze(-2), bias, (1, _single(stride)[0]), pad,
                   (1, _single(dilation)[0]), groups, fmt, acc=acc, backward=backward,
                   rounding=rounding).squeeze(-2)
    return y.squeeze(0) if unbatched else y
